"""The insert path of an enqueue: a validated job spec
(:class:`~scheduler_core.domain.options.JobOptions`) becomes a waiting job's rows through the
storage driver, joining the caller's transaction, and once it commits, the job's wake-ups —
the database's own notification to listening executors and, where a live consumer of the
configured transport takes its queue, a broker hint. A hint lost between commit and publish
is re-sent by the dispatcher, so a job never depends on its message. Once it commits, too,
``job_enqueued`` is sent (:mod:`scheduler_core.signals`); with tracing on, the enqueue has its
span and the job stores that span's context (:mod:`scheduler_core.tracing`).

Validation is :mod:`scheduler_core.api.registry`'s; this module trusts its callers (the
registry and schedule firing) to have done it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

import scheduler_core.signals as signals
import scheduler_core.tracing as tracing

from ..domain.options import JobOptions
from ..models import Job
from ..storage.drivers import driver
from ..storage.workflows import NewStep
from . import hints


def insert_job(
    options: JobOptions,
    *,
    unique_key: str | None = None,
    schedule_id: int | None = None,
    sender: Any = None,
) -> Job:
    """Insert a waiting job of the spec ``options`` in the caller's transaction; a known
    ``unique_key`` returns the job already accepted under it (nothing written, no wake-up).
    ``sender`` is the job's type, the sender of ``job_enqueued``; ``schedule_id`` the schedule
    whose occurrence it is."""
    span, trace_context = tracing.start_enqueue(options.name, options.queue)
    options = replace(options, trace_context=trace_context)
    try:
        job, new = _insert_one(options, unique_key=unique_key, schedule_id=schedule_id)
    except BaseException as e:
        tracing.end_enqueue(span, [], e)
        raise
    tracing.end_enqueue(span, [job.pk])
    if new:
        told = Enqueued(sender, job.pk, options.name, options.queue, options.priority, unique_key)
        _announce_at_commit(driver(), [told])
    return job


@dataclass(frozen=True)
class Enqueued:
    """One job accepted by an enqueue, as ``job_enqueued`` tells it (``sender``: its type)."""

    sender: Any
    job_id: int
    name: str
    queue: str
    priority: int
    unique_key: str | None = None


def _announce_at_commit(d: Any, jobs: Sequence[Enqueued]) -> None:
    """Send ``job_enqueued`` for each of ``jobs`` once the enqueue's transaction commits (never
    when it rolls back); nothing is registered while no receiver is connected."""
    if not jobs or not signals.job_enqueued.receivers:
        return

    def announce() -> None:
        for j in jobs:
            signals.send(
                signals.job_enqueued,
                j.sender,
                job_id=j.job_id,
                name=j.name,
                queue=j.queue,
                priority=j.priority,
                unique_key=j.unique_key,
            )

    d.on_commit(announce)


def _insert_one(
    options: JobOptions, *, unique_key: str | None, schedule_id: int | None
) -> tuple[Job, bool]:
    """The insert and its wake-ups; the job and whether it is new."""
    d = driver()
    queue = options.queue
    due_now = options.run_at is None or options.run_at <= timezone.now()
    hint = due_now and hints.uses_broker(queue)
    while True:
        job = d.insert_job(options, unique_key=unique_key, schedule_id=schedule_id, hinted=hint)
        if job is not None:
            break
        existing = Job.objects.using(d.alias).filter(unique_key=unique_key).first()
        if existing is not None:
            return existing, False
        # Accepted once and pruned since: accept it anew.
    d.notify(queue, options.priority, job.run_at)
    if hint:
        job_id = job.pk

        def publish() -> None:
            hints.publish(job_id, queue)

        d.on_commit(publish)
    return job, True


class TypePolicy(Protocol):
    """What an insert takes from a job type (:class:`scheduler_core.api.registry.JobType`):
    its name, and the job spec it makes with per-call options."""

    @property
    def name(self) -> str: ...

    def options(
        self,
        *,
        payload: dict[str, Any] | None = None,
        queue: str | None = None,
        priority: int = 0,
        run_at: datetime | None = None,
    ) -> JobOptions: ...


def insert_job_of(
    jt: TypePolicy,
    *,
    payload: dict[str, Any],
    run_at: datetime | None,
    unique_key: str | None,
    priority: int = 0,
    queue: str | None = None,
    schedule_id: int | None = None,
) -> Job:
    """:func:`insert_job` with the job spec ``jt`` makes (its own policy, and its queue unless
    ``queue`` names another), for an enqueue by name and a schedule's occurrences alike."""
    return insert_job(
        jt.options(payload=payload, queue=queue, priority=priority, run_at=run_at),
        unique_key=unique_key,
        schedule_id=schedule_id,
        sender=jt,
    )


