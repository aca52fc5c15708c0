"""The guarantee each operator action puts at stake, in the dashboard's words: the
confirmation statements, why an action is not available, a running job's cancel request, the
bulk actions. Which actions a job is offered is decided once, in
:mod:`scheduler_core.services.offered` (re-exported here), for the console and the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from scheduler_core.conf import tenure_settings
from scheduler_core.domain import states
from scheduler_core.domain.modes import GUARANTEES, EffectMode
from scheduler_core.models import Effect, Job
from scheduler_core.read import jobs as job_reads
from scheduler_core.services.offered import (
    ACTIONS,
    BY_KEY,
    FACT_OUTCOMES,
    STORE_ACTIONS,
    ActionSpec,
    offered,
)

__all__ = [
    "ACTIONS",
    "BY_KEY",
    "FACT_OUTCOMES",
    "STORE_ACTIONS",
    "ActionSpec",
    "offered",
]


def article(word: str) -> str:
    """``word`` with its indefinite article ("an indeterminate", "a failed")."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def not_available(spec: ActionSpec, job: Job) -> str:
    """Why ``spec`` is not offered for ``job``: its state, its mode or its need of a fact."""
    if spec.transition == states.OP_REQUEST_CANCEL and job.cancel_requested_at is not None:
        return "A cancel of this running job was already requested; its attempt has yet to stop."
    if job.state in spec.states and (spec.modes is None or job.effect in spec.modes):
        this = f"this {job.state} {job.effect} job"
        if spec.ending:
            if spec.transition == states.OP_GIVE_UP and job_reads.has_applied_effect(job.pk):
                return (
                    f"“{spec.label}” does not apply: an effect of {this} was applied, and "
                    "failed would say it did not happen. Resolve or cancel it."
                )
            if spec.verified:
                return f"“{spec.label}” states a fact about an unknown outcome; {this} has none."
            return (
                f"“{spec.label}” does not apply: {this} holds an effect of unknown outcome, "
                "which it would hide; state the fact you verified."
            )
        if spec.fact:
            return f"“{spec.label}” states a fact about an unknown outcome; {this} has none."
        return (
            f"“{spec.label}” does not apply: {this} may have applied an effect; state the fact "
            "you verified."
        )
    return f"“{spec.label}” does not apply to {article(job.state)} {job.effect} job."


def _promise(job: Job) -> str:
    try:
        g = GUARANTEES[EffectMode(job.effect)]
    except ValueError:
        return "unknown mode"
    return g.promise


def _keys(effects: Sequence[Effect]) -> str:
    return ", ".join(e.key for e in effects) if effects else "none recorded yet"


