"""The driver contract, part one: the driver itself and its capabilities, claims, completions,
heartbeats and ownership checks. Every test goes through :func:`driver` and reads the rows
back; the same tests run on every database (see ``tests/storage/__init__.py``)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection
from django.utils import timezone

from scheduler_core.domain import states
from scheduler_core.exceptions import (
    AttemptOverrun,
    EffectsUnsettled,
    StaleAttempt,
)
from scheduler_core.models import (
    Attempt,
    Effect,
    Job,
    StaleWrite,
)
from scheduler_core.storage.drivers import driver

from . import (
    EXEC,
    EXEC2,
    LEASE_SECONDS,
    OTHER_QUEUE,
    QUEUE,
    TIMEOUT,
    attempt_row,
    between,
    claim,
    claim_one,
    expire,
    insert,
    job_row,
    overrun,
    retry_now,
    take_over,
)

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = dt.timedelta(seconds=LEASE_SECONDS)


# -- the driver and its capabilities ------------------------------------------------------------


def test_driver_is_made_once_per_alias_for_the_connections_vendor() -> None:
    d = driver()
    assert d is driver() is driver("default")
    assert d.vendor == connection.vendor
    assert d.alias == "default"


def test_now_is_an_aware_datetime_close_to_pythons_clock() -> None:
    now = driver().now()
    assert now.tzinfo is not None and now.utcoffset() is not None
    assert abs(now - timezone.now()) < dt.timedelta(seconds=5)


def test_transaction_id_is_an_int_inside_a_transaction_only_with_the_capability() -> None:
    d = driver()
    with d.atomic():
        xid = d.transaction_id()
        insert()
    if d.has_transaction_ids:
        assert isinstance(xid, int) and xid > 0
        assert d.transaction_status(xid) == "committed"
    else:
        assert xid is None
        assert d.transaction_status(1) is None


def test_transaction_status_of_a_rolled_back_transaction_is_aborted_with_the_capability() -> None:
    d = driver()
    xid: int | None = None
    with pytest.raises(RuntimeError), d.atomic():
        xid = d.transaction_id()
        insert()
        raise RuntimeError("the caller rolls back")
    assert Job.objects.count() == 0
    if d.has_transaction_ids:
        assert xid is not None and d.transaction_status(xid) == "aborted"
    else:
        assert xid is None


def test_a_claim_skips_a_row_another_transaction_holds_or_waits_for_its_writer() -> None:
    """``skips_locked_rows``: the second claim takes the next job at once; without it the
    database serialises writers, so the second claim waits for the first's transaction."""
    first, second = insert().pk, insert().pk
    held, release = threading.Event(), threading.Event()
    holder_got: list[int] = []
    claimer_got: list[list[int]] = []

    def holder() -> None:
        try:
            with driver().atomic():
                holder_got.extend(x.job_id for x in claim(executor="t:holder"))
                held.set()
                release.wait(30)
        finally:
            connection.close()

    def claimer() -> None:
        try:
            claimer_got.append([x.job_id for x in claim(limit=2, executor="t:claimer")])
        finally:
            connection.close()

    a = threading.Thread(target=holder)
    a.start()
    try:
        assert held.wait(30)
        b = threading.Thread(target=claimer)
        b.start()
        if driver().skips_locked_rows:
            b.join(30)
            assert not b.is_alive(), "the claim should skip the held row, not wait for it"
            assert not release.is_set()
        else:
            b.join(1.0)
            assert b.is_alive(), "the second writer should wait for the first's transaction"
            release.set()
            b.join(30)
            assert not b.is_alive()
        assert claimer_got == [[second]]
    finally:
        release.set()
        a.join(30)
    assert holder_got == [first]
    assert job_row(first).lease_owner == "t:holder"
    assert job_row(second).lease_owner == "t:claimer"


# -- claim -------------------------------------------------------------------------------------


def test_claim_takes_due_jobs_by_priority_then_due_time_then_id() -> None:
    now = driver().now()
    late = insert(run_at=now - dt.timedelta(seconds=10)).pk
    early = insert(run_at=now - dt.timedelta(seconds=60)).pk
    early_twin = insert(run_at=now - dt.timedelta(seconds=60)).pk
    urgent = insert(run_at=now - dt.timedelta(seconds=5), priority=5).pk
    assert [x.job_id for x in claim(limit=3)] == [urgent, early, early_twin]
    assert job_row(late).state == "waiting"
    assert [x.job_id for x in claim(limit=3)] == [late]


