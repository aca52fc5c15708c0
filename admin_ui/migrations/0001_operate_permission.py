"""Create the custom ``scheduler_core.operate`` permission (acting from the dashboard)."""

from django.db import migrations


def create(apps, schema_editor):
    from admin_ui.permissions import ensure_operate_permission

    ensure_operate_permission(apps, using=schema_editor.connection.alias)


def remove(apps, schema_editor):
    apps.get_model("auth", "Permission").objects.filter(
        content_type__app_label="scheduler_core", codename="operate"
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("scheduler_core", "0001_initial"),
    ]

    operations = [migrations.RunPython(create, remove)]
