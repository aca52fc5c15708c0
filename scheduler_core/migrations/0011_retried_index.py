"""An index of the waiting jobs that were claimed before (``fence > 0``: retried, snoozed,
released, rescued), by ``updated_at``, on PostgreSQL.

The history rollup reads, each minute, the jobs an attempt of that minute can belong to. Since
0010 the waiting ones could come only through the claim index, which has no time in it; with a
backlog the planner read the whole attempt table instead (on 1,000,000 jobs with 40,000
waiting: 155 ms a minute, growing with the history; 0.05 ms with this index). A new job (fence
0) has no entry here, so an enqueue and a claim write none.

PostgreSQL builds it ``CONCURRENTLY`` (enqueues and claims go on; the migration is not atomic:
run again, it starts over). SQLite's rollup reads its state index, which holds every row
there: it gets no index.
"""

from typing import Any

from django.db import migrations, models

NAME = "tenure_job_retried"


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    # An earlier run stopped midway may have left an invalid index of this name.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY {NAME} ON tenure_job (updated_at) "
        "WHERE state = 'waiting' AND fence > 0"
    )


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler_core", "0010_resting_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        fields=["updated_at"],
                        name=NAME,
                        condition=models.Q(("fence__gt", 0), ("state", "waiting")),
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
