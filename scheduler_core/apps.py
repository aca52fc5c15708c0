"""App config: discovers ``<app>/jobs.py`` (and ``<app>/tasks.py`` when a ``TASKS`` backend is
Tenure's) at start-up, registers system checks, applies the connection settings Tenure's
guarantees need to its database's connections, and registers the Celery task when Celery is
the transport."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings

TENURE_BACKEND = "scheduler_core.backends.TenureBackend"


def uses_tenure_tasks() -> bool:
    """Whether a ``TASKS`` backend is :class:`scheduler_core.backends.TenureBackend` (or a
    subclass of it)."""
    for entry in (getattr(settings, "TASKS", None) or {}).values():
        path = str(entry.get("BACKEND", "")) if isinstance(entry, dict) else ""
        if path == TENURE_BACKEND:
            return True
        if path.startswith("django_tasks.") or path.startswith("django.tasks."):
            continue
        from django.utils.module_loading import import_string

        try:
            cls = import_string(path)
        except ImportError:
            continue
        from .backends import TenureBackend

        if isinstance(cls, type) and issubclass(cls, TenureBackend):
            return True
    return False


class SchedulerCoreConfig(AppConfig):
    """Tenure's core app."""

    name = "scheduler_core"
    verbose_name = "Tenure scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        from . import (
            checks,  # noqa: F401  (registers the checks)
            connsettings,
        )

        connection_created.connect(
            connsettings.on_connection_created, dispatch_uid="tenure.connection_settings"
        )
        # A connection some app opened before this one was ready gets them now.
        from django.db import connections

        from . import db

        if db.alias() in connections and connections[db.alias()].connection is not None:
            connsettings.apply(connections[db.alias()])

        autodiscover_modules("jobs")
        if uses_tenure_tasks():
            # Executors must know every task a web process may enqueue: <app>/tasks.py.
            autodiscover_modules("tasks")
        from importlib import import_module

        from . import conf

        for module in conf.get().JOB_MODULES:
            import_module(module)
        # The Celery transport's task registers itself with every Celery app when its module
        # is imported: the host need not autodiscover Tenure's modules. Without Celery
        # installed, check tenure.E014 says what to install.
        from importlib.util import find_spec

        if conf.get().TRANSPORT == "celery" and find_spec("celery") is not None:
            import_module("scheduler_core.transports.celery")
