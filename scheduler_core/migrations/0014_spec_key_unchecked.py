"""The spec row's key (``tenure_job_spec.job_id``) is no longer a foreign key in the database.

A spec row is inserted only by the statement that inserts its job (on SQLite, in the same
transaction) and deleted only with it (retention's one statement; the ORM's cascade when a
job is deleted through Django), so the database's check of the key at commit guarded nothing
Tenure's writes could break, and on PostgreSQL it cost a lookup per enqueued job with a plan
the session caches: a connection that had enqueued a handful of jobs into a freshly vacuumed,
nearly empty job table kept a sequential scan for that lookup, and its next bulk enqueue read
the whole job table once per job (``make bench``: 4,528 jobs/s for 5,000 jobs in
bench/results/2026-12-04.md, 40,535 after this migration in 2026-12-04-after-0014.md;
docs/operations.md, "What is recommended").

What this gives up: a ``DELETE FROM tenure_job`` typed by hand leaves its jobs' spec rows
behind (unreferenced and never read, but kept until removed by hand). Tenure's own deletes
remove both.

On PostgreSQL, dropping the constraint takes a brief lock on both tables and reads no rows;
reversed, adding it back validates every spec row against the job table. SQLite
rebuilds the spec table both ways (a copy of its rows).

Reversed, the migration first looks for spec rows whose job is gone and, if there are any,
refuses with the count and the statement that deletes them, before anything is changed — on
both databases alike. (Without the look, PostgreSQL refused with its own constraint error, and
SQLite refused only at the end of its table rebuild, from inside the migration's transaction,
which the failing process then left open.)
"""

from typing import Any

import django.db.models.deletion
from django.db import IntegrityError, migrations, models

# What deletes the spec rows a hand-typed ``DELETE FROM tenure_job`` left behind; the refusal
# quotes it and docs/operations.md ("The spec's key is not checked by the database") too.
ORPHANS_DELETE = (
    "DELETE FROM tenure_job_spec WHERE NOT EXISTS "
    "(SELECT 1 FROM tenure_job j WHERE j.id = tenure_job_spec.job_id)"
)


def refuse_orphans(apps: Any, schema_editor: Any) -> None:
    """Before the key is a foreign key again: refuse while a spec row's job is gone."""
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM tenure_job_spec s "
            "WHERE NOT EXISTS (SELECT 1 FROM tenure_job j WHERE j.id = s.job_id)"
        )
        (orphans,) = cur.fetchone()
    if orphans:
        raise IntegrityError(
            f"{orphans} row(s) of tenure_job_spec belong to no job (their jobs were deleted "
            "outside Tenure), so its key cannot be a foreign key again; nothing was changed. "
            f"Delete them first: {ORPHANS_DELETE}"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0013_autovacuum_settings"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobspec",
            name="job",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                related_name="spec",
                serialize=False,
                to="scheduler_core.job",
            ),
        ),
        # Reversed, operations run last to first: this look comes before the key is restored.
        migrations.RunPython(migrations.RunPython.noop, refuse_orphans),
    ]
