"""System checks for the transports: a misconfigured broker stops start-up with the reason.

* ``tenure.E010`` — Celery would accept a content type other than JSON (pickle runs code).
* ``tenure.E011`` — RQ has no ``RQ_QUEUES`` entry for a job type's broker queue, so its hints
  could never be published nor consumed.
* ``tenure.E012`` — django-rq's worker is not Tenure's, so ``rqworker`` would unpickle
  messages and run any function a message names.
"""

from __future__ import annotations

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


def _check_celery() -> list[Error]:
    accepted = set(getattr(settings, "CELERY_ACCEPT_CONTENT", ["json"]))
    if accepted - {"json", "application/json"}:
        return [
            Error(
                f"CELERY_ACCEPT_CONTENT={sorted(accepted)} accepts more than JSON; "
                "Tenure's messages are JSON and a pickled message can run code",
                id="tenure.E010",
            )
        ]
    return []


def _check_rq() -> list[Error]:
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