def test_claims_one_at_a_time_take_the_jobs_of_a_priority_by_due_time_then_id() -> None:
    now = driver().now()
    late = insert(run_at=now - dt.timedelta(seconds=10)).pk
    early = insert(run_at=now - dt.timedelta(seconds=60)).pk
    early_twin = insert(run_at=now - dt.timedelta(seconds=60)).pk
    assert [[x.job_id for x in claim()] for _ in range(4)] == [[early], [early_twin], [late], []]


def test_a_claim_after_one_cut_off_by_its_limit_reaches_the_lower_priorities() -> None:
    """Each claim takes the best due job there is: after a claim of one took the only job of
    a high priority, the next takes the lower priority's job (nothing else holds it)."""
    d = driver()
    low = insert(run_at=d.now() - dt.timedelta(seconds=60)).pk
    high = insert(priority=5).pk
    assert [x.job_id for x in claim()] == [high]
    assert [x.job_id for x in claim()] == [low]


def test_claim_takes_at_most_limit_jobs() -> None:
    ids = [insert().pk for _ in range(3)]
    assert len(claim(limit=2)) == 2
    assert Job.objects.filter(pk__in=ids, state="leased").count() == 2
    assert Job.objects.filter(pk__in=ids, state="waiting").count() == 1


@pytest.mark.parametrize("limit", [0, -1])
def test_claim_with_a_limit_below_one_returns_nothing_and_writes_nothing(limit: int) -> None:
    j = insert()
    assert claim(limit=limit) == []
    assert claim(limit=limit, job_id=j.pk) == []
    assert (job_row(j).state, job_row(j).fence) == ("waiting", 0)
    assert not Attempt.objects.exists()


def test_claim_leaves_jobs_not_yet_due_untouched() -> None:
    due = insert().pk
    future = insert(run_at=driver().now() + dt.timedelta(hours=1)).pk
    assert [x.job_id for x in claim(limit=10)] == [due]
    row = job_row(future)
    assert (row.state, row.fence, row.attempts, row.version, row.lease_owner) == (
        "waiting",
        0,
        0,
        1,
        "",
    )
    assert not Attempt.objects.filter(job_id=future).exists()


def test_claim_takes_only_jobs_of_the_named_queues() -> None:
    other = insert(queue=OTHER_QUEUE).pk
    assert claim(limit=10) == []
    assert job_row(other).state == "waiting"
    assert [x.job_id for x in claim(limit=10, queues=[QUEUE, OTHER_QUEUE])] == [other]


def test_a_claim_of_several_queues_takes_the_best_jobs_across_them() -> None:
    now = driver().now()
    low = insert(run_at=now - dt.timedelta(seconds=50)).pk
    high = insert(queue=OTHER_QUEUE, priority=3).pk
    older = insert(queue=OTHER_QUEUE, run_at=now - dt.timedelta(seconds=90)).pk
    got = claim(limit=2, queues=[QUEUE, OTHER_QUEUE])
    assert [x.job_id for x in got] == [high, older]
    assert job_row(low).state == "waiting"


def test_each_claim_raises_the_fence_by_one_and_writes_one_attempt_row() -> None:
    j = insert(payload={"n": 1})
    [first] = claim()
    row = job_row(j)
    assert (row.state, row.fence, row.attempts, row.lease_owner) == ("leased", 1, 1, EXEC)
    a = attempt_row(first)
    assert (a.job_id, a.number, a.fence, a.kind, a.executor, a.outcome, a.finished_at) == (
        j.pk,
        1,
        1,
        "run",
        EXEC,
        "",
        None,
    )
    retry_now(first)
    [second] = claim(executor=EXEC2)
    assert (second.fence, second.attempt) == (2, 2)
    assert job_row(j).fence == 2
    assert sorted(
        Attempt.objects.filter(job_id=j.pk).values_list("fence", "number", "executor")
    ) == [
        (1, 1, EXEC),
        (2, 2, EXEC2),
    ]


def test_a_lease_carries_the_claimed_jobs_columns() -> None:
    j = insert(payload={"to": "x@example.com"}, priority=2)
    [lease] = claim()
    row = job_row(j)
    a = attempt_row(lease)
    assert (lease.job_id, lease.fence, lease.attempt, lease.attempt_id) == (j.pk, 1, 1, a.pk)
    assert (lease.kind, lease.name, lease.queue, lease.payload) == (
        "run",
        row.name,
        QUEUE,
        {"to": "x@example.com"},
    )
    assert (lease.lease_seconds, lease.effect, lease.max_attempts) == (
        LEASE_SECONDS,
        "at_least_once",
        5,
    )
    assert (lease.timeout_seconds, lease.priority, lease.executor) == (TIMEOUT, 2, EXEC)
    assert lease.due_at == row.run_at
    assert lease.created_at == row.created_at
    assert lease.claimed_at == row.heartbeat_at == a.claimed_at


