"""Fences across a failover (PostgreSQL): the claim folds the server's timeline into the fence,
so a fence handed out after a promotion exceeds every fence of an earlier timeline, including
those of claims the promoted standby never received. The timeline is faked here by redefining
``tenure_fence_epoch()``; ``make chaos-failover`` (tests/process/test_failover.py) promotes a
real standby."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from scheduler_core import job
from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Attempt, Job
from scheduler_core.read import failover, liveness
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import EPOCH_BITS, Lease

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@job(name="tests.epoch.noop", lease_seconds=30, max_attempts=5)
def noop(ctx: Any) -> None:
    pass


def _claim(executor: str = "t:1:a") -> list[Lease]:
    return driver().claim(executor=executor, queues=["default"], limit=10)


def _restore_epoch() -> None:
    from importlib import import_module

    sql = import_module("scheduler_core.migrations.0021_fence_epoch").EPOCH_SQL
    with connection.cursor() as cur:
        cur.execute(sql)


@pytest.fixture
def on_timeline() -> Iterator[Callable[[int], None]]:
    """``on_timeline(n)``: the server's timeline reads as ``n`` from now on (this database)."""

    def switch(timeline: int) -> None:
        with connection.cursor() as cur:
            cur.execute(
                "CREATE OR REPLACE FUNCTION tenure_fence_epoch() RETURNS bigint "
                f"LANGUAGE sql VOLATILE AS $$ SELECT {int(timeline) - 1}::bigint $$"
            )

    try:
        yield switch
    finally:
        _restore_epoch()


def _lose_last_claim(job_id: int, fence: int) -> None:
    """The store as a standby left behind by its primary sees it: the claim that gave
    ``fence`` and its attempt never happened (the job waits again at the fence before)."""
    Attempt.objects.filter(job_id=job_id, fence=fence).delete()
    Job.objects.filter(pk=job_id).update(
        state="waiting", fence=fence - 1, attempts=fence - 1, lease_owner="", lease_expires_at=None
    )


def test_the_epoch_function_reads_the_timeline_the_server_writes() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT tenure_fence_epoch(), timeline_id FROM pg_control_checkpoint()")
        epoch, timeline = cur.fetchone()
    assert epoch == timeline - 1


def test_on_timeline_one_fences_count_from_one_as_before(on_timeline: Any) -> None:
    on_timeline(1)
    j = noop.enqueue()
    [lease] = _claim()
    assert lease.fence == 1
    Job.objects.filter(pk=j.pk).update(state="waiting", lease_owner="")
    Attempt.objects.filter(job_id=j.pk).update(finished_at=driver().now(), outcome="retried")
    [again] = _claim()
    assert again.fence == 2


def test_a_claim_lost_to_a_promotion_is_never_given_again_with_the_same_fence(
    on_timeline: Any,
) -> None:
    """The lost claim had fence 2 on timeline 1; the promoted standby holds fence 1. The claim
    on timeline 2 hands out ``1 << 32``, above anything timeline 1 gave. Before the epoch the
    standby handed out fence 2 a second time."""
    on_timeline(1)
    j = noop.enqueue()
    [first] = _claim()
    Job.objects.filter(pk=j.pk).update(state="waiting", lease_owner="")
    Attempt.objects.filter(pk=first.attempt_id).update(
        finished_at=driver().now(), outcome="retried"
    )
    [lost] = _claim()
    assert lost.fence == 2
    _lose_last_claim(j.pk, lost.fence)
    on_timeline(2)
    [after] = _claim(executor="t:2:b")
    assert after.fence == 1 << EPOCH_BITS
    assert after.fence > lost.fence
    assert Attempt.objects.filter(job_id=j.pk).count() == 2


def test_fences_keep_growing_within_a_timeline_and_across_several(on_timeline: Any) -> None:
    on_timeline(3)
    j = noop.enqueue()
    given = []
    for timeline in (3, 3, 4, 4, 6):
        on_timeline(timeline)
        [lease] = _claim()
        given.append(lease.fence)
        Job.objects.filter(pk=j.pk).update(state="waiting", lease_owner="")
        Attempt.objects.filter(pk=lease.attempt_id).update(
            finished_at=driver().now(), outcome="retried"
        )
    assert given == [2 << 32, (2 << 32) + 1, 3 << 32, (3 << 32) + 1, 5 << 32]


