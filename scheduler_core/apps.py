"""App config: discovers ``<app>/jobs.py`` at start-up, loads the configured transport's
adapter (so its publisher and, for Celery, its task are registered) and registers the system
checks."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed
from django.utils.module_loading import autodiscover_modules


def load_transport(name: str) -> None:
    """Load the adapter of transport ``name`` (Celery or RQ), which registers its publisher
    (and, for Celery, its task); nothing for the broker-less transport."""
    if name in ("celery", "rq"):
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
        from . import checks  # noqa: F401  (registers the checks)
        from .conf import tenure_settings

        autodiscover_modules("jobs")
        s = tenure_settings()
        for module in s.JOB_MODULES:
            import_module(module)
        load_transport(s.TRANSPORT)
        setting_changed.connect(_transport_changed, dispatch_uid="tenure.apps.transport")
