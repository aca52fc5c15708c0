"""The driver contract, part three: enqueues, broker hints, executors' liveness rows, earlier
owners still in flight, the count snapshot, retention, wake-ups and what the database says of
itself."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import threading
from datetime import datetime
from typing import Any

import pytest
from django.db import connection, transaction

from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import (
    Attempt,
    CountSnapshot,
    Effect,
    EffectEvent,
    Executor,
    Job,
    JobSpec,
)
from scheduler_core.storage.clock import DbNow
from scheduler_core.storage.drivers import driver
from tests.conftest import wait_until

from . import (
    DAY,
    EXEC,
    OTHER_QUEUE,
    QUEUE,
    age,
    batch_fields,
    between,
    claim,
    claim_one,
    fields,
    implements,
    insert,
    job_row,
    plain,
    reap,
    retry_now,
)

pytestmark = pytest.mark.django_db(transaction=True)


# -- insert_job ---------------------------------------------------------------------------------


def test_insert_job_writes_a_waiting_job_due_at_the_database_now() -> None:
    d = driver()
    before = d.now()
    j = d.insert_job(**fields(payload={"to": "a@example.com", "n": [1, 2]}, priority=3))
    after = d.now()
    assert j is not None
    row = job_row(j.pk)
    assert (row.name, row.queue, row.payload, row.priority) == (
        plain.name,
        QUEUE,
        {"to": "a@example.com", "n": [1, 2]},
        3,
    )
    assert (row.state, row.fence, row.attempts, row.version, row.next_kind) == (
        "waiting",
        0,
        0,
        1,
        "run",
    )
    assert (row.lease_owner, row.lease_expires_at, row.hinted_at) == ("", None, None)
    assert between(row.run_at, before, after)
    assert between(row.created_at, before, after)
    assert (j.state, j.run_at, j.created_at) == ("waiting", row.run_at, row.created_at)


def test_insert_job_keeps_an_explicit_due_time_and_marks_a_hinted_job() -> None:
    d = driver()
    at = (d.now() + dt.timedelta(hours=1)).replace(microsecond=250_000)
    j = d.insert_job(**fields(run_at=at, hinted=True))
    assert j is not None
    row = job_row(j.pk)
    assert row.run_at == at == j.run_at
    assert between(row.hinted_at, row.created_at, d.now())


def test_insert_job_returns_none_when_the_unique_key_is_taken() -> None:
    d = driver()
    first = d.insert_job(**fields(unique_key="k1", payload={"n": 1}))
    assert first is not None
    assert d.insert_job(**fields(unique_key="k1", payload={"n": 2})) is None
    [row] = Job.objects.filter(unique_key="k1")
    assert (row.pk, row.payload) == (first.pk, {"n": 1})


def test_insert_job_with_a_taken_unique_key_leaves_the_callers_transaction_usable() -> None:
    d = driver()
    with d.atomic():
        assert d.insert_job(**fields(unique_key="k1")) is not None
        assert d.insert_job(**fields(unique_key="k1")) is None
        assert d.insert_job(**fields(unique_key="k2")) is not None
    assert sorted(Job.objects.values_list("unique_key", flat=True)) == ["k1", "k2"]


def test_insert_job_joins_the_callers_transaction() -> None:
    d = driver()
    with pytest.raises(RuntimeError), d.atomic():
        d.insert_job(**fields())
        raise RuntimeError("the caller rolls back")
    assert not Job.objects.exists()


# -- insert_jobs ----------------------------------------------------------------------------------


def test_insert_jobs_returns_ids_and_due_times_in_payload_order() -> None:
    d = driver()
    payloads = [{"n": n} for n in (4, 0, 3, 1, 2)]
    before = d.now()
    rows = d.insert_jobs(payloads=payloads, **batch_fields())
    after = d.now()
    ids = [job_id for job_id, _ in rows]
    assert len(set(ids)) == 5
    assert [job_row(i).payload for i in ids] == payloads
    for job_id, run_at in rows:
        row = job_row(job_id)
        assert run_at == row.run_at
        assert between(run_at, before, after)
        assert (row.state, row.name, row.queue, row.hinted_at) == (
            "waiting",
            plain.name,
            QUEUE,
            None,
        )


def test_insert_jobs_gives_every_job_an_explicit_due_time_and_hint_mark() -> None:
    d = driver()
    at = (d.now() + dt.timedelta(hours=1)).replace(microsecond=125_000)
    rows = d.insert_jobs(payloads=[{"n": 1}, {"n": 2}], **batch_fields(run_at=at, hinted=True))
    assert [run_at for _, run_at in rows] == [at, at]
    for job_id, _ in rows:
        row = job_row(job_id)
        assert row.run_at == at and row.hinted_at is not None


def test_insert_jobs_joins_the_callers_transaction() -> None:
    d = driver()
    with pytest.raises(RuntimeError), d.atomic():
        d.insert_jobs(payloads=[{"n": 1}, {"n": 2}], **batch_fields())
        raise RuntimeError("the caller rolls back")
    assert not Job.objects.exists()


# -- take_due_hints ---------------------------------------------------------------------------------


def test_take_due_hints_picks_due_unhinted_jobs_in_claim_order_and_marks_them() -> None:
    d = driver()
    low = insert().pk
    high = insert(priority=4).pk
    future = insert(run_at=d.now() + dt.timedelta(hours=1)).pk
    elsewhere = insert(queue=OTHER_QUEUE).pk
    before = d.now()
    assert d.take_due_hints(queues=frozenset({QUEUE})) == [(high, QUEUE), (low, QUEUE)]
    after = d.now()
    for pk in (low, high):
        assert between(job_row(pk).hinted_at, before, after)
    assert job_row(future).hinted_at is None
    assert job_row(elsewhere).hinted_at is None


def test_take_due_hints_does_not_send_a_hint_again_at_once() -> None:
    d = driver()
    j = insert().pk
    assert d.take_due_hints() == [(j, QUEUE)]
    assert d.take_due_hints() == []


def test_take_due_hints_takes_at_most_limit_and_none_for_no_queues() -> None:
    d = driver()
    ids = [insert().pk for _ in range(3)]
    assert d.take_due_hints(queues=frozenset()) == []
    assert not Job.objects.filter(hinted_at__isnull=False).exists()
    assert d.take_due_hints(limit=2) == [(ids[0], QUEUE), (ids[1], QUEUE)]
    assert job_row(ids[2]).hinted_at is None


def test_take_due_hints_sends_a_fresh_hint_once_a_retried_job_is_due_again() -> None:
    d = driver()
    lease = claim_one()
    assert d.take_due_hints() == []  # leased: no hint
    retry_now(lease)
    assert d.take_due_hints() == [(lease.job_id, QUEUE)]


def test_take_due_hints_resends_an_old_hint_only_once_the_wait_doubled(settings: Any) -> None:
    settings.TENURE_REDISPATCH_AFTER_SECONDS = 10.0
    d = driver()
    recent, old = insert().pk, insert().pk
    # Both due 100 s ago. ``recent`` was hinted 15 s ago, 85 s after it was due: not again
    # until 85 s have passed. ``old`` was hinted 60 s ago, 40 s after it was due: again now.
    Job.objects.filter(pk__in=[recent, old]).update(run_at=DbNow(-100))
    Job.objects.filter(pk=recent).update(hinted_at=DbNow(-15))
    Job.objects.filter(pk=old).update(hinted_at=DbNow(-60))
    assert d.take_due_hints() == [(old, QUEUE)]


# -- executors: executor_started, executor_beat, executor_stopped, live_consumer_queues ---------------


def test_executor_started_registers_a_live_row() -> None:
    d = driver()
    before = d.now()
    d.executor_started(EXEC, transport="celery", queues=["a", "b"], concurrency=4)
    after = d.now()
    row = Executor.objects.get(pk=EXEC)
    assert (row.transport, row.queues, row.concurrency, row.active, row.pid) == (
        "celery",
        "a,b",
        4,
        0,
        os.getpid(),
    )
    assert row.stopped_at is None
    assert between(row.started_at, before, after) and between(row.heartbeat_at, before, after)
    assert d.live_consumer_queues("celery") == frozenset({"a", "b"})


def test_executor_started_again_clears_an_earlier_stop() -> None:
    d = driver()
    d.executor_started(EXEC, transport="celery", queues=["a"], concurrency=1)
    d.executor_stopped(EXEC)
    d.executor_started(EXEC, transport="celery", queues=["a", "c"], concurrency=2)
    row = Executor.objects.get(pk=EXEC)
    assert (row.stopped_at, row.queues, row.concurrency) == (None, "a,c", 2)
    assert Executor.objects.count() == 1


def test_executor_beat_refreshes_the_heartbeat_and_the_active_count() -> None:
    d = driver()
    d.executor_started(EXEC, transport="celery", queues=["a"], concurrency=4)
    Executor.objects.filter(pk=EXEC).update(heartbeat_at=DbNow(-120))
    before = d.now()
    d.executor_beat(EXEC, active=3)
    row = Executor.objects.get(pk=EXEC)
    assert row.active == 3
    assert between(row.heartbeat_at, before, d.now())


def test_executor_stopped_marks_the_row_and_its_queues_are_no_longer_consumed() -> None:
    d = driver()
    d.executor_started(EXEC, transport="celery", queues=["a"], concurrency=4)
    d.executor_beat(EXEC, active=2)
    d.executor_stopped(EXEC)
    row = Executor.objects.get(pk=EXEC)
    assert row.stopped_at is not None and row.active == 0
    assert d.live_consumer_queues("celery") == frozenset()


def test_live_consumer_queues_counts_only_fresh_executors_of_that_transport(
    settings: Any,
) -> None:
    settings.TENURE_EXECUTOR_STALE_SECONDS = 30.0
    d = driver()
    d.executor_started("t:fresh", transport="celery", queues=["a", "b"], concurrency=1)
    d.executor_started("t:silent", transport="celery", queues=["c"], concurrency=1)
    d.executor_started("t:rq", transport="rq", queues=["d"], concurrency=1)
    Executor.objects.filter(pk="t:silent").update(heartbeat_at=DbNow(-60))
    assert d.live_consumer_queues("celery") == frozenset({"a", "b"})
    assert d.live_consumer_queues("rq") == frozenset({"d"})
    assert d.live_consumer_queues("polling") == frozenset()


# -- in_flight_owners --------------------------------------------------------------------------------


def test_in_flight_owners_are_reaped_attempts_whose_executor_did_not_stop_newest_first() -> None:
    d = driver()
    j = insert().pk
    d.executor_started("t:live", transport="polling", queues=[QUEUE], concurrency=1)
    d.executor_started("t:gone", transport="polling", queues=[QUEUE], concurrency=1)
    d.executor_stopped("t:gone")
    leases = {}
    for executor in ("t:live", "t:unknown", "t:gone"):
        [lease] = claim(executor=executor, job_id=j)
        reap(lease)
        leases[executor] = lease
    [last] = claim(executor="t:live", job_id=j)
    retry_now(last)  # ended by its owner, not reaped
    owners = d.in_flight_owners(j)
    assert [(o.executor, o.attempt, o.fence) for o in owners] == [
        ("t:unknown", 2, 2),
        ("t:live", 1, 1),
    ]
    unknown, live = owners
    assert unknown.executor_last_seen is None
    assert live.executor_last_seen == Executor.objects.get(pk="t:live").heartbeat_at
    for owner in owners:
        a = leases[owner.executor]
        row = job_row(j).attempt_set.get(pk=a.attempt_id)
        assert (owner.last_heartbeat, owner.reaped_at) == (row.heartbeat_at, row.finished_at)
        assert owner.reaped_at is not None
    assert d.in_flight_owners(insert().pk) == []


# -- refresh_count_snapshot --------------------------------------------------------------------------


def _counts() -> dict[tuple[str, str, str], int]:
    return {(c.queue, c.name, c.state): c.n for c in CountSnapshot.objects.all()}


def test_refresh_count_snapshot_counts_succeeded_and_cancelled_jobs_per_queue_and_type() -> None:
    d = driver()
    for _ in range(2):
        d.complete(claim_one())
    d.complete(claim_one(queue=OTHER_QUEUE))
    cancelled = insert()
    assert d.operator_transition(
        cancelled.pk, expected_version=1, transition=states.OP_CANCEL, fields={}
    )
    insert()  # waiting: not counted
    before = d.now()
    assert d.refresh_count_snapshot(older_than=0) is True
    assert _counts() == {
        (QUEUE, plain.name, "succeeded"): 2,
        (OTHER_QUEUE, plain.name, "succeeded"): 1,
        (QUEUE, plain.name, "cancelled"): 1,
    }
    assert all(between(c.taken_at, before, d.now()) for c in CountSnapshot.objects.all())


def test_refresh_count_snapshot_keeps_a_snapshot_younger_than_asked_then_recounts() -> None:
    d = driver()
    d.complete(claim_one())
    assert d.refresh_count_snapshot(older_than=0) is True
    d.complete(claim_one())
    assert d.refresh_count_snapshot(older_than=3600) is False
    assert _counts() == {(QUEUE, plain.name, "succeeded"): 1}
    CountSnapshot.objects.update(taken_at=DbNow(-10))
    assert d.refresh_count_snapshot(older_than=5) is True
    assert _counts() == {(QUEUE, plain.name, "succeeded"): 2}


# -- prune_finished ------------------------------------------------------------------------------


def _succeeded_with_an_effect() -> int:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    d.effect_settle(lease, eff.key, Effect.APPLIED)
    d.complete(lease)
    return lease.job_id


def test_prune_finished_deletes_old_jobs_with_their_attempts_and_ledger() -> None:
    old = [_succeeded_with_an_effect() for _ in range(3)]
    recent = _succeeded_with_an_effect()
    age(old, 8 * DAY)
    assert driver().prune_finished("succeeded", 7 * DAY) == 3
    assert list(Job.objects.values_list("pk", flat=True)) == [recent]
    assert not Attempt.objects.filter(job_id__in=old).exists()
    assert not Effect.objects.filter(job_id__in=old).exists()
    assert not EffectEvent.objects.filter(effect__job_id__in=old).exists()
    # No foreign key removes the spec rows (migration 0014): retention's own delete does.
    assert list(JobSpec.objects.values_list("job_id", flat=True)) == [recent]
    assert Effect.objects.filter(job_id=recent).count() == 1
    assert driver().prune_finished("succeeded", 7 * DAY) == 0


def test_prune_finished_takes_the_oldest_first_up_to_limit() -> None:
    ids = [_succeeded_with_an_effect() for _ in range(3)]
    for job_id, days in zip(ids, (10, 9, 8), strict=True):
        age([job_id], days * DAY)
    assert driver().prune_finished("succeeded", 7 * DAY, limit=2) == 2
    assert list(Job.objects.values_list("pk", flat=True)) == [ids[2]]


def test_prune_finished_keeps_jobs_an_operator_acted_on() -> None:
    kept, gone = _succeeded_with_an_effect(), _succeeded_with_an_effect()
    driver().audit(job_id=kept, actor="alice", action="note", reason="looked at it")
    age([kept, gone], 8 * DAY)
    assert driver().prune_finished("succeeded", 7 * DAY) == 1
    assert list(Job.objects.values_list("pk", flat=True)) == [kept]


def test_prune_finished_keeps_jobs_whose_effect_may_have_happened() -> None:
    d = driver()
    doubtful = claim_one()
    d.effect_intend(doubtful, "send")
    d.finish(doubtful, Decision(transition=states.FAIL, reason="x"), outcome="failed")
    clean = claim_one()
    d.finish(clean, Decision(transition=states.FAIL, reason="x"), outcome="failed")
    age([doubtful.job_id, clean.job_id], 8 * DAY)
    assert d.prune_finished("failed", 7 * DAY) == 1
    assert list(Job.objects.values_list("pk", flat=True)) == [doubtful.job_id]
    assert Effect.objects.get(job_id=doubtful.job_id).state == Effect.UNKNOWN


def test_prune_finished_deletes_only_jobs_in_the_named_state() -> None:
    d = driver()
    failed = claim_one()
    d.finish(failed, Decision(transition=states.FAIL, reason="x"), outcome="failed")
    done = _succeeded_with_an_effect()
    age([failed.job_id, done], 8 * DAY)
    assert d.prune_finished("succeeded", 7 * DAY) == 1
    assert list(Job.objects.values_list("pk", flat=True)) == [failed.job_id]


@pytest.mark.parametrize("older_than, limit", [(0, 1000), (-1, 1000), (DAY, 0)])
def test_prune_finished_with_no_age_or_no_limit_deletes_nothing(
    older_than: float, limit: int
) -> None:
    done = _succeeded_with_an_effect()
    age([done], 8 * DAY)
    assert driver().prune_finished("succeeded", older_than, limit=limit) == 0
    assert Job.objects.filter(pk=done).exists()


@pytest.mark.parametrize("state", ["waiting", "leased", "indeterminate", "cancelled"])
def test_prune_finished_refuses_states_other_than_succeeded_and_failed(state: str) -> None:
    j = insert()
    Job.objects.filter(pk=j.pk).update(state=state)
    age([j.pk], 8 * DAY)
    with pytest.raises(ValueError, match="only finished jobs"):
        driver().prune_finished(state, 7 * DAY)
    assert Job.objects.filter(pk=j.pk).exists()


# -- notify, listen ----------------------------------------------------------------------------------


def test_a_wake_up_is_heard_once_its_transaction_commits_or_never_without_notifications() -> None:
    """``listen`` ends at once where the database has no notifications (and ``notify`` is then
    a harmless no-op); otherwise a committed ``notify`` is heard and a rolled-back one never."""
    d = driver()
    due = d.now()
    if not implements(d, "listen"):
        with d.atomic():
            d.notify(QUEUE, 5, due)
        assert list(itertools.islice(d.listen(lambda: False), 3)) == []
        return
    stop, listening = threading.Event(), threading.Event()
    heard: list[tuple[str, int, datetime]] = []

    def listener() -> None:
        try:
            for woken in d.listen(stop.is_set):
                if woken is None:
                    listening.set()
                else:
                    heard.append(woken)
        finally:
            connection.close()

    t = threading.Thread(target=listener)
    t.start()
    try:
        assert listening.wait(30), "the listener never reported in"
        with pytest.raises(RuntimeError), d.atomic():
            d.notify(QUEUE, 1, due)
            raise RuntimeError("the caller rolls back")
        with d.atomic():
            d.notify(QUEUE, 5, due)
            assert heard == []  # not before the commit
        wait_until(lambda: heard, timeout=30)
    finally:
        stop.set()
        t.join(30)
    [(queue, priority, at)] = heard
    assert (queue, priority) == (QUEUE, 5)
    assert abs(at - due) < dt.timedelta(milliseconds=1)


# -- database_pressure, estimated_jobs ---------------------------------------------------------------


def test_database_pressure_names_a_held_snapshot_or_is_empty_without_row_versions() -> None:
    d = driver()
    if not implements(d, "database_pressure"):
        assert d.database_pressure() == {}
        return
    held, release = threading.Event(), threading.Event()

    def hold_a_snapshot() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cur.execute("SELECT count(*) FROM tenure_job")
                held.set()
                release.wait(30)
        finally:
            connection.close()

    t = threading.Thread(target=hold_a_snapshot)
    t.start()
    try:
        assert held.wait(30)
        pressure = d.database_pressure()
    finally:
        release.set()
        t.join(30)
    assert set(pressure) == {"session", "table"}
    session = pressure["session"]
    assert session is not None and session["state"] == "idle in transaction"
    assert session["seconds"] >= 0
    assert {"n_dead_tup", "n_live_tup"} <= set(pressure["table"])


def test_estimated_jobs_is_an_int_and_minus_one_where_none_is_kept() -> None:
    d = driver()
    for _ in range(3):
        insert()
    n = d.estimated_jobs()
    assert isinstance(n, int)
    if implements(d, "estimated_jobs"):
        assert n >= -1
    else:
        assert n == -1