def test_claim_runs_the_lease_and_the_deadline_from_the_database_clock() -> None:
    insert()
    before = driver().now()
    [lease] = claim()
    after = driver().now()
    row = job_row(lease)
    assert between(row.lease_expires_at, before + LEASE, after + LEASE)
    timeout = dt.timedelta(seconds=TIMEOUT)
    assert between(row.deadline_at, before + timeout, after + timeout)
    assert between(row.heartbeat_at, before, after)
    assert attempt_row(lease).lease_expires_at == row.lease_expires_at


def test_claim_by_job_id_takes_only_that_job() -> None:
    a, b = insert().pk, insert().pk
    assert [x.job_id for x in claim(executor=EXEC2, job_id=b)] == [b]
    assert (job_row(a).state, job_row(b).state) == ("waiting", "leased")
    assert job_row(b).lease_owner == EXEC2


def test_claim_by_job_id_of_a_job_not_due_or_missing_gets_nothing() -> None:
    future = insert(run_at=driver().now() + dt.timedelta(hours=1)).pk
    assert claim(job_id=future) == []
    assert claim(job_id=future + 1000) == []
    assert job_row(future).fence == 0


def test_a_second_claim_gets_nothing_once_the_job_is_leased() -> None:
    j = insert().pk
    assert len(claim()) == 1
    assert claim(executor=EXEC2) == []
    assert claim(executor=EXEC2, job_id=j) == []
    row = job_row(j)
    assert (row.fence, row.lease_owner) == (1, EXEC)
    assert Attempt.objects.filter(job_id=j).count() == 1


# -- complete ----------------------------------------------------------------------------------


def test_complete_marks_the_job_succeeded_and_closes_its_attempt() -> None:
    lease = claim_one()
    version = job_row(lease).version
    xid = driver().complete(lease)
    row = job_row(lease)
    assert (row.state, row.lease_owner, row.lease_expires_at, row.next_kind) == (
        "succeeded",
        "",
        None,
        "run",
    )
    assert row.finished_at is not None and row.version == version + 1
    a = attempt_row(lease)
    assert a.outcome == "succeeded" and a.finished_at is not None
    if driver().has_transaction_ids:
        assert isinstance(xid, int) and driver().transaction_status(xid) == "committed"
    else:
        assert xid is None


def test_complete_is_refused_with_stale_attempt_when_the_fence_moved() -> None:
    lease = claim_one()
    take_over(lease)
    with pytest.raises(StaleAttempt) as refused:
        driver().complete(lease)
    assert type(refused.value) is StaleAttempt
    assert (refused.value.job_id, refused.value.fence) == (lease.job_id, lease.fence)
    assert job_row(lease).state == "leased"
    assert attempt_row(lease).finished_at is None


def test_complete_is_refused_with_attempt_overrun_past_the_deadline() -> None:
    lease = claim_one()
    overrun(lease)
    with pytest.raises(AttemptOverrun):
        driver().complete(lease)
    assert job_row(lease).state == "leased"
    assert attempt_row(lease).outcome == ""


@pytest.mark.parametrize("effect_state", [Effect.INTENDED, Effect.UNKNOWN])
def test_complete_is_refused_with_effects_unsettled_while_an_effect_may_have_happened(
    effect_state: str,
) -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    if effect_state == Effect.UNKNOWN:
        assert d.effect_settle(lease, eff.key, Effect.UNKNOWN) == Effect.UNKNOWN
    with pytest.raises(EffectsUnsettled) as refused:
        d.complete(lease)
    assert refused.value.keys == [eff.key]
    assert job_row(lease).state == "leased"
    assert attempt_row(lease).finished_at is None
    why = d.refusal(lease, states.COMPLETE.name)
    assert isinstance(why, EffectsUnsettled) and why.keys == [eff.key]


def test_complete_succeeds_once_the_effect_is_settled_applied() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    d.effect_settle(lease, eff.key, Effect.APPLIED)
    d.complete(lease)
    assert job_row(lease).state == "succeeded"


