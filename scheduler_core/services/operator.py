"""Operator actions — retry, cancel, resolve, give up, and a cancel request to a running job —
on one job or in bulk: the dashboard's and the command line's only way to change a job.

Each action is decided here (which transition it means for this job, the attempt budget a
retry grants, which verified fact it needs and about which effects, whether an earlier owner
may still be in flight) and written through the storage driver in one transaction with its
audit row: conditioned on the version the operator saw and a state the action may leave, so
a stale page or a race with the reaper changes nothing and raises
:class:`~scheduler_core.exceptions.ActionConflict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import F

from ..api import registry
from ..conf import tenure_settings
from ..domain import states
from ..domain.modes import EffectMode
from ..domain.outcomes import Kind
from ..domain.reasons import check_reason
from ..exceptions import ActionConflict, ActionRefused
from ..models import AuditEntry, Effect, Job
from ..storage.clock import DbNow
from ..storage.drivers import driver

VERIFIED_FACTS = {
    "not_applied": "The operator verified the effect did not happen.",
    "same_key": "Retry under the same idempotency key; the destination absorbs a repeat.",
    "applied": "The operator verified the effect happened.",
    "give_up": "The operator gives up on the job.",
}


@dataclass(frozen=True, kw_only=True)
class ActionResult:
    """The job after an operator action and its audit row."""

    job: Job
    audit: AuditEntry


def needs_fact(job: Job) -> bool:
    """Whether retrying or resolving ``job`` needs a fact the operator verified: it is
    indeterminate, or its ledger holds an effect that may or may not have happened. The
    dashboard offers, and this module accepts, a plain retry only when it does not."""
    return job.state == states.State.INDETERMINATE or driver().has_unsettled_effect(job.pk)


def ending_needs_fact(job: Job) -> bool:
    """Whether cancelling ``job`` or giving it up needs a fact the operator verified: its
    ledger holds an effect that may or may not have happened, which ``cancelled`` or
    ``failed`` would otherwise hide."""
    return driver().has_unsettled_effect(job.pk)


def operator_action(
    job_id: int,
    *,
    action: str,
    expected_version: int,
    actor: str,
    reason: str,
    verified: str = "",
    effects: Sequence[str] = (),
    accept_in_flight: bool = False,
    seen_owners: Sequence[int] | None = None,
) -> ActionResult:
    """Apply an operator's ``retry``, ``cancel``, ``resolve``, ``give_up`` or ``cancel_running``
    to one job.

    ``cancel_running`` asks a running (leased) job's attempt to stop: it records
    ``Job.cancel_requested_at`` (the database's clock) and leaves the job leased; the attempt
    learns it at its next lease renewal and ends the job ``cancelled`` (see
    :meth:`~scheduler_core.runtime.context.JobContext.cancelled`). A second request is refused.

    Conditioned on the job still having ``expected_version`` and a state the action may leave;
    otherwise :class:`ActionConflict` (nothing changes). The state change, the facts recorded
    in the ledger and the audit row commit together.

    Retrying or resolving a job that :func:`needs_fact` needs ``verified`` to name the fact
    the operator checked: ``not_applied`` or ``same_key`` (idempotent jobs only) for a retry,
    ``applied`` for a resolve. A fact applies to the effects ``effects`` names (by effect
    name), never to every effect of the job: with one unsettled effect it may be left out;
    with several, each one verified is named. A resolve must cover every unsettled effect.

    Cancelling or giving up a job whose ledger holds an effect of unknown outcome needs a
    fact too (:func:`ending_needs_fact`), about every such effect: ``applied`` or
    ``not_applied`` to cancel, ``not_applied`` to give up; so the unknown never hides behind
    ``cancelled`` or ``failed``. Without one, cancelling a waiting job holds it
    ``indeterminate`` (it stops running, the effect stays in question); any other such cancel
    or give-up is refused. Giving up a job with an effect recorded applied is refused:
    ``failed`` would say it did not happen.

    A ``not_applied`` fact (to retry, cancel or give up) is refused while an earlier owner may
    still be in flight
    (:meth:`~scheduler_core.storage.base.Driver.in_flight_owners`) unless ``accept_in_flight``
    says the operator accepts it: that owner, paused between its check and its send, would send
    when it resumes, and only a destination that checks the fencing token would refuse it.
    ``seen_owners`` are the fences of the owners the operator's confirmation showed (the
    dashboard and the command line always pass them): the action is refused as a conflict
    when the owners that may be in flight are not those, so an acceptance covers only the
    owners the operator saw. Every retry waits out the grace such an owner is given
    (:attr:`~scheduler_core.storage.records.InFlightOwner.clear_at`).
    """
    reason = check_reason(reason)
    d = driver()
    with d.atomic():
        job = Job.objects.using(d.alias).filter(pk=job_id).first()
        if job is None:
            raise ActionRefused(f"job {job_id} does not exist")
        # A stale page is a conflict whatever the job became since (leased, succeeded...):
        # judge the action only against the state the operator actually saw.
        if job.version != expected_version:
            raise ActionConflict(
                f"job {job_id} changed since version {expected_version}; reload and decide again"
            )
        if verified and verified not in VERIFIED_FACTS:
            raise ActionRefused(f"unknown verified fact {verified!r}")
        t, fields, effect_state = _operator_plan(job, action, verified)
        if not t.applies_to(job.state):
            raise ActionRefused(f"{action} does not apply to {_article(job.state)} job")
        if t == states.OP_REQUEST_CANCEL and job.cancel_requested_at is not None:
            raise ActionRefused(
                f"a cancel of job {job_id} was already requested at "
                f"{job.cancel_requested_at.isoformat(timespec='seconds')}"
            )
        named = _facts_about(job, action, effect_state, effects)
        owners = d.in_flight_owners(job_id)
        now_fences = sorted(o.fence for o in owners)
        if seen_owners is not None and sorted(set(seen_owners)) != now_fences:
            raise ActionConflict(
                f"the earlier owners of job {job_id} that may still be in flight changed since "
                f"the confirmation: it showed {_fences(seen_owners)}, now {_fences(now_fences)}; "
                "reload and decide again"
            )
        if effect_state == Effect.NOT_APPLIED and owners and not accept_in_flight:
            who = ", ".join(
                f"{o.executor} (attempt {o.attempt}, fence {o.fence}, {o.ended})" for o in owners
            )
            raise ActionRefused(
                f"an earlier owner may still be in flight: {who}. Its attempt was ended for it "
                "and it is not known to have stopped; paused between its check and its send, "
                "it sends when it resumes, and only a destination that checks the fencing token "
                "refuses it, and the fact you state may then become untrue. Confirm that you "
                "accept this (or that the process is gone)."
            )
        if t == states.OP_RETRY:
            # The next attempt starts no earlier than such an owner's grace runs out, as the
            # reaper's would.
            wait = max(
                ((o.clear_at - d.now()).total_seconds() for o in owners if o.clear_at), default=0
            )
            fields["run_at"] = DbNow(max(0.0, wait))
        if not d.operator_transition(
            job_id, expected_version=expected_version, transition=t, fields=fields
        ):
            raise ActionConflict(
                f"job {job_id} changed since version {expected_version}; reload and decide again"
            )
        for row in named:
            d.record_operator_fact(row, effect_state=effect_state, actor=actor, reason=reason)
        # A workflow step's other steps move with it, in this transaction and audit row.
        moved = d.operator_moved_step(job_id, t.target)
        before = job.state
        job.refresh_from_db()
        audit = d.audit(
            job=job,
            actor=actor,
            action=action,
            reason=reason,
            verified=verified,
            state_before=before,
            state_after=job.state,
            version_before=expected_version,
            detail={
                "transition": t.name,
                "fence": job.fence,
                "effects": [row.name for row in named],
                "in_flight_owners": [o.executor for o in owners],
                "accepted_in_flight": bool(owners and accept_in_flight),
                **({"workflow_steps_moved": moved} if moved else {}),
                **(
                    {
                        "cancel_requested_at": job.cancel_requested_at.isoformat(),
                        "lease_owner": job.lease_owner,
                    }
                    if t == states.OP_REQUEST_CANCEL and job.cancel_requested_at
                    else {}
                ),
            },
        )
    return ActionResult(job=job, audit=audit)


def _fences(fences: Sequence[int]) -> str:
    return f"fences {', '.join(str(f) for f in sorted(set(fences)))}" if fences else "none"


def _facts_about(job: Job, action: str, effect_state: str, effects: Sequence[str]) -> list[Effect]:
    """The ledger rows a verified fact is about: the effects named, which must be unsettled;
    none named means the only unsettled one. A resolve must leave none unsettled."""
    if effects and not effect_state:
        raise ActionRefused(f"{action} records no fact about effects; name none")
    if not effect_state:
        return []
    unsettled = {row.name: row for row in driver().unsettled_effects(job.pk)}
    if not effects:
        if len(unsettled) > 1:
            raise ActionRefused(
                f"the job has {len(unsettled)} effects whose outcome is unknown "
                f"({', '.join(sorted(unsettled))}): name the one(s) you verified"
            )
        effects = list(unsettled)
    named = []
    for name in dict.fromkeys(effects):
        if name not in unsettled:
            raise ActionRefused(f"effect {name!r} of job {job.pk} is not awaiting a fact")
        named.append(unsettled[name])
    left = sorted(set(unsettled) - {row.name for row in named})
    ended = {"resolve": "a succeeded", "cancel": "a cancelled", "give_up": "a failed"}
    if action in ended and left:
        raise ActionRefused(
            f"effect(s) {', '.join(left)} would stay unknown in {ended[action]} job: verify "
            "them too"
        )
    return named


def _article(word: str) -> str:
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _operator_plan(
    job: Job, action: str, verified: str
) -> tuple[states.Transition, dict[str, Any], str]:
    """Which transition an action means for this job, its extra fields, and the effect
    outcome the operator's fact records."""
    state = states.State(job.state)
    if action == "cancel_running":
        if verified:
            raise ActionRefused("cancel_running records no verified fact")
        return states.OP_REQUEST_CANCEL, {"cancel_requested_at": DbNow()}, ""
    if state == states.State.LEASED:
        raise ActionRefused(
            "a leased job cannot be retried, resolved or cancelled outright; ask its running "
            "attempt to stop (cancel_running)"
        )
    if action == "cancel":
        return _cancel_plan(job, verified)
    if action == "retry":
        effect_state = ""
        # A failed job whose effect outcome is unknown needs the same stated fact as an
        # indeterminate one: a retry may otherwise repeat an effect that happened.
        if needs_fact(job):
            if verified == "not_applied":
                effect_state = Effect.NOT_APPLIED
            elif verified == "same_key":
                if job.effect != EffectMode.IDEMPOTENT:
                    raise ActionRefused(
                        "retrying under the same key is safe only for idempotent jobs"
                    )
            else:
                raise ActionRefused(
                    "retrying this job needs the fact you verified: not_applied, or same_key "
                    "for an idempotent job"
                )
        elif verified:
            raise ActionRefused(f"{verified} is a fact about an unknown outcome; this job has none")
        jt = registry.get(job.name)
        budget = jt.max_attempts if jt else tenure_settings().DEFAULT_MAX_ATTEMPTS
        return (
            states.OP_RETRY,
            {
                "run_at": DbNow(),
                "hinted_at": None,
                "finished_at": None,
                "next_kind": Kind.RUN.value,
                "max_attempts": F("attempts") + budget,
                # A cancel request an earlier attempt ignored does not follow the retry.
                "cancel_requested_at": None,
                "reason": f"retried by operator ({verified or 'failed job'})",
            },
            effect_state,
        )
    if action == "resolve":
        if verified != "applied":
            raise ActionRefused("resolving as succeeded needs verified=applied")
        return (
            states.OP_RESOLVE,
            {"finished_at": DbNow(), "reason": "resolved by operator: effect applied"},
            Effect.APPLIED,
        )
    if action == "give_up":
        applied = sorted(e.name for e in driver().applied_of_job(job.pk))
        if applied:
            raise ActionRefused(
                f"effect(s) {', '.join(applied)} of job {job.pk} were applied: failed would say "
                "they did not happen; resolve the job, or cancel it"
            )
        effect_state = ""
        if ending_needs_fact(job):
            if verified != "not_applied":
                raise ActionRefused(
                    "giving up a job whose effect outcome is unknown needs the fact you "
                    "verified: not_applied (failed says the effect did not happen)"
                )
            effect_state = Effect.NOT_APPLIED
        elif verified:
            raise ActionRefused(f"{verified} is a fact about an unknown outcome; this job has none")
        return (
            states.OP_GIVE_UP,
            {"finished_at": DbNow(), "reason": "operator gave up"},
            effect_state,
        )
    raise ActionRefused(f"unknown action {action!r}")


