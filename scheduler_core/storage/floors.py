"""Claim floors (PostgreSQL): where this process's claims of each queue start reading the claim
index, so a claim under a long-held snapshot does not walk the index entries of every job
leased since vacuum last could run. Used by :class:`~scheduler_core.storage.postgres.PostgresDriver`.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime

from ..conf import tenure_settings
from .records import Lease

PIN_SECONDS = 30.0
"""How long a wake-up keeps claims sent before it from raising its floor past its job: longer
than any claim takes (a full read every ``TENURE_CLAIM_FULL_SCAN_SECONDS`` finds a job left
below a floor by a claim slower than this)."""

FULL_SCAN_SHARE = 0.05
"""The largest share of a process's time its full reads of a queue may take: the next one comes
no sooner than its last one's time divided by this (20 x), nor than
``TENURE_CLAIM_FULL_SCAN_SECONDS``."""


class ClaimFloors:
    """Where this process's claims of each queue start reading the claim index (PostgreSQL).

    Leasing a job changes its row, and the job's old entry stays in the claim index until
    vacuum removes it, which vacuum cannot do while any snapshot older than the change is held
    (a long report, a forgotten ``REPEATABLE READ`` session). A claim reading the index from
    its start visits each such entry, and its row, before the first waiting job: 2 ms with
    10,000 of them, 5 ms with 30,000, without bound
    (``tests/db/test_claim_plan.py::test_a_claim_seeks_past_the_entries_a_held_snapshot_keeps``).

    So the process keeps, per (queue, priority), a floor, and its claims seek to the floors.
    A claim raises a floor to the oldest due time it took there, less
    ``TENURE_CLAIM_FLOOR_MARGIN_SECONDS`` (enqueues that commit a little late); a wake-up
    (every enqueue sends one, naming its job's priority and due time) lowers it to that job,
    or adds its priority. A full read from the start still comes on the first claim of a
    queue and every ``TENURE_CLAIM_FULL_SCAN_SECONDS`` whatever happens (a claim rolled back
    elsewhere, or a lost wake-up, can leave jobs below the floors), or, when a full read takes
    longer than a twentieth of that, every twenty times its own time (``FULL_SCAN_SHARE``). A full read cut off by its
    limit may not have reached the lower priorities: before the next claim seeks, the
    priorities below the lowest it took are *discovered* — one index probe per priority that
    has a waiting job (``PostgresDriver._waiting_priorities``) — rather than read again from
    the start, which under a held snapshot walks every entry claimed since and had made every
    other claim a full read when jobs arrive one at a time (the mean claim statement
    rose from 0.1 to 38 ms over a 160 s snapshot in a soak). Seeking only decides which
    waiting jobs a claim reads first; the claim itself, and what it guarantees, are unchanged.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floors: dict[tuple[str, int], datetime] = {}
        self._full_at: dict[str, float] = {}
        self._full_took: dict[str, float] = {}
        """How long each queue's last full read took (seconds)."""
        self._cut_off: dict[str, int | None] = {}
        """Queues whose last full read was cut off by its limit: the lowest priority it took
        there (None: it took none of that queue's jobs)."""
        self._rescan: set[str] = set()
        """Queues whose priorities below their cut-off are to be discovered."""
        self._pins: dict[tuple[str, int], deque[tuple[datetime, float]]] = {}
        """Every wake-up of the last :data:`PIN_SECONDS`, oldest first: (due time, when), so
        a claim sent before one cannot raise the floor past its job. Each is kept until it
        is that old, not only until the next claim sent after it returns: a claim sent
        earlier may return later (its completion's transaction waiting on a lock), and a
        wake-up that did not lower the floor binds such a claim too."""

    def seeks(self, queues: Sequence[str], *, now: float) -> list[tuple[str, int, datetime]]:
        """The (queue, priority, floor) seeks for a claim of ``queues``, or none when a full
        read is due for any of them."""
        every = tenure_settings().CLAIM_FULL_SCAN_SECONDS
        wanted = set(queues)
        with self._lock:
            for q in wanted:
                full_at = self._full_at.get(q)
                # A full read reads every entry a held snapshot keeps, so it grows with the
                # snapshot's age; spaced by its own cost it takes at most FULL_SCAN_SHARE of
                # the process's time however long the snapshot is held.
                spacing = max(every, self._full_took.get(q, 0.0) / FULL_SCAN_SHARE)
                if full_at is None or now - full_at >= spacing:
                    return []
            return sorted((q, p, f) for (q, p), f in self._floors.items() if q in wanted)

    def undiscovered(self, queues: Sequence[str]) -> list[tuple[str, int | None]]:
        """The (queue, below) pairs whose priorities under ``below`` (None: every priority)
        are to be discovered before the next claim from the floors."""
        with self._lock:
            return sorted(
                ((q, self._cut_off.get(q)) for q in set(queues) & self._rescan),
                key=lambda x: x[0],
            )

    def discovered(self, queue: str, found: Sequence[tuple[int, datetime]]) -> None:
        """Record a discovery of ``queue``'s lower priorities: each priority found gets a
        floor at its oldest waiting job, and the queue counts as fully seen again."""
        for priority, due_at in found:
            self.woken(queue, priority, due_at)
        with self._lock:
            self._rescan.discard(queue)
            self._cut_off.pop(queue, None)

    def learn(
        self,
        queues: Sequence[str],
        leases: Sequence[Lease],
        *,
        limit: int,
        full: bool,
        now: float,
        elapsed: float = 0.0,
    ) -> None:
        """Record a claim of up to ``limit`` jobs of ``queues`` (``full``: read from the start,
        in ``elapsed`` seconds) and what it leased."""
        margin = dt.timedelta(seconds=tenure_settings().CLAIM_FLOOR_MARGIN_SECONDS)
        oldest: dict[tuple[str, int], datetime] = {}
        for lease in leases:
            key = (lease.queue, lease.priority)
            if lease.due_at is not None and (key not in oldest or lease.due_at < oldest[key]):
                oldest[key] = lease.due_at
        short = len(leases) < limit
        with self._lock:
            for q in queues:
                if full:
                    self._full_at[q] = now
                    self._full_took[q] = elapsed
                    self._rescan.discard(q)
                    if short:
                        self._cut_off.pop(q, None)
                    else:
                        took = [x.priority for x in leases if x.queue == q]
                        self._cut_off[q] = min(took) if took else None
                        # The next claim discovers the priorities this read did not reach
                        # before it seeks: seeking only from the floors it set would miss a
                        # due job of a lower priority (an empty claim with work waiting).
                        self._rescan.add(q)
            for key, due in oldest.items():
                floor = due - margin
                for pinned, at in reversed(self._pins.get(key, ())):
                    if at < now:
                        break
                    # Woken while this claim was under way: its job may not have been
                    # visible to it; keep the floor at that job until a later claim.
                    floor = min(floor, pinned - margin)
                # A full read saw the queue from the start: its oldest job is the floor, even
                # below one a wake-up for a later job set (a retry's, or after a new
                # connection) or where another claim had skipped a job it held.
                if full or key not in self._floors or floor > self._floors[key]:
                    self._floors[key] = floor

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        """A job of ``queue`` is waiting, due at ``due_at``: lower its priority's floor to
        it (or add the priority), so the next claim's seek reaches it."""
        floor = due_at - dt.timedelta(seconds=tenure_settings().CLAIM_FLOOR_MARGIN_SECONDS)
        at = time.monotonic()
        with self._lock:
            key = (queue, priority)
            if key not in self._floors or floor < self._floors[key]:
                self._floors[key] = floor
            pins = self._pins.setdefault(key, deque())
            pins.append((due_at, at))
            while pins[0][1] < at - PIN_SECONDS:
                pins.popleft()

    def forget(self) -> None:
        """Drop every floor (tests; a new connection, which may reach a promoted standby)."""
        with self._lock:
            self._floors.clear()
            self._full_at.clear()
            self._full_took.clear()
            self._cut_off.clear()
            self._rescan.clear()
            self._pins.clear()


FLOORS = ClaimFloors()
"""This process's claim floors (one set per process, shared by its threads)."""

LIMITED_FLOORS = ClaimFloors()
"""This process's floors for the claims of limited queues
(:meth:`~scheduler_core.storage.postgres.PostgresDriver.claim_limited_queue`), kept apart:
the claim of open queues passes over a limited queue's jobs at its gate, so its full reads
are no reads of that queue, and a limited queue's own full reads come on its own claims."""


def woken(queue: str, priority: int, due_at: datetime) -> None:
    """A job of ``queue`` is waiting, due at ``due_at``: both sets of floors learn it."""
    FLOORS.woken(queue, priority, due_at)
    LIMITED_FLOORS.woken(queue, priority, due_at)


def forget() -> None:
    """Drop both sets of floors (tests; a new connection, which may reach a promoted
    standby)."""
    FLOORS.forget()
    LIMITED_FLOORS.forget()
