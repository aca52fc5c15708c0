"""Transports deliver wake-ups, never ownership: the database decides who runs a job.

``TENURE_TRANSPORT`` picks one: ``polling`` (broker-less; ``run_executor``), ``celery``
(primary) or ``rq``. Celery and RQ are imported only inside their adapters.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError

from .. import conf

log = logging.getLogger("tenure.transports")

BROKER_TRANSPORTS = frozenset({"celery", "rq"})
EVERY_QUEUE = "*"
"""What a consumer that cannot say which queues it serves registers."""
CONSUMERS_REFRESH_SECONDS = 5.0
"""How long a process trusts what it last read of the live consumers."""
NO_CONSUMER_REFRESH_SECONDS = 1.0
"""How long it trusts a read that found none: the first worker to start is noticed within a
second, so jobs enqueued before it are hinted soon after it registers."""


class _Consumers:
    """The broker queues that live executors of the configured transport consume, as the
    executor registry says (their liveness rows), read at most every
    ``CONSUMERS_REFRESH_SECONDS`` by each process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: tuple[float, str, frozenset[str]] | None = None

    def queues(self, transport: str) -> frozenset[str]:
        now = time.monotonic()
        with self._lock:
            read = self._read
        if read is not None and read[1] == transport:
            ttl = CONSUMERS_REFRESH_SECONDS if read[2] else NO_CONSUMER_REFRESH_SECONDS
            if now - read[0] < ttl:
                return read[2]
        try:
            found = _live_consumer_queues(transport)
        except DatabaseError as e:
            # Not knowing is no reason to stop announcing: keep the last answer (or assume a
            # consumer), since a hint nobody takes only costs a message.
            log.warning("could not read the live consumers (%s)", e)
            found = read[2] if read is not None else frozenset({EVERY_QUEUE})
        with self._lock:
            self._read = (now, transport, found)
        return found

    def forget(self) -> None:
        with self._lock:
            self._read = None


def _live_consumer_queues(transport: str) -> frozenset[str]:
    from ..dbclock import DbNow
    from ..models import Executor

    rows = Executor.objects.filter(
        transport=transport,
        stopped_at__isnull=True,
        heartbeat_at__gt=DbNow(-conf.get().EXECUTOR_STALE_SECONDS),
    ).values_list("queues", flat=True)
    return frozenset(q for row in rows for q in row.split(",") if q)


CONSUMERS = _Consumers()


def uses_broker(queue: str | None = None) -> bool:
    """Whether due jobs of ``queue`` (or of any queue) are announced through a broker
    message: a broker transport is configured, ``BROKER_QUEUES`` is empty or names the queue,
    and a live executor of that transport consumes it. Hints nobody would take are not sent:
    broker-less executors serve such a queue from the database."""
    s = conf.get()
    if s.TRANSPORT not in BROKER_TRANSPORTS:
        return False
    if queue is not None and s.BROKER_QUEUES and queue not in s.BROKER_QUEUES:
        return False
    live = CONSUMERS.queues(s.TRANSPORT)
    if queue is None:
        return bool(live)
    return EVERY_QUEUE in live or broker_queue(queue) in live


def hinted_queues() -> frozenset[str] | None:
    """The Tenure queues whose due jobs get broker hints now (empty: none), or None for every
    queue (a consumer serves them all and ``BROKER_QUEUES`` names none)."""
    s = conf.get()
    if s.TRANSPORT not in BROKER_TRANSPORTS:
        return frozenset()
    live = CONSUMERS.queues(s.TRANSPORT)
    prefix = s.BROKER_QUEUE_PREFIX
    if EVERY_QUEUE in live:
        return frozenset(s.BROKER_QUEUES) if s.BROKER_QUEUES else None
    named = frozenset(q[len(prefix) :] for q in live if q.startswith(prefix))
    return named & frozenset(s.BROKER_QUEUES) if s.BROKER_QUEUES else named


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
