"""Tenure in a project's own test suite: run the jobs a test enqueued, in the test's thread, on
the real path — the claim (fence and lease from the database), the handler under its effect
mode and ledger, the fenced completion or failure — and assert on what was enqueued.

Nothing is mocked: :func:`run_pending` claims due jobs as an executor does and runs each
attempt with the executor's own code (:func:`scheduler_core.runtime.attempt.run_lease`), one
at a time, on the test's database connection. So it works inside the transaction of a plain
``TestCase`` (pytest-django's ``db``) as well as in a ``TransactionTestCase``
(``django_db(transaction=True)``): every statement it makes runs on the connection that made
the test's rows, and what it writes is rolled back with the test. ``docs/howto/testing.md``
says what differs between the two.

The ``tenure_jobs`` pytest fixture (:mod:`scheduler_core.pytest_plugin`) and the
:func:`jobs_under_test` context manager give a :class:`JobsUnderTest`, which sees the jobs
accepted since it was made.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .api.registry import JobType
from .models import Attempt, Job
from .runtime.attempt import run_lease
from .storage.drivers import driver
from .storage.records import new_executor_id

__all__ = [
    "JobsUnderTest",
    "Ran",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued",
    "jobs_under_test",
    "run_pending",
]


@dataclass(frozen=True, kw_only=True)
class Ran:
    """One attempt :func:`run_pending` ran."""

    job_id: int
    name: str
    outcome: str
    """The attempt's outcome: ``succeeded``, ``retried``, ``failed``, ``indeterminate``, ..."""
    error: str = ""
    """The attempt's error with its traceback, when it raised."""


def run_pending(*, queues: Sequence[str] | None = None, max_jobs: int = 1000) -> list[Ran]:
    """Run every due waiting job (of ``queues``; default: every queue with one), one attempt
    at a time in this thread, until none is due; return what ran, in order.

    Jobs enqueued by the handlers run too, once due. A job not yet due (``run_at``,
    ``delay``, a retry's backoff) stays waiting; so do jobs of a paused queue.
    ``max_jobs`` bounds the attempts run (a job that enqueues itself forever stops there,
    with ``RuntimeError``).
    """
    executor = new_executor_id("test")
    ran: list[Ran] = []
    while True:
        wanted = list(queues) if queues is not None else _queues_with_waiting_jobs()
        leases = driver().claim(executor=executor, queues=wanted, limit=1) if wanted else []
        if not leases:
            return ran
        if len(ran) >= max_jobs:
            raise RuntimeError(f"run_pending ran {max_jobs} attempts and jobs are still due")
        lease = leases[0]
        outcome = run_lease(lease)
        error = (
            Attempt.objects.filter(pk=lease.attempt_id).values_list("traceback", flat=True).first()
        )
        ran.append(Ran(job_id=lease.job_id, name=lease.name, outcome=outcome, error=error or ""))


def _queues_with_waiting_jobs() -> list[str]:
    return sorted(set(Job.objects.waiting().values_list("queue", flat=True).distinct()))


def enqueued(
    job_type: JobType | str | None = None, *, since: int = 0, **payload_subset: Any
) -> list[Job]:
    """The jobs accepted (whatever their state now), oldest first: of ``job_type`` (a
    registered job type or its name; None: any), with id above ``since``, whose payload holds
    every item of ``payload_subset``."""
    qs = Job.objects.select_related("spec").filter(pk__gt=since).order_by("pk")
    if job_type is not None:
        qs = qs.filter(name=_name(job_type))
    return [j for j in qs if _holds(j.payload, payload_subset)]


def assert_enqueued(
    job_type: JobType | str,
    *,
    count: int | None = None,
    since: int = 0,
    **payload_subset: Any,
) -> list[Job]:
    """Assert that jobs of ``job_type`` whose payload holds ``payload_subset`` were accepted
    (exactly ``count`` of them, when given); return them. The ``AssertionError`` lists the
    jobs of that type that were accepted."""
    found = enqueued(job_type, since=since, **payload_subset)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    wanted = "a job" if count is None else f"{count} job(s)"
    seen = [f"  job {j.pk} [{j.state}] {j.payload}" for j in enqueued(job_type, since=since)]
    raise AssertionError(
        f"expected {wanted} of {_name(job_type)} with payload items {payload_subset}, found "
        f"{len(found)}; accepted jobs of that type:\n" + ("\n".join(seen) or "  (none)")
    )


def assert_not_enqueued(job_type: JobType | str, *, since: int = 0, **payload_subset: Any) -> None:
    """Assert that no job of ``job_type`` whose payload holds ``payload_subset`` was accepted."""
    found = enqueued(job_type, since=since, **payload_subset)
    if found:
        listed = "\n".join(f"  job {j.pk} [{j.state}] {j.payload}" for j in found)
        raise AssertionError(f"expected no job of {_name(job_type)}, found:\n{listed}")


class JobsUnderTest:
    """The jobs accepted since this was made, and the means to run them (what the
    ``tenure_jobs`` fixture and :func:`jobs_under_test` give)."""

    def __init__(self) -> None:
        self.since: int = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        """Jobs with a greater id were accepted since this was made."""

    def run_pending(
        self, *, queues: Sequence[str] | None = None, max_jobs: int = 1000
    ) -> list[Ran]:
        """:func:`run_pending` (every due job, older ones included)."""
        return run_pending(queues=queues, max_jobs=max_jobs)

    def enqueued(self, job_type: JobType | str | None = None, **payload_subset: Any) -> list[Job]:
        """:func:`enqueued`, of the jobs accepted since this was made."""
        return enqueued(job_type, since=self.since, **payload_subset)

    def assert_enqueued(
        self, job_type: JobType | str, *, count: int | None = None, **payload_subset: Any
    ) -> list[Job]:
        """:func:`assert_enqueued`, of the jobs accepted since this was made."""
        return assert_enqueued(job_type, count=count, since=self.since, **payload_subset)

    def assert_not_enqueued(self, job_type: JobType | str, **payload_subset: Any) -> None:
        """:func:`assert_not_enqueued`, of the jobs accepted since this was made."""
        assert_not_enqueued(job_type, since=self.since, **payload_subset)


@contextmanager
def jobs_under_test() -> Iterator[JobsUnderTest]:
    """A :class:`JobsUnderTest` for the block: ``with jobs_under_test() as jobs: ...``."""
    yield JobsUnderTest()


def _name(job_type: JobType | str) -> str:
    return job_type if isinstance(job_type, str) else job_type.name


def _holds(payload: Any, subset: dict[str, Any]) -> bool:
    return isinstance(payload, dict) and all(
        k in payload and payload[k] == v for k, v in subset.items()
    )