def insert_jobs(
    options: JobOptions, payloads: Sequence[dict[str, Any]], *, sender: Any = None
) -> list[int]:
    """Insert many waiting jobs of the spec ``options``, one per payload, in one statement, in
    the caller's transaction, and return their ids (in payload order). No unique keys: a job
    that must be accepted once goes through :func:`insert_job`. Due jobs get one wake-up for
    the whole batch and, on a broker transport, one hint per job after commit."""
    if not payloads:
        return []
    name, queue, priority = options.name, options.queue, options.priority
    span, trace_context = tracing.start_enqueue(name, queue)
    options = replace(options, payload={}, trace_context=trace_context)
    d = driver()
    due_now = options.run_at is None or options.run_at <= timezone.now()
    hint = due_now and hints.uses_broker(queue)
    try:
        with d.atomic():
            rows = d.insert_jobs(options, payloads, hinted=hint)
            ids = [job_id for job_id, _ in rows]
            d.notify(queue, priority, min(at for _, at in rows))
            if hint:

                def publish_all() -> None:
                    for job_id in ids:
                        hints.publish(job_id, queue)

                d.on_commit(publish_all)
            _announce_at_commit(d, [Enqueued(sender, i, name, queue, priority) for i in ids])
    except BaseException as e:
        tracing.end_enqueue(span, [], e)
        raise
    tracing.end_enqueue(span, ids)
    return ids


@dataclass(frozen=True, kw_only=True)
class PlannedStep:
    """One validated step of a workflow to insert (:mod:`scheduler_core.api.workflow`)."""

    jt: TypePolicy
    name: str
    payload: dict[str, Any]
    parents: tuple[int, ...]
    """Indexes of earlier steps."""
    queue: str
    priority: int


def insert_workflow(
    *, name: str, unique_key: str | None, on_failure: str, steps: Sequence[PlannedStep]
) -> tuple[int, bool, dict[str, int]]:
    """Insert a workflow, one job per step and the edges between them in the caller's
    transaction; return its id, whether it was written (False: ``unique_key`` was taken, and
    the workflow holding it is returned, nothing written) and its jobs by step name.

    Steps without parents are due at once and woken as any enqueue; the others are inserted
    not due (:data:`~scheduler_core.domain.workflows.BLOCKED_AT`) until their last parent's
    fenced completion makes them due."""
    d = driver()
    # One enqueue span for the whole workflow; every step stores its context, so each step's
    # attempts are children of it as a single job's are of its enqueue.
    span, trace_context = tracing.start_enqueue(name, steps[0].queue if steps else "")
    try:
        wid, created, jobs = _insert_workflow(d, name, unique_key, on_failure, steps, trace_context)
    except BaseException as e:
        tracing.end_enqueue(span, [], e)
        raise
    tracing.end_enqueue(span, list(jobs.values()) if created else [])
    return wid, created, jobs


def _insert_workflow(
    d: Any,
    name: str,
    unique_key: str | None,
    on_failure: str,
    steps: Sequence[PlannedStep],
    trace_context: dict[str, str] | None,
) -> tuple[int, bool, dict[str, int]]:
    # No savepoint (two round trips), as a single job's insert: an error inside ends the
    # caller's transaction, which then writes nothing.
    with d.atomic(savepoint=False):
        row, created = d.insert_workflow(name=name, unique_key=unique_key, on_failure=on_failure)
        if not created:
            return row.pk, False, d.workflow_jobs(row.pk)
        ids = d.insert_workflow_jobs(
            row.pk,
            [
                NewStep(
                    options=p.jt.options(payload=p.payload, queue=p.queue, priority=p.priority),
                    hinted=not p.parents and hints.uses_broker(p.queue),
                    name=p.name,
                    parents=p.parents,
                )
                for p in steps
            ],
            trace_context=trace_context,
        )
        roots = [(ids[i], p.queue, p.priority) for i, p in enumerate(steps) if not p.parents]
        now = timezone.now()
        for queue, priority in sorted({(q, pr) for _, q, pr in roots}):
            d.notify(queue, priority, now)
        hinted = [(job_id, q) for job_id, q, _ in roots if hints.uses_broker(q)]
        if hinted:

            def publish() -> None:
                for job_id, q in hinted:
                    hints.publish(job_id, q)

            d.on_commit(publish)
        # Each step is a job enqueued, told once the workflow's transaction commits.
        _announce_at_commit(
            d, [Enqueued(p.jt, ids[i], p.jt.name, p.queue, p.priority) for i, p in enumerate(steps)]
        )
    return row.pk, True, {p.name: ids[i] for i, p in enumerate(steps)}
