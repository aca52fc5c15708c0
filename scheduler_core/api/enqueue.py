"""The insert path of an enqueue: validated fields become a waiting job's row through the
storage driver, joining the caller's transaction, and once it commits, the job's wake-ups —
the database's own notification to listening executors and, where a live consumer of the
configured transport takes its queue, a broker hint. A hint lost between commit and publish
is re-sent by the dispatcher, so a job never depends on its message.

Validation is :mod:`scheduler_core.api.registry`'s; this module trusts its callers (the
registry and schedule firing) to have done it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

from ..models import Job
from ..storage.drivers import driver
from . import hints


def insert_job(
    *,
    name: str,
    queue: str,
    payload: dict[str, Any],
    priority: int,
    run_at: datetime | None,
    max_attempts: int,
    lease_seconds: int,
    unique_key: str | None,
    effect: str,
    timeout_seconds: float,
    schedule_id: int | None = None,
) -> Job:
    """Insert a waiting job in the caller's transaction; a known ``unique_key`` returns the
    job already accepted under it (nothing written, no wake-up)."""
    d = driver()
    due_now = run_at is None or run_at <= timezone.now()
    hint = due_now and hints.uses_broker(queue)
    fields: dict[str, Any] = {
        "name": name,
        "queue": queue,
        "payload": payload,
        "priority": priority,
        "run_at": run_at,
        "max_attempts": max_attempts,
        "lease_seconds": lease_seconds,
        "timeout_seconds": timeout_seconds,
        "unique_key": unique_key,
        "effect": effect,
        "schedule_id": schedule_id,
        "hinted": hint,
    }
    while True:
        job = d.insert_job(fields)
        if job is not None:
            break
        existing = Job.objects.using(d.alias).filter(unique_key=unique_key).first()
        if existing is not None:
            return existing
        # Accepted once and pruned since: accept it anew.
    d.notify(queue, priority, job.run_at)
    if hint:
        job_id = job.pk

        def publish() -> None:
            hints.publish(job_id, queue)

        d.on_commit(publish)
    return job


class TypePolicy(Protocol):
    """What an insert takes from a job type (:class:`scheduler_core.api.registry.JobType`)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def lease_seconds(self) -> int: ...
    @property
    def max_runtime(self) -> float: ...
    @property
    def effect(self) -> Any: ...


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
    """:func:`insert_job` with the job type's own policy (attempts, lease, effect mode,
    maximum runtime, and its queue unless ``queue`` names another): the one mapping of a
    type to its job's fields, for an enqueue by name and a schedule's occurrences alike."""
    return insert_job(
        name=jt.name,
        queue=jt.queue if queue is None else queue,
        payload=payload,
        priority=priority,
        run_at=run_at,
        max_attempts=jt.max_attempts,
        lease_seconds=jt.lease_seconds,
        unique_key=unique_key,
        effect=jt.effect.value,
        timeout_seconds=jt.max_runtime,
        schedule_id=schedule_id,
    )


def insert_jobs(
    *,
    name: str,
    queue: str,
    payloads: Sequence[dict[str, Any]],
    priority: int,
    run_at: datetime | None,
    max_attempts: int,
    lease_seconds: int,
    effect: str,
    timeout_seconds: float,
) -> list[int]:
    """Insert many waiting jobs of one type in one statement, in the caller's transaction, and
    return their ids (in payload order). No unique keys: a job that must be accepted once goes
    through :func:`insert_job`. Due jobs get one wake-up for the whole batch and, on a broker
    transport, one hint per job after commit."""
    if not payloads:
        return []
    d = driver()
    due_now = run_at is None or run_at <= timezone.now()
    hint = due_now and hints.uses_broker(queue)
    fields = {
        "name": name,
        "queue": queue,
        "priority": priority,
        "run_at": run_at,
        "max_attempts": max_attempts,
        "lease_seconds": lease_seconds,
        "timeout_seconds": timeout_seconds,
        "effect": effect,
        "hinted": hint,
    }
    with d.atomic():
        rows = d.insert_jobs(fields, payloads)
        ids = [job_id for job_id, _ in rows]
        d.notify(queue, priority, min(at for _, at in rows))
        if hint:

            def publish_all() -> None:
                for job_id in ids:
                    hints.publish(job_id, queue)

            d.on_commit(publish_all)
    return ids
