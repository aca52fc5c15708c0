"""One active attempt, held by the database (migration 0015): at most one open attempt per job,
and each attempt's row carries its whole lease as its claim and renewals left it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from prometheus_client import REGISTRY

from scheduler_core import job
from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Attempt, Job, OpenAttempt
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

from .migrating import migrate

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.one_open.record", queue="one-open", lease_seconds=30, timeout=300)
def record(ctx: Any, n: int = 0) -> None:
    """Does nothing: the tests read the rows a claim and its end leave."""


def _claim(executor: str = "t:1:a") -> Lease:
    [lease] = driver().claim(executor=executor, queues=["one-open"], limit=1)
    return lease


def test_the_attempt_row_carries_the_lease_its_claim_and_renewal_left_on_the_job() -> None:
    record.enqueue(n=1)
    lease = _claim()
    j = Job.objects.get(pk=lease.job_id)
    a = Attempt.objects.get(pk=lease.attempt_id)
    assert a.finished_at is None
    assert (a.executor, a.fence, a.lease_expires_at, a.heartbeat_at, a.deadline_at) == (
        j.lease_owner,
        j.fence,
        j.lease_expires_at,
        j.heartbeat_at,
        j.deadline_at,
    )
    assert a.deadline_at is not None and a.deadline_at > a.lease_expires_at  # 300 s > 30 s
    driver().heartbeat(lease)
    j.refresh_from_db()
    a.refresh_from_db()
    assert (a.lease_expires_at, a.deadline_at) == (j.lease_expires_at, j.deadline_at)


def test_the_database_refuses_a_second_open_attempt_of_a_job() -> None:
    record.enqueue(n=1)
    lease = _claim()
    first = Attempt.objects.get(pk=lease.attempt_id)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(
            job_id=lease.job_id, number=2, fence=2, executor="t:2:b", claimed_at=first.claimed_at
        )
    assert Attempt.objects.filter(job_id=lease.job_id).count() == 1  # nothing written


def test_a_job_gets_a_new_open_attempt_once_the_last_one_ended() -> None:
    j = record.enqueue(n=1)
    # The first attempt fails transiently: the job waits again and its attempt is closed.
    driver().finish(_claim(), Decision(transition=states.RETRY), outcome="transient")
    second = _claim(executor="t:2:b")
    rows = list(Attempt.objects.filter(job_id=j.pk).order_by("fence"))
    assert [(a.fence, a.finished_at is None) for a in rows] == [(1, False), (2, True)]
    assert rows[1].pk == second.attempt_id


def _open_by_hand(job_id: int, fence: int, when: Any) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at, "
            "outcome, error_class, error_type, message, traceback) "
            "VALUES (%s, %s, %s, 'run', 'hand', %s, '', '', '', '', '') RETURNING id",
            [job_id, fence, fence, when],
        )
        return int(cur.fetchone()[0])


def test_a_claim_passes_over_a_job_beside_a_stray_open_attempt_until_the_reaper_closes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job waiting beside an open attempt (rows written by hand: Tenure's writes never leave
    one) is passed over: the jobs behind it are claimed, one a claim, and no claim fails on the
    unique index. The reaper's sweep closes the stray attempt with a warning and nothing else
    changes; the job is claimed next, under a higher fence."""
    head = record.enqueue(n=1)
    behind = [record.enqueue(n=i) for i in (2, 3)]
    stray = _open_by_hand(head.pk, 0, driver().now())
    got = [_claim(executor=f"t:{i}:a") for i in (1, 2)]  # one a claim: the head is passed over
    assert [x.job_id for x in got] == [j.pk for j in behind]
    assert driver().claim(executor="t:3:a", queues=["one-open"], limit=4) == []
    assert Job.objects.get(pk=head.pk).state == "waiting"

    # A current open attempt is left alone; only the stray one is closed.
    reaper.WALK.forget()
    counted = REGISTRY.get_sample_value("tenure_stray_attempts_closed_total") or 0.0
    with caplog.at_level("WARNING", logger="tenure.reaper"):
        assert reaper.close_stray_attempts() == 1
    assert REGISTRY.get_sample_value("tenure_stray_attempts_closed_total") == counted + 1
    assert f"closed attempt {stray} " in caplog.text and f"of job {head.pk} " in caplog.text
    rows = {a.pk: (a.outcome, a.finished_at is None) for a in Attempt.objects.all()}
    assert rows == {
        stray: ("superseded", False),
        got[0].attempt_id: ("", True),
        got[1].attempt_id: ("", True),
    }
    j = Job.objects.get(pk=head.pk)
    assert (j.state, j.fence, j.attempts) == ("waiting", 0, 0)  # the job is not touched
    assert reaper.close_stray_attempts() == 0

    later = _claim(executor="t:4:a")
    assert (later.job_id, later.fence) == (head.pk, 1)


