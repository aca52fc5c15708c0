"""Payload search: on PostgreSQL a GIN index over the job payload (``jsonb_path_ops``), so a
search by JSON fragment (``payload @> '{"invoice_id": 1005}'``) reads the index, not the
table. SQLite keeps no such index: its search reads the payloads (the embedded default's
tables are small)."""

from typing import Any

from django.db import migrations

INDEX = "tenure_job_payload"


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON tenure_job USING gin (payload jsonb_path_ops)"
        )


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("scheduler_core", "0007_console")]
    operations = [migrations.RunPython(create, drop)]
