"""A job's result: the JSON value its handler returned, kept by the attempt's fenced completion
and read as ``job.result`` (docs/reference/jobs.md, "Results")."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.management import call_command

from demo.models import LedgerEntry
from scheduler_core import job
from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Attempt, Job
from scheduler_core.read.results import result_of, results_of
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

EXECUTOR = "results-test:1:x"


@job(name="results.total")
def total(ctx: Any, *, numbers: list[int]) -> dict[str, Any]:
    return {"total": sum(numbers), "job": ctx.job_id}


@job(name="results.nothing")
def nothing(ctx: Any) -> None:
    return None


@job(name="results.not_json", max_attempts=3)
def not_json(ctx: Any) -> Any:
    return {1, 2}


@job(name="results.text", max_attempts=3)
def text(ctx: Any, *, n: int) -> str:
    return "x" * n


@job(name="results.credit", effect="transactional", max_attempts=3)
def credit(ctx: Any, *, cents: int, bad: bool = False) -> Any:
    LedgerEntry.objects.create(
        account="a", cents=cents, effect_key=f"credit-{ctx.job_id}", job_id=ctx.job_id, fence=1
    )
    return object() if bad else {"credited": cents}


@job(name="results.async")
async def async_total(ctx: Any, *, numbers: list[int]) -> int:
    return sum(numbers)


def _run(job_id: int) -> str:
    """Claim job ``job_id`` and run its attempt here, as an executor does."""
    [lease] = driver().claim(executor=EXECUTOR, job_id=job_id)
    return run_lease(lease)


def test_a_jobs_return_value_is_its_result() -> None:
    j = total.enqueue(numbers=[1, 2, 3])
    assert j.result is None  # not run yet
    assert _run(j.pk) == "succeeded"
    assert j.result == {"total": 6, "job": j.pk}
    assert Job.objects.get(pk=j.pk).result == {"total": 6, "job": j.pk}
    assert Attempt.objects.get(job_id=j.pk).return_value == {"total": 6, "job": j.pk}


def test_an_async_handlers_return_value_is_its_result() -> None:
    j = async_total.enqueue(numbers=[4, 5])
    assert _run(j.pk) == "succeeded"
    assert j.result == 9


@pytest.mark.parametrize("group_commit", [True, False], ids=["group", "next-claim"])
def test_results_written_by_the_executors_group_commit_are_kept(
    settings: Any, group_commit: bool
) -> None:
    # Together in one statement, or each with the claim of the thread's next job.
    settings.TENURE_EXECUTOR_GROUP_COMMIT = group_commit
    jobs = [total.enqueue(numbers=[i, i]) for i in range(5)]
    call_command("run_executor", "--burst", "--queues", "default", "--concurrency", "2")
    assert [Job.objects.get(pk=j.pk).result for j in jobs] == [
        {"total": 2 * i, "job": j.pk} for i, j in enumerate(jobs)
    ]


def test_a_handler_returning_none_succeeds_with_no_result() -> None:
    j = nothing.enqueue()
    assert _run(j.pk) == "succeeded"
    assert j.result is None
    assert results_of([j.pk]) == {j.pk: None}  # succeeded, with None


def test_a_value_that_is_not_json_fails_the_attempt_without_a_retry() -> None:
    j = not_json.enqueue()
    assert _run(j.pk) == "failed"
    row = Job.objects.get(pk=j.pk)
    assert row.state == "failed" and row.attempts == 1  # three allowed: it would return the same
    attempt = Attempt.objects.get(job_id=j.pk)
    assert attempt.error_type == "scheduler_core.exceptions.InvalidResult"
    assert "result value of type set is not JSON" in attempt.message
    assert attempt.return_value is None
    assert row.result is None


def test_a_value_over_the_limit_fails_the_attempt(settings: Any) -> None:
    settings.TENURE_MAX_RETURN_VALUE_BYTES = 100
    small, big = text.enqueue(n=98), text.enqueue(n=99)
    assert _run(small.pk) == "succeeded"
    assert small.result == "x" * 98
    assert _run(big.pk) == "failed"
    attempt = Attempt.objects.get(job_id=big.pk)
    assert "101 bytes; the limit is 100" in attempt.message
    assert "TENURE_MAX_RETURN_VALUE_BYTES" in attempt.message


def test_a_transactional_jobs_result_commits_with_its_writes() -> None:
    j = credit.enqueue(cents=5)
    assert _run(j.pk) == "succeeded"
    assert j.result == {"credited": 5}
    assert LedgerEntry.objects.filter(job_id=j.pk).count() == 1


def test_a_transactional_job_returning_a_bad_value_rolls_its_writes_back() -> None:
    j = credit.enqueue(cents=5, bad=True)
    assert _run(j.pk) == "failed"
    assert LedgerEntry.objects.filter(job_id=j.pk).count() == 0
    assert Attempt.objects.get(job_id=j.pk).error_type.endswith("InvalidResult")


def test_a_stale_attempts_result_is_refused_with_its_completion() -> None:
    j = total.enqueue(numbers=[1])
    [old] = driver().claim(executor=EXECUTOR, job_id=j.pk)
    driver().finish(old, _retry_now(), outcome="retried")
    [new] = driver().claim(executor=EXECUTOR, job_id=j.pk)
    with pytest.raises(StaleAttempt):
        driver().complete(old, result={"stale": True})
    assert Attempt.objects.get(pk=old.attempt_id).return_value is None
    driver().complete(new, result={"fresh": True})
    assert j.result == {"fresh": True}


def test_result_of_reads_the_succeeded_attempts_value_and_tells_unfinished_jobs_apart() -> None:
    done, waiting = total.enqueue(numbers=[2]), total.enqueue(numbers=[3])
    assert _run(done.pk) == "succeeded"
    assert result_of(done.pk) == {"total": 2, "job": done.pk}
    assert result_of(waiting.pk) is None
    assert results_of([done.pk, waiting.pk, 10**9]) == {done.pk: {"total": 2, "job": done.pk}}


def test_a_job_an_operator_resolved_has_no_result() -> None:
    j = not_json.enqueue()
    assert _run(j.pk) == "failed"
    row = Job.objects.get(pk=j.pk)
    operator.operator_action(
        j.pk,
        action="resolve",
        expected_version=row.version,
        actor="op",
        reason="done by hand",
        verified="applied",
    )
    assert Job.objects.get(pk=j.pk).state == "succeeded"
    assert results_of([j.pk]) == {j.pk: None}


def test_retention_deletes_the_result_with_the_job() -> None:
    j = total.enqueue(numbers=[1])
    assert _run(j.pk) == "succeeded"
    time.sleep(0.05)
    assert driver().prune_finished("succeeded", 0.01) == 1
    assert not Attempt.objects.filter(job_id=j.pk).exists()
    assert results_of([j.pk]) == {}


def _retry_now() -> Any:
    from scheduler_core.domain import states
    from scheduler_core.domain.outcomes import Decision

    return Decision(transition=states.RETRY, reason="again")
