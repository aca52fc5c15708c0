"""Outcome to transition: what an attempt's result means for its job. Pure functions."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from . import states
from .classify import FailureClass
from .modes import EffectMode
from .retry import RetryPolicy


class Kind(enum.StrEnum):
    """What an attempt does: run the handler, or ask the destination what happened."""

    RUN = "run"
    RECONCILE = "reconcile"


class Reconciliation(enum.StrEnum):
    """A reconcile function's answer about the job's effect."""

    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The transition to make and its parameters."""

    transition: states.Transition
    delay: float = 0.0
    """Seconds until the job is due again (retries only)."""
    next_kind: Kind = Kind.RUN
    reason: str = ""
    """Why: stored on the job when it becomes terminal or indeterminate."""
    spend_attempt: bool = True
    """False for a snooze: the attempt is handed back to the budget."""
    duplicate_possible: bool = False
    """An at-least-once re-run after an ambiguous outcome: the ledger notes the risk."""


@dataclass(frozen=True, kw_only=True)
class Situation:
    """What the decision needs to know about the job at the end of an attempt."""

    mode: EffectMode
    attempt: int
    max_attempts: int
    age_seconds: float
    has_reconcile: bool = False


def _ambiguous(s: Situation, *, policy: RetryPolicy, rng: random.Random, why: str) -> Decision:
    """The effect may have happened: each mode's rule, never a blind re-run."""
    exhausted = s.attempt >= s.max_attempts
    too_old = policy.max_age is not None and s.age_seconds >= policy.max_age
    if s.mode == EffectMode.TRANSACTIONAL:
        # Nothing was committed with a lost or failed attempt: the transaction rolled back.
        return _transient(s, policy=policy, rng=rng, why=why, retry_after=None)
    if s.mode == EffectMode.AT_MOST_ONCE:
        return Decision(transition=states.PARK, reason=f"{why}; at most once: not re-run")
    if exhausted or too_old:
        bound = "attempts exhausted" if exhausted else "maximum age reached"
        return Decision(transition=states.PARK, reason=f"{why}; {bound} with the effect unsettled")
    delay = policy.delay(s.attempt, rng)
    if s.mode == EffectMode.RECONCILABLE and s.has_reconcile:
        return Decision(transition=states.RETRY, delay=delay, next_kind=Kind.RECONCILE, reason=why)
    if s.mode == EffectMode.RECONCILABLE:
        return Decision(transition=states.PARK, reason=f"{why}; no reconcile function declared")
    return Decision(
        transition=states.RETRY,
        delay=delay,
        reason=why,
        duplicate_possible=s.mode == EffectMode.AT_LEAST_ONCE,
    )


def _transient(
    s: Situation, *, policy: RetryPolicy, rng: random.Random, why: str, retry_after: float | None
) -> Decision:
    if s.attempt >= s.max_attempts:
        return Decision(transition=states.FAIL, reason=f"attempts exhausted ({s.attempt}): {why}")
    if policy.max_age is not None and s.age_seconds >= policy.max_age:
        return Decision(transition=states.FAIL, reason=f"maximum age reached: {why}")
    return Decision(
        transition=states.RETRY, delay=policy.delay(s.attempt, rng, retry_after), reason=why
    )


def after_failure(
    s: Situation,
    failure: FailureClass,
    *,
    policy: RetryPolicy,
    rng: random.Random,
    message: str = "",
    retry_after: float | None = None,
) -> Decision:
    """Decide what follows an attempt whose handler raised."""
    why = f"{failure.value}: {message}" if message else failure.value
    if failure == FailureClass.PERMANENT:
        return Decision(transition=states.FAIL, reason=f"permanent error: {message}")
    if failure == FailureClass.INDETERMINATE:
        return _ambiguous(s, policy=policy, rng=rng, why=why)
    return _transient(s, policy=policy, rng=rng, why=why, retry_after=retry_after)


def after_abandon(
    s: Situation, *, unsettled_effect: bool, policy: RetryPolicy, rng: random.Random, why: str
) -> Decision:
    """Decide what follows an attempt whose lease expired or that was released unfinished.

    Without an unsettled effect intent nothing can have happened outside the database, so a
    retry is safe. With one, the effect may have happened and the mode's rule applies.
    """
    if unsettled_effect:
        decision = _ambiguous(s, policy=policy, rng=rng, why=why)
    elif s.attempt >= s.max_attempts:
        decision = Decision(
            transition=states.FAIL, reason=f"attempts exhausted ({s.attempt}): {why}"
        )
    else:
        decision = Decision(transition=states.RETRY, delay=0.0, reason=why)
    # Name the reaper's own transitions so the attempt history says who moved the job.
    reap = {
        states.RETRY.name: states.REAP_RETRY,
        states.FAIL.name: states.REAP_FAIL,
        states.PARK.name: states.REAP_PARK,
    }[decision.transition.name]
    return Decision(
        transition=reap,
        delay=decision.delay,
        next_kind=decision.next_kind,
        reason=decision.reason,
        duplicate_possible=decision.duplicate_possible,
    )


def after_reconcile(answer: Reconciliation) -> Decision:
    """Decide what follows a reconcile attempt's answer."""
    if answer == Reconciliation.APPLIED:
        return Decision(transition=states.COMPLETE, reason="reconciled: effect applied")
    if answer == Reconciliation.NOT_APPLIED:
        return Decision(
            transition=states.RETRY,
            reason="reconciled: effect not applied; run again under the same key",
            spend_attempt=False,
        )
    return Decision(transition=states.PARK, reason="reconciled: destination cannot say")