def test_refusal_names_the_reason_a_fenced_write_matched_no_row() -> None:
    d = driver()
    lease = claim_one()
    # Nothing wrong with the lease: the fallback answer is a stale refusal.
    assert type(d.refusal(lease, "heartbeat")) is StaleAttempt
    d.effect_intend(lease, "send")
    assert type(d.refusal(lease, "heartbeat")) is StaleAttempt
    assert type(d.refusal(lease, states.COMPLETE.name)) is EffectsUnsettled
    overrun(lease)
    assert type(d.refusal(lease, states.COMPLETE.name)) is AttemptOverrun
    take_over(lease)
    why = d.refusal(lease, states.COMPLETE.name)
    assert type(why) is StaleAttempt and why.write == "complete"


def test_record_stale_keeps_the_refusal_as_evidence() -> None:
    lease = claim_one()
    driver().record_stale(StaleAttempt(lease.job_id, lease.fence, "complete"), EXEC)
    [w] = StaleWrite.objects.filter(job_id=lease.job_id)
    assert (w.fence, w.write, w.executor) == (lease.fence, "complete", EXEC)


# -- complete_many_and_claim, complete_and_claim ---------------------------------------------


def test_complete_many_and_claim_leaves_out_a_stale_lease_and_completes_the_others() -> None:
    d = driver()
    for _ in range(3):
        insert()
    leases = claim(limit=3)
    waiting = [insert().pk for _ in range(2)]
    stale = leases[1]
    take_over(stale)
    with d.atomic():
        xid, matched, got = d.complete_many_and_claim(
            leases, executor=EXEC2, queues=[QUEUE], limit=2
        )
    assert matched == {leases[0].job_id, leases[2].job_id}
    for lease in (leases[0], leases[2]):
        assert job_row(lease).state == "succeeded"
        assert attempt_row(lease).outcome == "succeeded"
    assert (job_row(stale).state, job_row(stale).fence) == ("leased", stale.fence + 1)
    assert attempt_row(stale).finished_at is None
    assert type(d.refusal(stale, states.COMPLETE.name)) is StaleAttempt
    assert [x.job_id for x in got] == waiting
    for lease in got:
        row = job_row(lease)
        assert (row.state, row.fence, row.lease_owner) == ("leased", 1, EXEC2)
        assert attempt_row(lease).fence == 1
    if d.has_transaction_ids:
        assert isinstance(xid, int) and d.transaction_status(xid) == "committed"
    else:
        assert xid is None


def test_complete_many_and_claim_leaves_out_a_lease_whose_effect_is_unsettled() -> None:
    d = driver()
    ok, doubtful = claim_one(), claim_one()
    eff = d.effect_intend(doubtful, "send")
    with d.atomic():
        _, matched, got = d.complete_many_and_claim(
            [ok, doubtful], executor=EXEC, queues=[QUEUE], limit=1
        )
    assert matched == {ok.job_id}
    assert got == []
    assert (job_row(ok).state, job_row(doubtful).state) == ("succeeded", "leased")
    why = d.refusal(doubtful, states.COMPLETE.name)
    assert isinstance(why, EffectsUnsettled) and why.keys == [eff.key]


def test_complete_many_and_claim_with_limit_zero_claims_nothing() -> None:
    d = driver()
    lease = claim_one()
    left = insert().pk
    with d.atomic():
        _, matched, got = d.complete_many_and_claim([lease], executor=EXEC, queues=[QUEUE], limit=0)
    assert (matched, got) == ({lease.job_id}, [])
    assert job_row(left).state == "waiting"


def test_complete_many_and_claim_writes_nothing_if_the_callers_transaction_rolls_back() -> None:
    d = driver()
    lease = claim_one()
    left = insert().pk
    with pytest.raises(RuntimeError), d.atomic():
        _, _, got = d.complete_many_and_claim([lease], executor=EXEC, queues=[QUEUE], limit=1)
        assert [x.job_id for x in got] == [left]
        raise RuntimeError("the caller rolls back")
    assert job_row(lease).state == "leased"
    assert attempt_row(lease).finished_at is None
    assert (job_row(left).state, job_row(left).fence) == ("waiting", 0)
    assert not Attempt.objects.filter(job_id=left).exists()


def test_complete_and_claim_completes_the_lease_and_returns_the_new_claims() -> None:
    d = driver()
    lease = claim_one()
    nxt = insert().pk
    with d.atomic():
        xid, got = d.complete_and_claim(lease, executor=EXEC, queues=[QUEUE], limit=5)
    assert job_row(lease).state == "succeeded"
    assert attempt_row(lease).outcome == "succeeded"
    assert [x.job_id for x in got] == [nxt]
    assert job_row(nxt).state == "leased"
    assert (xid is not None) == d.has_transaction_ids


