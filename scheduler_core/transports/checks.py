"""System checks for the transports: a misconfigured broker stops start-up with the reason.

* ``tenure.E010`` — Celery would accept a content type other than JSON (pickle runs code).
* ``tenure.E011`` — RQ has no ``RQ_QUEUES`` entry for a job type's broker queue, so its hints
  could never be published nor consumed.
* ``tenure.E012`` — django-rq's worker is not Tenure's, so ``rqworker`` would unpickle
  messages and run any function a message names.
* ``tenure.E013`` — Celery would cancel running attempts when its broker connection drops
  (``worker_cancel_long_running_tasks_on_connection_loss``): each holds a lease in the
  database and must end through the write seam, and its hint is only a wake-up.
* ``tenure.E014`` — ``TENURE_TRANSPORT = "celery"`` and Celery is not installed.
* ``tenure.E015`` — (a Celery worker, at start) the worker's app lacks Tenure's task or
  overrides its options (late acknowledgement, no redelivery of a lost child's hint, JSON).
* ``tenure.E016`` — ``TENURE_TRANSPORT = "rq"`` and django-rq is not installed, or
  ``django_rq`` is not in ``INSTALLED_APPS`` (its ``rqworker`` command runs the worker).

A Celery app's settings are read from Django's settings under the ``CELERY_`` namespace that
Celery's Django integration uses, else from the current Celery app. A Celery worker checks its
own app again when it starts and refuses to start on any of E010, E013 or E015
(:mod:`scheduler_core.transports.celery`), whatever way the app was configured.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

from ..api import registry
from ..api.hints import broker_queue
from ..conf import tenure_settings

WORKER = "scheduler_core.transports.rq.Worker"


@register()
def check_transport(app_configs: Any, **kwargs: Any) -> list[Error]:
    """Check the chosen transport's broker settings."""
    name = tenure_settings().TRANSPORT
    if name == "celery":
        return _check_celery()
    if name == "rq":
        return _check_rq()
    return []


def celery_problems(get: Callable[[str], Any]) -> list[tuple[str, str, str]]:
    """What a Celery configuration (``get(name)`` of a lower-case setting) would weaken, as
    ``(check id, message, hint)``; used by the system check and by a starting worker."""
    found: list[tuple[str, str, str]] = []
    accepted = set(get("accept_content") or ["json"])
    if accepted - {"json", "application/json"}:
        found.append(
            (
                "tenure.E010",
                f"Celery's accept_content={sorted(accepted)} accepts more than JSON; "
                "Tenure's messages are JSON and a pickled message can run code",
                'Set CELERY_ACCEPT_CONTENT = ["json"].',
            )
        )
    if get("worker_cancel_long_running_tasks_on_connection_loss"):
        found.append(
            (
                "tenure.E013",
                "Celery's worker_cancel_long_running_tasks_on_connection_loss is on: a lost "
                "broker connection would cancel running attempts that hold database leases",
                "Set CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False.",
            )
        )
    return found


def _celery_setting(name: str) -> Any:
    """A Celery setting as the project's Django settings give it (``CELERY_<NAME>``), else as
    the current Celery app has it."""
    django_name = f"CELERY_{name.upper()}"
    if hasattr(settings, django_name):
        return getattr(settings, django_name)
    from celery import current_app

    return current_app.conf.get(name)


def _check_celery() -> list[Error]:
    if find_spec("celery") is None:
        return [
            Error(
                'TENURE_TRANSPORT = "celery" but Celery is not installed',
                hint="pip install 'tenure[celery]'",
                id="tenure.E014",
            )
        ]
    return [
        Error(message, hint=hint or None, id=check_id)
        for check_id, message, hint in celery_problems(_celery_setting)
    ]


def _check_rq() -> list[Error]:
    from django.apps import apps

    if find_spec("django_rq") is None or find_spec("rq") is None:
        return [
            Error(
                'TENURE_TRANSPORT = "rq" but django-rq is not installed',
                hint="pip install 'tenure[rq]'",
                id="tenure.E016",
            )
        ]
    if not apps.is_installed("django_rq"):
        return [
            Error(
                'TENURE_TRANSPORT = "rq" but "django_rq" is not in INSTALLED_APPS',
                hint="Add it: its rqworker command runs Tenure's RQ worker (docs/install.md).",
                id="tenure.E016",
            )
        ]
    errors: list[Error] = []
    queues = getattr(settings, "RQ_QUEUES", {})
    for jt in registry.all_types().values():
        name = broker_queue(jt.queue)
        if name not in queues:
            errors.append(
                Error(
                    f"RQ_QUEUES has no entry for queue {name!r} (job type {jt.name})",
                    hint="Add it with the Redis URL and "
                    "'SERIALIZER': 'rq.serializers.JSONSerializer'.",
                    id="tenure.E011",
                )
            )
    worker = getattr(settings, "RQ", {}).get("WORKER_CLASS", "rq.Worker")
    try:
        cls = import_string(worker) if isinstance(worker, str) else worker
        ours = issubclass(cls, import_string(WORKER))
    except ImportError:
        ours = False
    if not ours:
        errors.append(
            Error(
                f"RQ['WORKER_CLASS'] is {worker!r}, not {WORKER} or a subclass",
                hint="Without it rqworker unpickles messages and runs any function they name.",
                id="tenure.E012",
            )
        )
    return errors
