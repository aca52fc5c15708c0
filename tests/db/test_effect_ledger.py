"""The effect ledger against a real database: fenced intents, keys from work identity, each
mode's rule for an earlier unsettled intent, and the transactional mode's single commit."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction

from scheduler_core import Indeterminate, job
from scheduler_core.domain import keys
from scheduler_core.domain.outcomes import Reconciliation
from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Effect, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.runtime.context import JobContext
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

calls: list[tuple[int, int, str]] = []


def _body(ctx: Any) -> None:
    with ctx.effect("send") as eff:
        if not eff.done:
            calls.append((ctx.job_id, ctx.fence, eff.key))
            eff.applied(destination_ref=f"ref-{ctx.fence}")


@job(name="tests.ledger.idem", effect="idempotent", lease_seconds=30)
def idem(ctx: Any) -> None:
    _body(ctx)


@job(name="tests.ledger.alo", effect="at_least_once", lease_seconds=30)
def alo(ctx: Any) -> None:
    _body(ctx)


@job(name="tests.ledger.amo", effect="at_most_once", lease_seconds=30)
def amo(ctx: Any) -> None:
    _body(ctx)


def _applied_lookup(ctx: Any) -> str:
    return "applied"


@job(
    name="tests.ledger.rec",
    effect="reconcilable",
    lease_seconds=30,
    reconcile=_applied_lookup,
)
def rec(ctx: Any) -> None:
    _body(ctx)


@job(name="tests.ledger.tx", effect="transactional", lease_seconds=30)
def tx(ctx: Any, *, fail: bool = False) -> None:
    with ctx.effect("credit") as eff:
        calls.append((ctx.job_id, ctx.fence, eff.key))
        if fail:
            raise RuntimeError("handler failed after its write")


@pytest.fixture(autouse=True)
def _clear() -> None:
    calls.clear()


def _claim_one(job_id: int) -> Lease:
    [lease] = driver().claim(executor="t:1:x", job_id=job_id)
    return lease


def _expire_and_reap(job_id: int) -> None:
    # The database clock moves past the lease (simulated by moving the lease, not the clock).
    Job.objects.filter(pk=job_id).update(
        lease_expires_at=Job.objects.get(pk=job_id).lease_expires_at - dt.timedelta(hours=1)
    )
    reaper.reap_once()


def _due_now(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


def test_effect_key_is_work_identity_and_effect_name_never_the_attempt() -> None:
    j = idem.enqueue()
    lease1 = _claim_one(j.pk)
    row1 = driver().effect_intend(lease1, "send")
    created = Job.objects.get(pk=j.pk).created_at
    assert row1.key == keys.effect_key(driver().installation_id(), j.pk, created, "send")
    assert row1.key == JobContext(lease1).effect_key("send")
    _expire_and_reap(j.pk)
    _due_now(j.pk)
    lease2 = _claim_one(j.pk)
    row2 = driver().effect_intend(lease2, "send")
    assert row2.pk == row1.pk and row2.key == row1.key
    assert (row2.fence, row2.intents) == (lease2.fence, 2)
    assert "retries under the same key" in row2.note


def test_stale_attempt_whose_lease_expired_by_database_clock_cannot_start_an_effect() -> None:
    j = idem.enqueue()
    lease = _claim_one(j.pk)
    # Not reaped yet: the fence is still current, only the lease ran out.
    Job.objects.filter(pk=j.pk).update(
        lease_expires_at=Job.objects.get(pk=j.pk).lease_expires_at - dt.timedelta(hours=1)
    )
    with pytest.raises(StaleAttempt):
        driver().effect_intend(lease, "send")
    assert not Effect.objects.filter(job_id=j.pk).exists()


def test_attempt_whose_fence_moved_cannot_start_or_settle_an_effect() -> None:
    j = idem.enqueue()
    old = _claim_one(j.pk)
    row = driver().effect_intend(old, "send")
    _expire_and_reap(j.pk)
    _due_now(j.pk)
    new = _claim_one(j.pk)
    with pytest.raises(StaleAttempt):
        driver().effect_intend(old, "send")
    with pytest.raises(StaleAttempt):
        driver().effect_settle(old, row.key, Effect.APPLIED, destination_ref="late")
    row.refresh_from_db()
    assert row.destination_ref == "" and row.fence == old.fence
    driver().effect_intend(new, "send")
    driver().effect_settle(new, row.key, Effect.APPLIED, destination_ref="ch_1")
    row.refresh_from_db()
    assert (row.state, row.destination_ref, row.fence) == ("applied", "ch_1", new.fence)


def test_run_records_applied_with_destination_reference() -> None:
    j = idem.enqueue()
    assert run_lease(_claim_one(j.pk)) == "succeeded"
    e = Effect.objects.get(job_id=j.pk)
    assert (e.state, e.destination_ref, e.fence) == ("applied", "ref-1", 1)
    assert calls == [(j.pk, 1, e.key)]


def test_attempt_lost_after_applying_is_retried_and_the_rerun_skips_the_call() -> None:
    j = amo.enqueue()
    ctx = JobContext(_claim_one(j.pk))
    _body(ctx)  # applied and recorded; the process then dies before its completion
    _expire_and_reap(j.pk)
    assert Job.objects.get(pk=j.pk).state == "waiting"  # nothing unsettled: a safe retry
    _due_now(j.pk)
    assert run_lease(_claim_one(j.pk)) == "succeeded"
    assert len(calls) == 1
    assert Effect.objects.get(job_id=j.pk).intents == 1


def test_failure_before_sending_is_recorded_not_applied_and_after_sending_unknown() -> None:
    from scheduler_core import Transient

    j1, j2 = idem.enqueue(), idem.enqueue()
    for j, exc, expected in (
        (j1, Transient("503"), "not_applied"),
        (j2, TimeoutError(), "unknown"),
    ):
        ctx = JobContext(_claim_one(j.pk))
        with pytest.raises(type(exc)), ctx.effect("send"):
            raise exc
        e = Effect.objects.get(job_id=j.pk)
        assert e.state == expected
        assert type(exc).__name__ in e.note
        assert ctx.ambiguous is (expected == "unknown")


def test_at_least_once_rerun_after_unsettled_intent_records_duplicate_possible_and_cause() -> None:
    j = alo.enqueue()
    lease1 = _claim_one(j.pk)
    driver().effect_intend(lease1, "send")
    _expire_and_reap(j.pk)
    _due_now(j.pk)
    lease2 = _claim_one(j.pk)
    assert run_lease(lease2) == "succeeded"
    e = Effect.objects.get(job_id=j.pk)
    assert e.state == "applied" and e.duplicate_possible and e.intents == 2
    assert f"duplicate possible: attempt 2 (fence {lease2.fence})" in e.note


@pytest.mark.parametrize("jt", [amo, rec], ids=["at_most_once", "reconcilable"])
def test_no_new_intent_over_an_unsettled_one_in_modes_that_must_not_rerun(jt: Any) -> None:
    j = jt.enqueue()
    lease1 = _claim_one(j.pk)
    driver().effect_intend(lease1, "send")
    # Settle the attempt as if the handler had let a transient error escape afterwards.
    from scheduler_core.domain.outcomes import Decision
    from scheduler_core.domain.states import RETRY

    driver().finish(lease1, Decision(transition=RETRY), outcome="retried")
    _due_now(j.pk)
    lease2 = _claim_one(j.pk)
    with pytest.raises(Indeterminate):
        driver().effect_intend(lease2, "send")
    e = Effect.objects.get(job_id=j.pk)
    assert (e.intents, e.fence) == (1, lease1.fence)


def test_at_most_once_rerun_over_unsettled_intent_is_parked_by_the_executor() -> None:
    j = amo.enqueue()
    lease1 = _claim_one(j.pk)
    driver().effect_intend(lease1, "send")
    from scheduler_core.domain.outcomes import Decision
    from scheduler_core.domain.states import RETRY

    driver().finish(lease1, Decision(transition=RETRY), outcome="retried")
    _due_now(j.pk)
    assert run_lease(_claim_one(j.pk)) == "indeterminate"
    assert calls == []
    assert Job.objects.get(pk=j.pk).state == "indeterminate"


def test_reconcile_attempt_runs_under_a_fresh_claim_and_settles_the_ledger() -> None:
    j = rec.enqueue()
    lease1 = _claim_one(j.pk)
    driver().effect_intend(lease1, "send")
    _expire_and_reap(j.pk)
    job_row = Job.objects.get(pk=j.pk)
    assert (job_row.state, job_row.next_kind) == ("waiting", "reconcile")
    _due_now(j.pk)
    lease2 = _claim_one(j.pk)
    assert lease2.kind == "reconcile" and lease2.fence == lease1.fence + 1
    assert run_lease(lease2) == "reconciled"
    e = Effect.objects.get(job_id=j.pk)
    assert e.state == Reconciliation.APPLIED.value
    # The job resumes: its run attempt skips the effect the lookup found applied.
    job_row = Job.objects.get(pk=j.pk)
    assert (job_row.state, job_row.next_kind, job_row.attempts) == ("waiting", "run", 1)
    assert run_lease(_claim_one(j.pk)) == "succeeded"
    assert calls == []  # the lookup answered; nothing was sent again


def test_operator_retry_of_indeterminate_job_reuses_the_same_effect_key() -> None:
    j = amo.enqueue()
    lease1 = _claim_one(j.pk)
    first = driver().effect_intend(lease1, "send")
    _expire_and_reap(j.pk)
    job_row = Job.objects.get(pk=j.pk)
    assert job_row.state == "indeterminate"
    assert Effect.objects.get(pk=first.pk).state == "unknown"
    operator.operator_action(
        j.pk,
        action="retry",
        expected_version=job_row.version,
        actor="op",
        reason="checked the mailbox: nothing arrived",
        verified="not_applied",
        # The reaped owner (t:1:x) never recorded a stop: the operator accepts that it may
        # still be paused before its send (tests/db/test_sticky_unknown.py shows the refusal).
        accept_in_flight=True,
    )
    assert run_lease(_claim_one(j.pk)) == "succeeded"
    e = Effect.objects.get(job_id=j.pk)
    assert e.pk == first.pk and e.key == first.key
    assert (e.state, e.intents) == ("applied", 2)


def test_transactional_intent_writes_nothing_until_the_job_commits() -> None:
    j = tx.enqueue()
    lease = _claim_one(j.pk)
    with transaction.atomic():
        row = driver().effect_intend(lease, "credit")
        assert row.pk is None
        assert not Effect.objects.filter(job_id=j.pk).exists()
        driver().effect_settle(
            lease, row.key, Effect.APPLIED, destination_ref="ledger:1", name="credit"
        )
        assert Effect.objects.get(job_id=j.pk).state == "applied"
        transaction.set_rollback(True)
    assert not Effect.objects.filter(job_id=j.pk).exists()


def test_transactional_handler_writes_and_completion_commit_together_or_not_at_all() -> None:
    ok, bad = tx.enqueue(), tx.enqueue(fail=True)
    assert run_lease(_claim_one(ok.pk)) == "succeeded"
    assert Effect.objects.get(job_id=ok.pk).state == "applied"
    assert run_lease(_claim_one(bad.pk)) == "retried"
    assert not Effect.objects.filter(job_id=bad.pk).exists()
    assert Job.objects.get(pk=bad.pk).state == "waiting"


def test_transactional_attempt_that_lost_its_fence_commits_nothing() -> None:
    j = tx.enqueue()
    old = _claim_one(j.pk)
    _expire_and_reap(j.pk)
    _due_now(j.pk)
    new = _claim_one(j.pk)
    assert run_lease(old) == "stale"
    assert not Effect.objects.filter(job_id=j.pk).exists()
    assert calls == []  # refused before the handler's effect began
    assert run_lease(new) == "succeeded"
    assert Effect.objects.get(job_id=j.pk).fence == new.fence
