"""Operator actions — retry, cancel, resolve, give up — on one job or in bulk: the dashboard's
and the command line's only way to change a job.

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
) -> ActionResult:
    """Apply an operator's ``retry``, ``cancel``, ``resolve`` or ``give_up`` to one job.

    Conditioned on the job still having ``expected_version`` and a state the action may leave;
    otherwise :class:`ActionConflict` (nothing changes). The state change, the facts recorded
    in the ledger and the audit row commit together.

    Retrying or resolving a job that :func:`needs_fact` needs ``verified`` to name the fact
    the operator checked: ``not_applied`` or ``same_key`` (idempotent jobs only) for a retry,
    ``applied`` for a resolve. A fact applies to the effects ``effects`` names (by effect
    name), never to every effect of the job: with one unsettled effect it may be left out;
    with several, each one verified is named. A resolve must cover every unsettled effect.

    A ``not_applied`` retry is refused while an earlier owner may still be in flight
    (:meth:`~scheduler_core.storage.base.Driver.in_flight_owners`) unless ``accept_in_flight`` says the operator accepts it: that
    owner, paused between its check and its send, would send when it resumes, and only a
    destination that checks the fencing token would refuse it.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ActionRefused("a reason is required")
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
            an = "an" if job.state[:1] in "aeiou" else "a"
            raise ActionRefused(f"{action} does not apply to {an} {job.state} job")
        named = _facts_about(job, action, effect_state, effects)
        owners = d.in_flight_owners(job_id)
        if effect_state == Effect.NOT_APPLIED and owners and not accept_in_flight:
            who = ", ".join(f"{o.executor} (attempt {o.attempt}, fence {o.fence})" for o in owners)
            raise ActionRefused(
                f"an earlier owner may still be in flight: {who}. Its lease ran out and it is "
                "not known to have stopped; paused between its check and its send, it sends "
                "when it resumes, and only a destination that checks the fencing token refuses "
                "it. Confirm that you accept this (or that the process is gone) to retry."
            )
        if not d.operator_transition(
            job_id, expected_version=expected_version, transition=t, fields=fields
        ):
            raise ActionConflict(
                f"job {job_id} changed since version {expected_version}; reload and decide again"
            )
        for row in named:
            d.record_operator_fact(row, effect_state=effect_state, actor=actor, reason=reason)
        before = job.state
        job.refresh_from_db()
        audit = d.audit(
            job=job,
            actor=actor,
            action=action,
            reason=reason[:4000],
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
            },
        )
    return ActionResult(job=job, audit=audit)


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
    if action == "resolve" and left:
        raise ActionRefused(
            f"effect(s) {', '.join(left)} would stay unknown in a succeeded job: verify them too"
        )
    return named


def _operator_plan(
    job: Job, action: str, verified: str
) -> tuple[states.Transition, dict[str, Any], str]:
    """Which transition an action means for this job, its extra fields, and the effect
    outcome the operator's fact records."""
    state = states.State(job.state)
    if state == states.State.LEASED:
        raise ActionRefused("a leased job cannot be retried, resolved or cancelled")
    if action == "cancel":
        return states.OP_CANCEL, {"finished_at": DbNow(), "reason": "cancelled by operator"}, ""
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
        return (
            states.OP_GIVE_UP,
            {"finished_at": DbNow(), "reason": "operator gave up"},
            "",
        )
    raise ActionRefused(f"unknown action {action!r}")


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
    if not (reason or "").strip():
        raise ActionRefused("a reason is required")
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