def statement(spec: ActionSpec, job: Job, effects: Sequence[Effect]) -> str:
    """The confirmation the operator ticks: what the action does to the effect guarantee.

    ``effects`` is the job's whole ledger. A verified fact is about the effects the operator
    ticks, never every effect of the job; an effect left unknown stays unknown until a stated
    fact settles it, whatever later attempts report.
    """
    mode, promise = job.effect, _promise(job)
    unsettled = [e for e in effects if e.unsettled]
    keys = _keys(effects)
    if spec.key == "retry":
        return (
            f"The job runs again with a fresh attempt budget under the same effect key "
            f"({keys}). Its mode is {mode}: {promise}"
        )
    if spec.key == "retry-not-applied":
        return (
            "I verified at the destination that each effect I ticked did NOT happen. The ledger "
            "records those as not applied and the job runs again under the same key "
            f"({keys}). An effect I did not tick stays unknown: a later attempt that sent "
            "nothing does not settle it. If a ticked effect did happen after all, it happens "
            f"twice: mode {mode} promises only: {promise}"
        )
    if spec.key == "retry-same-key":
        return (
            f"The job runs again under the same idempotency key ({keys}). No fact is recorded: "
            "its effects stay unknown until the destination acknowledges a request (a replay "
            "included); a later attempt that sent nothing does not settle them. The "
            f"destination absorbs the repeat only while it still keeps that key: {promise}"
        )
    if spec.key == "resolve-applied":
        return (
            "I verified at the destination that each effect I ticked happened; every effect of "
            "unknown outcome must be ticked. The ledger records them as applied and the job is "
            "marked succeeded; it never runs again. If an effect did not in fact happen, it is "
            "lost."
        )
    if spec.key == "give-up":
        return (
            "The job is marked failed and never runs again unless someone retries it. Failed "
            "says its effects did not happen: the ledger holds none of unknown outcome and none "
            "applied."
        )
    if spec.key == "give-up-not-applied":
        return (
            "I verified at the destination that each effect I ticked did NOT happen; every "
            "effect of unknown outcome must be ticked. The ledger records them as not applied "
            "and the job is marked failed; it never runs again unless someone retries it."
        )
    if spec.key in ("cancel-not-applied", "cancel-applied"):
        saw = "happened" if spec.verified == "applied" else "did NOT happen"
        return (
            f"I verified at the destination that each effect I ticked {saw}; every effect of "
            "unknown outcome must be ticked. The ledger records what I verified and the job is "
            "cancelled; it never runs again. An effect that happened is not undone."
        )
    if spec.key == "cancel":
        if unsettled:
            return (
                f"The ledger holds {len(unsettled)} effect(s) whose outcome is unknown: cancelled "
                "would hide them, so the job is held indeterminate instead. It stops running; "
                "verify each effect at the destination, then cancel it stating what you found."
            )
        return "The job is cancelled and never runs again. An effect already applied is not undone."
    if spec.key == "cancel-running":
        every = job.lease_seconds * tenure_settings().HEARTBEAT_FRACTION
        text = (
            "The running attempt is asked to stop; it learns it at its next heartbeat (about "
            f"every {every:g}s). The handler must cooperate (ctx.cancelled, "
            "ctx.check_cancelled()): nothing interrupts it. From the request on, no new effect "
            "starts: the database refuses every effect intent. Effects already applied stay "
            "applied and are not undone; if the handler returns after one was applied, the job "
            "ends succeeded and its page says so. Otherwise it ends cancelled. A handler that "
            f"ignores the request runs until its maximum runtime ({job.timeout_seconds:g}s); "
            "when its lease then ends, the job ends cancelled, never retried. If an effect it "
            "started may have happened, the job ends indeterminate instead of cancelled, for "
            "you to verify."
        )
        if unsettled:
            text += (
                f" The ledger holds {len(unsettled)} effect(s) whose outcome is unknown: unless "
                "a later fact settles them, the job ends indeterminate."
            )
        return text
    raise ValueError(f"no statement for {spec.key!r}")


@dataclass(frozen=True, kw_only=True)
class CancelRequest:
    """A running job's cancel request, for the job page: when, by whom, why, what came of it."""

    at: datetime
    by: str
    reason: str
    outcome: str


def cancel_request(job: Job) -> CancelRequest | None:
    """The cancel request recorded on ``job`` (None: none), with its audit row's actor and
    reason and, in words, what the attempt did about it."""
    if job.cancel_requested_at is None:
        return None
    audit = job_reads.cancel_request_audit(job)
    if job.state == states.State.LEASED:
        outcome = "Waiting for the running attempt to stop (it learns it at its next heartbeat)."
    elif job.state == states.State.CANCELLED:
        outcome = "The attempt stopped: the job was cancelled."
    elif job.state == states.State.SUCCEEDED:
        outcome = (
            "Cancel requested after its effect was applied: the handler returned and the job "
            "succeeded."
        )
    else:
        outcome = (
            f"The attempt did not stop; the job is now {job.state} ({job.reason or 'no reason'})."
        )
    return CancelRequest(
        at=job.cancel_requested_at,
        by=audit.actor if audit else "unknown",
        reason=audit.reason if audit else "",
        outcome=outcome,
    )


BULK_LABELS = {"retry": "Retry failed jobs", "cancel": "Cancel jobs"}


def bulk_statement(action: str, count: int) -> str:
    """The confirmation for a bulk action over ``count`` jobs."""
    if action == "retry":
        return (
            f"All {count} failed jobs matched run again with a fresh attempt budget, each under "
            "its own unchanged effect key; each job's mode decides whether a repeated effect is "
            "absorbed, recorded as a possible duplicate, or prevented. Indeterminate jobs, and "
            "failed jobs with an effect of unknown outcome, are not included: each needs its "
            "own verified fact."
        )
    return (
        f"All {count} jobs matched (waiting, failed or indeterminate) are cancelled and never "
        "run again. Effects already applied are not undone."
    )
