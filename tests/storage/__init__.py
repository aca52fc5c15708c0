"""The storage driver's contract suite: every named operation of
:class:`~scheduler_core.storage.base.Driver`, exercised through
:func:`~scheduler_core.storage.drivers.driver` only, so the same tests run against
``SqliteDriver`` (``make test-sqlite``) and ``PostgresDriver`` (``make test-postgres``) and the
two cannot drift. A test whose behaviour depends on a capability reads the driver's flag
(``skips_locked_rows``, ``has_transaction_ids``, ``one_writer``) and asserts the documented
behaviour of each branch; nothing here branches on a vendor's name.

This module holds what the suite's files share: the job types (registered once, at import),
the fields of an insert, and small helpers that set up rows and read them back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db.models import F

from scheduler_core import job
from scheduler_core.api.registry import JobType
from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Attempt, Job
from scheduler_core.storage.base import Driver
from scheduler_core.storage.clock import DbNow
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

QUEUE = "storage"
OTHER_QUEUE = "storage-other"
EXEC = "t:1:storage"
EXEC2 = "t:2:storage"
LEASE_SECONDS = 30
TIMEOUT = 120.0
DAY = 24 * 3600.0
SLACK = dt.timedelta(seconds=1)
"""Tolerance of a comparison between database timestamps taken by different statements (SQLite
keeps milliseconds; the machine may be loaded)."""


@job(
    name="tests.storage.plain",
    queue=QUEUE,
    max_attempts=5,
    lease_seconds=LEASE_SECONDS,
    timeout=TIMEOUT,
)
def plain(ctx: Any, **payload: Any) -> None:
    """Nothing: the suite drives the driver, never a handler."""


@job(
    name="tests.storage.at_most_once",
    queue=QUEUE,
    effect="at_most_once",
    max_attempts=5,
    lease_seconds=LEASE_SECONDS,
    timeout=TIMEOUT,
)
def at_most_once(ctx: Any, **payload: Any) -> None:
    """Nothing."""


@job(
    name="tests.storage.transactional",
    queue=QUEUE,
    effect="transactional",
    max_attempts=5,
    lease_seconds=LEASE_SECONDS,
    timeout=TIMEOUT,
)
def transactional(ctx: Any, **payload: Any) -> None:
    """Nothing."""


INSERT_ARGS = ("unique_key", "schedule_id", "hinted")
"""What :meth:`Driver.insert_job` takes beside the job spec."""


def fields(jt: JobType = plain, **over: Any) -> dict[str, Any]:
    """The keyword arguments :meth:`Driver.insert_job` takes, for one job of ``jt``: its job
    spec (``over``'s spec fields set) and the other arguments ``over`` names."""
    args = {k: over.pop(k) for k in INSERT_ARGS if k in over}
    return {"options": replace(jt.options(), **over), **args}


def batch_fields(jt: JobType = plain, **over: Any) -> dict[str, Any]:
    """The keyword arguments :meth:`Driver.insert_jobs` takes besides the payloads."""
    hinted = over.pop("hinted", False)
    return {"options": replace(jt.options(), **over), "hinted": hinted}


def insert(jt: JobType = plain, **over: Any) -> Job:
    """One waiting job, through the driver."""
    j = driver().insert_job(**fields(jt, **over))
    assert j is not None
    return j


def claim(
    limit: int = 1,
    *,
    executor: str = EXEC,
    queues: Sequence[str] = (QUEUE,),
    job_id: int | None = None,
) -> list[Lease]:
    return driver().claim(executor=executor, queues=queues, limit=limit, job_id=job_id)


def claim_one(jt: JobType = plain, *, executor: str = EXEC, **over: Any) -> Lease:
    """Insert one job and claim exactly it."""
    j = insert(jt, **over)
    [lease] = claim(executor=executor, job_id=j.pk)
    return lease


def job_row(ref: Lease | Job | int) -> Job:
    """The job's row as the database now has it."""
    pk = ref.job_id if isinstance(ref, Lease) else ref.pk if isinstance(ref, Job) else ref
    return Job.objects.get(pk=pk)


def attempt_row(lease: Lease) -> Attempt:
    return Attempt.objects.get(pk=lease.attempt_id)


def take_over(lease: Lease) -> None:
    """Another claim moved the job's fence on (the lease's attempt lost ownership)."""
    Job.objects.filter(pk=lease.job_id).update(fence=F("fence") + 1, lease_owner="t:9:other")


def overrun(lease: Lease) -> None:
    """The attempt's maximum runtime ran out a second ago (its lease still runs)."""
    Job.objects.filter(pk=lease.job_id).update(deadline_at=DbNow(-1))


def expire(lease: Lease, seconds_ago: float) -> None:
    """The lease expired ``seconds_ago`` by the database's clock (not reaped)."""
    Job.objects.filter(pk=lease.job_id).update(lease_expires_at=DbNow(-seconds_ago))


def age(job_ids: Sequence[int], seconds: float) -> None:
    """The jobs were last changed ``seconds`` ago."""
    Job.objects.filter(pk__in=list(job_ids)).update(updated_at=DbNow(-seconds))


def retry_now(lease: Lease, **decision: Any) -> None:
    """End the attempt with a retry due at once."""
    driver().finish(lease, Decision(transition=states.RETRY, **decision), outcome="failed")


def reap(lease: Lease) -> None:
    """What the reaper does to an expired lease: the job waits again, the attempt is ended
    ``lease_expired``."""
    expire(lease, 5)
    driver().finish(
        lease,
        Decision(transition=states.REAP_RETRY, reason="lease expired"),
        outcome="lease_expired",
        expired_for=0,
    )


def between(value: dt.datetime | None, low: dt.datetime, high: dt.datetime) -> bool:
    """Whether ``value`` lies in ``[low, high]``, give or take :data:`SLACK`."""
    return value is not None and low - SLACK <= value <= high + SLACK


def implements(d: Driver, name: str) -> bool:
    """Whether the driver implements a *vendor* hook whose base answer is "nothing here"
    (``listen``, ``database_pressure``, ``estimated_jobs``): the contract has no capability
    flag for notifications or for row-version statistics, so this is how a test tells which
    documented branch applies."""
    return getattr(type(d), name) is not getattr(Driver, name)
