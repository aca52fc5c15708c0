"""A handler that enqueues the next job (docs/celery.md, "Chains and groups"): outside a
``transactional`` job the enqueue commits on its own, before the attempt's end is recorded,
so a retried attempt enqueues again; a ``unique_key`` made from the job's id keeps one
successor; in a ``transactional`` job the enqueue commits with the completion or not at all."""

from __future__ import annotations

import time
from typing import Any

import pytest

from scheduler_core import Transient, job
from scheduler_core.models import Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

EXECUTOR = "handler-enqueue-test:1:x"


@job(name="tests.chain.next", queue="chain-next")
def next_step(ctx: Any, *, after: int) -> None:
    """The successor: never run here, only counted."""


def _then(ctx: Any, *, unique: bool) -> None:
    next_step.enqueue(after=ctx.job_id, unique_key=f"after-{ctx.job_id}" if unique else None)
    if ctx.attempt == 1:
        raise Transient("the first attempt fails after its enqueue")


@job(name="tests.chain.plain", queue="chain", max_attempts=3, backoff_base=0.01, backoff_cap=0.01)
def plain(ctx: Any) -> None:
    _then(ctx, unique=False)


@job(name="tests.chain.keyed", queue="chain", max_attempts=3, backoff_base=0.01, backoff_cap=0.01)
def keyed(ctx: Any) -> None:
    _then(ctx, unique=True)


@job(
    name="tests.chain.transactional",
    queue="chain",
    effect="transactional",
    max_attempts=3,
    backoff_base=0.01,
    backoff_cap=0.01,
)
def transactional(ctx: Any) -> None:
    _then(ctx, unique=False)


def _run_to_the_end(job_id: int) -> list[int]:
    """Claim and run ``job_id`` until it ends; the successors counted after each attempt."""
    successors: list[int] = []
    deadline = time.monotonic() + 30
    while Job.objects.get(pk=job_id).state == "waiting":
        assert time.monotonic() < deadline, "the job never became due"
        leases = driver().claim(executor=EXECUTOR, job_id=job_id)
        if not leases:
            time.sleep(0.02)  # the retry's backoff
            continue
        run_lease(leases[0])
        successors.append(Job.objects.filter(name="tests.chain.next").count())
    return successors


def test_outside_a_transactional_job_a_retried_attempt_enqueues_the_next_job_again() -> None:
    first = plain.enqueue()
    assert _run_to_the_end(first.pk) == [1, 2]
    assert Job.objects.get(pk=first.pk).state == "succeeded"


def test_a_unique_key_made_from_the_jobs_id_keeps_one_successor() -> None:
    first = keyed.enqueue()
    assert _run_to_the_end(first.pk) == [1, 1]
    assert Job.objects.get(name="tests.chain.next").unique_key == f"after-{first.pk}"


def test_in_a_transactional_job_the_enqueue_commits_with_the_completion_or_not_at_all() -> None:
    first = transactional.enqueue()
    assert _run_to_the_end(first.pk) == [0, 1]
    assert Job.objects.get(pk=first.pk).state == "succeeded"
