"""PostgreSQL's claims fold the server's timeline into the fence (``tenure_fence_epoch()``).

The function reads the timeline of the WAL the server writes now (the first eight hex digits
of the current WAL file's name), which a promotion changes at once; the claim sets a job's
fence to at least ``epoch << 32``, so fences handed out after a promotion exceed those of every
earlier timeline (docs/architecture.md, "Fences across a failover"). Timeline 1 is epoch 0: on
a cluster never promoted fences are what they were, and existing fences need no rewrite. A
standby cannot run it (no claim runs there). SQLite has no timelines and no function.
The table ``tenure_timeline`` records each timeline with when Tenure first wrote on it (the
current one now, then every ``run_scheduler`` round), so the console can date a failover.
Backwards, the function and the table go (the claims of earlier code do not call it).
"""

from typing import Any

from django.db import migrations, models

EPOCH_SQL = """
CREATE OR REPLACE FUNCTION tenure_fence_epoch() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1
$$
"""


RECORD_SQL = """
INSERT INTO tenure_timeline (timeline, first_seen_at)
SELECT tenure_fence_epoch() + 1, clock_timestamp()
ON CONFLICT (timeline) DO NOTHING
"""


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(EPOCH_SQL)
        schema_editor.execute(RECORD_SQL)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS tenure_fence_epoch()")


class Migration(migrations.Migration):
    dependencies = [("scheduler_core", "0020_installation_identity")]

    operations = [
        migrations.CreateModel(
            name="StoreTimeline",
            fields=[
                ("timeline", models.BigIntegerField(primary_key=True, serialize=False)),
                ("first_seen_at", models.DateTimeField()),
            ],
            options={"db_table": "tenure_timeline"},
        ),
        migrations.RunPython(forwards, backwards),
    ]