def test_a_fence_from_a_higher_timeline_is_kept_when_the_store_moves_to_a_lower_one(
    on_timeline: Any,
) -> None:
    """A database restored into a new cluster (timeline 1) keeps its fences growing."""
    on_timeline(5)
    j = noop.enqueue()
    [lease] = _claim()
    Job.objects.filter(pk=j.pk).update(state="waiting", lease_owner="")
    Attempt.objects.filter(pk=lease.attempt_id).update(
        finished_at=driver().now(), outcome="retried"
    )
    on_timeline(1)
    [again] = _claim()
    assert again.fence == lease.fence + 1


def test_a_prepared_claim_reads_the_new_timeline_on_the_same_connection(
    on_timeline: Any,
) -> None:
    """The claim is prepared per connection; it reads the epoch at every execution."""
    on_timeline(1)
    for _ in range(3):
        noop.enqueue()
    [a] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    [b] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    on_timeline(2)
    [c] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    assert (a.fence, b.fence, c.fence) == (1, 1, 1 << 32)


def test_without_prepared_statements_the_claim_reads_the_epoch_too(
    on_timeline: Any, settings: Any
) -> None:
    """``TENURE_PREPARED_STATEMENTS = False``, as behind a transaction-pooling PgBouncer
    (docs/howto/pgbouncer.md): the epoch is a function the statement calls, no session state."""
    settings.TENURE_PREPARED_STATEMENTS = False
    on_timeline(1)
    noop.enqueue(), noop.enqueue()
    [a] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    on_timeline(3)
    [b] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    assert (a.fence, b.fence) == (1, 2 << EPOCH_BITS)


def test_after_a_reconnect_the_claim_reaches_a_job_whose_claim_the_standby_lost(
    on_timeline: Any,
) -> None:
    """The claim seeks from this process's floors, raised by the claims it made. A promoted
    standby that lost one of them has that job waiting below the floors again; the promotion
    broke the connection, and a new connection drops the floors, so the next claim reads from
    the start. Before, the job waited for the next full read (``CLAIM_FULL_SCAN_SECONDS``),
    and an asynchronous failover drained at a few jobs per full read."""
    on_timeline(1)
    now = driver().now()
    x = noop.enqueue(run_at=now - dt.timedelta(seconds=60))
    y = noop.enqueue(run_at=now - dt.timedelta(seconds=1))
    [lx] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    [ly] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    assert (lx.job_id, ly.job_id) == (x.pk, y.pk)
    _lose_last_claim(x.pk, lx.fence)
    on_timeline(2)
    connection.close()  # as a promotion does
    assert [le.job_id for le in _claim(executor="t:2:b")] == [x.pk]


# -- attempt numbers --------------------------------------------------------------------------


def _finish(lease: Lease) -> None:
    Job.objects.filter(pk=lease.job_id).update(state="waiting", lease_owner="")
    Attempt.objects.filter(pk=lease.attempt_id).update(
        finished_at=driver().now(), outcome="retried"
    )


def test_attempt_numbers_given_after_a_promotion_come_after_any_the_lost_timeline_gave(
    on_timeline: Any,
) -> None:
    """Timeline 1 claimed the job (attempt 1) in a commit the standby never received; the
    standby's claim numbered its attempt 1 again before ``attempt_base``. Now it numbers it
    past the job's budget (5), and the retry policy still counts the attempts spent."""
    on_timeline(1)
    j = noop.enqueue()
    [lost] = _claim()
    assert (lost.number, lost.fence) == (1, 1)
    _lose_last_claim(j.pk, lost.fence)
    on_timeline(2)
    [after] = _claim(executor="t:2:b")
    assert after.number == 6 and after.attempt == 1
    assert Attempt.objects.get(pk=after.attempt_id).number == 6
    _finish(after)
    [retry] = _claim(executor="t:2:b")
    assert (retry.number, retry.attempt) == (7, 2)
    assert list(Attempt.objects.filter(job_id=j.pk).values_list("number", flat=True)) == [6, 7]


