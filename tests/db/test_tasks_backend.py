"""``scheduler_core.backends.TenureBackend``: ``django.tasks`` tasks enqueued, claimed, run and
recorded as Tenure jobs, and read back as ``TaskResult`` (docs/install.md, "django.tasks")."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from demo.models import LedgerEntry
from scheduler_core import job
from scheduler_core.backends import STATUS, TenureBackend
from scheduler_core.exceptions import EnqueueError, StaleAttempt
from scheduler_core.models import Attempt, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver
from tests import tasks_for_tests
from tests.tasks_for_tests import (
    add,
    async_add,
    async_counted,
    async_overrunning,
    fails,
    nested,
    once_per_order,
    reply_lost,
    returns_a_set,
    returns_nan,
    returns_nothing,
    returns_text,
    transactional_total,
    urgent,
    whenever,
    with_context,
)

try:
    from django.tasks import TaskResultStatus, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued
except ImportError:
    from django_tasks import TaskResultStatus, task, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued

pytestmark = pytest.mark.django_db(transaction=True)

EXECUTOR = "tasks-test:1:x"


def _run(result_id: str) -> str:
    """Claim the job ``result_id`` names and run its attempt here, as an executor does."""
    [lease] = driver().claim(executor=EXECUTOR, job_id=int(result_id))
    return run_lease(lease)


def _backend() -> TenureBackend:
    backend = task_backends["default"]
    assert isinstance(backend, TenureBackend)
    return backend


# -- the backend as django.tasks sees it ------------------------------------------------------


def test_the_backend_declares_what_it_supports() -> None:
    backend = _backend()
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_a_task_with_positional_and_keyword_arguments_runs_and_returns_its_value() -> None:
    result = add.enqueue(2, 3, scale=10)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3] and result.kwargs == {"scale": 10}
    job = Job.objects.get(pk=int(result.id))
    assert job.name == "tests.tasks_for_tests.add"
    assert job.payload == {"args": [2, 3], "kwargs": {"scale": 10}}
    assert _run(result.id) == "succeeded"
    got = add.get_result(result.id)
    assert got.status == TaskResultStatus.SUCCESSFUL
    assert got.return_value == 50
    assert got.is_finished and got.attempts == 1
    assert got.worker_ids == [EXECUTOR]
    assert got.enqueued_at == job.created_at
    assert got.started_at is not None and got.finished_at is not None
    assert got.enqueued_at <= got.started_at <= got.finished_at
    assert got.last_attempted_at == got.started_at
    assert got.errors == []
    # refresh() reads the record again.
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 50


def test_the_return_value_is_stored_as_json() -> None:
    result = nested.enqueue(3)
    assert _run(result.id) == "succeeded"
    value = {"n": 3, "squares": [0, 1, 4], "pair": [3, "x"]}
    assert _backend().get_result(result.id).return_value == value
    assert Attempt.objects.get(job_id=int(result.id)).return_value == value


def test_a_transactional_tasks_return_value_commits_with_its_completion() -> None:
    result = transactional_total.enqueue([1, 2, 3])
    assert Job.objects.get(pk=int(result.id)).effect == "transactional"
    assert _run(result.id) == "succeeded"
    assert transactional_total.get_result(result.id).return_value == 6


def test_a_stale_attempts_completion_and_its_return_value_are_refused() -> None:
    result = add.enqueue(1, 2)
    [old] = driver().claim(executor=EXECUTOR, job_id=int(result.id))
    # The lease runs out (moved back rather than waiting) and the reaper hands the job on.
    Job.objects.filter(pk=old.job_id).update(
        lease_expires_at=timezone.now() - dt.timedelta(hours=1)
    )
    reaper.reap_once()
    [new] = driver().claim(executor="tasks-test:2:y", job_id=old.job_id)
    assert new.fence == old.fence + 1
    with pytest.raises(StaleAttempt):
        driver().complete(old, result=99)
    assert Attempt.objects.get(pk=old.attempt_id).return_value is None
    assert run_lease(new) == "succeeded"
    assert add.get_result(result.id).return_value == 3


def test_a_task_returning_none_succeeds_with_none() -> None:
    result = returns_nothing.enqueue()
    assert _run(result.id) == "succeeded"
    assert returns_nothing.get_result(result.id).return_value is None


@pytest.mark.parametrize(
    ("enqueue", "reason"),
    [
        (lambda: returns_a_set.enqueue(), "not JSON"),
        (lambda: returns_nan.enqueue(), "NaN"),
    ],
    ids=["set", "nan"],
)
def test_a_return_value_that_is_not_json_fails_the_task_without_a_retry(
    enqueue: Any, reason: str
) -> None:
    result = enqueue()
    assert _run(result.id) == "failed"
    got = _backend().get_result(result.id)
    assert got.status == TaskResultStatus.FAILED
    assert got.tenure_state == "failed"
    assert got.attempts == 1  # three were allowed: running it again returns the same
    [error] = got.errors
    assert error.exception_class_path == "scheduler_core.exceptions.InvalidResult"
    assert reason in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = got.return_value
    assert Attempt.objects.get(job_id=int(result.id)).return_value is None


def test_a_return_value_over_the_limit_fails_the_task(settings: Any) -> None:
    settings.TENURE_MAX_RETURN_VALUE_BYTES = 100
    small, big = returns_text.enqueue(90), returns_text.enqueue(200)
    assert _run(small.id) == "succeeded"
    assert returns_text.get_result(small.id).return_value == "x" * 90
    assert _run(big.id) == "failed"
    got = returns_text.get_result(big.id)
    assert got.status == TaskResultStatus.FAILED
    assert "202 bytes; the limit is 100" in got.errors[-1].traceback


def test_an_error_is_recorded_with_its_class_and_traceback_on_each_attempt() -> None:
    result = fails.enqueue()
    assert _run(result.id) == "retried"
    got = fails.get_result(result.id)
    assert got.status == TaskResultStatus.READY  # ready to be executed again
    [error] = got.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "Traceback" in error.traceback
    # Due a second ago: SQLite's clock has millisecond text, a Python "now" could be ahead.
    Job.objects.filter(pk=int(result.id)).update(run_at=timezone.now() - dt.timedelta(seconds=1))
    assert _run(result.id) == "failed"
    got.refresh()
    assert got.status == TaskResultStatus.FAILED and got.is_finished
    assert [e.exception_class for e in got.errors] == [ValueError, ValueError]
    assert got.attempts == 2 and got.finished_at is not None


def test_a_task_that_takes_context_gets_tenures_context_too() -> None:
    result = with_context.enqueue(x=4)
    assert _run(result.id) == "succeeded"
    value = with_context.get_result(result.id).return_value
    job = Job.objects.get(pk=int(result.id))
    assert value == {"job": job.pk, "fence": job.fence, "attempt": 1, "status": "RUNNING", "x": 4}


def test_an_async_task_runs_on_the_executor() -> None:
    result = async_add.enqueue(20, 22)
    assert _run(result.id) == "succeeded"
    assert async_add.get_result(result.id).return_value == 42


def test_an_async_tasks_orm_writes_commit_with_its_completion() -> None:
    result = async_counted.enqueue("acct-7")
    assert _run(result.id) == "succeeded"
    got = async_counted.get_result(result.id)
    assert got.return_value == {"job": int(result.id), "rows": 1}
    assert LedgerEntry.objects.filter(account="acct-7").count() == 1


def test_an_async_task_past_its_maximum_runtime_is_cancelled() -> None:
    # Before async tasks were awaited in the attempt's own coroutine, the task ran on to its
    # end (django.tasks' own bridge knows no maximum runtime) and then found its write refused.
    tasks_for_tests.SLOW_TASK_STOPPED.clear()
    result = async_overrunning.enqueue()
    began = time.monotonic()
    assert _run(result.id) == "stale"
    assert time.monotonic() - began < 5
    assert tasks_for_tests.SLOW_TASK_STOPPED == ["finally"]


# -- enqueue --------------------------------------------------------------------------------------


def test_an_enqueue_joins_the_callers_transaction() -> None:
    with transaction.atomic():
        kept = add.enqueue(1, 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = add.enqueue(1, 2)
        assert Job.objects.filter(pk=int(dropped.id)).exists()  # visible inside
        raise RuntimeError("roll back")
    assert Job.objects.filter(pk=int(kept.id)).exists()
    assert not Job.objects.filter(pk=int(dropped.id)).exists()
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(dropped.id)


def test_task_enqueued_is_sent_only_once_the_enqueue_commits() -> None:
    seen: list[str] = []

    def receiver(sender: Any, task_result: Any, **_: Any) -> None:
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            add.enqueue(0, 0)
            raise RuntimeError("roll back")
        assert seen == []
        with transaction.atomic():
            result = add.enqueue(0, 1)
            assert seen == []
        assert seen == [result.id]
    finally:
        task_enqueued.disconnect(receiver)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: add.enqueue(1), "arguments do not fit task tests.tasks_for_tests.add"),
        (lambda: add.enqueue(1, 2, bogus=3), "arguments do not fit"),
        (lambda: add.enqueue(object(), 2), "not JSON"),
        (lambda: add.enqueue(1, "\x00"), "NUL"),
    ],
    ids=["missing", "unexpected", "object", "nul"],
)
def test_bad_arguments_are_refused_and_write_nothing(call: Any, message: str) -> None:
    before = Job.objects.count()
    with pytest.raises(EnqueueError, match=message):
        call()
    assert Job.objects.count() == before


def test_run_after_defers_the_job_and_a_naive_time_is_refused() -> None:
    later = timezone.now() + dt.timedelta(hours=1)
    result = add.using(run_after=later).enqueue(1, 2)
    job = Job.objects.get(pk=int(result.id))
    assert abs((job.run_at - later).total_seconds()) < 0.01
    assert driver().claim(executor=EXECUTOR, job_id=job.pk) == []  # not due
    assert add.get_result(result.id).status == TaskResultStatus.READY
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=dt.datetime(2030, 1, 1)).enqueue(1, 2)


def test_priority_is_the_jobs_priority_and_higher_runs_first() -> None:
    low = whenever.enqueue()
    high = urgent.enqueue()
    plain = add.enqueue(1, 2)
    priorities = dict(Job.objects.values_list("pk", "priority"))
    assert priorities[int(low.id)] == -50 and priorities[int(high.id)] == 50
    assert priorities[int(plain.id)] == 0
    order = [
        lease.job_id for lease in driver().claim(executor=EXECUTOR, queues=["default"], limit=3)
    ]
    assert order == [int(high.id), int(plain.id), int(low.id)]
    assert add.using(priority=100).enqueue(1, 1).status == TaskResultStatus.READY
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)


def test_tenure_options_reach_the_job_and_a_unique_key_deduplicates() -> None:
    first = once_per_order.enqueue(7)
    again = once_per_order.enqueue(7)
    other = once_per_order.enqueue(8)
    assert again.id == first.id and other.id != first.id
    job = Job.objects.get(pk=int(first.id))
    assert (job.unique_key, job.max_attempts, job.lease_seconds) == ("order-7", 1, 7)
    assert job.timeout_seconds == 60.0
    assert _run(first.id) == "succeeded"
    assert once_per_order.enqueue(7).status == TaskResultStatus.SUCCESSFUL


def test_the_backends_options_apply_to_its_tasks(settings: Any) -> None:
    settings.TASKS = {
        "default": {"BACKEND": "scheduler_core.backends.TenureBackend"},
        "strict": {
            "BACKEND": "scheduler_core.backends.TenureBackend",
            "QUEUES": ["strict"],
            "OPTIONS": {"effect": "at_most_once", "max_attempts": 2, "lease_seconds": 9},
        },
    }
    strict = task(backend="strict", queue_name="strict")(tasks_for_tests.plain)
    result = strict.enqueue(5)
    job = Job.objects.get(pk=int(result.id))
    assert (job.queue, job.effect, job.max_attempts, job.lease_seconds) == (
        "strict",
        "at_most_once",
        2,
        9,
    )
    assert result.backend == "strict"


# -- results --------------------------------------------------------------------------------------


def _in_state(state: str) -> str:
    """A task's job brought to ``state`` the way the system brings jobs there."""
    if state == "indeterminate":
        result = reply_lost.enqueue()
        assert _run(result.id) == "indeterminate"
        return result.id
    if state == "failed":
        result = returns_a_set.enqueue()
        assert _run(result.id) == "failed"
        return result.id
    result = add.enqueue(1, 2)
    if state == "leased":
        driver().claim(executor=EXECUTOR, job_id=int(result.id))
    elif state == "succeeded":
        assert _run(result.id) == "succeeded"
    elif state == "cancelled":
        job = Job.objects.get(pk=int(result.id))
        operator.operator_action(
            job.pk, action="cancel", expected_version=job.version, actor="olivia", reason="dup"
        )
    return result.id


