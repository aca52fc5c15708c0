"""Outcome to transition: what an attempt's result means for its job. Pure functions."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, replace

from . import states
from .classify import FailureClass
from .modes import EffectMode
from .retry import RetryPolicy, snooze_delay


class Kind(enum.StrEnum):
    """What an attempt does: run the handler, ask the destination what happened, or run the
    job's fallback function (``@job(fallback=...)``)."""

    RUN = "run"
    RECONCILE = "reconcile"
    FALLBACK = "fallback"


class Reconciliation(enum.StrEnum):
    """A reconcile function's answer about one effect of the job."""

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
    kind: str = Kind.RUN
    """The kind of the attempt that ended (``run``, ``reconcile`` or ``fallback``)."""
    has_fallback: bool = False
    fallback_shares_key: bool = False
    """Whether the fallback's destination accepts the same effect key as the primary's (a
    claim the job type must state; unstated, it cannot)."""
    unsettled_effect: bool = False
    """Whether an effect of the job may have happened: intended, or unknown, in this attempt
    or any earlier one (the ledger's answer is sticky: only a stated fact settles it)."""
    applied_effects: tuple[str, ...] = ()
    """The names of the job's effects the ledger records applied (a stated fact)."""
    cancel_requested: bool = False
    """Whether an operator asked the job's running attempt to stop."""


def _ambiguous(
    s: Situation,
    *,
    policy: RetryPolicy,
    rng: random.Random,
    why: str,
    in_flight_grace: float = 0.0,
) -> Decision:
    """The effect may have happened: each mode's rule, never a blind re-run.

    ``in_flight_grace`` is the least delay before the next attempt. When the attempt itself
    reports the ambiguity its request may still be travelling to the destination; the next
    attempt (a reconcile lookup or a retry under the same key) must start only once such a
    request can have landed, or a lookup could answer "not applied" just before it does.
    """
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
    delay = max(policy.delay(s.attempt, rng), in_flight_grace)
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
    in_flight_grace: float = 0.0,
) -> Decision:
    """Decide what follows an attempt whose handler raised.

    ``in_flight_grace`` (the reaper's grace, passed by the executor) delays the attempt that
    follows an indeterminate failure, so a request still in flight can land first. The end
    state passes :func:`final`, the ledger's rule.
    """
    return final(
        s,
        _after_failure(
            s,
            failure,
            policy=policy,
            rng=rng,
            message=message,
            retry_after=retry_after,
            in_flight_grace=in_flight_grace,
        ),
    )


def _after_failure(
    s: Situation,
    failure: FailureClass,
    *,
    policy: RetryPolicy,
    rng: random.Random,
    message: str = "",
    retry_after: float | None = None,
    in_flight_grace: float = 0.0,
) -> Decision:
    why = f"{failure.value}: {message}" if message else failure.value
    if s.has_fallback or s.kind == Kind.FALLBACK:
        plain = _after_failure(
            replace(s, has_fallback=False, kind=Kind.RUN),
            failure,
            policy=policy,
            rng=rng,
            message=message,
            retry_after=retry_after,
            in_flight_grace=in_flight_grace,
        )
        return _with_fallback(s, failure, plain, policy=policy, why=why)
    if _may_have_happened(s) and failure != FailureClass.INDETERMINATE:
        # This attempt says nothing was sent, but an earlier outcome is still unknown: the
        # effect may have happened, so the mode's rule for an ambiguous outcome applies, and
        # "failed" (which would claim nothing happened) is never the answer.
        if failure == FailureClass.PERMANENT:
            return Decision(
                transition=states.PARK,
                reason=f"permanent error: {message}; an earlier outcome of the effect is "
                "unknown, so it may have happened",
            )
        return _ambiguous(
            s,
            policy=policy,
            rng=rng,
            why=f"{why} (an earlier outcome of the effect is unknown)",
            in_flight_grace=in_flight_grace,
        )
    if failure == FailureClass.PERMANENT:
        return Decision(transition=states.FAIL, reason=f"permanent error: {message}")
    if failure == FailureClass.INDETERMINATE:
        return _ambiguous(s, policy=policy, rng=rng, why=why, in_flight_grace=in_flight_grace)
    return _transient(s, policy=policy, rng=rng, why=why, retry_after=retry_after)


def _may_have_happened(s: Situation) -> bool:
    """Whether the ledger says an effect of the job may have happened (never true of a
    ``transactional`` job: its effect rolled back with any attempt that did not commit)."""
    return s.unsettled_effect and s.mode != EffectMode.TRANSACTIONAL


def unregistered(name: str, *, by_reaper: bool = False) -> Decision:
    """Decide for a job whose type is not registered in this process (a deploy removed it):
    fail closed. Without the type there is no policy, reconcile function or fallback rule to
    decide with, so the job is parked for an operator; it never retries or hands over."""
    return Decision(
        transition=states.REAP_PARK if by_reaper else states.PARK,
        reason=f"no job type {name!r} is registered here: parked for an operator rather than "
        "decided without its policy",
    )


