"""The claim protocol against a real database: atomic ownership, fencing, leases, reaping."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection, transaction

from scheduler_core import EnqueueError, UnknownJob, enqueue, job
from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Attempt, Job, StaleWrite
from scheduler_core.runtime import attempt
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

seen: list[tuple[int, int, int]] = []


@job(name="tests.claim.record", lease_seconds=30, max_attempts=3)
def record(ctx: Any, *, n: int = 0) -> None:
    seen.append((ctx.job_id, ctx.attempt, ctx.fence))


@job(name="tests.claim.short", lease_seconds=1, max_attempts=3)
def short(ctx: Any) -> None:
    pass


def _claim(limit: int = 1, executor: str = "t:1:a") -> list[Lease]:
    return driver().claim(executor=executor, queues=["default"], limit=limit)


pytestmark = pytest.mark.django_db(transaction=True)


def test_claim_leases_the_job_increments_fence_and_writes_an_attempt() -> None:
    j = record.enqueue(n=1)
    [lease] = _claim()
    j.refresh_from_db()
    assert (j.state, j.fence, j.attempts, j.lease_owner) == ("leased", 1, 1, "t:1:a")
    assert lease.fence == 1 and lease.attempt == 1 and lease.payload == {"n": 1}
    a = Attempt.objects.get(pk=lease.attempt_id)
    assert (a.job_id, a.fence, a.number, a.kind, a.executor) == (j.pk, 1, 1, "run", "t:1:a")


def test_lease_expiry_is_set_from_the_database_clock() -> None:
    record.enqueue()
    before = driver().now()
    [lease] = _claim()
    after = driver().now()
    j = Job.objects.get(pk=lease.job_id)
    assert (
        before + dt.timedelta(seconds=29) <= j.lease_expires_at <= after + dt.timedelta(seconds=31)
    )


def test_a_claimed_job_is_not_claimed_again() -> None:
    record.enqueue()
    assert len(_claim()) == 1
    assert _claim(executor="t:2:b") == []


def test_batch_claim_takes_up_to_limit_in_priority_then_due_order() -> None:
    low = [record.enqueue(n=i).pk for i in range(3)]
    high = record.enqueue(n=9, priority=5).pk
    leases = _claim(limit=2)
    assert len(leases) == 2
    assert {x.job_id for x in leases} == {high, low[0]}


def test_future_run_at_is_not_claimed_until_due() -> None:
    record.enqueue(run_at=driver().now() + dt.timedelta(hours=1))
    assert _claim() == []


def test_claim_by_id_only_takes_that_waiting_due_job() -> None:
    a = record.enqueue().pk
    b = record.enqueue().pk
    [lease] = driver().claim(executor="x", job_id=b)
    assert lease.job_id == b
    assert driver().claim(executor="y", job_id=b) == []
    assert driver().claim(executor="y", job_id=999999) == []
    assert Job.objects.get(pk=a).state == "waiting"


def test_write_with_an_old_fence_changes_nothing_and_is_reported() -> None:
    record.enqueue()
    [old] = _claim()
    # The lease is lost: the reaper moves the job on and another executor claims it.
    Job.objects.filter(pk=old.job_id).update(
        lease_expires_at=driver().now() - dt.timedelta(seconds=5)
    )
    assert reaper.reap_once()["reap_retry"] == 1
    [new] = _claim(executor="t:2:b")
    assert new.fence == old.fence + 1
    for write in (
        lambda: driver().heartbeat(old),
        lambda: driver().complete(old),
        lambda: driver().finish(
            old, Decision(transition=states.FAIL, reason="x"), outcome="failed"
        ),
        lambda: driver().effect_intend(old, "charge"),
        lambda: attempt.release(old),
    ):
        with pytest.raises(StaleAttempt):
            write()
    j = Job.objects.get(pk=new.job_id)
    assert (j.state, j.fence, j.lease_owner) == ("leased", new.fence, "t:2:b")
    # Through the executor: the stale attempt runs, its completion is refused and recorded.
    assert run_lease(old) == "stale"
    assert StaleWrite.objects.filter(job_id=old.job_id, fence=old.fence).count() == 1
    driver().complete(new)
    assert Job.objects.get(pk=new.job_id).state == "succeeded"


def test_heartbeat_extends_the_lease() -> None:
    record.enqueue()
    [lease] = _claim()
    Job.objects.filter(pk=lease.job_id).update(
        lease_expires_at=driver().now() + dt.timedelta(seconds=1)
    )
    driver().heartbeat(lease)
    j = Job.objects.get(pk=lease.job_id)
    assert j.lease_expires_at > driver().now() + dt.timedelta(seconds=25)


def test_reaper_leaves_live_leases_and_moves_expired_ones() -> None:
    record.enqueue()
    record.enqueue()
    a, b = _claim(limit=2)
    Job.objects.filter(pk=a.job_id).update(
        lease_expires_at=driver().now() - dt.timedelta(seconds=1)
    )
    counts = reaper.reap_once()
    assert counts == {"reap_retry": 1}
    ja, jb = Job.objects.get(pk=a.job_id), Job.objects.get(pk=b.job_id)
    assert (ja.state, ja.lease_owner) == ("waiting", "")
    assert jb.state == "leased"
    assert Attempt.objects.get(pk=a.attempt_id).outcome == "lease_expired"


def test_reaper_fails_a_job_whose_attempts_are_spent() -> None:
    j = short.enqueue()
    for _ in range(3):
        assert len(_claim()) == 1
        Job.objects.filter(pk=j.pk).update(
            lease_expires_at=driver().now() - dt.timedelta(seconds=1)
        )
        reaper.reap_once()
    j.refresh_from_db()
    assert j.state == "failed" and "attempts exhausted" in j.reason
    assert j.attempts == 3


def test_release_returns_the_job_without_spending_the_attempt() -> None:
    j = record.enqueue()
    [lease] = _claim()
    attempt.release(lease)
    j.refresh_from_db()
    assert (j.state, j.attempts) == ("waiting", 0)
    assert Attempt.objects.get(pk=lease.attempt_id).outcome == "released"


def test_executor_runs_handler_with_identity_attempt_and_fence() -> None:
    seen.clear()
    j = record.enqueue(n=3)
    [lease] = _claim()
    assert run_lease(lease) == "succeeded"
    assert seen == [(j.pk, 1, 1)]
    j.refresh_from_db()
    assert j.state == "succeeded" and j.finished_at is not None


# ---------------------------------------------------------------------------------------------
# Enqueue: dedup, the caller's transaction, bad input
# ---------------------------------------------------------------------------------------------


def test_unique_key_returns_the_job_already_accepted() -> None:
    a = record.enqueue(n=1, unique_key="k1")
    b = record.enqueue(n=2, unique_key="k1")
    assert a.pk == b.pk and b.payload == {"n": 1}
    assert Job.objects.filter(unique_key="k1").count() == 1


def test_enqueue_joins_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        record.enqueue(n=1)
        raise RuntimeError("caller rolls back")
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "payload, error",
    [
        ({"n": float("nan")}, "NaN"),
        ({"n": "a\x00b"}, "NUL"),
        ({"n": "\ud800"}, "UTF-8"),
        ({"n": 2**70}, "64 bits"),
        ({"n": object()}, "not JSON"),
        ({"m": 1}, "does not fit"),
        ({"n": "x" * 300_000}, "limit"),
        ({"n": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, "deeper"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_payload_is_refused_and_writes_nothing(payload: Any, error: str) -> None:
    with pytest.raises(EnqueueError, match=error):
        enqueue("tests.claim.record", payload)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "options, error",
    [
        ({"run_at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"run_at": dt.datetime(9000, 1, 1, tzinfo=dt.UTC)}, "days ahead"),
        ({"run_at": "tomorrow"}, "datetime"),
        ({"priority": 10**6}, "priority"),
        ({"unique_key": ""}, "unique_key"),
        ({"unique_key": "x" * 301}, "unique_key"),
    ],
)
def test_nonsensical_options_are_refused(options: dict[str, Any], error: str) -> None:
    with pytest.raises(EnqueueError, match=error):
        enqueue("tests.claim.record", {"n": 1}, **options)
    assert Job.objects.count() == 0


def test_unregistered_name_is_refused() -> None:
    with pytest.raises(UnknownJob, match="no job is registered"):
        enqueue("nope.missing", {})
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": 10**9}, "lease_seconds"),
        ({"effect": "exactly_once"}, "effect"),
    ],
)
def test_nonsensical_job_options_are_refused_at_registration(
    kwargs: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        job(name="tests.claim.bad", **kwargs)(lambda ctx: None)


# ---------------------------------------------------------------------------------------------
# Two connections (PostgreSQL): a claim skips rows another transaction holds
# ---------------------------------------------------------------------------------------------


def _second_connection() -> Any:
    import psycopg

    return psycopg.connect(**connection.get_connection_params())


@pytest.mark.postgres
def test_claim_skips_a_row_locked_by_another_connection() -> None:
    first = record.enqueue(n=1).pk
    second = record.enqueue(n=2).pk
    other = _second_connection()
    try:
        other.execute("BEGIN")
        other.execute("SELECT id FROM tenure_job WHERE id = %s FOR UPDATE", [first])
        leases = _claim(limit=2)
        assert [x.job_id for x in leases] == [second]
    finally:
        other.rollback()
        other.close()
    assert [x.job_id for x in _claim()] == [first]


@pytest.mark.postgres
def test_stale_completion_waits_for_the_reaper_then_changes_nothing() -> None:
    """A completion racing the reaper's locked row is decided after the reaper commits."""
    record.enqueue()
    [lease] = _claim()
    other = _second_connection()
    try:
        other.execute("BEGIN")
        other.execute(
            "UPDATE tenure_job SET state='waiting', lease_owner='', version=version+1 "
            "WHERE id=%s AND fence=%s",
            [lease.job_id, lease.fence],
        )
        result: list[Any] = []

        def complete() -> None:
            try:
                driver().complete(lease)
                result.append("accepted")
            except StaleAttempt:
                result.append("refused")
            finally:
                connection.close()

        t = threading.Thread(target=complete)
        t.start()
        t.join(0.5)
        assert t.is_alive(), "the completion should wait on the row lock"
        other.commit()
        t.join(10)
        assert result == ["refused"]
    finally:
        other.close()
    assert Job.objects.get(pk=lease.job_id).state == "waiting"


def test_concurrent_claimers_never_share_a_job() -> None:
    ids = {record.enqueue(n=i).pk for i in range(200)}
    got: list[list[int]] = []
    lock = threading.Lock()

    def claimer(k: int) -> None:
        mine: list[int] = []
        try:
            while True:
                leases = driver().claim(executor=f"t:{k}", queues=["default"], limit=7)
                if not leases:
                    break
                mine.extend(x.job_id for x in leases)
        finally:
            connection.close()
        with lock:
            got.append(mine)

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    flat = [i for mine in got for i in mine]
    assert sorted(flat) == sorted(ids)
    assert len(flat) == len(set(flat))
    assert Job.objects.filter(fence=1, state="leased").count() == 200
