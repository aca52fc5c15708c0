"""Workflows in the store: the insert of a workflow with its steps and edges, and what a step's
end does to the others, written in the transaction of that end — a success makes due the
children whose last parent it was, a failure or cancel ends the steps it calls off
``cancelled``, an unknown outcome holds its children, an operator's retry undoes the hold or
the cancel it caused. Also the reads the runtime and the console need (parents' results,
a workflow's steps and edges, held steps).

Every write here runs inside a transaction that already wrote the step's own end under its
guard (fence for an attempt, version for an operator): a refused end writes nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, JSONField, OuterRef, Q, Subquery

from ..domain import states
from ..domain import workflows as rules
from ..domain.options import JobOptions
from ..models import Attempt, Job, Workflow, WorkflowEdge, WorkflowStep
from .clock import DbNow, to_datetime
from .records import Holds

DueListener = Callable[[Sequence[tuple[int, str]]], None]

_DUE_LISTENERS: list[DueListener] = []


def on_steps_due(listener: DueListener) -> None:
    """Call ``listener`` with ``(job id, queue)`` of the steps a transaction made due, once it
    commits (the broker hints' module registers one, so a released step's wake-up needs no
    dispatcher round)."""
    if listener not in _DUE_LISTENERS:
        _DUE_LISTENERS.append(listener)


@dataclass(frozen=True, kw_only=True)
class NewStep:
    """One step of a workflow to insert: its job's spec, its step name and its parents
    (indexes of earlier steps in the same list)."""

    options: JobOptions
    """The step's job spec (its ``name`` the job type); the insert sets its workflow, its
    trace context and, for a step with parents, its due time."""
    hinted: bool
    """Whether a broker hint will be published for it (only a step without parents)."""
    name: str
    parents: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StepRow:
    """One step as the console and ``manage.py workflows`` show it."""

    job_id: int
    name: str
    state: str
    pending: int
    reason: str
    blocked: bool
    """Waiting on its parents (not yet due)."""
    held: bool
    """Blocked with a parent whose outcome is unknown (indeterminate)."""
    parents: tuple[int, ...]


def _blocked() -> Holds:
    """A step blocked on its parents, as a condition no partial index's predicate matches
    (read by key, never through the claim index's waiting entries)."""
    return Holds(Q(state=states.State.WAITING, run_at=rules.BLOCKED_AT))


class WorkflowOps:
    """The workflow writes and reads of a driver (mixed into
    :class:`~scheduler_core.storage.core.DriverCore`, which provides these attributes)."""

    alias: str
    now_sql: str

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        raise NotImplementedError

    def on_commit(self, fn: Callable[[], None]) -> None:
        raise NotImplementedError

    def insert_jobs(
        self, options: JobOptions, payloads: Sequence[dict[str, Any]], *, hinted: bool = False
    ) -> list[tuple[int, datetime]]:
        raise NotImplementedError

    # -- enqueue ---------------------------------------------------------------------------

    def insert_workflow(
        self, *, name: str, unique_key: str | None, on_failure: str
    ) -> tuple[Workflow, bool]:
        """Insert a workflow row in the caller's transaction; with a ``unique_key`` already
        taken, the workflow holding it and False (nothing written). A new row's ``created_at``
        is the database's clock, not read back (its callers need its id)."""
        row = Workflow(name=name, unique_key=unique_key, on_failure=on_failure, created_at=DbNow())
        if unique_key is None:
            # Nothing to conflict with: no savepoint (two round trips) around the insert.
            row.save(using=self.alias, force_insert=True)
            return row, True
        found = Workflow.objects.using(self.alias).filter(unique_key=unique_key).first()
        if found is not None:
            return found, False
        try:
            with transaction.atomic(using=self.alias):
                row.save(using=self.alias, force_insert=True)
        except IntegrityError:
            if unique_key is None:
                raise
            found = Workflow.objects.using(self.alias).filter(unique_key=unique_key).first()
            if found is None:
                raise
            return found, False
        return row, True

    def insert_workflow_jobs(
        self,
        workflow_id: int,
        steps: Sequence[NewStep],
        *,
        trace_context: dict[str, str] | None = None,
    ) -> list[int]:
        """One job per step, the step rows and the edges of workflow ``workflow_id``, in the
        caller's transaction; the job ids in step order. ``trace_context``: the workflow's
        enqueue span, stored with every step. A step with parents is inserted
        waiting but not due (:data:`~scheduler_core.domain.workflows.BLOCKED_AT`). Here one
        insert per group of steps alike (type, queue, priority, blocked or not), then the
        step rows and edges; PostgreSQL's driver writes it all in one statement."""
        groups: dict[tuple[str, str, int, bool], list[int]] = {}
        for i, p in enumerate(steps):
            o = p.options
            groups.setdefault((o.name, o.queue, o.priority, bool(p.parents)), []).append(i)
        ids: list[int] = [0] * len(steps)
        for (_, _, _, blocked), members in groups.items():
            first = steps[members[0]]
            rows = self.insert_jobs(
                replace(
                    first.options,
                    run_at=rules.BLOCKED_AT if blocked else None,
                    payload={},
                    workflow_id=workflow_id,
                    trace_context=trace_context,
                ),
                [steps[i].options.payload for i in members],
                hinted=first.hinted,
            )
            for i, (job_id, _) in zip(members, rows, strict=True):
                ids[i] = job_id
        self.insert_steps(
            workflow_id,
            [(ids[i], p.name, len(p.parents)) for i, p in enumerate(steps)],
            [(ids[parent], ids[i]) for i, p in enumerate(steps) for parent in p.parents],
        )
        return ids

    def insert_steps(
        self,
        workflow_id: int,
        steps: Sequence[tuple[int, str, int]],
        edges: Iterable[tuple[int, int]],
    ) -> None:
        """The step rows (``(job id, name, parents)``) and edges (``(parent, child)`` job ids)
        of jobs just inserted, in the caller's transaction."""
        WorkflowStep.objects.using(self.alias).bulk_create(
            [
                WorkflowStep(job_id=job_id, workflow_id=workflow_id, name=name, pending=pending)
                for job_id, name, pending in steps
            ]
        )
        WorkflowEdge.objects.using(self.alias).bulk_create(
            [WorkflowEdge(workflow_id=workflow_id, parent_id=p, child_id=c) for p, c in edges]
        )
        blocked = [j for j, _, n in steps if n > 0]
        if blocked:
            Job.objects.using(self.alias).filter(pk__in=blocked).update(
                reason=rules.WAITING_FOR_PARENTS
            )

    def workflow_jobs(self, workflow_id: int) -> dict[str, int]:
        """``{step name: job id}`` of a workflow."""
        return dict(
            WorkflowStep.objects.using(self.alias)
            .filter(workflow_id=workflow_id)
            .values_list("name", "job_id")
        )

    # -- a step's end ----------------------------------------------------------------------

    def steps_succeeded(self, job_ids: Sequence[int]) -> list[int]:
        """*Vendor.* Steps ``job_ids`` just succeeded (in this transaction): each child's count
        of parents yet to succeed goes down, and the children it reaches zero for become due
        now (:meth:`_announce_due`). Returns the ids of the children made due."""
        raise NotImplementedError

    def _announce_due(self, rows: Sequence[Sequence[Any]]) -> list[int]:
        """Steps made due (rows of ``id, queue, priority, run_at``): listening executors are
        told once the transaction commits; their ids, sorted."""
        if not rows:
            return []
        due_at = to_datetime(rows[0][3])
        for queue, priority in sorted({(q, p) for _, q, p, _ in rows}):
            self.notify(queue, priority, due_at)
        if _DUE_LISTENERS:
            due = [(int(job_id), queue) for job_id, queue, _, _ in rows]

            def tell() -> None:
                for listener in list(_DUE_LISTENERS):
                    listener(due)

            self.on_commit(tell)
        return sorted(int(r[0]) for r in rows)

    def step_ended(self, job_id: int, state: str) -> list[int]:
        """Step ``job_id`` just entered ``state`` (in this transaction): move the others as
        its workflow says. Returns the ids of the steps it changed."""
        state = states.State(state)
        if state == states.State.SUCCEEDED:
            return self.steps_succeeded([job_id])
        if state in (states.State.FAILED, states.State.CANCELLED):
            return self._call_off(job_id, state)
        if state == states.State.INDETERMINATE:
            return self._hold(job_id)
        if state == states.State.WAITING:
            return self._unhold(job_id)
        return []

    def _step(self, job_id: int) -> WorkflowStep | None:
        return (
            WorkflowStep.objects.using(self.alias)
            .select_related("workflow")
            .filter(job_id=job_id)
            .first()
        )

    def descendants(self, job_id: int) -> list[int]:
        """Every step that comes after ``job_id``, directly or not."""
        found: set[int] = set()
        frontier = [job_id]
        while frontier:
            nxt = set(
                WorkflowEdge.objects.using(self.alias)
                .filter(parent_id__in=frontier)
                .values_list("child_id", flat=True)
            )
            frontier = sorted(nxt - found)
            found |= nxt
        return sorted(found)

    def _call_off(self, job_id: int, state: str) -> list[int]:
        """A step failed or was cancelled: its dependents (``continue``) or every step of the
        workflow not yet run (``cancel``) end cancelled, naming it. A step already claimed
        once is left to end on its own: only steps never run are called off."""
        step = self._step(job_id)
        if step is None:
            return []
        if step.workflow.on_failure == rules.CONTINUE:
            targets = self.descendants(job_id)
        else:
            targets = list(
                WorkflowStep.objects.using(self.alias)
                .filter(workflow_id=step.workflow_id)
                .exclude(job_id=job_id)
                .values_list("job_id", flat=True)
            )
        if not targets:
            return []
        never_run = Holds(Q(state__in=list(states.UPSTREAM_CANCEL.sources), fence=0))
        qs = Job.objects.using(self.alias).filter(never_run, pk__in=targets)
        ids = sorted(qs.values_list("pk", flat=True))
        if not ids:
            return []
        Job.objects.using(self.alias).filter(never_run, pk__in=ids).update(
            state=states.UPSTREAM_CANCEL.target,
            updated_at=DbNow(),
            finished_at=DbNow(),
            version=F("version") + 1,
            reason=rules.upstream_reason(step.name, state),
        )
        WorkflowStep.objects.using(self.alias).filter(job_id__in=ids).update(cancelled_by=job_id)
        return ids

    def _hold(self, job_id: int) -> list[int]:
        """A step's outcome is unknown: its blocked children say they are held by it."""
        step = self._step(job_id)
        if step is None:
            return []
        children = self._blocked_children(job_id)
        Job.objects.using(self.alias).filter(pk__in=children).update(
            reason=rules.held_reason(step.name)
        )
        return children

    def operator_moved_step(self, job_id: int, state: str) -> list[int]:
        """An operator's action moved step ``job_id`` to ``state`` (in this transaction, after
        its version-checked write): a retry or a resolve first makes the steps its end called
        off wait again, then the others move as after any end."""
        if not WorkflowStep.objects.using(self.alias).filter(job_id=job_id).exists():
            return []
        state = states.State(state)
        reopened = []
        if state in (states.State.WAITING, states.State.SUCCEEDED):
            reopened = self._reopen(job_id)
        return sorted(set(reopened + self.step_ended(job_id, state)))

    def _unhold(self, job_id: int) -> list[int]:
        """An operator sent a failed or indeterminate step back to waiting: its children are
        no longer held by it."""
        step = self._step(job_id)
        if step is None:
            return []
        children = self._blocked_children(job_id)
        Job.objects.using(self.alias).filter(pk__in=children).update(
            reason=rules.WAITING_FOR_PARENTS
        )
        return children

    def _reopen(self, job_id: int) -> list[int]:
        """The steps that step ``job_id``'s failure or cancel called off wait again."""
        reopened = list(
            WorkflowStep.objects.using(self.alias)
            .filter(cancelled_by=job_id, job__state__in=list(states.UPSTREAM_RETRY.sources))
            .values_list("job_id", "pending")
        )
        for pending in sorted({p for _, p in reopened}):
            ids = [j for j, p in reopened if p == pending]
            Job.objects.using(self.alias).filter(
                pk__in=ids, state__in=list(states.UPSTREAM_RETRY.sources)
            ).update(
                state=states.UPSTREAM_RETRY.target,
                run_at=rules.BLOCKED_AT if pending > 0 else DbNow(),
                hinted_at=None,
                finished_at=None,
                updated_at=DbNow(),
                version=F("version") + 1,
                reason=rules.WAITING_FOR_PARENTS if pending > 0 else "",
            )
        ids = [j for j, _ in reopened]
        WorkflowStep.objects.using(self.alias).filter(job_id__in=ids).update(cancelled_by=None)
        return sorted(ids)

    def _blocked_children(self, job_id: int) -> list[int]:
        kids = WorkflowEdge.objects.using(self.alias).filter(parent_id=job_id).values("child_id")
        return sorted(
            Job.objects.using(self.alias)
            .filter(_blocked(), pk__in=kids)
            .values_list("pk", flat=True)
        )

    # -- retention -------------------------------------------------------------------------

    def unfinished_children(self, job: Any) -> Any:
        """The edges from ``job`` (a value or ``OuterRef``) to a child still waiting or leased:
        retention keeps such a parent, whose result the child has yet to read."""
        return WorkflowEdge.objects.using(self.alias).filter(
            parent_id=job,
            child_id__in=Job.objects.using(self.alias)
            .filter(state__in=[states.State.WAITING, states.State.LEASED])
            .values("pk"),
        )

    def forget_steps(self, job_ids: Sequence[int]) -> None:
        """Retention deletes jobs ``job_ids``: their step rows and edges go with them."""
        WorkflowStep.objects.using(self.alias).filter(job_id__in=list(job_ids)).delete()
        WorkflowEdge.objects.using(self.alias).filter(parent_id__in=list(job_ids)).delete()
        WorkflowEdge.objects.using(self.alias).filter(child_id__in=list(job_ids)).delete()

    # -- reads -----------------------------------------------------------------------------

    def parent_results(self, job_id: int) -> dict[str, Any]:
        """``{parent step name: its return value}`` for step ``job_id``, in one query: each
        parent's value is its accepted attempt's, as :meth:`JobQuerySet.results` reads it."""
        value = (
            Attempt.objects.using(self.alias)
            .filter(job_id=OuterRef("job_id"), outcome="succeeded")
            .order_by("-fence")
            .values("return_value")[:1]
        )
        parents = WorkflowEdge.objects.using(self.alias).filter(child_id=job_id).values("parent_id")
        rows = (
            WorkflowStep.objects.using(self.alias)
            .filter(job_id__in=parents)
            .annotate(value=Subquery(value, output_field=JSONField()))
            .values_list("name", "value")
        )
        return dict(rows)

    def workflow_steps(self, workflow_id: int) -> list[StepRow]:
        """Every step of a workflow with its state and parents, in insert order."""
        steps = list(
            WorkflowStep.objects.using(self.alias)
            .filter(workflow_id=workflow_id)
            .select_related("job")
            .order_by("job_id")
        )
        parents: dict[int, list[int]] = {}
        for p, c in (
            WorkflowEdge.objects.using(self.alias)
            .filter(workflow_id=workflow_id)
            .values_list("parent_id", "child_id")
        ):
            parents.setdefault(c, []).append(p)
        state_of = {s.job_id: s.job.state for s in steps}
        rows = []
        for s in steps:
            blocked = s.job.state == states.State.WAITING and s.job.run_at >= rules.BLOCKED_AT
            ps = tuple(sorted(parents.get(s.job_id, [])))
            held = blocked and any(state_of.get(p) == states.State.INDETERMINATE for p in ps)
            rows.append(
                StepRow(
                    job_id=s.job_id,
                    name=s.name,
                    state=s.job.state,
                    pending=s.pending,
                    reason=s.job.reason,
                    blocked=blocked,
                    held=held,
                    parents=ps,
                )
            )
        return rows

    def held_steps(self) -> int:
        """Blocked steps with a parent whose outcome is unknown (indeterminate)."""
        parents = Job.objects.using(self.alias).filter(state=states.State.INDETERMINATE)
        kids = WorkflowEdge.objects.using(self.alias).filter(parent_id__in=parents.values("pk"))
        return (
            Job.objects.using(self.alias)
            .filter(
                pk__in=kids.values("child_id"),
                state=states.State.WAITING,
                run_at=rules.BLOCKED_AT,
            )
            .count()
        )
