"""How long a ``transactional`` handler may hold SQLite's one write lock, and the thread that
takes the lock back when it holds it longer.

On SQLite a transaction holds the database's one write lock from its first statement (every
transaction begins ``IMMEDIATE``), and a ``transactional`` handler runs inside its job's
transaction: while it works, no other write can be made — no other attempt's lease renewal,
no claim, no reaping. So its transaction is bounded: it may last at most :func:`bound_for`
the shortest lease among the other attempts running when it began,
``(0.8 - TENURE_HEARTBEAT_FRACTION)`` of it, about 0.47 with the default renewal every third
of a lease. A renewal due while the lock is held then still lands before 80 % of its lease has
passed, the margin the heartbeat keeps anyway, so no attempt loses its lease to a
transactional handler. With no other attempt running there is nothing to bound: no new one
can begin meanwhile (a claim is a write), and the handler's own completion is written in its
own transaction, whatever its lease says by then.

Past the bound, the :class:`Watch` thread ends the transaction from outside: it has SQLite
refuse every further statement of that connection (an authorizer) and rolls the transaction
back (after the statement running there, if any), which frees the lock. The handler's next
statement, its completion included, fails; when the job's outermost atomic block ends
(:meth:`Watch.atomic`) the connection is usable again and the attempt fails with
:class:`~scheduler_core.exceptions.WriteLockHeldTooLong` (transient: retried with backoff,
within the job's attempts). Nothing of the handler's transaction is kept.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..conf import tenure_settings
from ..exceptions import WriteLockHeldTooLong

log = logging.getLogger("tenure.storage")


def bound_for(shortest_lease: float) -> float:
    """Seconds a transactional handler's transaction may hold SQLite's write lock while
    attempts whose shortest lease is ``shortest_lease`` seconds are running."""
    fraction = max(0.1, 0.8 - tenure_settings().HEARTBEAT_FRACTION)
    return fraction * shortest_lease


def _refuse(action: int, arg1: str | None, *_: Any) -> int:
    """The authorizer of a connection whose transaction was taken back: only ``ROLLBACK``."""
    if action == sqlite3.SQLITE_TRANSACTION and (arg1 or "").upper() == "ROLLBACK":
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


@dataclass(eq=False)
class _Held:
    """One transaction being watched."""

    raw: sqlite3.Connection
    deadline: float
    """By this process's monotonic clock."""
    bound: float
    thread: str
    """The name of the thread running the handler, for the log."""
    shortest: float
    taken: bool = False
    """Whether the watch rolled the transaction back."""
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Watch:
    """This process's watch over the transactions of its ``transactional`` handlers on SQLite:
    one thread, started when first needed, that ends a transaction at its bound."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._held: dict[int, _Held] = {}
        """By the id of the Django connection (one per thread) the transaction runs on."""
        self._thread: threading.Thread | None = None

    def begin(self, connection: Any, *, shortest_lease: float) -> float:
        """Watch the transaction open on ``connection`` (a Django SQLite connection, this
        thread's) from now on; returns its bound in seconds."""
        bound = bound_for(shortest_lease)
        held = _Held(
            raw=connection.connection,
            deadline=time.monotonic() + bound,
            bound=bound,
            thread=threading.current_thread().name,
            shortest=shortest_lease,
        )
        with self._cv:
            self._held[id(connection)] = held
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tenure-sqlite-hold", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return bound

    @contextmanager
    def atomic(self, inner: AbstractContextManager[Any], connection: Any) -> Iterator[Any]:
        """``inner`` (the driver's atomic block on ``connection``); when the outermost block
        ends, the watch of its transaction ends too, and a transaction the watch took back
        raises :class:`WriteLockHeldTooLong` (its connection usable again)."""
        outermost = not connection.in_atomic_block
        try:
            with inner as entered:
                yield entered
        except BaseException as exc:
            taken = self._end(connection) if outermost else None
            if taken is not None:
                raise taken from exc
            raise
        taken = self._end(connection) if outermost else None
        if taken is not None:
            # The handler's commit found nothing left to commit: the watch had rolled it back.
            raise taken

    def _end(self, connection: Any) -> WriteLockHeldTooLong | None:
        with self._cv:
            held = self._held.pop(id(connection), None)
        if held is None:
            return None
        with held.lock:
            held.done = True
            if not held.taken:
                return None
        held.raw.set_authorizer(None)
        return WriteLockHeldTooLong(
            f"the handler's transaction held SQLite's write lock for more than "
            f"{held.bound:.2f}s ({0.8 - tenure_settings().HEARTBEAT_FRACTION:.2f} of "
            f"{held.shortest:g}s, the shortest lease of the other attempts running when it began); "
            "it was rolled back so that their lease renewals get through. Keep slow work "
            "outside a transactional handler, or run on PostgreSQL"
        )

    def _run(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [h for h in self._held.values() if h.deadline <= now and not h.taken]
                if not due:
                    later = [h.deadline for h in self._held.values() if not h.taken]
                    self._cv.wait(min(later) - now if later else None)
                    continue
            for held in due:
                self._take_back(held)

    def _take_back(self, held: _Held) -> None:
        with held.lock:
            if held.done or held.taken:
                return
            # From now on SQLite refuses the connection's statements (it re-prepares those
            # it had prepared when the authorizer changes), so nothing the handler does next
            # can run outside the transaction about to end; a statement running now finishes
            # first (the connection's own mutex), then the rollback frees the lock.
            held.raw.set_authorizer(_refuse)
            for _ in range(100):
                try:
                    held.raw.execute("ROLLBACK")
                except sqlite3.Error:
                    if held.raw.in_transaction:
                        time.sleep(0.01)  # a statement of the handler's was in the way
                        continue
                    # No transaction left to roll back: it ended on its own just now.
                    held.raw.set_authorizer(None)
                    held.done = True
                    return
                held.taken = True
                break
            else:
                held.raw.set_authorizer(None)
                log.error("%s: could not roll back a transactional handler", held.thread)
                held.done = True
                return
        log.warning(
            "%s: a transactional handler held SQLite's write lock past %.2fs; rolled back",
            held.thread,
            held.bound,
        )


WATCH = Watch()
"""This process's watch."""
