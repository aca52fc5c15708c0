"""Operator actions on a whole workflow — cancel it, retry its failed steps — made of the
single-job actions of :mod:`scheduler_core.services.operator` (each guarded by its job's
state and version, each with its own audit row) plus one audit row for the workflow action,
all in one transaction: a conflict on any step changes nothing.

A cancel ends every waiting step ``cancelled`` and asks every running one to stop (the
cooperative cancel); a step whose effect outcome is unknown is left to its own verified fact.
A retry sends every failed step back to waiting (the steps their failure called off wait
again with them); an indeterminate step needs the fact its operator verified, so it is named,
not retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..domain import states
from ..domain.reasons import REASON_MAX_CHARS, check_reason
from ..exceptions import ActionConflict, ActionRefused
from ..models import AuditEntry, Job, Workflow
from ..storage.drivers import driver
from . import operator


@dataclass(frozen=True, kw_only=True)
class WorkflowActionResult:
    """What a workflow action did: the steps it moved (by job id, the single-job audit rows
    say how), those it left and why, and the workflow's own audit row."""

    workflow_id: int
    action: str
    moved: list[int] = field(default_factory=list)
    left: dict[int, str] = field(default_factory=dict)
    audit: AuditEntry | None = None


def _workflow(workflow_id: int) -> Workflow:
    row = Workflow.objects.using(driver().alias).filter(pk=workflow_id).first()
    if row is None:
        raise ActionRefused(f"workflow {workflow_id} does not exist")
    return row


def seen_versions(workflow_id: int) -> str:
    """The version of every step of a workflow, as one token: a page shows it, and the action
    it posts is refused as a conflict when any step changed since."""
    steps = Job.objects.using(driver().alias).filter(step__workflow_id=workflow_id)
    return ",".join(f"{pk}:{v}" for pk, v in steps.order_by("pk").values_list("pk", "version"))


def workflow_action(
    workflow_id: int, *, action: str, actor: str, reason: str, seen: str | None = None
) -> WorkflowActionResult:
    """``cancel`` or ``retry`` workflow ``workflow_id`` (see the module's docstring). Raises
    :class:`~scheduler_core.exceptions.ActionRefused` when there is nothing to do or no
    reason, :class:`~scheduler_core.exceptions.ActionConflict` when a step changed under it
    or since ``seen`` (:func:`seen_versions` of the page the operator decided on): nothing
    changes then."""
    reason = check_reason(reason)
    if action not in ("cancel", "retry"):
        raise ActionRefused(f"a workflow action is cancel or retry, not {action!r}")
    d = driver()
    with d.atomic():
        wf = _workflow(workflow_id)
        if seen is not None and seen != seen_versions(wf.pk):
            raise ActionConflict(
                f"a step of workflow {wf.pk} changed since the page was read; reload and "
                "decide again"
            )
        steps = d.workflow_steps(wf.pk)
        moved: list[int] = []
        left: dict[int, str] = {}
        # Running steps first (their cancel request changes no other step), then the rest in
        # the workflow's order; each is read again just before, since the one before may have
        # moved it (a cancel calls off the steps after it).
        order = sorted(steps, key=lambda s: (s.state != states.State.LEASED, s.job_id))
        for s in order:
            job = Job.objects.using(d.alias).filter(pk=s.job_id).first()
            if job is None:
                continue
            step_action = _step_action(job, action)
            if step_action is None:
                continue
            if isinstance(step_action, tuple):
                left[job.pk] = step_action[1]
                continue
            operator.operator_action(
                job.pk,
                action=step_action,
                expected_version=job.version,
                actor=actor,
                reason=_step_reason(wf.pk, action, reason),
            )
            moved.append(job.pk)
        if not moved:
            raise ActionRefused(
                f"workflow {wf.pk} has no step to {action}"
                + (f" ({'; '.join(f'job {j}: {w}' for j, w in left.items())})" if left else "")
            )
        audit = d.audit(
            job=None,
            actor=actor,
            action=f"workflow_{action}",
            reason=reason,
            detail={"workflow": wf.pk, "name": wf.name, "moved": moved, "left": left},
        )
    return WorkflowActionResult(
        workflow_id=wf.pk, action=action, moved=moved, left=left, audit=audit
    )


def _step_reason(workflow_id: int, action: str, reason: str) -> str:
    """A step's audit reason: the workflow action's, named; when the two no longer fit the
    limit together, a pointer to the workflow's audit entry, which keeps the reason whole
    (nothing is cut, and the operator is not refused a length they did not type)."""
    named = f"workflow {workflow_id} {action}: {reason}"
    if len(named) <= REASON_MAX_CHARS:
        return named
    return f"workflow {workflow_id} {action}: the reason is in the workflow's audit entry"


def _step_action(job: Job, action: str) -> str | tuple[None, str] | None:
    """The single-job action a workflow action means for one step: its name, ``(None, why)``
    for a step left to an operator's own decision, or None for a step it does not touch."""
    state = states.State(job.state)
    if action == "cancel":
        if state == states.State.LEASED:
            return None if job.cancel_requested_at is not None else "cancel_running"
        if state == states.State.WAITING:
            if operator.ending_needs_fact(job):
                return (None, "an effect of unknown outcome: cancel it with a verified fact")
            return "cancel"
        if state == states.State.INDETERMINATE:
            return (None, "indeterminate: resolve, retry or cancel it with a verified fact")
        return None
    if state == states.State.FAILED:
        if operator.needs_fact(job):
            return (None, "an effect of unknown outcome: retry it with a verified fact")
        return "retry"
    if state == states.State.INDETERMINATE:
        return (None, "indeterminate: retry it with the fact you verified (jobs retry)")
    return None
