"""``Job.attempt_base``: attempt numbers do not repeat across a failover.

The first claim of a job on a new timeline, for a job claimed last on an earlier one, raises
the base past the job's budget (``pg_statements.NUMBER_SKIP``), so the attempts numbered now
come after any the lost timeline numbered. A column with a constant default: PostgreSQL adds it
without rewriting the table; existing jobs start at 0, their numbers as they were. On SQLite
Django adds it by copying the table, and the copy is built with every index the models
declare, the retried index included, which SQLite never had (0011: its rollup reads the state
index): the migration drops that one again, both ways.
"""

from typing import Any

from django.db import migrations, models


def drop_sqlite_retried_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP INDEX IF EXISTS tenure_job_retried")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0023_workflows"),
    ]

    operations = [
        # Backwards the column goes by a copy too: the index is dropped after it (operations
        # run in reverse).
        migrations.RunPython(migrations.RunPython.noop, drop_sqlite_retried_index),
        migrations.AddField(
            model_name="job",
            name="attempt_base",
            field=models.IntegerField(
                db_default=0,
                default=0,
                help_text="Added to attempts to number an attempt; raised by the first claim after a failover that may have lost claims of this job (docs/architecture.md).",
            ),
        ),
        migrations.RunPython(drop_sqlite_retried_index, migrations.RunPython.noop),
    ]
