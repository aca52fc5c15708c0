"""At most one open attempt per job, held by the database; and each attempt's deadline on its
own row.

``tenure_attempt_open`` is a unique index of ``job_id`` over the attempts not yet finished:
"one active attempt" (docs/guarantees.md) no longer rests only on the claim's statement and
the fence checks of every write; a claim that tried to open a second attempt of a job would
fail. ``deadline_at`` is the attempt's maximum runtime as its claim set it on the job, so an
attempt's row carries its whole lease (owner, expiry, last renewal, deadline).

Before the index is built, an open attempt that is not its job's current one (the job is not
leased under that attempt's fence) is closed with the outcome ``superseded``: no write of it
can be accepted any more, since every one is fenced on the job, and the unique index could not
be built while it stays open. Releases before this one never leave such a row; the step is
there for a database written by hand. Open attempts that are current get their job's deadline.

PostgreSQL builds the index ``CONCURRENTLY`` (claims and completions go on; the migration is
not atomic: run again, it starts over). Reversed, the index and the column go.
"""

from typing import Any

from django.db import migrations, models

NAME = "tenure_attempt_open"

NOW = {
    "postgresql": "clock_timestamp()",
    "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')",
}

CURRENT = """EXISTS (SELECT 1 FROM tenure_job AS j WHERE j.id = tenure_attempt.job_id
    AND j.state = 'leased' AND j.fence = tenure_attempt.fence)"""
"""An open attempt is its job's current one."""


def forwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    now = NOW.get(vendor, "CURRENT_TIMESTAMP")
    schema_editor.execute(
        f"UPDATE tenure_attempt SET finished_at = {now}, outcome = 'superseded' "
        f"WHERE finished_at IS NULL AND NOT {CURRENT}"
    )
    schema_editor.execute(
        "UPDATE tenure_attempt SET deadline_at = (SELECT j.deadline_at FROM tenure_job AS j "
        "WHERE j.id = tenure_attempt.job_id) "
        f"WHERE finished_at IS NULL AND {CURRENT}"
    )
    if vendor == "postgresql":
        # An earlier run stopped midway may have left an invalid index of this name.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        schema_editor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {NAME} ON tenure_attempt (job_id) "
            "WHERE finished_at IS NULL"
        )
    else:
        schema_editor.execute(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {NAME} ON tenure_attempt (job_id) "
            "WHERE finished_at IS NULL"
        )


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
    else:
        schema_editor.execute(f"DROP INDEX IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler_core", "0014_spec_key_unchecked"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="deadline_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When this attempt's maximum runtime runs out (database clock), as its "
                "claim set it on the job; empty on attempts made before migration 0015.",
                null=True,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="attempt",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("finished_at__isnull", True)),
                        fields=("job",),
                        name=NAME,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
