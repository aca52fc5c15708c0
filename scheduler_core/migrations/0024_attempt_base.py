"""``Job.attempt_base``: attempt numbers do not repeat across a failover.

The first claim of a job on a new timeline, for a job claimed last on an earlier one, raises
the base past the job's budget (``pg_statements.NUMBER_SKIP``), so the attempts numbered now
come after any the lost timeline numbered. A column with a constant default: PostgreSQL adds it
without rewriting the table; existing jobs start at 0, their numbers as they were.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0023_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="attempt_base",
            field=models.IntegerField(
                db_default=0,
                default=0,
                help_text="Added to attempts to number an attempt; raised by the first claim after a failover that may have lost claims of this job (docs/architecture.md).",
            ),
        ),
    ]