def test_complete_and_claim_raises_stale_attempt_and_the_rollback_undoes_its_claims() -> None:
    d = driver()
    lease = claim_one()
    nxt = insert().pk
    take_over(lease)
    with pytest.raises(StaleAttempt) as refused, d.atomic():
        d.complete_and_claim(lease, executor=EXEC, queues=[QUEUE], limit=5)
    assert type(refused.value) is StaleAttempt
    assert (job_row(nxt).state, job_row(nxt).fence) == ("waiting", 0)
    assert not Attempt.objects.filter(job_id=nxt).exists()


def test_complete_and_claim_raises_attempt_overrun_past_the_deadline() -> None:
    d = driver()
    lease = claim_one()
    overrun(lease)
    with pytest.raises(AttemptOverrun), d.atomic():
        d.complete_and_claim(lease, executor=EXEC, queues=[QUEUE], limit=1)
    assert job_row(lease).state == "leased"


# -- heartbeat ----------------------------------------------------------------------------------


def test_heartbeat_extends_the_lease_from_the_database_clock() -> None:
    lease = claim_one()
    expire(lease, -1)  # one second left
    before = driver().now()
    assert driver().heartbeat(lease) is False  # renewed; no cancel requested
    after = driver().now()
    row = job_row(lease)
    assert between(row.lease_expires_at, before + LEASE, after + LEASE)
    assert between(row.heartbeat_at, before, after)
    a = attempt_row(lease)
    assert between(a.lease_expires_at, before + LEASE, after + LEASE)
    assert between(a.heartbeat_at, before, after)


def test_a_late_heartbeat_renews_a_lease_that_expired_but_was_not_reaped() -> None:
    lease = claim_one()
    expire(lease, 5)
    driver().heartbeat(lease)
    assert job_row(lease).lease_expires_at > driver().now() + LEASE - dt.timedelta(seconds=5)


def test_heartbeat_is_refused_when_the_fence_moved() -> None:
    lease = claim_one()
    take_over(lease)
    expires = job_row(lease).lease_expires_at
    with pytest.raises(StaleAttempt) as refused:
        driver().heartbeat(lease)
    assert type(refused.value) is StaleAttempt and refused.value.write == "heartbeat"
    assert job_row(lease).lease_expires_at == expires


def test_heartbeat_is_refused_once_the_job_is_finished() -> None:
    lease = claim_one()
    driver().complete(lease)
    with pytest.raises(StaleAttempt):
        driver().heartbeat(lease)
    assert job_row(lease).state == "succeeded"


def test_heartbeat_is_refused_with_attempt_overrun_past_the_deadline() -> None:
    lease = claim_one()
    overrun(lease)
    expires = job_row(lease).lease_expires_at
    with pytest.raises(AttemptOverrun):
        driver().heartbeat(lease)
    assert job_row(lease).lease_expires_at == expires


# -- assert_current, leased_job ---------------------------------------------------------------


def test_assert_current_accepts_a_live_lease_and_changes_nothing() -> None:
    lease = claim_one()
    before = job_row(lease)
    with driver().atomic():
        driver().assert_current(lease, "effect_intent")
    after = job_row(lease)
    assert (after.heartbeat_at, after.version, after.lease_expires_at) == (
        before.heartbeat_at,
        before.version,
        before.lease_expires_at,
    )


def test_assert_current_refuses_an_expired_lease_unless_told_it_need_not_be_valid() -> None:
    lease = claim_one()
    expire(lease, 1)
    with pytest.raises(StaleAttempt) as refused:
        driver().assert_current(lease, "effect_intent")
    assert type(refused.value) is StaleAttempt and refused.value.write == "effect_intent"
    driver().assert_current(lease, "effect_outcome", lease_valid=False)


def test_assert_current_refuses_with_attempt_overrun_past_the_deadline() -> None:
    lease = claim_one()
    overrun(lease)
    with pytest.raises(AttemptOverrun):
        driver().assert_current(lease, "effect_intent")


def test_assert_current_refuses_when_the_fence_moved_even_if_the_lease_need_not_be_valid() -> None:
    lease = claim_one()
    take_over(lease)
    with pytest.raises(StaleAttempt):
        driver().assert_current(lease, "effect_outcome", lease_valid=False)


def test_leased_job_is_the_row_only_while_the_lease_holds_it() -> None:
    lease = claim_one()
    found = driver().leased_job(lease)
    assert found is not None and (found.pk, found.fence) == (lease.job_id, lease.fence)
    take_over(lease)
    assert driver().leased_job(lease) is None