def test_a_job_enqueued_after_the_promotion_numbers_its_attempts_from_one(
    on_timeline: Any,
) -> None:
    """Tenure first wrote on timeline 2 before the job was created: no timeline lost a claim
    of it. A job claimed already on timeline 2 is not moved again either."""
    on_timeline(2)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO tenure_timeline (timeline, first_seen_at) "
            "VALUES (2, clock_timestamp() - interval '1 minute')"
        )
    noop.enqueue()
    [lease] = _claim()
    assert (lease.number, lease.attempt) == (1, 1)
    _finish(lease)
    [again] = _claim()
    assert again.number == 2


def test_a_claim_on_the_first_timeline_does_not_move_the_numbers(on_timeline: Any) -> None:
    on_timeline(1)
    j = noop.enqueue()
    for expected in (1, 2, 3):
        [lease] = _claim()
        assert lease.number == expected
        _finish(lease)
    assert Job.objects.get(pk=j.pk).attempt_base == 0


# -- what the console says ------------------------------------------------------------------


def _status_text() -> str:
    out = io.StringIO()
    call_command("jobs_status", stdout=out)
    return out.getvalue()


def test_no_failover_is_reported_while_the_timeline_stays(on_timeline: Any) -> None:
    on_timeline(1)
    driver().record_timeline()
    assert failover.failover() == {"timeline": 1, "timeline_changed": False}
    assert "failover" not in {r.key for r in liveness.assess(pressure=None).reasons}
    assert "failover:" not in _status_text()


def test_the_console_reports_a_failover_and_names_the_jobs_that_may_have_run_twice(
    on_timeline: Any,
) -> None:
    """Job ``a`` was running at the switch and ran again on the new timeline; job ``b``'s claim
    was lost with the old primary, and its first execution showed itself by a refused write.
    Both are named with the fences of both executions."""
    on_timeline(1)
    driver().record_timeline()
    a, b = noop.enqueue(), noop.enqueue()
    [lease_a] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    [lease_b] = driver().claim(executor="t:1:a", queues=["default"], limit=1)
    assert (lease_a.job_id, lease_b.job_id) == (a.pk, b.pk)
    _lose_last_claim(b.pk, lease_b.fence)
    on_timeline(2)
    assert driver().record_timeline() == 2
    # ``a``'s lease is reaped on the new timeline, and both run again.
    Attempt.objects.filter(pk=lease_a.attempt_id).update(
        finished_at=driver().now(), outcome="lease_expired"
    )
    Job.objects.filter(pk=a.pk).update(state="waiting", lease_owner="")
    again = {x.job_id: x.fence for x in _claim(executor="t:2:b")}
    assert again == {a.pk: 1 << EPOCH_BITS, b.pk: 1 << EPOCH_BITS}
    # The lost execution of ``b`` tries to renew its lease: refused, and recorded.
    with pytest.raises(StaleAttempt) as refused:
        driver().heartbeat(lease_b)
    driver().record_stale(refused.value, "t:1:a")

    report = failover.failover()
    assert report["timeline_changed"] and (report["previous_timeline"], report["timeline"]) == (
        1,
        2,
    )
    assert report["dated_by"] == "recorded"
    assert report["in_flight_at_switch"] == 1
    assert report["possibly_rerun"] == 2
    assert report["jobs"] == [
        {"job": a.pk, "old_fences": [1], "new_fences": [1 << 32], "lost_execution": False},
        {"job": b.pk, "old_fences": [1], "new_fences": [1 << 32], "lost_execution": True},
    ]
    [reason] = [r for r in liveness.assess(pressure=None).reasons if r.key == "failover"]
    assert "timeline 1 to 2" in reason.text and "1 attempts were in flight" in reason.text
    text = _status_text()
    assert "failover: The store failed over" in text
    assert f"job {b.pk}: fences [1] before the switch, [{1 << 32}] after" in text
    out = io.StringIO()
    call_command("jobs_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["failover"]["possibly_rerun"] == 2
