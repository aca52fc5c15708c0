"""App config for the operator dashboard."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_migrate


def _after_migrate(
    sender: AppConfig,
    *,
    apps: Any = None,
    using: str = DEFAULT_DB_ALIAS,
    **kwargs: Any,
) -> None:
    """Keep the ``operate`` permission present after migrate and after a test flush.

    A flush deletes every permission and Django re-creates only its default ones; this app has
    no models, so it listens for the core app's signal instead of its own. It works in the
    migrated state (``apps``) on the migrated database (``using``): ``migrate scheduler_core``
    on a new database runs before the content types and permissions tables exist, and then
    there is nothing to keep yet.
    """
    if sender.label != "scheduler_core":
        return
    from .permissions import ensure_operate_permission

    if apps is not None:
        try:
            apps.get_model("contenttypes", "ContentType")
            apps.get_model("auth", "Permission")
        except LookupError:
            return
    ensure_operate_permission(apps, using=using)


class AdminUiConfig(AppConfig):
    """Operator dashboard."""

    name = "admin_ui"
    verbose_name = "Tenure operator dashboard"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)

        post_migrate.connect(_after_migrate, dispatch_uid="admin_ui.operate_permission")
