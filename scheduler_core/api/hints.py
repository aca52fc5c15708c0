"""Broker hints: which queues' due jobs get a message, and sending one through the configured
transport's publisher.

Transports deliver wake-ups, never ownership: a message carries a job id only and the
database decides who runs it. A hint goes only where a live executor of the configured
transport (``TENURE_TRANSPORT``) consumes the queue, as the executor registry says, so hints
nobody would take are not sent and broker-less executors serve such queues from the database.
The Celery and RQ adapters (:mod:`scheduler_core.transports`) register their publisher here
when they are loaded (``AppConfig.ready`` loads the configured one); this module imports no
transport.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from django.db import DatabaseError

from ..conf import tenure_settings
from ..storage import workflows
from ..storage.drivers import driver

log = logging.getLogger("tenure.transports")

BROKER_TRANSPORTS = frozenset({"celery", "rq"})
EVERY_QUEUE = "*"
"""What a consumer that cannot say which queues it serves registers."""
CONSUMERS_REFRESH_SECONDS = 5.0
"""How long a process trusts what it last read of the live consumers."""
NO_CONSUMER_REFRESH_SECONDS = 1.0
"""How long it trusts a read that found none: the first worker to start is noticed within a
second, so jobs enqueued before it are hinted soon after it registers."""

Publisher = Callable[[int, str], None]
"""Sends one hint: ``(job id, broker queue name)``; raises when the broker refused it."""

_publishers: dict[str, Publisher] = {}


def register_publisher(transport: str, publish: Publisher) -> None:
    """Make ``publish`` the way hints of ``transport`` are sent (called by its adapter)."""
    _publishers[transport] = publish


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
            found = driver().live_consumer_queues(transport)
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


CONSUMERS = _Consumers()


def uses_broker(queue: str | None = None) -> bool:
    """Whether due jobs of ``queue`` (or of any queue) are announced through a broker
    message: a broker transport is configured, ``BROKER_QUEUES`` is empty or names the queue,
    and a live executor of that transport consumes it. Hints nobody would take are not sent:
    broker-less executors serve such a queue from the database."""
    s = tenure_settings()
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
    s = tenure_settings()
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
    return tenure_settings().BROKER_QUEUE_PREFIX + queue


def publish(job_id: int, queue: str) -> bool:
    """Send a hint that ``job_id`` is due. Returns False (and logs) if the broker refused, or
    if the configured transport's adapter was never loaded in this process.

    The message carries the job id only; the claim decides whether anything runs. A lost hint
    only delays the job: the dispatcher re-sends hints for due jobs not claimed.
    """
    name = tenure_settings().TRANSPORT
    if name not in BROKER_TRANSPORTS:
        return True
    sender = _publishers.get(name)
    if sender is None:
        log.warning("no %s publisher is loaded here; job %s waits for the dispatcher", name, job_id)
        return False
    try:
        sender(job_id, broker_queue(queue))
        return True
    except Exception as e:
        log.warning("could not publish hint for job %s on %s: %s", job_id, queue, e)
        return False


def publish_due_steps(due: Sequence[tuple[int, str]]) -> None:
    """Hints for workflow steps their last parent's completion made due (after it committed),
    where a broker consumer takes their queue; the dispatcher re-sends any that are lost."""
    for job_id, queue in due:
        if uses_broker(queue):
            publish(job_id, queue)


workflows.on_steps_due(publish_due_steps)
