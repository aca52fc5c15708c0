"""PostgreSQL's wake-ups: a job that becomes due is announced with ``NOTIFY`` once its
transaction commits, executors ``LISTEN`` on a connection of their own, and every wake-up lowers
this process's claim floors (:mod:`.floors`) so the next claim's seek reaches its job. A mixin
of :class:`~scheduler_core.storage.postgres.PostgresDriver`; the statements are in
:mod:`.pg_statements` (:data:`~.pg_statements.SEND_WAKEUP`, :data:`~.pg_statements.LISTEN`)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime

import psycopg
from django.db import DatabaseError, connections

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


SEND_GAP_SECONDS = 0.01
"""The least time between two sends of one process's wake-up thread: what is announced in
between goes out with the next send, at most this much later."""


class _Sender:
    """A thread that sends one process's wake-ups, so the thread whose commit announced a job
    goes on at once: a broker-less executor's loop, which writes every completion, would
    otherwise wait a round trip after each commit that made a job due.

    A wake-up announced while the last send is less than :data:`SEND_GAP_SECONDS` old waits
    for the next send, which carries one wake-up per queue and priority naming the earliest
    due time announced (it lowers a listener's floors at least as far as each would have). A
    busy executor thus sends, and every listening process receives, a bounded number of
    wake-ups a second however many jobs its commits make due; the first wake-up after a quiet
    spell goes at once. The process that announced the jobs learned them at the commit
    (:meth:`PgWakeups._announce`), so its own next claim reaches them without waiting."""

    def __init__(self, send: Callable[[list[tuple[str, int, datetime]]], None]) -> None:
        self._send = send
        self._cv = threading.Condition()
        self._waiting: dict[tuple[str, int], datetime] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tenure-wakeups", daemon=True)
        self._thread.start()

    def put(self, queue: str, priority: int, due_at: datetime) -> None:
        with self._cv:
            key = (queue, priority)
            known = self._waiting.get(key)
            self._waiting[key] = due_at if known is None else min(known, due_at)
            self._cv.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Send what waits, then end the thread (waiting at most ``timeout`` seconds)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout)

    def _take(self, sent_at: float) -> list[tuple[str, int, datetime]] | None:
        """The wake-ups of the next send, once one is due; None once stopped with none left."""
        with self._cv:
            while True:
                if self._stopping:
                    break
                if self._waiting:
                    gap = sent_at + SEND_GAP_SECONDS - time.monotonic()
                    if gap <= 0:
                        break
                    self._cv.wait(gap)
                else:
                    self._cv.wait()
            batch = [(q, p, at) for (q, p), at in self._waiting.items()]
            self._waiting.clear()
        return batch or None

    def _run(self) -> None:
        sent_at = -SEND_GAP_SECONDS
        try:
            while (batch := self._take(sent_at)) is not None:
                sent_at = time.monotonic()
                try:
                    self._send(batch)
                except Exception:  # the thread must live on: the next wake-ups still go
                    log.exception("could not send wake-ups; polling finds their jobs")
        finally:
            connections.close_all()  # this thread's own


class PgWakeups(DriverCore):
    """The wake-ups of :class:`~scheduler_core.storage.postgres.PostgresDriver`."""

    _sender: _Sender | None = None
    _heard_here: list[Callable[[str], None]] = []
    _sent_from: int | None = None
    """The server process the wake-up thread sends from: its own wake-ups, which this
    process learned as it announced them, are passed over when they come back."""

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        """Once the caller's transaction commits, send the wake-up (:meth:`send_wakeups`), from
        the thread of :meth:`start_wakeup_sender` when this process started one.

        The ``NOTIFY`` is not part of the enqueue's transaction: PostgreSQL serialises the
        commits of every transaction that notifies, each holding one database-wide lock through
        its commit's flush to disk, so enqueues committing at once queued behind each other
        (the soak's most common wait event, ``Lock:object``, and arrivals falling behind their
        schedule). Sent after the commit, in a transaction of its own that need not wait for
        the disk, it holds that lock for microseconds. A wake-up lost with a process that dies
        between the two is a job found by the next poll (``TENURE_POLL_INTERVAL``)."""
        self.on_commit(lambda: self._announce(queue, priority, due_at))

    def _announce(self, queue: str, priority: int, due_at: datetime) -> None:
        sender = self._sender
        if sender is None:
            self.send_wakeups([(queue, priority, due_at)])
            return
        # This process learns it at once: its floors before its next claim, and the loop
        # that claims (which a wake-up of its own, coming back from the server, would have
        # woken a round trip and a send later; the listener passes those over).
        floors.woken(queue, priority, due_at)
        for hear in self._heard_here:
            hear(queue)
        sender.put(queue, priority, due_at)

    def start_wakeup_sender(self, on_wakeup: Callable[[str], None] | None = None) -> None:
        """See :meth:`.vendor_ops.VendorOps.start_wakeup_sender`; ``on_wakeup`` is called with
        the queue of each wake-up this process announces, as it announces it."""
        if on_wakeup is not None:
            self._heard_here = [*self._heard_here, on_wakeup]
        if self._sender is None:
            self._sender = _Sender(self._send_from_thread)

    def _send_from_thread(self, wakeups: list[tuple[str, int, datetime]]) -> None:
        """The wake-up thread's send; a session that failed is closed, so the next send
        opens another rather than failing on it again."""
        if not self.send_wakeups(wakeups, learned=True):
            self.connection.close()

    def stop_wakeup_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.stop()
        self._heard_here = []
        self._sent_from = None

    def send_wakeups(
        self, wakeups: list[tuple[str, int, datetime]], *, learned: bool = False
    ) -> bool:
        """Send ``(queue, priority, due time)`` wake-ups now, in one transaction of their own
        (outside any of the caller's), and have this process's floors learn them unless they
        ``learned`` them already; whether they were sent. A failure is logged, never raised:
        the jobs they announce have committed already, and polling finds them."""
        if not learned:
            for queue, priority, due_at in wakeups:
                floors.woken(queue, priority, due_at)
        try:
            with self.connection.cursor() as cur:
                if learned:
                    # Known before the wake-ups can come back to this process's listener.
                    self._sent_from = self.connection.connection.info.backend_pid
                # The transaction only notifies: nothing in it needs to reach the disk before
                # the wake-up is delivered (SEND_WAKEUP says how).
                cur.execute(SEND_WAKEUP, [WAKEUP_CHANNEL, [wakeup_payload(*w) for w in wakeups]])
        except DatabaseError as e:
            log.warning(
                "could not send the wake-ups for queues %s (%s); polling finds the jobs",
                sorted({q for q, _, _ in wakeups}),
                e,
            )
            return False
        return True

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
                            if n.pid == self._sent_from:
                                continue  # this process's own, learned as announced
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