EXPECTED = {
    "waiting": (TaskResultStatus.READY, None),
    "leased": (TaskResultStatus.RUNNING, None),
    "succeeded": (TaskResultStatus.SUCCESSFUL, None),
    "failed": (TaskResultStatus.FAILED, "scheduler_core.exceptions.InvalidResult"),
    "indeterminate": (TaskResultStatus.FAILED, "scheduler_core.exceptions.Indeterminate"),
    "cancelled": (TaskResultStatus.FAILED, "scheduler_core.exceptions.JobCancelled"),
}


def test_every_job_state_has_a_result_status() -> None:
    from scheduler_core.domain.states import State

    assert set(STATUS) == {s.value for s in State} == set(EXPECTED)


@pytest.mark.parametrize("state", list(EXPECTED))
def test_each_job_state_maps_to_its_documented_result_status(state: str) -> None:
    result_id = _in_state(state)
    assert Job.objects.get(pk=int(result_id)).state == state
    got = _backend().get_result(result_id)
    status, last_error = EXPECTED[state]
    assert got.status == status
    assert got.tenure_state == state
    if last_error is None:
        assert got.errors == []
    else:
        assert got.errors[-1].exception_class_path == last_error
        assert issubclass(got.errors[-1].exception_class, BaseException)
    if state in ("indeterminate", "cancelled"):
        with pytest.raises(ValueError):
            _ = got.return_value  # never read as a success
    assert got.is_finished == (status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED))


