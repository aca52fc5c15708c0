"""Failures reach the host's logs as a Celery user expects: an attempt that failed is logged at
``WARNING`` when a retry follows and at ``ERROR`` when none does (failed, or indeterminate),
with its traceback and the attempt's identity in ``extra``; a success logs nothing at
``WARNING`` or above. Through the executor's path (``run_lease``, the broker-less worker) and
the real database; before this, a failure was one ``INFO`` line without a traceback."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import pytest

from scheduler_core import Permanent, job
from scheduler_core.logging import JsonFormatter
from scheduler_core.models import Job
from scheduler_core.runtime import worker
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "failure-logging"
EXEC = "t:1:failure-logging"


class ProviderDown(RuntimeError):
    """The destination refused the connection."""


@job(name="tests.logging.flaky", queue=Q, max_attempts=2)
def flaky(ctx: Any) -> None:
    raise ProviderDown("connection refused by the provider")


@job(name="tests.logging.refused", queue=Q, max_attempts=5)
def refused(ctx: Any) -> None:
    raise Permanent("card declined")


@job(name="tests.logging.ambiguous", queue=Q, effect="at_most_once", max_attempts=5)
def ambiguous(ctx: Any) -> None:
    with ctx.effect("send"):
        raise TimeoutError("sent; the reply never came")


@job(name="tests.logging.fine", queue=Q)
def fine(ctx: Any) -> None:
    """Nothing."""


def _run_one(job_id: int) -> str:
    [lease] = driver().claim(executor=EXEC, job_id=job_id)
    return run_lease(lease)


def _records(caplog: pytest.LogCaptureFixture, job_id: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "tenure_job_id", None) == job_id]


def test_a_failure_with_a_retry_to_come_is_a_warning_with_its_traceback_and_identity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    j = flaky.enqueue()
    caplog.set_level(logging.INFO, logger="tenure")
    assert _run_one(j.pk) == "retried"
    [r] = _records(caplog, j.pk)
    assert r.name == "tenure.executor"
    assert r.levelno == logging.WARNING
    assert r.exc_info is not None and r.exc_info[0] is ProviderDown
    assert "connection refused by the provider" in r.getMessage()
    job_row = Job.objects.get(pk=j.pk)
    assert {k: v for k, v in r.__dict__.items() if k.startswith("tenure_")} == {
        "tenure_job_id": j.pk,
        "tenure_job_name": "tests.logging.flaky",
        "tenure_queue": Q,
        "tenure_attempt": 1,
        "tenure_fence": job_row.fence,
        "tenure_attempt_kind": "run",
        "tenure_outcome": "retried",
        "tenure_error_class": "transient",
        "tenure_executor": EXEC,
    }


def test_the_last_attempt_s_failure_is_an_error(caplog: pytest.LogCaptureFixture) -> None:
    j = flaky.enqueue()
    caplog.set_level(logging.INFO, logger="tenure")
    assert _run_one(j.pk) == "retried"
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=1))
    assert _run_one(j.pk) == "failed"
    first, last = _records(caplog, j.pk)
    assert (first.levelno, last.levelno) == (logging.WARNING, logging.ERROR)
    assert (last.tenure_attempt, last.tenure_outcome) == (2, "failed")  # type: ignore[attr-defined]
    assert last.exc_info is not None and last.exc_info[0] is ProviderDown


def test_a_permanent_failure_is_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    j = refused.enqueue()
    caplog.set_level(logging.INFO, logger="tenure")
    assert _run_one(j.pk) == "failed"
    [r] = _records(caplog, j.pk)
    assert r.levelno == logging.ERROR
    assert r.exc_info is not None and r.exc_info[0] is Permanent
    assert r.tenure_error_class == "permanent"  # type: ignore[attr-defined]


def test_an_indeterminate_end_is_an_error(caplog: pytest.LogCaptureFixture) -> None:
    j = ambiguous.enqueue()
    caplog.set_level(logging.INFO, logger="tenure")
    assert _run_one(j.pk) == "indeterminate"
    [r] = [r for r in _records(caplog, j.pk) if r.name == "tenure.executor"]
    assert r.levelno == logging.ERROR
    assert r.exc_info is not None and r.exc_info[0] is TimeoutError
    assert r.tenure_outcome == "indeterminate"  # type: ignore[attr-defined]


def test_the_broker_less_worker_logs_failures_and_not_successes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = refused.enqueue()
    good = fine.enqueue_many([{}, {}])
    caplog.set_level(logging.INFO, logger="tenure")
    worker.Worker(queues=[Q], concurrency=2, burst=True, poll_interval=0.05).run()
    [r] = _records(caplog, bad.pk)
    assert r.levelno == logging.ERROR and r.exc_info is not None
    assert not [r for g in good for r in _records(caplog, g) if r.levelno >= logging.WARNING]


def test_the_json_formatter_writes_the_attempt_s_identity_and_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    j = refused.enqueue()
    caplog.set_level(logging.INFO, logger="tenure")
    _run_one(j.pk)
    [r] = _records(caplog, j.pk)
    out = json.loads(JsonFormatter().format(r))
    assert out["level"] == "ERROR" and out["logger"] == "tenure.executor"
    assert out["tenure_job_id"] == j.pk and out["tenure_outcome"] == "failed"
    assert "Traceback" in out["exception"] and "card declined" in out["exception"]
    assert out["message"] == r.getMessage()


def test_an_attempt_the_reaper_ended_is_a_warning_or_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    retried = fine.enqueue()
    parked = ambiguous.enqueue()
    [a] = driver().claim(executor=EXEC, job_id=retried.pk)
    [b] = driver().claim(executor=EXEC, job_id=parked.pk)
    # An effect of the second was intended and never settled: its outcome is unknown.
    driver().effect_intend(b, "send")
    Job.objects.filter(pk__in=[a.job_id, b.job_id]).update(lease_expires_at=driver().now())
    caplog.set_level(logging.INFO, logger="tenure")
    reaper.reap_once()
    [r] = _records(caplog, retried.pk)
    assert (r.levelno, r.tenure_outcome, r.tenure_fence) == (  # type: ignore[attr-defined]
        logging.WARNING,
        "lease_expired",
        a.fence,
    )
    [r] = _records(caplog, parked.pk)
    assert r.levelno == logging.ERROR and "indeterminate" in r.getMessage()
