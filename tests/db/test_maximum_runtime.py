"""Every attempt has a maximum runtime: the database holds its deadline; past it the attempt
may not renew its lease, complete or start an effect, it shows as ``overrunning``, and the
reaper moves the job on once its lease runs out. And a handler that swallows an ambiguous
effect error and returns never ends ``succeeded`` with its ledger row unknown.

Each test fails on the code before attempts had deadlines (``timeout`` defaulted to none
and only the executor's own heartbeat thread knew of one)."""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

import pytest

from scheduler_core import job
from scheduler_core.api import registry
from scheduler_core.exceptions import AttemptOverrun
from scheduler_core.models import Effect, Job, StaleWrite
from scheduler_core.read import health
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

Q = "runtime"
EXEC = "t:1:runtime"
calls: list[int] = []


@job(name="tests.runtime.default", queue=Q, lease_seconds=30)
def undeclared(ctx: Any) -> None:
    """Declares no maximum runtime: the project's default applies."""


@job(name="tests.runtime.short", queue=Q, lease_seconds=30, timeout=0.5, max_attempts=3)
def slow(ctx: Any, *, seconds: float = 1.0) -> None:
    """Runs past its declared maximum runtime, then tries to make its effect."""
    time.sleep(seconds)
    with ctx.effect("send") as eff:
        if not eff.done:
            calls.append(ctx.fence)


def _swallow(ctx: Any) -> None:
    try:
        with ctx.effect("send"):
            raise TimeoutError("sent; no reply")
    except TimeoutError:
        pass  # the handler's author thought "probably fine"


swallow_idem = job(name="tests.runtime.swallow_idem", queue=Q, effect="idempotent")(_swallow)
swallow_amo = job(name="tests.runtime.swallow_amo", queue=Q, effect="at_most_once")(_swallow)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    calls.clear()


def _claim(job_id: int) -> Lease:
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=job_id)
    return lease


def _overrun(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(deadline_at=driver().now() - dt.timedelta(seconds=1))


def test_every_job_type_has_a_maximum_runtime_and_nonsense_is_refused(settings: Any) -> None:
    jt = registry.get("tests.runtime.default")
    assert jt is not None and jt.timeout is None
    assert jt.max_runtime == 600.0
    settings.TENURE_DEFAULT_TIMEOUT_SECONDS = 42.0
    assert jt.max_runtime == 42.0
    assert undeclared.enqueue().timeout_seconds == 42.0
    for bad in (0, -1, math.inf, math.nan, True, "60", 8 * 24 * 3600):
        with pytest.raises(ValueError, match="maximum runtime"):
            job(name=f"tests.runtime.bad{bad!r}", timeout=bad)(lambda ctx: None)


def test_the_claim_sets_the_deadline_by_the_database_clock() -> None:
    j = slow.enqueue()
    before = driver().now()
    _claim(j.pk)
    j.refresh_from_db()
    assert j.deadline_at is not None
    assert before + dt.timedelta(seconds=0.5) <= j.deadline_at
    assert j.deadline_at <= driver().now() + dt.timedelta(seconds=0.5)


def test_past_its_deadline_an_attempt_may_not_renew_start_an_effect_or_complete() -> None:
    j = undeclared.enqueue()
    lease = _claim(j.pk)
    _overrun(j.pk)
    with pytest.raises(AttemptOverrun):
        driver().heartbeat(lease)
    with pytest.raises(AttemptOverrun):
        driver().effect_intend(lease, "send")
    with pytest.raises(AttemptOverrun):
        driver().complete(lease)
    j.refresh_from_db()
    assert (j.state, j.fence) == ("leased", lease.fence)
    assert not Effect.objects.filter(job=j).exists()


def test_an_overrunning_attempt_shows_as_such_until_the_reaper_ends_it() -> None:
    j = slow.enqueue(seconds=1.0)
    lease = _claim(j.pk)
    # The handler sleeps past its 0.5 s maximum runtime; its effect intent is then refused.
    assert run_lease(lease) == "stale"
    assert calls == []
    assert StaleWrite.objects.filter(job_id=j.pk, write="effect_intent").count() == 1
    counts = health.health_counts()
    assert (counts["overrunning"], counts["running"], counts["abandoned"]) == (1, 0, 0)
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=5))
    assert reaper.reap_once() == {"reap_retry": 1}
    j.refresh_from_db()
    assert j.state == "waiting"
    assert j.reason.startswith("maximum runtime of 0.5s exceeded")
    assert health.health_counts()["overrunning"] == 0


def test_a_handler_that_swallows_an_ambiguous_error_never_ends_succeeded() -> None:
    idem, amo = swallow_idem.enqueue(), swallow_amo.enqueue()
    # Idempotent: the mode's rule for an ambiguous outcome is a retry under the same key.
    assert run_lease(_claim(idem.pk)) == "retried"
    # At most once: parked for an operator, never re-run.
    assert run_lease(_claim(amo.pk)) == "indeterminate"
    for j in (idem, amo):
        j.refresh_from_db()
        assert j.state != "succeeded"
        assert Effect.objects.get(job=j).state == "unknown"
        assert "may or may not have happened" in j.last_error