def after_cancel_request(s: Situation, *, handler_stopped: bool) -> Decision:
    """Decide for an attempt that ends after an operator asked it to stop: the job is
    ``cancelled``. ``handler_stopped`` says the handler raised the cancel (else it returned, or
    failed, without an effect applied: a completion would have claimed work that was called off).
    An effect that may have happened keeps the job out of ``cancelled`` (:func:`final`).
    """
    how = "the handler stopped" if handler_stopped else "the handler ended with no effect applied"
    return final(
        s,
        Decision(
            transition=states.CANCEL,
            reason=f"cancelled by operator while running: {how}",
        ),
    )


def final(s: Situation, d: Decision) -> Decision:
    """The ledger's rule for the state a job ends in; every decision above passes through it.

    ``failed`` says the work did not happen, ``cancelled`` that it was called off before it
    could. Neither may hide an effect:

    * an effect that may have happened (intended or unknown in the ledger) turns either into
      ``indeterminate``: an operator checks the destination and states the fact;
    * an effect recorded applied turns ``failed`` into ``indeterminate`` too (the job did part
      of its work; a retry skips what is applied, a resolve says it is done), and stays visible
      behind ``cancelled``, whose reason names it.

    A ``transactional`` job has no effect outside its own transaction, which rolled back with
    any attempt that did not complete, so the rule leaves its decisions as they are.
    """
    target = d.transition.target
    if s.mode == EffectMode.TRANSACTIONAL or target not in (
        states.State.FAILED,
        states.State.CANCELLED,
    ):
        return d
    by_reaper = d.transition.name.startswith("reap_")
    park = states.REAP_PARK if by_reaper else states.PARK
    if s.unsettled_effect:
        return replace(
            d,
            transition=park,
            reason=f"{d.reason}; an effect may have happened (its outcome is unknown): "
            "an operator verifies it",
        )
    if s.applied_effects:
        names = ", ".join(s.applied_effects)
        if target == states.State.CANCELLED:
            return replace(d, reason=f"{d.reason}; effect(s) {names} had been applied")
        return replace(
            d,
            transition=park,
            reason=f"{d.reason}; effect(s) {names} applied before the job ended: an operator "
            "resolves it, or retries it (applied effects are skipped)",
        )
    return d


def after_abandon(
    s: Situation,
    *,
    unsettled_effect: bool,
    policy: RetryPolicy,
    rng: random.Random,
    why: str,
    in_flight_grace: float = 0.0,
) -> Decision:
    """Decide what follows an attempt whose lease expired or that was released unfinished.

    Without an unsettled effect intent nothing can have happened outside the database, so a
    retry is safe. With one, the effect may have happened and the mode's rule applies. The
    reaper acts only after the lease and its grace ran out, so it passes no extra grace; a
    release by a live executor passes ``in_flight_grace``. The end state passes
    :func:`final`, the ledger's rule.
    """
    if s.cancel_requested:
        # The operator called the work off; the attempt never answered before its lease ended.
        return final(
            s,
            Decision(
                transition=states.REAP_CANCEL,
                reason=f"cancelled by operator: {why} before the attempt answered the request",
            ),
        )
    return final(
        s,
        _after_abandon(
            s,
            unsettled_effect=unsettled_effect,
            policy=policy,
            rng=rng,
            why=why,
            in_flight_grace=in_flight_grace,
        ),
    )


def _after_abandon(
    s: Situation,
    *,
    unsettled_effect: bool,
    policy: RetryPolicy,
    rng: random.Random,
    why: str,
    in_flight_grace: float = 0.0,
) -> Decision:
    if s.kind == Kind.FALLBACK:
        plain = _after_abandon(
            replace(s, kind=Kind.RUN),
            unsettled_effect=unsettled_effect,
            policy=policy,
            rng=rng,
            why=why,
            in_flight_grace=in_flight_grace,
        )
        return _abandoned_fallback(s, plain, unsettled_effect=unsettled_effect)
    if unsettled_effect:
        decision = _ambiguous(s, policy=policy, rng=rng, why=why, in_flight_grace=in_flight_grace)
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


