"""The state, name and queue indexes hold only jobs at rest (succeeded, failed, indeterminate,
cancelled) on PostgreSQL; the state index sorts them by ``updated_at`` ascending.

Waiting and leased rows are read through the claim and leases indexes only. Each claim and
completion leaves a version of a job's row behind; in these three indexes those versions had
cost every job six more entries, which no vacuum removes while an older snapshot is held. And
a claim whose plan read the ``state = 'waiting'`` entries of the queue index instead of the
claim index (the planner costed the two within 1 % of each other) walked every version left
since the snapshot on every claim: a soak's claims went from 0.3 to 61 ms for two minutes
(docs/operations.md, "A long transaction").

PostgreSQL builds each new index ``CONCURRENTLY`` under a temporary name, then drops the old
one and renames the new (so this migration is not atomic: run again, it starts over). SQLite
keeps its indexes over every row: it keeps no old versions, and its planner would not use
these predicates for a query on one state.
"""

from typing import Any

from django.db import migrations, models

RESTING = ("cancelled", "failed", "indeterminate", "succeeded")
PREDICATE = "state IN (" + ", ".join(f"'{s}'" for s in RESTING) + ")"

NEW = {
    "tenure_job_state": '"state", "updated_at", "id"',
    "tenure_job_name_state": '"name", "state"',
    "tenure_job_queue_state": '"queue", "state"',
}
OLD = {
    "tenure_job_state": '"state", "updated_at" DESC, "id" DESC',
    "tenure_job_name_state": '"name", "state"',
    "tenure_job_queue_state": '"queue", "state"',
}


def _rebuild(schema_editor: Any, columns: dict[str, str], where: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, cols in columns.items():
        tmp = f"{name}_0010"
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {tmp}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {tmp} ON tenure_job ({cols}) {where}"
        )
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        schema_editor.execute(f"ALTER INDEX {tmp} RENAME TO {name}")


def forwards(apps: Any, schema_editor: Any) -> None:
    _rebuild(schema_editor, NEW, f"WHERE {PREDICATE}")


def backwards(apps: Any, schema_editor: Any) -> None:
    _rebuild(schema_editor, OLD, "")


def _resting(fields: list[str], name: str) -> models.Index:
    return models.Index(
        fields=fields, name=name, condition=models.Q(("state__in", list(RESTING)))
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler_core", "0009_fewer_index_entries"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="tenure_job_state"),
                migrations.RemoveIndex(model_name="job", name="tenure_job_name_state"),
                migrations.RemoveIndex(model_name="job", name="tenure_job_queue_state"),
                migrations.AddIndex(
                    model_name="job", index=_resting(["state", "updated_at", "id"], "tenure_job_state")
                ),
                migrations.AddIndex(
                    model_name="job", index=_resting(["name", "state"], "tenure_job_name_state")
                ),
                migrations.AddIndex(
                    model_name="job", index=_resting(["queue", "state"], "tenure_job_queue_state")
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
