"""The reaper: jobs whose lease expired (by the database's clock, plus a grace) are moved on,
each by the decision its job type's policy and effect mode make (:mod:`scheduler_core.api.
policy`), written through the storage driver under the dead owner's fence.

Safe in many processes at once: candidates are locked ``SKIP LOCKED`` where the database can,
and each write is conditioned on the job still being leased under the same fence with its
lease expired, so a late heartbeat that landed meanwhile wins.
"""

from __future__ import annotations

import logging
import random
from collections import Counter

from ..api import policy
from ..conf import tenure_settings
from ..exceptions import StaleAttempt
from ..read import metrics
from ..storage.clock import to_datetime
from ..storage.drivers import driver

log = logging.getLogger("tenure.reaper")


def reap(*, limit: int = 100, rng: random.Random | None = None) -> Counter[str]:
    """Move up to ``limit`` jobs whose lease expired on; counts by transition name. A job
    whose type is not registered in this process is parked, never retried or handed to a
    fallback."""
    rng = rng or random.Random()
    grace = tenure_settings().REAP_GRACE_SECONDS
    counts: Counter[str] = Counter()
    d = driver()
    with d.atomic():
        jobs = list(d.expired_leases(grace)[:limit])
        if not jobs:
            return counts
        now = d.now()
        for job in jobs:
            overran = job.deadline_at is not None and to_datetime(job.deadline_at) <= now
            why = (
                f"maximum runtime of {job.timeout_seconds:g}s exceeded (owner {job.lease_owner})"
                if overran
                else f"lease expired (owner {job.lease_owner})"
            )
            lease = d.lease_of(job)
            decision = policy.abandoned(lease, now=now, why=why, rng=rng)
            try:
                # The expiry is re-checked in the write itself: a late heartbeat may have landed.
                d.finish(lease, decision, outcome="lease_expired", expired_for=grace)
                counts[decision.transition.name] += 1
            except StaleAttempt:
                continue
    for name, n in counts.items():
        log.info("reaper: %s x%d", name, n)
    return counts


def reap_once(*, limit: int = 500, rng: random.Random | None = None) -> Counter[str]:
    """Move every expired lease on (in batches of ``limit``); counts by transition."""
    total: Counter[str] = Counter()
    while True:
        got = reap(limit=limit, rng=rng)
        total.update(got)
        if sum(got.values()) < limit:
            break
    for name, n in total.items():
        metrics.reaped(name, n)
    return total
