"""What a job was accepted as moves to a row of its own, ``tenure_job_spec``: the payload, the
effect mode, the lease length and the maximum runtime, written once at enqueue.

Every claim and completion writes a new version of the job row; while a long transaction holds
a snapshot, every old version stays, with an entry in each index — the payload's GIN index
included. Moved out, these columns are written once per job instead of three times, and the
payload index holds one entry set per job (docs/operations.md, "Why the tables outgrow…").

The copy runs in the migration's transaction, in batches of job ids with a line of progress
each on a large table (1,000,000 jobs: see docs/operations.md, "Upgrading"). Stop the
executors and schedulers first: code from before this migration writes the columns it drops.
Reversible: the columns come back, filled from the spec rows, and the table is dropped.
"""

import sys
from typing import Any

import django.db.models.deletion
from django.db import migrations, models

BATCH = 100_000
"""Job ids copied per statement."""

COLUMNS = "payload, effect, lease_seconds, timeout_seconds"

OLD_INDEX = "tenure_job_payload"
NEW_INDEX = "tenure_job_spec_payload"


def _progress(done: int, total: int) -> None:
    sys.stdout.write(f"  job specs: {done:,} of {total:,} job ids copied\n")
    sys.stdout.flush()


def _checks_now(schema_editor: Any, cur: Any) -> None:
    """Foreign keys checked as rows are written, not at commit: PostgreSQL refuses to alter a
    table (the columns dropped next) while checks deferred to commit are pending on it."""
    if schema_editor.connection.vendor == "postgresql":
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")


def copy_forwards(apps: Any, schema_editor: Any) -> None:
    """Each job's spec row from its own columns, a batch of ids per statement."""
    with schema_editor.connection.cursor() as cur:
        _checks_now(schema_editor, cur)
        cur.execute("SELECT min(id), max(id) FROM tenure_job")
        lo, hi = cur.fetchone()
        if lo is None:
            return
        span = hi - lo + 1
        if span > BATCH:
            sys.stdout.write("\n")  # off the line migrate has begun for this migration
        for start in range(lo, hi + 1, BATCH):
            cur.execute(
                f"INSERT INTO tenure_job_spec (job_id, {COLUMNS}) "
                f"SELECT id, {COLUMNS} FROM tenure_job WHERE id >= %s AND id < %s",
                [start, start + BATCH],
            )
            if span > BATCH:
                _progress(min(start + BATCH, hi + 1) - lo, span)


def copy_backwards(apps: Any, schema_editor: Any) -> None:
    """The job's columns (just added back, at their defaults) from its spec row."""
    with schema_editor.connection.cursor() as cur:
        _checks_now(schema_editor, cur)
        cur.execute(
            f"UPDATE tenure_job SET ({COLUMNS}) = "
            f"(SELECT {COLUMNS} FROM tenure_job_spec AS s WHERE s.job_id = tenure_job.id) "
            "WHERE EXISTS (SELECT 1 FROM tenure_job_spec AS s WHERE s.job_id = tenure_job.id)"
        )


def index_forwards(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL's payload index moves with the payload (SQLite keeps none: migration 0008)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {OLD_INDEX}")
    schema_editor.execute(
        f"CREATE INDEX {NEW_INDEX} ON tenure_job_spec USING gin (payload jsonb_path_ops)"
    )


def index_backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        # Adding the columns back rebuilt SQLite's table with every index the models name,
        # the retried one too, which SQLite never had (0011): as it was.
        schema_editor.execute("DROP INDEX IF EXISTS tenure_job_retried")
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {NEW_INDEX}")
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {OLD_INDEX} ON tenure_job USING gin (payload jsonb_path_ops)"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0011_retried_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobSpec",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="spec",
                        serialize=False,
                        to="scheduler_core.job",
                    ),
                ),
                ("payload", models.JSONField(default=dict)),
                (
                    "effect",
                    models.CharField(
                        choices=[
                            ("transactional", "transactional"),
                            ("idempotent", "idempotent"),
                            ("reconcilable", "reconcilable"),
                            ("at_least_once", "at_least_once"),
                            ("at_most_once", "at_most_once"),
                        ],
                        default="at_least_once",
                        max_length=20,
                    ),
                ),
                ("lease_seconds", models.IntegerField(default=30)),
                (
                    "timeout_seconds",
                    models.FloatField(
                        default=600.0,
                        help_text="Maximum runtime of one attempt; past it the attempt may not "
                        "renew its lease, complete or start an effect.",
                    ),
                ),
            ],
            options={
                "db_table": "tenure_job_spec",
            },
        ),
        migrations.RunPython(copy_forwards, copy_backwards),
        migrations.RunPython(index_forwards, index_backwards),
        migrations.RemoveField(model_name="job", name="effect"),
        migrations.RemoveField(model_name="job", name="lease_seconds"),
        migrations.RemoveField(model_name="job", name="payload"),
        migrations.RemoveField(model_name="job", name="timeout_seconds"),
        migrations.AlterField(
            model_name="job",
            name="max_attempts",
            field=models.IntegerField(
                default=5, help_text="Attempt budget; an operator's retry raises it."
            ),
        ),
    ]
