"""Cancelling a running job, cooperatively and fenced: the operator's request is recorded with
its audit row; the attempt learns it from its next lease renewal; ``ctx.cancelled`` and
``ctx.check_cancelled()`` let the handler stop; the database refuses every effect intent after
the request; the job ends ``cancelled`` — never ``succeeded`` unless an effect had been applied
before the request, which the job page says; a handler that ignores the request ends at its
maximum runtime as any overrunning attempt; a stale attempt writes nothing.

The handlers below make the operator's request themselves, mid-run, through the same service
the dashboard and the command line call, and then let the heartbeat renew once
(``Heartbeater.tick``), so each step happens in a known order.

Each test fails on the code before running jobs could be cancelled (a leased job refused every
operator action, and the renewal reported nothing)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler_core import job
from scheduler_core.domain import outcomes, states
from scheduler_core.domain.modes import EffectMode
from scheduler_core.domain.outcomes import Decision
from scheduler_core.exceptions import (
    ActionConflict,
    ActionRefused,
    AttemptOverrun,
    JobCancelled,
    StaleAttempt,
)
from scheduler_core.models import Attempt, AuditEntry, Effect, Job, StaleWrite
from scheduler_core.runtime import worker
from scheduler_core.runtime.attempt import end_cancelled, run_lease
from scheduler_core.runtime.context import JobContext
from scheduler_core.runtime.heartbeat import Heartbeater
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease
from tests.ui import factories

pytestmark = pytest.mark.django_db(transaction=True)

Q = "cancelling"
EXEC = "t:1:cancel"
HB = Heartbeater(EXEC, beat_executor=False)
seen: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    seen.clear()


def request_cancel(job_id: int, *, actor: str = "olivia") -> operator.ActionResult:
    """The operator's request, as the dashboard and the command line make it."""
    version = Job.objects.get(pk=job_id).version
    return operator.operator_action(
        job_id,
        action="cancel_running",
        expected_version=version,
        actor=actor,
        reason="the customer withdrew the order",
    )


def renew() -> None:
    """One heartbeat round now (the thread would make it within lease_seconds / 3)."""
    HB.tick(0.0)


@job(name="tests.cancel.cooperative", queue=Q, effect="idempotent")
def cooperative(ctx: Any) -> None:
    seen["before"] = ctx.cancelled
    request_cancel(ctx.job_id)
    seen["requested"] = ctx.cancelled  # not learned yet: no renewal since
    renew()
    seen["renewed"] = ctx.cancelled
    ctx.check_cancelled()
    seen["went_on"] = True


@job(name="tests.cancel.effect_after", queue=Q, effect="idempotent")
def effect_after(ctx: Any) -> None:
    request_cancel(ctx.job_id)
    with ctx.effect("send"):
        seen["sent"] = True


@job(name="tests.cancel.returns", queue=Q, effect="at_least_once")
def returns(ctx: Any) -> None:
    request_cancel(ctx.job_id)  # and returns before any renewal tells it


@job(name="tests.cancel.applied_first", queue=Q, effect="idempotent")
def applied_first(ctx: Any) -> None:
    with ctx.effect("send"):
        pass
    request_cancel(ctx.job_id)
    renew()
    seen["renewed"] = ctx.cancelled


@job(name="tests.cancel.ignores", queue=Q, timeout=0.5, max_attempts=3)
def ignores(ctx: Any) -> None:
    request_cancel(ctx.job_id)
    renew()
    seen["renewed"] = ctx.cancelled
    time.sleep(0.8)  # carries on past its maximum runtime, never looking


@job(name="tests.cancel.raises_unasked", queue=Q, max_attempts=3)
def raises_unasked(ctx: Any) -> None:
    raise JobCancelled("nobody asked")


