"""App config: at start-up discovers ``<app>/jobs.py`` (and ``<app>/tasks.py`` when a ``TASKS``
backend is Tenure's), registers the system checks, applies the connection settings Tenure's
guarantees need to its database's connections, and loads the configured transport's adapter
(which registers its publisher and, for Celery, its task)."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import autodiscover_modules, import_string

TENURE_BACKEND = "scheduler_core.backends.TenureBackend"


def uses_tenure_tasks() -> bool:
    """Whether a ``TASKS`` backend is :class:`scheduler_core.backends.TenureBackend` (or a
    subclass of it)."""
    for entry in (getattr(settings, "TASKS", None) or {}).values():
        path = str(entry.get("BACKEND", "")) if isinstance(entry, dict) else ""
        if path == TENURE_BACKEND:
            return True
        if path.startswith(("django_tasks.", "django.tasks.")):
            continue
        try:
            cls = import_string(path)
        except ImportError:
            continue
        from .backends import TenureBackend  # only when a backend of another name is named

        if isinstance(cls, type) and issubclass(cls, TenureBackend):
            return True
    return False


def load_transport(name: str) -> None:
    """Load the adapter of transport ``name`` (Celery or RQ), which registers its publisher
    (and, for Celery, its task, so the host need not autodiscover Tenure's modules); nothing
    for the broker-less transport, or when the transport's package is not installed (checks
    ``tenure.E014``/``E016`` then say what to install)."""
    if name in ("celery", "rq") and find_spec(name) is not None:
        import_module(f"scheduler_core.transports.{name}")


def _transport_changed(*, setting: str, value: Any, **_: Any) -> None:
    # ``override_settings`` (and tests' ``settings`` fixture) may switch transports at run time.
    if setting == "TENURE_TRANSPORT" and isinstance(value, str):
        load_transport(value)


class SchedulerCoreConfig(AppConfig):
    """Tenure's core app."""

    name = "scheduler_core"
    verbose_name = "Tenure scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db import connections
        from django.db.backends.signals import connection_created

        from . import checks  # noqa: F401  (registers the checks)
        from .conf import tenure_settings
        from .db import alias
        from .storage import connection_settings

        connection_created.connect(
            connection_settings.on_connection_created, dispatch_uid="tenure.connection_settings"
        )
        # A connection some app opened before this one was ready gets them now.
        if alias() in connections and connections[alias()].connection is not None:
            connection_settings.apply(connections[alias()])

        autodiscover_modules("jobs")
        if uses_tenure_tasks():
            # Executors must know every task a web process may enqueue: <app>/tasks.py.
            autodiscover_modules("tasks")
        s = tenure_settings()
        for module in s.JOB_MODULES:
            import_module(module)
        load_transport(s.TRANSPORT)
        setting_changed.connect(_transport_changed, dispatch_uid="tenure.apps.transport")
