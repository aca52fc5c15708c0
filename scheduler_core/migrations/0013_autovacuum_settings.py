"""Autovacuum settings of their own for the tables every job writes several versions of, on
PostgreSQL: ``tenure_job`` (a claim and a completion each write a new version), ``tenure_attempt``
(written at claim, again at its end) and ``tenure_effect`` (the ledger row of a ledgered job).

PostgreSQL's default vacuums a table once its dead versions pass 50 + 20 % of its rows. These
tables keep the finished history (7 days by default), so the 20 % grows with it: at 154 jobs/s
and 370,000 jobs kept, about 100,000 dead versions gathered between two vacuums, the pages
holding them could not take new rows, and the tables grew past their compact size
(docs/operations.md, "Per-table autovacuum"). Here a fixed count decides instead: a vacuum once
5,000 versions are dead, whatever the history holds (in the soak's hour: the job table every
autovacuum round, ``autovacuum_naptime``, one minute by default; the attempt table 3 times in
20 minutes).

``ALTER TABLE … SET (…)`` takes a SHARE UPDATE EXCLUSIVE lock: enqueues, claims and completions
go on while it runs. An operator's own values made later with ``ALTER TABLE … SET`` stay: no
later migration sets these again. Reversed, the three tables go back to the server's settings.
SQLite has no vacuum of this kind: nothing to do there.
"""

from typing import Any

from django.db import migrations

TABLES = ("tenure_job", "tenure_attempt", "tenure_effect")

SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
}
"""Per table: a vacuum after 5,000 dead row versions, whatever the table's size."""


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    values = ", ".join(f"{k} = {v}" for k, v in SETTINGS.items())
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {table} SET ({values})")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(SETTINGS)})")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0012_job_spec"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
