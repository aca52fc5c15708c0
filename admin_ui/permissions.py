"""Who may see the dashboard and who may act on jobs.

Seeing needs ``scheduler_core.view_job`` (one of Django's default permissions for Job);
acting needs the custom ``scheduler_core.operate``. Both are checked in the views, never only
in templates, so a hidden button is not the only guard.
"""

from __future__ import annotations

from typing import Any

VIEW_PERM = "scheduler_core.view_job"
OPERATE_PERM = "scheduler_core.operate"
OPERATE_CODENAME = "operate"
OPERATE_NAME = "Can act on jobs (retry, resolve, cancel) from the operator dashboard"


def ensure_operate_permission(apps: Any = None, *, using: str | None = None) -> Any:
    """Create the ``operate`` permission on Job if it is missing; return it.

    Called by this app's data migration, after every ``migrate``/``flush`` (``post_migrate``,
    since a flush deletes permissions and Django re-creates only its default ones) and by
    ``create_demo_users``. ``apps`` is the migration state's registry when given; ``using``
    the database alias (the router's choice when None).
    """
    if apps is None:
        from django.apps import apps as global_apps

        apps = global_apps
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    ct, _ = content_type_model.objects.db_manager(using).get_or_create(
        app_label="scheduler_core", model="job"
    )
    perm, _ = permission_model.objects.db_manager(using).get_or_create(
        content_type=ct, codename=OPERATE_CODENAME, defaults={"name": OPERATE_NAME}
    )
    return perm


def grant(user: Any, *, operate: bool) -> None:
    """Give ``user`` the view permission, and ``operate`` too when asked."""
    from django.contrib.auth.models import Permission

    ensure_operate_permission()
    perms = [Permission.objects.get(content_type__app_label="scheduler_core", codename="view_job")]
    if operate:
        perms.append(ensure_operate_permission())
    user.user_permissions.add(*perms)
