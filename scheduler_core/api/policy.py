"""How a registered job type decides: the one builder of a :class:`~scheduler_core.domain.
outcomes.Situation` (what a decision needs to know about an attempt), and the decision for an
attempt that ended without a result (its lease expired, or its executor gave it up).

The decisions themselves are the pure rules of :mod:`scheduler_core.domain.outcomes`; this
module only gathers their inputs from the registry, the lease and the ledger. The runtime (an
attempt's own end) and the services (the reaper) both decide through it.
"""

from __future__ import annotations

import random
from datetime import datetime

from ..domain import outcomes
from ..domain.modes import EffectMode
from ..domain.outcomes import Decision, Situation
from ..storage.drivers import driver
from ..storage.records import Lease
from .registry import JobType, get


def situation(
    jt: JobType,
    lease: Lease,
    *,
    now: datetime,
    ambiguous: bool = False,
    cancel_requested: bool = False,
) -> Situation:
    """What a decision about ``lease``'s attempt needs, as of the database's ``now``.

    ``ambiguous``: this attempt itself saw an effect's outcome become unknown. Otherwise the
    ledger's sticky answer is read: an earlier attempt's unknown outcome is not erased by this
    attempt's "nothing sent" (a transactional job's effect rolled back with its attempt, so it
    has none to ask about). The ledger's applied effects are read with it, for the rule of a
    job's end state. ``cancel_requested``: an operator asked the attempt to stop."""
    mode = EffectMode(lease.effect)
    unsettled: tuple[str, ...] = ()
    applied: tuple[str, ...] = ()
    if mode != EffectMode.TRANSACTIONAL:
        unsettled, applied = driver().ledger_summary(lease.job_id)
    return Situation(
        mode=mode,
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        age_seconds=(now - lease.created_at).total_seconds(),
        has_reconcile=jt.reconcile is not None,
        kind=lease.kind,
        has_fallback=jt.fallback is not None,
        fallback_shares_key=jt.fallback_shares_key,
        unsettled_effect=ambiguous or bool(unsettled),
        applied_effects=applied,
        cancel_requested=cancel_requested,
    )


def abandoned(
    lease: Lease,
    *,
    now: datetime,
    why: str,
    rng: random.Random,
    in_flight_grace: float = 0.0,
    cancel_requested: bool = False,
) -> Decision:
    """The decision for a leased job whose attempt ended without a result (its lease expired,
    or its executor gave it up): fail closed (park) when the type is unknown here; cancelled
    when an operator had asked the attempt to stop (unless an effect may have happened)."""
    jt = get(lease.name)
    if jt is None:
        return outcomes.unregistered(lease.name, by_reaper=True)
    s = situation(jt, lease, now=now, cancel_requested=cancel_requested)
    return outcomes.after_abandon(
        s,
        unsettled_effect=s.unsettled_effect,
        policy=jt.retry_policy,
        rng=rng,
        why=why,
        in_flight_grace=in_flight_grace,
    )
