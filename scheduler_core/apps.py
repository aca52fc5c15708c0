"""App config: discovers ``<app>/jobs.py`` at start-up, registers system checks, applies the
connection settings Tenure's guarantees need to its database's connections, and registers the
Celery task when Celery is the transport."""

from __future__ import annotations

from django.apps import AppConfig


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
