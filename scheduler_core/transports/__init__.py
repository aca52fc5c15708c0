"""Transports deliver wake-ups, never ownership: the database decides who runs a job.

``TENURE_TRANSPORT`` picks one: ``polling`` (broker-less; ``run_executor``), ``celery``
(primary) or ``rq``. Celery and RQ are imported only inside their adapters.
"""

from __future__ import annotations

import logging

from .. import conf

log = logging.getLogger("tenure.transports")

BROKER_TRANSPORTS = frozenset({"celery", "rq"})


def uses_broker(queue: str | None = None) -> bool:
    """Whether due jobs (of ``queue``, or of any queue) are announced through a broker
    message: a broker transport is configured and ``BROKER_QUEUES`` is empty or names it."""
    s = conf.get()
    if s.TRANSPORT not in BROKER_TRANSPORTS:
        return False
    return queue is None or not s.BROKER_QUEUES or queue in s.BROKER_QUEUES


def broker_queue(queue: str) -> str:
    """The name a Tenure queue has on the broker: ``BROKER_QUEUE_PREFIX`` + ``queue``."""
    return conf.get().BROKER_QUEUE_PREFIX + queue


def publish(job_id: int, queue: str) -> bool:
    """Send a hint that ``job_id`` is due. Returns False (and logs) if the broker refused.

    The message carries the job id only; the claim decides whether anything runs. A lost hint
    only delays the job: the dispatcher re-sends hints for due jobs not claimed.
    """
    name = conf.get().TRANSPORT
    try:
        if name == "celery":
            from . import celery as adapter
        elif name == "rq":
            from . import rq as adapter  # type: ignore[no-redef]
        else:
            return True
        adapter.publish(job_id, broker_queue(queue))
        return True
    except Exception as e:
        log.warning("could not publish hint for job %s on %s: %s", job_id, queue, e)
        return False