def test_the_reapers_sweep_from_the_start_closes_stray_attempts() -> None:
    """``run_scheduler``'s round reaches the repair: the first sweep of a process reads from
    the start of the leases index, and that one closes stray open attempts."""
    j = record.enqueue(n=1)
    stray = _open_by_hand(j.pk, 0, driver().now())
    reaper.WALK.forget()
    reaper.reap_once()
    assert Attempt.objects.get(pk=stray).outcome == "superseded"
    assert _claim().job_id == j.pk


def test_0015_closes_open_attempts_that_are_not_their_jobs_current_and_fills_deadlines(
    latest: None,
) -> None:
    a, b = record.enqueue(n=1), record.enqueue(n=2)
    current = _claim()  # job a (the older): leased under fence 1, attempt open
    assert current.job_id == a.pk
    migrate([("scheduler_core", "0014_spec_key_unchecked")])
    now = driver().now()
    # A database written by hand: job b waits, yet an attempt of it is open; job a's attempt
    # under an old fence was left open too.
    stray_b = _open_by_hand(b.pk, 1, now)
    stray_a = _open_by_hand(a.pk, 0, now)
    migrate([("scheduler_core", "0015_one_open_attempt")])
    rows = {r.pk: r for r in Attempt.objects.all()}
    assert {pk: (r.outcome, r.finished_at is None) for pk, r in rows.items()} == {
        current.attempt_id: ("", True),
        stray_b: ("superseded", False),
        stray_a: ("superseded", False),
    }
    # Read by name: columns later migrations add (``attempt_base``, 0024) are not there yet.
    deadline = Job.objects.values_list("deadline_at", flat=True).get(pk=a.pk)
    assert rows[current.attempt_id].deadline_at == deadline
    assert rows[stray_b].deadline_at is None
    with pytest.raises(IntegrityError), transaction.atomic():
        _open_by_hand(a.pk, 5, now)


def _open_rows() -> dict[int, int]:
    return dict(OpenAttempt.objects.values_list("job_id", "attempt_id"))


def test_the_open_attempts_table_follows_every_way_an_attempt_opens_and_ends() -> None:
    """The database keeps ``tenure_open_attempt`` (0017): a claim's attempt is in it, its end
    takes it out, a reopened attempt is back, an open attempt deleted is gone, and an attempt
    written already ended never enters."""
    j = record.enqueue(n=1)
    lease = _claim()
    assert _open_rows() == {j.pk: lease.attempt_id}
    driver().finish(lease, Decision(transition=states.RETRY), outcome="transient")
    assert _open_rows() == {}
    Attempt.objects.filter(pk=lease.attempt_id).update(finished_at=None)
    assert _open_rows() == {j.pk: lease.attempt_id}
    Attempt.objects.filter(pk=lease.attempt_id).delete()
    assert _open_rows() == {}
    now = driver().now()
    Attempt.objects.create(
        job_id=j.pk, number=9, fence=9, executor="hand", claimed_at=now, finished_at=now
    )
    assert _open_rows() == {}
    second = _claim(executor="t:2:b")
    assert _open_rows() == {j.pk: second.attempt_id}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's heap-only updates")
def test_ending_an_attempt_writes_no_index_entry() -> None:
    """No index of ``tenure_attempt`` reads ``finished_at`` (0017), so its end is a heap-only
    update: the primary key and the job-and-fence index hold one entry an attempt, not two.
    With the partial index of 0015 every end was a new entry in each."""
    record.enqueue_many([{"n": i} for i in range(20)])
    leases = driver().claim(executor="t:1:a", queues=["one-open"], limit=20)
    assert len(leases) == 20
    count = (
        "SELECT pg_stat_get_xact_tuples_updated('tenure_attempt'::regclass), "
        "pg_stat_get_xact_tuples_hot_updated('tenure_attempt'::regclass)"
    )
    with transaction.atomic(), connection.cursor() as cur:
        for lease in leases:
            driver().complete(lease)
        cur.execute(count)
        updated, heap_only = cur.fetchone()
    assert (updated, heap_only) == (20, 20)
    assert _open_rows() == {}


def test_0017_moves_the_open_attempts_into_their_table_and_back(latest: None) -> None:
    a, b = record.enqueue(n=1), record.enqueue(n=2)
    open_a = _claim()
    assert open_a.job_id == a.pk
    migrate([("scheduler_core", "0016_queue_leased_index")])
    # Under 0015's index: an attempt of b opened, and a's still open.
    open_b = _open_by_hand(b.pk, 1, driver().now())
    migrate([("scheduler_core", "0017_open_attempt_table")])
    assert _open_rows() == {a.pk: open_a.attempt_id, b.pk: open_b}
    with pytest.raises(IntegrityError), transaction.atomic():
        _open_by_hand(a.pk, 5, driver().now())
    migrate([("scheduler_core", "0016_queue_leased_index")])
    # The partial index is back, and with it the refusal.
    with pytest.raises(IntegrityError), transaction.atomic():
        _open_by_hand(b.pk, 5, driver().now())
    migrate([("scheduler_core", "0017_open_attempt_table")])
    assert _open_rows() == {a.pk: open_a.attempt_id, b.pk: open_b}
