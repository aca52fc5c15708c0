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
from typing import Any

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