def _cancel_plan(job: Job, verified: str) -> tuple[states.Transition, dict[str, Any], str]:
    """Cancel: at once when no effect is in question; with the fact the operator verified
    about each effect of unknown outcome; else, for a waiting job, held indeterminate."""
    if not ending_needs_fact(job):
        if verified:
            raise ActionRefused(f"{verified} is a fact about an unknown outcome; this job has none")
        return states.OP_CANCEL, {"finished_at": DbNow(), "reason": "cancelled by operator"}, ""
    if verified in (Effect.APPLIED, Effect.NOT_APPLIED):
        outcome = "applied" if verified == Effect.APPLIED else "not applied"
        return (
            states.OP_CANCEL,
            {"finished_at": DbNow(), "reason": f"cancelled by operator (verified {outcome})"},
            verified,
        )
    if verified:
        raise ActionRefused("cancelling states applied or not_applied about the unknown effects")
    names = ", ".join(e.name for e in driver().unsettled_effects(job.pk))
    if job.state == states.State.WAITING:
        return (
            states.OP_HOLD,
            {
                "reason": f"cancel requested by operator, but effect(s) {names} may have "
                "happened: held for an operator to verify, then cancel"
            },
            "",
        )
    raise ActionRefused(
        f"effect(s) {names} of job {job.pk} may or may not have happened: cancelled would hide "
        "that. State the fact you verified for each (applied or not_applied) to cancel"
    )


