"""App config: discovers ``<app>/jobs.py`` at start-up and registers system checks."""

from __future__ import annotations

from django.apps import AppConfig


class SchedulerCoreConfig(AppConfig):
    """Tenure's core app."""

    name = "scheduler_core"
    verbose_name = "Tenure scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the checks)

        autodiscover_modules("jobs")
        from importlib import import_module

        from . import conf

        for module in conf.get().JOB_MODULES:
            import_module(module)