@job(name="tests.cancel.transactional", queue=Q, effect="transactional")
def transactional(ctx: Any) -> None:
    # The handler's own write, in the job's transaction (a row of a table the test can read).
    StaleWrite.objects.create(job_id=ctx.job_id, fence=ctx.fence, write="handler", executor="h")
    renew()
    ctx.check_cancelled()


SITUATION = outcomes.Situation(
    mode=EffectMode.AT_LEAST_ONCE, attempt=1, max_attempts=3, age_seconds=1.0
)
"""A decision's inputs with no effect in question."""


def claim(j: Job) -> Lease:
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    return lease


def run(j: Job) -> tuple[str, Job]:
    outcome = run_lease(claim(j), heartbeater=HB)
    return outcome, Job.objects.get(pk=j.pk)


def test_a_cancel_request_is_recorded_with_its_audit_row_and_the_job_stays_leased() -> None:
    j = cooperative.enqueue()
    lease = claim(j)
    before = Job.objects.get(pk=j.pk)
    t0 = driver().now()
    result = request_cancel(j.pk)
    after = Job.objects.get(pk=j.pk)
    assert after.state == "leased" and after.fence == lease.fence
    assert after.cancel_requested_at is not None
    assert t0 <= after.cancel_requested_at <= driver().now()  # the database's clock
    assert after.version == before.version + 1
    audit = AuditEntry.objects.get(job=j)
    assert audit == result.audit
    assert (audit.actor, audit.action, audit.reason) == (
        "olivia",
        "cancel_running",
        "the customer withdrew the order",
    )
    assert (audit.state_before, audit.state_after) == ("leased", "leased")
    assert audit.version_before == before.version
    assert audit.detail["transition"] == "operator_request_cancel"
    assert audit.detail["lease_owner"] == EXEC


def test_a_waiting_job_is_cancelled_at_once_and_cancel_running_only_asks_a_running_one() -> None:
    j = cooperative.enqueue()
    with pytest.raises(ActionRefused, match="does not apply to a waiting job"):
        request_cancel(j.pk)
    assert Job.objects.get(pk=j.pk).cancel_requested_at is None
    done = operator.operator_action(
        j.pk, action="cancel", expected_version=j.version, actor="olivia", reason="r"
    )
    assert done.job.state == "cancelled"
    running = cooperative.enqueue()
    claim(running)
    with pytest.raises(ActionRefused, match="cancel_running"):
        operator.operator_action(
            running.pk,
            action="cancel",
            expected_version=Job.objects.get(pk=running.pk).version,
            actor="olivia",
            reason="r",
        )
    assert AuditEntry.objects.filter(job=running).count() == 0


def test_a_stale_page_or_a_second_request_changes_nothing() -> None:
    j = cooperative.enqueue()
    claim(j)
    seen_version = Job.objects.get(pk=j.pk).version
    with pytest.raises(ActionConflict):
        operator.operator_action(
            j.pk,
            action="cancel_running",
            expected_version=seen_version - 1,  # the page from before the claim
            actor="olivia",
            reason="r",
        )
    row = Job.objects.get(pk=j.pk)
    assert (row.cancel_requested_at, row.version) == (None, seen_version)
    assert not AuditEntry.objects.exists()
    request_cancel(j.pk)
    first = Job.objects.get(pk=j.pk)
    with pytest.raises(ActionRefused, match="already requested"):
        request_cancel(j.pk)
    again = Job.objects.get(pk=j.pk)
    assert (again.cancel_requested_at, again.version) == (first.cancel_requested_at, first.version)
    assert AuditEntry.objects.filter(job=j).count() == 1


def test_the_lease_renewal_reports_the_request() -> None:
    j = cooperative.enqueue()
    lease = claim(j)
    assert driver().heartbeat(lease) is False
    request_cancel(j.pk)
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() + dt.timedelta(seconds=2))
    before = driver().now()
    assert driver().heartbeat(lease) is True
    row = Job.objects.get(pk=j.pk)
    # Still a renewal: the lease runs on from the database's now.
    assert row.lease_expires_at >= before + dt.timedelta(seconds=lease.lease_seconds - 1)
    assert row.state == "leased"