BULK_ACTIONS = frozenset({"retry", "cancel"})
BULK_MAX = 1000
"""The most jobs one bulk action may change; a larger filter must be narrowed first."""


@dataclass(frozen=True, kw_only=True)
class BulkResult:
    """What a bulk operator action changed: one audited action per job."""

    action: str
    results: list[ActionResult]


def bulk_operator_action(
    jobs: Any, *, action: str, confirmed_count: int, actor: str, reason: str
) -> BulkResult:
    """Apply ``retry`` or ``cancel`` to every job ``jobs`` (a Job queryset) matches.

    All or nothing, in one transaction: the operator confirmed ``confirmed_count`` jobs, and a
    filter that now matches a different number raises :class:`ActionConflict`, as does any job
    that changes between listing and writing. Each job goes through :func:`operator_action`
    (state guard, version check, its own audit row). An indeterminate job is never retried in
    bulk: it needs the fact its own operator verified, so it is refused.
    """
    if action not in BULK_ACTIONS:
        raise ActionRefused(f"bulk action must be one of {sorted(BULK_ACTIONS)}")
    reason = check_reason(reason)
    d = driver()
    with d.atomic():
        matched = list(
            jobs.using(d.alias).order_by("id").values_list("id", "version")[: BULK_MAX + 1]
        )
        if len(matched) > BULK_MAX:
            raise ActionRefused(f"a bulk action changes at most {BULK_MAX} jobs; narrow the filter")
        if len(matched) != confirmed_count:
            raise ActionConflict(
                f"the filter now matches {len(matched)} jobs, not the {confirmed_count} "
                "confirmed; reload and decide again"
            )
        if not matched:
            raise ActionRefused("the filter matches no jobs")
        results = [
            operator_action(job_id, action=action, expected_version=v, actor=actor, reason=reason)
            for job_id, v in matched
        ]
    return BulkResult(action=action, results=results)
