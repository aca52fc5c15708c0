"""PostgreSQL's wake-ups: a job that becomes due is announced with ``NOTIFY`` once its
transaction commits, executors ``LISTEN`` on a connection of their own, and every wake-up lowers
this process's claim floors (:mod:`.floors`) so the next claim's seek reaches its job. A mixin
of :class:`~scheduler_core.storage.postgres.PostgresDriver`; the statements are in
:mod:`.pg_statements` (:data:`~.pg_statements.SEND_WAKEUP`, :data:`~.pg_statements.LISTEN`)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime

import psycopg
from django.db import DatabaseError

from . import floors
from .core import DriverCore
from .pg_statements import LISTEN, SEND_WAKEUP, WAKEUP_CHANNEL

log = logging.getLogger("tenure.storage")

__all__ = ["WAKEUP_CHANNEL", "PgWakeups", "read_wakeup", "wakeup_payload"]


def wakeup_payload(queue: str, priority: int, due_at: datetime) -> str:
    """A wake-up's text: ``"<priority> <due time, epoch seconds> <queue>"``."""
    return f"{priority} {due_at.timestamp():.6f} {queue}"


def read_wakeup(payload: str) -> tuple[str, int, datetime] | None:
    """``(queue, priority, due time)`` from a wake-up's text, or None if it is not one."""
    try:
        priority, epoch, queue = payload.split(" ", 2)
        return queue, int(priority), datetime.fromtimestamp(float(epoch), tz=dt.UTC)
    except ValueError:
        return None


class PgWakeups(DriverCore):
    """The wake-ups of :class:`~scheduler_core.storage.postgres.PostgresDriver`."""

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        """Once the caller's transaction commits, send the wake-up (:meth:`send_wakeup`).

        The ``NOTIFY`` is not part of the enqueue's transaction: PostgreSQL serialises the
        commits of every transaction that notifies, each holding one database-wide lock through
        its commit's flush to disk, so enqueues committing at once queued behind each other
        (the soak's most common wait event, ``Lock:object``, and arrivals falling behind their
        schedule). Sent after the commit, in a transaction of its own that need not wait for
        the disk, it holds that lock for microseconds. A wake-up lost with a process that dies
        between the two is a job found by the next poll (``TENURE_POLL_INTERVAL``)."""
        self.on_commit(lambda: self.send_wakeup(queue, priority, due_at))

    def send_wakeup(self, queue: str, priority: int, due_at: datetime) -> None:
        """Send one wake-up now, in a transaction of its own (outside any of the caller's),
        and have this process's floors learn it. A failure is logged, never raised: the job it
        announces has committed already, and polling finds it."""
        floors.woken(queue, priority, due_at)
        try:
            with self.connection.cursor() as cur:
                # The transaction only notifies: nothing in it needs to reach the disk before
                # the wake-up is delivered (SEND_WAKEUP says how).
                cur.execute(SEND_WAKEUP, [WAKEUP_CHANNEL, wakeup_payload(queue, priority, due_at)])
        except DatabaseError as e:
            log.warning(
                "could not send the wake-up for queue %s (%s); polling finds the job", queue, e
            )

    def listen(self, stop: Callable[[], bool]) -> Iterator[tuple[str, int, datetime] | None]:
        """``LISTEN`` on a connection of its own (reconnecting with backoff); every wake-up
        also lowers this process's floors, so the next claim's seek reaches its job."""
        params = self.connection.get_connection_params()
        delay = 0.5
        while not stop():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(LISTEN)
                    delay = 0.5
                    while not stop():
                        heard = False
                        for n in conn.notifies(timeout=1.0):
                            woken = read_wakeup(n.payload)
                            if woken is not None:
                                heard = True
                                floors.woken(*woken)
                                yield woken
                        if not heard:
                            yield None
            except psycopg.Error as e:  # reconnect with backoff; polling still runs meanwhile
                log.debug("listener reconnecting after %s", e)
                yield None
                end = time.monotonic() + delay
                while time.monotonic() < end and not stop():
                    time.sleep(0.1)
                delay = min(10.0, delay * 2)

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        floors.woken(queue, priority, due_at)

    def forget_floors(self) -> None:
        floors.forget()