def test_a_cooperative_handler_stops_and_the_job_ends_cancelled() -> None:
    outcome, row = run(cooperative.enqueue())
    assert outcome == "cancelled"
    assert seen == {"before": False, "requested": False, "renewed": True}
    assert row.state == "cancelled" and row.finished_at is not None
    assert row.reason == "cancelled by operator while running: the handler stopped"
    attempt = Attempt.objects.get(job=row)
    assert attempt.outcome == "cancelled" and attempt.finished_at is not None
    assert attempt.error_type.endswith("JobCancelled")


def test_no_effect_intent_is_accepted_after_the_request() -> None:
    j = cooperative.enqueue()
    lease = claim(j)
    request_cancel(j.pk)
    with pytest.raises(JobCancelled):
        driver().effect_intend(lease, "send")
    assert not Effect.objects.filter(job=j).exists()
    # A handler that opens an effect after the request (before any renewal told it) is
    # refused by the database, learns it, and its job ends cancelled.
    outcome, row = run(effect_after.enqueue())
    assert outcome == "cancelled" and row.state == "cancelled"
    assert "sent" not in seen
    assert not Effect.objects.filter(job=row).exists()


def test_a_handler_that_returns_after_the_request_without_an_effect_ends_cancelled() -> None:
    outcome, row = run(returns.enqueue())
    assert outcome == "cancelled"
    assert row.state == "cancelled"
    assert (
        row.reason
        == "cancelled by operator while running: the handler ended with no effect applied"
    )
    assert Attempt.objects.get(job=row).outcome == "cancelled"


@pytest.mark.parametrize("group_commit", [False, True])
def test_the_executor_loop_ends_a_handler_returning_after_the_request_cancelled(
    group_commit: bool,
) -> None:
    """The completion the executor writes for a handler that returned, on its own or together
    with other threads' (``group_commit``, the path a Celery chain's completions share), is
    refused after the request: the job ends cancelled, never succeeded."""
    j = returns.enqueue()
    stats = worker.Worker(
        queues=[Q], concurrency=1, burst=True, poll_interval=0.05, group_commit=group_commit
    ).run()
    row = Job.objects.get(pk=j.pk)
    assert row.state == "cancelled"
    assert stats.outcomes.get("cancelled") == 1
    assert Attempt.objects.get(job=row).outcome == "cancelled"


def test_an_effect_applied_before_the_request_lets_the_job_succeed_and_the_page_says_so() -> None:
    outcome, row = run(applied_first.enqueue())
    assert seen == {"renewed": True}
    assert outcome == "succeeded" and row.state == "succeeded"
    assert row.cancel_requested_at is not None
    assert Effect.objects.get(job=row).state == Effect.APPLIED
    client = Client()
    client.force_login(factories.user("olivia", operate=True))
    page = client.get(reverse("admin_ui:job_detail", args=[row.pk])).content.decode()
    assert "Cancel requested at" in page and "by olivia" in page
    assert "Cancel requested after its effect was applied" in page


def test_an_ignored_request_ends_the_job_cancelled_when_its_lease_ends() -> None:
    """Fails on the code before: the reaper retried the job the operator had called off."""
    outcome, row = run(ignores.enqueue())
    assert seen == {"renewed": True}
    # Past its deadline its completion is refused like any overrunning attempt's.
    assert outcome == "stale" and row.state == "leased"
    Job.objects.filter(pk=row.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=5))
    assert reaper.reap_once() == {"reap_cancel": 1}
    row.refresh_from_db()
    assert row.state == "cancelled" and row.finished_at is not None
    assert row.reason.startswith("cancelled by operator: maximum runtime of 0.5s exceeded")
    assert row.attempt_set.get().outcome == "lease_expired"


