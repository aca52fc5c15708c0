"""A limited queue counts its leased jobs by an index of its own leases.

``tenure_job_queue_leased`` indexes the leased jobs by queue. A claim of a queue with a
``max_leased`` limit counts that queue's leased jobs under its queue's lock; it used to read
them through the leases index (by expiry, every queue's), which, while a snapshot is held,
keeps an entry of every job leased since in any queue: each count read all of them (3,000
after 3,000 jobs of another queue). It now reads its own queue's entries only
(``tests/db/test_claim_plan.py::test_a_limited_queues_count_reads_its_own_leases_only``).

PostgreSQL builds the index ``CONCURRENTLY`` (claims and completions go on; the migration is
not atomic: run again, it starts over). Reversed, the index goes.
"""

from typing import Any

from django.db import migrations, models

NAME = "tenure_job_queue_leased"


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        # An earlier run stopped midway may have left an invalid index of this name.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {NAME} ON tenure_job (queue) WHERE state = 'leased'"
        )
    else:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {NAME} ON tenure_job (queue) WHERE state = 'leased'"
        )


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
    else:
        schema_editor.execute(f"DROP INDEX IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler_core", "0015_one_open_attempt"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        condition=models.Q(("state", "leased")),
                        fields=["queue"],
                        name=NAME,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