def test_an_indeterminate_result_says_an_operator_decides() -> None:
    got = _backend().get_result(_in_state("indeterminate"))
    assert "may or may not have happened" in got.errors[-1].traceback


@pytest.mark.parametrize("result_id", ["999999999", "abc", "", "-1", "1.5"])
def test_an_id_that_names_no_task_job_does_not_exist(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        _backend().get_result(result_id)


@job(name="tests.tasks_backend.plain_job")
def plain_job(ctx: Any) -> None:
    """A job that is not a task."""


def test_the_id_of_a_plain_job_is_not_a_task_result() -> None:
    job = plain_job.enqueue()
    with pytest.raises(TaskResultDoesNotExist):
        _backend().get_result(str(job.pk))


def test_another_tasks_result_is_a_mismatch() -> None:
    result = add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        nested.get_result(result.id)


# -- check() -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, set()),
        ({"OPTIONS": {"effect": "idempotent", "max_attempts": 3, "timeout": 30}}, set()),
        ({"OPTIONS": {"retries": 3}}, {"tenure.E031"}),
        ({"OPTIONS": {"effect": "exactly_once"}}, {"tenure.E032"}),
        ({"OPTIONS": {"effect": "reconcilable"}}, {"tenure.E032"}),
        ({"OPTIONS": {"max_attempts": 0}}, {"tenure.E032"}),
        ({"OPTIONS": {"lease_seconds": "30"}}, {"tenure.E032"}),
        ({"OPTIONS": {"timeout": -1}}, {"tenure.E032"}),
        ({"QUEUES": ["default", "x" * 101]}, {"tenure.E033"}),
    ],
)
def test_check_reports_a_misconfigured_backend(params: dict[str, Any], expected: set[str]) -> None:
    backend = TenureBackend("probe", {"BACKEND": "scheduler_core.backends.TenureBackend", **params})
    assert {m.id for m in backend.check()} == expected


def test_a_reconcilable_task_is_refused_at_definition() -> None:
    from scheduler_core.backends import tenure_options

    with pytest.raises(InvalidTask, match="reconcile"):
        task()(tenure_options(effect="reconcilable")(tasks_for_tests.reconcilable))
