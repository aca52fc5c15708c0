"""Queues paused and limited by an operator: the claim itself enforces it, through every claim
entry point (the broker-less executor's batch claim, a transport's claim of the job its message
names, a completion that claims the next jobs), with an audit row for every change and nothing
changed by a stale page or bad input."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections

from scheduler_core import job
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import AuditEntry, Job, Queue
from scheduler_core.read import health
from scheduler_core.read.queues import queue_overview
from scheduler_core.runtime import attempt, completion
from scheduler_core.services import queues
from scheduler_core.storage.clock import DbNow
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:queues"
Q = "qtest"
OTHER = "qother"
ACTOR = "cli:tester"


@job(name="tests.queues.ok", queue=Q, max_attempts=3)
def ok(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


@job(name="tests.queues.other", queue=OTHER, max_attempts=3)
def other(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _claim(limit: int = 10, queues_: tuple[str, ...] = (Q,)) -> list[Lease]:
    return driver().claim(executor=EXEC, queues=list(queues_), limit=limit)


def _leased(queue: str = Q) -> int:
    return Job.objects.filter(queue=queue, state="leased").count()


def _pause(queue: str = Q) -> queues.QueueActionResult:
    return queues.pause(queue, actor=ACTOR, reason="deploying the billing fix")


def _limit(
    max_leased: int | None = None, max_per_second: float | None = None, queue: str = Q
) -> queues.QueueActionResult:
    return queues.set_limits(
        queue,
        max_leased=max_leased,
        max_per_second=max_per_second,
        actor=ACTOR,
        reason="the provider rate-limits us",
        expected_version=queues.queue_settings(queue).version,
    )


# -- pause and resume -----------------------------------------------------------------------


def test_a_paused_queue_is_claimed_by_no_batch_claim_and_others_still_are() -> None:
    ok.enqueue_many([{"n": i} for i in range(3)])
    b = other.enqueue(n=1)
    _pause()
    got = _claim(limit=10, queues_=(Q, OTHER))
    assert [x.job_id for x in got] == [b.pk]
    assert _claim() == []
    assert _leased() == 0


def test_a_paused_queue_is_claimed_by_no_claim_of_the_job_a_message_names() -> None:
    a = ok.enqueue(n=1)
    _pause()
    assert driver().claim(executor=EXEC, job_id=a.pk, limit=1) == []
    assert Job.objects.get(pk=a.pk).state == "waiting"


def test_a_completion_claims_nothing_of_a_paused_queue() -> None:
    a, b = ok.enqueue(n=1), ok.enqueue(n=2)
    [lease] = _claim(limit=1)
    assert lease.job_id == a.pk
    _pause()
    with driver().atomic():
        _, got = driver().complete_and_claim(lease, executor=EXEC, queues=[Q], limit=5)
    assert got == []
    _, _, got = driver().complete_many_and_claim([], executor=EXEC, queues=[Q], limit=5)
    assert got == []
    assert Job.objects.get(pk=a.pk).state == "succeeded"
    assert Job.objects.get(pk=b.pk).state == "waiting"


def test_a_running_job_of_a_paused_queue_finishes_and_resume_claims_again() -> None:
    a, b = ok.enqueue(n=1), ok.enqueue(n=2)
    [lease] = _claim(limit=1)
    paused = _pause()
    assert attempt.run_lease(lease) == "succeeded"
    assert Job.objects.get(pk=a.pk).state == "succeeded"
    assert _claim() == []
    queues.resume(Q, actor=ACTOR, reason="fix deployed", expected_version=paused.queue.version)
    assert [x.job_id for x in _claim()] == [b.pk]


def test_the_next_claim_after_a_run_skips_a_paused_queue() -> None:
    ok.enqueue_many([{"n": i} for i in range(3)])
    [lease] = _claim(limit=1)
    _pause()
    nxt = completion.NextClaim(executor=EXEC, queues=[Q], wanted=lambda: 2)
    assert attempt.run_lease(lease, next_claim=nxt) == "succeeded"
    assert nxt.got == []


def test_pause_and_resume_write_the_row_and_an_audit_entry_each() -> None:
    r = _pause()
    row = Queue.objects.get(pk=Q)
    assert (row.paused, row.paused_by, row.paused_reason) == (
        True,
        ACTOR,
        "deploying the billing fix",
    )
    assert row.paused_at is not None and r.queue.version == row.version == 1
    a = AuditEntry.objects.get(action="pause_queue")
    assert a.job_id is None and a.actor == ACTOR and a.reason == "deploying the billing fix"
    assert a.detail["queue"] == Q
    assert a.detail["before"]["paused"] is False and a.detail["after"]["paused"] is True
    queues.resume(Q, actor="dash:bob", reason="done", expected_version=1)
    row.refresh_from_db()
    assert (row.paused, row.paused_by, row.version) == (False, "", 2)
    b = AuditEntry.objects.get(action="resume_queue")
    assert b.actor == "dash:bob" and b.detail["before"]["paused_by"] == ACTOR


def test_a_stale_version_changes_nothing() -> None:
    _pause()
    with pytest.raises(ActionConflict, match="changed since version 0"):
        queues.resume(Q, actor=ACTOR, reason="x", expected_version=0)
    with pytest.raises(ActionConflict):
        queues.set_limits(
            Q, max_leased=2, max_per_second=None, actor=ACTOR, reason="x", expected_version=7
        )
    row = Queue.objects.get(pk=Q)
    assert (row.paused, row.max_leased, row.version) == (True, None, 1)
    assert AuditEntry.objects.count() == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_leased": -1, "max_per_second": None}, "max_leased must be between"),
        ({"max_leased": 10**9, "max_per_second": None}, "max_leased must be between"),
        ({"max_leased": 2.5, "max_per_second": None}, "whole number"),
        ({"max_leased": None, "max_per_second": -3.0}, "max_per_second must be between"),
        ({"max_leased": None, "max_per_second": float("nan")}, "max_per_second must be between"),
        ({"max_leased": None, "max_per_second": 1e9}, "max_per_second must be between"),
        ({"max_leased": None, "max_per_second": 0.00001}, "at least"),
    ],
)
def test_bad_limits_are_refused_and_change_nothing(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ActionRefused, match=message):
        queues.set_limits(Q, actor=ACTOR, reason="typo", expected_version=0, **kwargs)
    assert not Queue.objects.exists()
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("reason", ["", "   "])
def test_an_empty_reason_is_refused_and_changes_nothing(reason: str) -> None:
    with pytest.raises(ActionRefused, match="reason is required"):
        queues.pause(Q, actor=ACTOR, reason=reason)
    with pytest.raises(ActionRefused, match="reason is required"):
        queues.set_limits(
            Q, max_leased=1, max_per_second=None, actor=ACTOR, reason=reason, expected_version=0
        )
    assert not Queue.objects.exists() and not AuditEntry.objects.exists()


def test_pausing_twice_or_resuming_an_unpaused_queue_is_refused() -> None:
    with pytest.raises(ActionRefused, match="not paused"):
        queues.resume(Q, actor=ACTOR, reason="x")
    _pause()
    with pytest.raises(ActionRefused, match="paused already"):
        _pause()
    assert AuditEntry.objects.count() == 1


def test_a_bad_queue_name_is_refused() -> None:
    with pytest.raises(ActionRefused, match="not a queue name"):
        queues.pause("bad name; drop", actor=ACTOR, reason="x")
    assert not Queue.objects.exists()


# -- health ------------------------------------------------------------------------------------


def test_waiting_jobs_of_a_paused_queue_are_paused_not_stuck(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 1.0
    ok.enqueue_many([{"n": i} for i in range(2)])
    b = other.enqueue(n=1)
    Job.objects.update(run_at=DbNow(-60))
    before = health.health_counts()
    assert (before["stuck"], before["paused"]) == (3, 0)
    _pause()
    after = health.health_counts()
    assert (after["stuck"], after["paused"]) == (1, 2)
    assert list(Job.objects.filter(health.health_q("stuck")).values_list("id", flat=True)) == [b.pk]


# -- limits ----------------------------------------------------------------------------------


def test_max_leased_caps_the_leased_jobs_across_claims_and_claimers() -> None:
    ok.enqueue_many([{"n": i} for i in range(6)])
    _limit(max_leased=2)
    first = _claim(limit=5)
    assert len(first) == 2
    assert driver().claim(executor="t:2:queues", queues=[Q], limit=5) == []
    assert _leased() == 2
    assert attempt.run_lease(first[0]) == "succeeded"
    assert len(_claim(limit=5)) == 1
    assert _leased() == 2


def test_max_leased_holds_for_a_claim_of_the_job_a_message_names() -> None:
    jobs = ok.enqueue_many([{"n": i} for i in range(2)])
    _limit(max_leased=1)
    assert len(driver().claim(executor=EXEC, job_id=jobs[0], limit=1)) == 1
    assert driver().claim(executor=EXEC, job_id=jobs[1], limit=1) == []
    assert _leased() == 1


def test_a_completion_that_claims_counts_its_own_job_finished() -> None:
    ok.enqueue_many([{"n": i} for i in range(4)])
    _limit(max_leased=1)
    [lease] = _claim(limit=3)
    with driver().atomic():
        _, got = driver().complete_and_claim(lease, executor=EXEC, queues=[Q], limit=3)
    assert len(got) == 1
    assert _leased() == 1


def test_a_batch_claim_of_several_queues_takes_each_within_its_limits() -> None:
    ok.enqueue_many([{"n": i} for i in range(5)])
    other.enqueue_many([{"n": i} for i in range(5)])
    _limit(max_leased=2)
    got = _claim(limit=10, queues_=(Q, OTHER))
    assert len(got) == 7
    assert _leased(Q) == 2 and _leased(OTHER) == 5
    # A batch never takes more than it asked for, limited queues included.
    ok.enqueue_many([{"n": i} for i in range(5)])
    Job.objects.filter(queue=OTHER).update(state="succeeded")
    _limit(max_leased=10)
    assert len(_claim(limit=3, queues_=(Q, OTHER))) == 3


def test_the_rate_limit_refills_by_the_database_clock() -> None:
    ok.enqueue_many([{"n": i} for i in range(20)])
    _limit(max_per_second=4)
    # A fresh bucket holds one second's worth.
    assert len(_claim(limit=10)) == 4
    assert _claim(limit=10) == []
    # Half a second of the database's clock later: two more tokens.
    Queue.objects.filter(pk=Q).update(tokens_at=DbNow(-0.5))
    assert len(_claim(limit=10)) == 2
    assert _claim(limit=10) == []
    row = Queue.objects.get(pk=Q)
    assert row.tokens < 1.0 and row.tokens_at is not None


def test_the_rate_limit_over_real_time_admits_no_more_than_its_rate() -> None:
    ok.enqueue_many([{"n": i} for i in range(100)])
    _limit(max_per_second=10)
    start = time.monotonic()
    taken = 0
    while time.monotonic() - start < 1.0:
        taken += len(_claim(limit=3))
        time.sleep(0.02)
    elapsed = time.monotonic() - start
    # A full bucket (10) plus what arrived meanwhile, and a token of slack for the clocks.
    assert taken <= 10 + 10 * elapsed + 1
    assert taken >= 10


def test_a_rate_limit_holds_for_a_completion_that_claims() -> None:
    ok.enqueue_many([{"n": i} for i in range(10)])
    _limit(max_per_second=2)
    got = _claim(limit=5)
    assert len(got) == 2
    with driver().atomic():
        _, more = driver().complete_and_claim(got[0], executor=EXEC, queues=[Q], limit=5)
    assert more == []


def test_clearing_the_limits_claims_as_before() -> None:
    ok.enqueue_many([{"n": i} for i in range(5)])
    _limit(max_leased=1)
    assert len(_claim(limit=5)) == 1
    _limit(max_leased=None, max_per_second=None)
    assert len(_claim(limit=5)) == 4


def test_a_paused_limited_queue_claims_nothing() -> None:
    ok.enqueue_many([{"n": i} for i in range(3)])
    _limit(max_leased=5)
    _pause()
    assert _claim() == []


def test_limits_are_audited_with_before_and_after() -> None:
    _limit(max_leased=3, max_per_second=1.5)
    a = AuditEntry.objects.get(action="limit_queue")
    assert a.detail["before"]["max_leased"] is None
    assert (a.detail["after"]["max_leased"], a.detail["after"]["max_per_second"]) == (3, 1.5)


def test_an_unlimited_queue_claims_in_one_statement() -> None:
    # A queue another operator limited, and one with no row at all.
    _limit(max_leased=1, queue=OTHER)
    ok.enqueue_many([{"n": i} for i in range(3)])
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as seen:
        got = _claim(limit=3)
    assert len(got) == 3
    statements = [q["sql"].lstrip() for q in seen.captured_queries]
    # PostgreSQL's claim is one statement prepared on the server (Django's log does not see
    # it); SQLite's is the UPDATE and the Attempt rows' INSERT, as before: no lock of, and no
    # read of, tenure_queue besides the gate inside the claim.
    if connection.vendor == "sqlite":
        assert [s.split()[0] for s in statements] == ["BEGIN", "UPDATE", "INSERT", "COMMIT"], (
            statements
        )
    else:
        assert statements == [], statements


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks of concurrent claimers")
def test_concurrent_claimers_never_exceed_max_leased() -> None:
    ok.enqueue_many([{"n": i} for i in range(60)])
    _limit(max_leased=3)
    errors: list[BaseException] = []
    peak = [0]

    def claimer(k: int) -> None:
        try:
            for _ in range(15):
                got = driver().claim(executor=f"t:{k}:conc", queues=[Q], limit=2)
                peak[0] = max(peak[0], _leased())
                for lease in got:
                    attempt.run_lease(lease)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert peak[0] <= 3
    assert Job.objects.filter(queue=Q, state="succeeded").count() > 0


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_the_gated_claims_read_jobs_by_key_or_in_index_order() -> None:
    from django.db import transaction

    from scheduler_core.storage import pg_statements

    ids = ok.enqueue_many([{"n": i} for i in range(3000)])
    _limit(max_leased=1, queue=OTHER)
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    for shape, params in [
        (pg_statements.CLAIM_BY_ID, {"job_id": ids[10], "queues": []}),
        (pg_statements.CLAIM_ONE_QUEUE, {"queues": [Q]}),
        (pg_statements.CLAIM_QUEUES, {"queues": [Q, OTHER]}),
    ]:
        sql = pg_statements.claim_sql(shape)
        values = [
            *pg_statements.claim_params(shape, executor=EXEC, limit=5, **params),  # type: ignore[arg-type]
            *pg_statements.limited_params(
                shape, queues=params["queues"], job_id=params.get("job_id")
            ),  # type: ignore[arg-type]
        ]
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("EXPLAIN " + sql, values)
            plan = "\n".join(r[0] for r in cur.fetchall())
            transaction.set_rollback(True)
        assert "Seq Scan on tenure_job" not in plan, plan
        if shape == pg_statements.CLAIM_BY_ID:
            assert "Index Cond: (id = " in plan, plan  # one row, by key (its sort is of one)
        else:
            # The claim index's ordered walk, not a sort of every waiting job.
            assert "tenure_job_claim" in plan, plan
            assert "Sort Key: tenure_job.priority" not in plan, plan


def test_the_overview_scan_counts_each_queue_as_the_queues_page_does() -> None:
    # The overview's queues section reads its per-queue figures from the overview's one scan;
    # they must be the queues page's own counts, or the two pages would disagree.
    for n in range(3):
        ok.enqueue(n=n)
    ok.enqueue(n=9, run_at=driver().now() + dt.timedelta(hours=1))  # waiting, not due
    other.enqueue(n=1)
    assert len(_claim(limit=1)) == 1
    _pause(OTHER)
    rows, _, _ = health.overview_counts()
    by_page = {
        r["name"]: {k: r[k] for k in ("waiting", "due", "leased")} | r["held_by"]
        for r in queue_overview()
        if r["name"] in (Q, OTHER)
    }
    assert {k: v for k, v in health.queue_counts(rows).items() if k in (Q, OTHER)} == by_page
    assert by_page[Q] == {  # 4 enqueued, 1 claimed
        "waiting": 3,
        "due": 2,
        "leased": 1,
        "paused": 0,
        "concurrency_limited": 0,
        "rate_limited": 0,
    }
    assert by_page[OTHER] == {  # due, and held by the pause
        "waiting": 1,
        "due": 1,
        "leased": 0,
        "paused": 1,
        "concurrency_limited": 0,
        "rate_limited": 0,
    }
