"""Workflows: steps that are ordinary jobs, each run only after every step it comes after has
succeeded. ``workflow(...)`` starts a description, ``.step()`` and ``.map()`` add steps, and
``.enqueue()`` writes the workflow, its jobs and their edges in the caller's transaction::

    from scheduler_core import workflow

    wf = workflow("order.fulfil", unique_key="order-7")
    a = wf.step(charge, invoice_id=7, cents=500)
    b = wf.step(ship, after=[a], order=7)
    c = wf.step(email, after=[a], order=7)
    wf.step(close, after=[b, c], order=7)
    wf.enqueue()

A step with parents is inserted waiting but not due (:data:`~scheduler_core.domain.workflows
.BLOCKED_AT`); the fenced completion of its last parent makes it due in the same transaction
(:mod:`scheduler_core.storage.workflows`). Validation happens before anything is written: a
bad step raises :class:`~scheduler_core.exceptions.EnqueueError` and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..domain import workflows as rules
from ..exceptions import EnqueueError, UnknownJob
from . import registry

__all__ = ["Step", "WorkflowBuilder", "WorkflowRun", "workflow"]


@dataclass(frozen=True)
class Step:
    """A step of a workflow being described: pass it in another step's ``after``."""

    builder: WorkflowBuilder = field(repr=False, compare=False)
    index: int
    name: str


@dataclass(frozen=True, kw_only=True)
class WorkflowRun:
    """An enqueued workflow: its id, whether this call wrote it (False: its ``unique_key`` was
    taken, and this is the workflow that took it), and its jobs by step name."""

    id: int
    created: bool
    jobs: dict[str, int]


@dataclass
class _Planned:
    jt: registry.JobType
    name: str
    payload: dict[str, Any]
    parents: tuple[int, ...]
    queue: str | None
    priority: int


class WorkflowBuilder:
    """A workflow being described (see :func:`workflow`)."""

    def __init__(self, name: str, *, unique_key: str | None, on_failure: str) -> None:
        if not isinstance(name, str) or not name or len(name) > 200 or "\x00" in name:
            raise EnqueueError("a workflow name is a string of 1 to 200 characters")
        if on_failure not in rules.ON_FAILURE:
            raise EnqueueError(
                f"on_failure must be one of {', '.join(rules.ON_FAILURE)}, not {on_failure!r}"
            )
        if unique_key is not None and (
            not isinstance(unique_key, str)
            or not unique_key
            or len(unique_key) > 300
            or "\x00" in unique_key
        ):
            raise EnqueueError("unique_key must be a non-empty string of at most 300 characters")
        self.name = name
        self.unique_key = unique_key
        self.on_failure = on_failure
        self._steps: list[_Planned] = []
        self._enqueued: WorkflowRun | None = None

    def step(
        self,
        job_type: registry.JobType | str,
        *,
        after: Iterable[Step] = (),
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        **payload: Any,
    ) -> Step:
        """Add a step: one job of ``job_type`` with ``payload``, run after every step in
        ``after`` has succeeded. Its name (the key of ``ctx.parent_results`` in its children)
        is the job type's name unless ``name`` gives one; two steps of one type need names."""
        jt = self._type(job_type)
        parents = self._parents(after)
        payload = registry.validate_payload(jt, payload)
        if queue is not None and (not isinstance(queue, str) or not queue or len(queue) > 100):
            raise EnqueueError("queue must be a non-empty string of at most 100 characters")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise EnqueueError("priority must be an integer in -1000..1000")
        if not -1000 <= priority <= 1000:
            raise EnqueueError("priority must be an integer in -1000..1000")
        step_name = jt.name if name is None else name
        if any(p.name == step_name for p in self._steps):
            raise EnqueueError(
                f"two steps are named {step_name!r}: give one a name of its own (name=...)"
            )
        self._steps.append(_Planned(jt, step_name, payload, parents, queue, priority))
        return Step(self, len(self._steps) - 1, step_name)

    def map(
        self,
        job_type: registry.JobType | str,
        items: Iterable[dict[str, Any]],
        *,
        after: Iterable[Step] = (),
        name: str | None = None,
    ) -> list[Step]:
        """Add one step per item (each a payload), all after ``after`` and parallel to each
        other; named ``<name>[0]``, ``<name>[1]``... (``name`` defaults to the type's)."""
        jt = self._type(job_type)
        base = jt.name if name is None else name
        after = list(after)
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise EnqueueError(f"map item {i} is not a payload (a dict of keyword arguments)")
            out.append(self.step(jt, after=after, name=f"{base}[{i}]", **item))
        return out

    def _type(self, job_type: registry.JobType | str) -> registry.JobType:
        if self._enqueued is not None:
            raise EnqueueError("this workflow was enqueued already; describe a new one")
        name = job_type.name if isinstance(job_type, registry.JobType) else job_type
        jt = registry.get(name) if isinstance(name, str) else None
        if jt is None:
            raise UnknownJob(f"no job is registered as {name!r}")
        return jt

    def _parents(self, after: Iterable[Step]) -> tuple[int, ...]:
        if isinstance(after, Step):
            after = [after]
        out = []
        for p in after:
            if not isinstance(p, Step) or p.builder is not self:
                raise EnqueueError("after= takes steps of this same workflow")
            out.append(p.index)
        return tuple(sorted(set(out)))

    def enqueue(self) -> WorkflowRun:
        """Write the workflow, one job per step and the edges between them, in the caller's
        transaction (one of its own otherwise). Steps without parents are due at once; the
        others wait for their parents. A ``unique_key`` already taken writes nothing and returns
        the workflow that took it (``created`` False)."""
        try:
            rules.check_shape(
                [p.name for p in self._steps], {i: p.parents for i, p in enumerate(self._steps)}
            )
        except rules.ShapeError as e:
            raise EnqueueError(str(e)) from None
        from . import enqueue as insert

        wid, created, jobs = insert.insert_workflow(
            name=self.name,
            unique_key=self.unique_key,
            on_failure=self.on_failure,
            steps=[
                insert.PlannedStep(
                    jt=p.jt,
                    name=p.name,
                    payload=p.payload,
                    parents=p.parents,
                    queue=p.jt.queue if p.queue is None else p.queue,
                    priority=p.priority,
                )
                for p in self._steps
            ],
        )
        run = WorkflowRun(id=wid, created=created, jobs=jobs)
        self._enqueued = run
        return run


def workflow(
    name: str, *, unique_key: str | None = None, on_failure: str = rules.CANCEL
) -> WorkflowBuilder:
    """Describe a workflow named ``name``. ``unique_key`` makes its enqueue happen once, like a
    job's. ``on_failure``: ``"cancel"`` (default) ends every step not yet run ``cancelled``
    when a step fails; ``"continue"`` ends only that step's dependents and runs the rest."""
    return WorkflowBuilder(name, unique_key=unique_key, on_failure=on_failure)
