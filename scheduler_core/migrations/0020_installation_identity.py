"""The installation records the identity of the database its id was made for.

``Installation.identity`` holds what the database's driver reads as its identity (PostgreSQL:
the cluster's ``system_identifier``, the database's oid and name; SQLite: the file's path and
inode), so that a restored or cloned database, which keeps the original's installation id, is
told apart at start-up (check ``tenure.W024``). An installation made before this migration
records the identity its database has now: a copy made before it cannot be told apart.
Backwards, the columns go.
"""

from typing import Any

from django.db import migrations, models


def record_identity(apps: Any, schema_editor: Any) -> None:
    """The current database's identity, on the installation row (made if missing)."""
    import secrets

    from django.utils import timezone
    from django.utils.module_loading import import_string

    from scheduler_core.storage.drivers import BY_VENDOR

    Installation = apps.get_model("scheduler_core", "Installation")
    conn = schema_editor.connection
    dotted = BY_VENDOR.get(conn.vendor)
    identity = import_string(dotted).read_identity(conn) if dotted is not None else {}
    db = conn.alias
    row = Installation.objects.using(db).filter(pk=1).first()
    if row is None:
        row = Installation(id=1, key=secrets.token_hex(6))
    row.identity = identity
    row.identity_at = timezone.now()
    row.save(using=db)


class Migration(migrations.Migration):
    dependencies = [("scheduler_core", "0017_open_attempt_table")]

    operations = [
        migrations.AddField(
            model_name="installation",
            name="identity",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="The database's identity when the id was made or adopted (empty: "
                "unknown).",
            ),
        ),
        migrations.AddField(
            model_name="installation",
            name="identity_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(record_identity, migrations.RunPython.noop),
    ]