def after_reconcile(
    s: Situation,
    *,
    still_unknown: tuple[str, ...],
    whole_job: Reconciliation | None = None,
    failure: FailureClass | None = None,
    policy: RetryPolicy,
    rng: random.Random,
    message: str = "",
    retry_after: float | None = None,
) -> Decision:
    """Decide what follows a reconcile attempt, which asked the destination about each effect
    of unknown outcome, one at a time, and settled each one it had an answer for.

    ``still_unknown`` names the effects still unsettled (the lookup answered ``unknown`` or
    raised); ``failure`` is the class of the worst error a lookup raised, if any.
    ``whole_job`` is the answer about the job as a whole, asked when the ledger held no effect
    to ask about (a handler that reported an ambiguous outcome outside ``ctx.effect``):
    ``applied`` then completes the job, as there is nothing in the ledger to perform again.

    * Every effect settled: the job resumes with a ``run`` attempt, which skips the effects
      applied and performs those not applied (or never started) under their keys. The
      reconcile attempt is handed back to the budget: it decided, it did no work.
    * A lookup that failed permanently: the destination cannot say; an operator decides.
    * Otherwise (an ``unknown`` answer, a transient error) the question is asked again later,
      bounded by the job's attempts and age, then left to an operator. The job never goes back
      to a plain run while an effect is unknown.
    """
    if whole_job == Reconciliation.APPLIED and not still_unknown:
        return Decision(
            transition=states.COMPLETE,
            reason="reconciled: the destination says the work was applied (no effect in the "
            "ledger to settle)",
        )
    if not still_unknown:
        return Decision(
            transition=states.RETRY,
            reason="reconciled: every effect of unknown outcome settled; the job resumes and "
            "performs the effects not applied",
            spend_attempt=False,
        )
    names = ", ".join(still_unknown)
    if failure is not None:
        why = f"reconcile {failure.value}: {message}" if message else f"reconcile {failure.value}"
    else:
        why = "reconciled: the destination cannot say yet"
    why = f"{why} (effect(s) {names})"
    if failure == FailureClass.PERMANENT:
        return Decision(transition=states.PARK, reason=f"{why}; the destination cannot say")
    if s.attempt >= s.max_attempts:
        return Decision(transition=states.PARK, reason=f"{why}; attempts exhausted")
    if policy.too_old(s.age_seconds):
        return Decision(transition=states.PARK, reason=f"{why}; maximum age reached")
    return Decision(
        transition=states.RETRY,
        delay=policy.delay(s.attempt, rng, retry_after),
        next_kind=Kind.RECONCILE,
        reason=why,
    )


# ---------------------------------------------------------------------------------------------
# Snoozes and fallbacks
# ---------------------------------------------------------------------------------------------


def after_snooze(
    s: Situation, seconds: float, *, policy: RetryPolicy, cap: float = 366 * 86400.0
) -> Decision:
    """Decide what follows a handler that raised ``Snooze(seconds)``.

    The job waits ``seconds`` (clamped to ``[0, cap]``) and the attempt is handed back to the
    budget, so snoozing never exhausts ``max_attempts``; ``max_age`` still bounds it. The next
    attempt is of the same kind (a snoozed fallback stays on the fallback).
    """
    if policy.too_old(s.age_seconds):
        return final(
            s, Decision(transition=states.FAIL, reason="maximum age reached while snoozing")
        )
    return Decision(
        transition=states.RETRY,
        delay=snooze_delay(seconds, cap=cap),
        next_kind=Kind.FALLBACK if s.kind == Kind.FALLBACK else Kind.RUN,
        reason=f"snoozed for {seconds}s",
        spend_attempt=False,
    )


def _may_fall_back(s: Situation, policy: RetryPolicy) -> bool:
    """Whether a failed primary attempt may hand over to the fallback."""
    if s.attempt >= s.max_attempts or policy.too_old(s.age_seconds):
        return False
    # A destination that cannot take the same key could repeat an effect the primary may
    # have made: only once every effect of the job is known not applied (or none started).
    return s.fallback_shares_key or not s.unsettled_effect


def _with_fallback(
    s: Situation, failure: FailureClass, plain: Decision, *, policy: RetryPolicy, why: str
) -> Decision:
    """Adjust ``plain`` (the decision without fallbacks) for a job that declares one.

    * A ``run`` attempt that failed transiently or permanently hands over: the next attempt,
      due at once, is a ``fallback`` attempt of the same job (same effect keys), when budget
      and age allow and :func:`_may_fall_back` says the key rule holds.
    * A ``fallback`` attempt's retries stay on the fallback.
    * An ambiguous outcome of a fallback whose destination cannot share the key is parked:
      neither destination can tell whether the other already made the effect.
    """
    if s.kind == Kind.RUN and s.has_fallback:
        if failure != FailureClass.INDETERMINATE and _may_fall_back(s, policy):
            return Decision(
                transition=states.RETRY,
                delay=0.0,
                next_kind=Kind.FALLBACK,
                reason=f"{why}; the next attempt runs the fallback",
            )
        return plain
    if s.kind != Kind.FALLBACK:
        return plain
    ambiguous = failure == FailureClass.INDETERMINATE or _may_have_happened(s)
    if ambiguous and not s.fallback_shares_key and s.mode != EffectMode.TRANSACTIONAL:
        return Decision(
            transition=states.PARK,
            reason=f"{why}; the fallback's destination cannot share the effect key",
        )
    return _stay_on_fallback(plain)


def _stay_on_fallback(d: Decision) -> Decision:
    if d.transition.target == states.State.WAITING and d.next_kind == Kind.RUN:
        return replace(d, next_kind=Kind.FALLBACK)
    return d


def _abandoned_fallback(s: Situation, plain: Decision, *, unsettled_effect: bool) -> Decision:
    """A fallback attempt whose lease expired or that was released: the same rules as a
    failure of it (an unsettled effect at a destination that cannot share the key is parked;
    retries stay on the fallback)."""
    if unsettled_effect and not s.fallback_shares_key and s.mode != EffectMode.TRANSACTIONAL:
        return Decision(
            transition=states.REAP_PARK,
            reason=f"{plain.reason}; the fallback's destination cannot share the effect key",
        )
    return _stay_on_fallback(plain)