def test_an_ignored_request_with_an_effect_in_question_ends_indeterminate() -> None:
    """A cancel never hides an effect that may have happened (fails on the code before: the
    job was retried, and a cancel would have ended it cancelled)."""
    j = cooperative.enqueue()
    lease = claim(j)
    driver().effect_intend(lease, "send")  # and the process dies before it learns the outcome
    request_cancel(j.pk)
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=5))
    assert reaper.reap_once() == {"reap_park": 1}
    row = Job.objects.get(pk=j.pk)
    assert row.state == "indeterminate"
    assert "an effect may have happened" in row.reason
    assert Effect.objects.get(job=j).state == Effect.UNKNOWN


def test_a_stale_attempt_cannot_use_a_later_attempts_cancel_request() -> None:
    j = cooperative.enqueue()
    old = claim(j)
    # Its lease runs out; the reaper hands the job on; a new attempt claims it and is asked
    # to stop.
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=5))
    reaper.reap_once()
    new = claim(j)
    assert new.fence == old.fence + 1
    request_cancel(j.pk)
    with pytest.raises(StaleAttempt):
        driver().heartbeat(old)
    with pytest.raises(StaleAttempt) as refused:
        driver().effect_intend(old, "send")
    assert type(refused.value) is StaleAttempt  # a lost lease, not a cancel
    decision = outcomes.after_cancel_request(SITUATION, handler_stopped=True)
    with pytest.raises(StaleAttempt):
        driver().finish(old, decision, outcome="cancelled")
    with pytest.raises(StaleAttempt):
        end_cancelled(JobContext(old), JobCancelled("stop"))
    row = Job.objects.get(pk=j.pk)
    assert (row.state, row.fence) == ("leased", new.fence)


def test_an_attempt_ends_its_job_cancelled_only_after_a_request() -> None:
    j = cooperative.enqueue()
    lease = claim(j)
    with pytest.raises(StaleAttempt):
        driver().finish(
            lease, outcomes.after_cancel_request(SITUATION, handler_stopped=True), outcome="x"
        )
    assert Job.objects.get(pk=j.pk).state == "leased"
    # A handler raising the cancel exception unasked is an ordinary failure (retried).
    outcome, row = run(raises_unasked.enqueue())
    assert outcome == "retried" and row.state == "waiting"


def test_past_its_deadline_a_cancelled_attempt_is_refused_as_overrunning() -> None:
    j = cooperative.enqueue()
    lease = claim(j)
    request_cancel(j.pk)
    Job.objects.filter(pk=j.pk).update(deadline_at=driver().now() - dt.timedelta(seconds=1))
    with pytest.raises(AttemptOverrun):
        driver().heartbeat(lease)
    with pytest.raises(AttemptOverrun):
        driver().effect_intend(lease, "send")


def test_a_transactional_handler_that_stops_rolls_its_writes_back_and_ends_cancelled() -> None:
    j = transactional.enqueue()
    lease = claim(j)
    request_cancel(j.pk)  # before the handler's transaction begins
    assert run_lease(lease, heartbeater=HB) == "cancelled"
    assert Job.objects.get(pk=j.pk).state == "cancelled"
    assert not StaleWrite.objects.filter(job_id=j.pk, write="handler").exists()


def test_an_operator_retry_clears_a_request_the_attempt_never_answered() -> None:
    j = cooperative.enqueue()
    lease = claim(j)
    request_cancel(j.pk)
    # The attempt fails before its next renewal told it: the job fails with the request kept.
    driver().finish(lease, Decision(transition=states.FAIL, reason="permanent"), outcome="failed")
    row = Job.objects.get(pk=j.pk)
    assert row.state == "failed" and row.cancel_requested_at is not None
    operator.operator_action(
        j.pk, action="retry", expected_version=row.version, actor="olivia", reason="try again"
    )
    row = Job.objects.get(pk=j.pk)
    assert row.state == "waiting" and row.cancel_requested_at is None
