"""The reaper: jobs whose lease expired (by the database's clock, plus a grace) are moved on,
each by the decision its job type's policy and effect mode make (:mod:`scheduler_core.api.
policy`), written through the storage driver under the dead owner's fence.

Safe in many processes at once: candidates are locked ``SKIP LOCKED`` where the database can,
and each write is conditioned on the job still being leased under the same fence with its
lease expired, so a late heartbeat that landed meanwhile wins.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from collections import Counter
from datetime import datetime

from ..api import policy, registry
from ..conf import tenure_settings
from ..exceptions import StaleAttempt
from ..read import metrics
from ..runtime import observe
from ..storage.clock import to_datetime
from ..storage.drivers import driver

log = logging.getLogger("tenure.reaper")


FULL_WALK_SECONDS = 60.0
"""How often a sweep reads the leases index from its start, whatever the last sweep read."""

WALK_MARGIN = dt.timedelta(seconds=10)
"""How far below the last sweep's bound the next one starts: far longer than any transaction
that sets a lease (a claim or a renewal) takes to commit."""


class LeaseWalk:
    """Where this process's next sweep starts reading the leases index.

    A renewal or a completion leaves the job's old entry in the leases index until vacuum
    removes it, which it cannot do while an older snapshot is held; all those entries have
    expiries long past, so a sweep reading every expiry up to its bound read each of them, and
    its row, every second (under a 15-minute snapshot at 300 jobs/s, a third of a second a
    sweep, growing). Every lease that expired before a completed sweep's bound was read by
    that sweep, so the next one starts a margin below it. A sweep from the start still runs
    every ``FULL_WALK_SECONDS`` and first in each process: it finds a row an earlier sweep
    skipped because another transaction held it. Starting higher only decides which entries
    a sweep reads; each write is fenced and re-checks the expiry as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._low: datetime | None = None
        self._full_at: float | None = None

    def since(self, *, now: float) -> datetime | None:
        """The expiry the next sweep starts from; None: from the start of the index."""
        with self._lock:
            if self._full_at is None or now - self._full_at >= FULL_WALK_SECONDS:
                return None
            return self._low

    def swept(self, *, since: datetime | None, bound: datetime, now: float) -> None:
        """Record a completed sweep from ``since`` that read every expiry below ``bound``."""
        with self._lock:
            if since is None:
                self._full_at = now
            low = bound - WALK_MARGIN
            if self._low is None or low > self._low:
                self._low = low

    def forget(self) -> None:
        """Start again from the start of the index (tests; a replaced database)."""
        with self._lock:
            self._low = None
            self._full_at = None


WALK = LeaseWalk()
"""This process's lease walk."""


def reap(*, limit: int = 100, rng: random.Random | None = None) -> Counter[str]:
    """Move up to ``limit`` jobs whose lease expired on; counts by transition name. A job
    whose type is not registered in this process is parked, never retried or handed to a
    fallback."""
    return _reap(limit=limit, rng=rng, since=None)[0]


def _reap(
    *, limit: int, rng: random.Random | None, since: datetime | None
) -> tuple[Counter[str], int]:
    """:func:`reap`, and how many expired leases it read."""
    rng = rng or random.Random()
    grace = tenure_settings().REAP_GRACE_SECONDS
    counts: Counter[str] = Counter()
    d = driver()
    with d.atomic():
        jobs = list(d.expired_leases(grace, since=since)[:limit])
        if not jobs:
            return counts, 0
        now = d.now()
        for job in jobs:
            overran = job.deadline_at is not None and to_datetime(job.deadline_at) <= now
            why = (
                f"maximum runtime of {job.timeout_seconds:g}s exceeded (owner {job.lease_owner})"
                if overran
                else f"lease expired (owner {job.lease_owner})"
            )
            lease = d.lease_of(job)
            decision = policy.abandoned(
                lease,
                now=now,
                why=why,
                rng=rng,
                cancel_requested=job.cancel_requested_at is not None,
            )
            try:
                # The expiry is re-checked in the write itself: a late heartbeat may have landed.
                d.finish(lease, decision, outcome="lease_expired", expired_for=grace)
                counts[decision.transition.name] += 1
            except StaleAttempt:
                continue
            observe.reaped(lease, registry.get(lease.name), decision.transition.target, why)
    for name, n in counts.items():
        log.info("reaper: %s x%d", name, n)
    return counts, len(jobs)


def close_stray_attempts(*, limit: int = 100) -> int:
    """Close the open attempts that are not their job's current one (rows written by hand or
    a defect: the claim passes over their jobs until then), each with a warning; how many.
    A sweep from the start of the leases index runs this too, so it comes first in each
    process and then every ``FULL_WALK_SECONDS``: it reads every open attempt's index entry,
    and under a held snapshot those include one for every attempt ended since."""
    closed = driver().close_stray_attempts(limit=limit)
    for row in closed:
        log.warning(
            "reaper: closed attempt %(id)s (number %(number)s, fence %(fence)s) of job "
            "%(job_id)s as superseded: it was open but its job is not leased under its fence, "
            "so no write of it could be accepted, and the job could not be claimed beside it",
            row,
        )
    if closed:
        metrics.stray_attempts_closed(len(closed))
    return len(closed)


def reap_once(*, limit: int = 500, rng: random.Random | None = None) -> Counter[str]:
    """Move every expired lease on (in batches of ``limit``), reading the leases index from
    where this process's last sweep left off (:class:`LeaseWalk`); counts by transition. A
    sweep from the start first closes stray open attempts (:func:`close_stray_attempts`)."""
    total: Counter[str] = Counter()
    started = time.monotonic()
    since = WALK.since(now=started)
    if since is None:
        close_stray_attempts()
    # Taken before the sweep's first read, whose own bound (its statement's time less the
    # grace) is no earlier: every expiry below this one is read by the time the loop ends.
    bound = driver().now() - dt.timedelta(seconds=tenure_settings().REAP_GRACE_SECONDS)
    while True:
        got, read = _reap(limit=limit, rng=rng, since=since)
        total.update(got)
        if read < limit:
            # Read to the bound: the next sweep may start below it.
            WALK.swept(since=since, bound=bound, now=started)
            break
        if not got:
            break  # a full batch none of which could be written: read it again next time
    for name, n in total.items():
        metrics.reaped(name, n)
    return total
