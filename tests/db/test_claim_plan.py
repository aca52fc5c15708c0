"""The claim walks the claim index in order and stops at the first due rows: its cost does not
grow with the backlog, nor (from its floors) with the entries a held snapshot keeps in the
index. Several queues are claimed in the same global order as one."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from scheduler_core import conf, job
from scheduler_core.domain import states
from scheduler_core.domain.options import JobOptions
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Job
from scheduler_core.runtime import connections
from scheduler_core.storage import floors, pg_statements, postgres
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:claim-plan"


@job(name="tests.claimplan.a", queue="plan_a")
def in_a(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


@job(name="tests.claimplan.b", queue="plan_b")
def in_b(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _plan(sql: str, params: list[Any]) -> str:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    return plan


def _claim_statement(queues: list[str], *, floors: bool, limit: int = 1) -> tuple[str, list[Any]]:
    shape = pg_statements.claim_shape(by_id=False, nqueues=len(queues), floors=floors)
    seeks = [(q, 0, driver().now() - dt.timedelta(seconds=60)) for q in queues] if floors else []
    sql = f"WITH {pg_statements.claim_ctes(shape)} SELECT * FROM got"
    return sql, pg_statements.claim_params(
        shape, executor=EXEC, queues=queues, limit=limit, seeks=seeks
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
@pytest.mark.parametrize("floors", [False, True], ids=["from-the-start", "from-the-floors"])
@pytest.mark.parametrize("queues", [["plan_a"], ["plan_a", "plan_b"]])
def test_the_claim_reads_the_index_in_order_whatever_the_backlog(
    queues: list[str], floors: bool
) -> None:
    in_a.enqueue_many([{"n": i} for i in range(5000)])
    in_b.enqueue_many([{"n": i} for i in range(5000)])
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    plan = _plan(*_claim_statement(queues, floors=floors))
    # A sort of every waiting job (what `queue = ANY(...)` planned) is what this rules out.
    assert "tenure_job_claim" in plan, plan
    assert "Seq Scan on tenure_job" not in plan, plan
    assert "Sort Key: tenure_job.priority" not in plan, plan
    # The guard against a job beside an open attempt is a probe per candidate, not an
    # anti-join reading every open attempt on each claim (pg_statements.claimable).
    assert "Anti Join" not in plan and "Seq Scan on tenure_attempt" not in plan, plan
    # The completion with the next claim uses the same walk.
    [lease] = driver().claim(executor=EXEC, queues=queues, limit=1)
    assert Job.objects.get(pk=lease.job_id).state == "leased"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_claimed_and_completed_rows_are_found_by_key_when_statistics_are_stale() -> None:
    # Statistics taken while every job had succeeded (the usual picture), then a burst of new
    # jobs: the planner believes almost none is waiting, which once made it walk the state
    # index through every waiting job to find the few rows the claim had locked.
    in_b.enqueue_many([{"n": i} for i in range(3000)])
    Job.objects.update(state="succeeded")
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    in_a.enqueue_many([{"n": i} for i in range(3000)])
    [lease] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)
    shape = pg_statements.claim_shape(by_id=False, nqueues=1, floors=False)
    sql = pg_statements.complete_many_sql(shape)
    params = [
        *pg_statements.claim_params(shape, executor=EXEC, queues=["plan_a"], limit=8),
        *driver()._complete_params([lease]),
        *pg_statements.limited_params(shape, queues=["plan_a"], job_id=None),
    ]
    plan = _plan(sql, params)
    assert "tenure_job_state" not in plan, plan
    assert "Seq Scan on tenure_job" not in plan, plan
    assert "Index Scan using tenure_job_pkey on tenure_job j" in plan, plan


def test_several_queues_are_claimed_in_one_priority_order() -> None:
    low_a = in_a.enqueue(n=1)
    high_b = in_b.enqueue(n=2, priority=5)
    mid_a = in_a.enqueue(n=3, priority=2)
    low_b = in_b.enqueue(n=4)
    got = driver().claim(executor=EXEC, queues=["plan_a", "plan_b"], limit=3)
    # Priority first, then due time and id, across both queues: of the two lowest, the
    # older is taken and the newer left.
    assert [x.job_id for x in got] == [high_b.pk, mid_a.pk, low_a.pk]
    assert Job.objects.get(pk=low_b.pk).state == "waiting"
    [last] = driver().claim(executor=EXEC, queues=["plan_b", "plan_a"], limit=3)
    assert last.job_id == low_b.pk


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache")
def test_executor_connections_plan_the_prepared_statements_once() -> None:

    connections.limit_idle_transactions()
    connection.close()
    with connection.cursor() as cur:
        cur.execute("SHOW plan_cache_mode")
        assert cur.fetchone()[0] == "force_generic_plan"
    # The claim then runs on its generic plan: the same index walk.
    in_a.enqueue_many([{"n": i} for i in range(10)])
    for _ in range(7):  # past the five custom plans PostgreSQL would otherwise try first
        [_lease] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)
    assert Job.objects.filter(state="leased").count() == 7


def _prepared_plan(fragment: str, params: list[Any]) -> str:
    """The plan this connection's prepared statement containing ``fragment`` now runs on
    (``EXPLAIN EXECUTE``: with ``force_generic_plan``, its cached generic plan)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
            [f"%{fragment}%"],
        )
        [(name,)] = cur.fetchall()
        marks = ", ".join(["%s"] * len(params))
        cur.execute(f"EXPLAIN EXECUTE {name}({marks})", params)
        return "\n".join(r[0] for r in cur.fetchall())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache")
def test_a_plan_made_on_an_empty_table_is_replaced_once_the_table_has_grown(
    settings: Any,
) -> None:
    """A generic plan is kept until the table's statistics change. Made when the table was
    empty, it read the whole table on every claim and completion; each connection plans its
    statements afresh every TENURE_REPLAN_SECONDS."""
    # Long enough for the 5,000 enqueues below on a loaded machine, within the same plan.
    settings.TENURE_REPLAN_SECONDS = 3.0
    with connection.cursor() as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")
        cur.execute("ANALYZE tenure_job")  # empty: the statistics say no rows, no pages
    shape = pg_statements.claim_shape(by_id=False, nqueues=1, floors=False)
    params = [
        *pg_statements.claim_params(shape, executor=EXEC, queues=["plan_a"], limit=1),
        *driver()._complete_params([]),
        *pg_statements.limited_params(shape, queues=["plan_a"], job_id=None),
    ]
    floors.FLOORS.forget()
    driver().complete_many_and_claim([], executor=EXEC, queues=["plan_a"], limit=1)
    before = _prepared_plan("done AS (", params)
    # What the planner makes of an empty table: read it (what this test is about).
    assert "Seq Scan on tenure_job" in before, before
    in_a.enqueue_many([{"n": i} for i in range(5000)])
    floors.FLOORS.forget()
    driver().complete_many_and_claim([], executor=EXEC, queues=["plan_a"], limit=1)
    assert "Seq Scan on tenure_job" in _prepared_plan("done AS (", params)  # still the old plan
    time.sleep(3.1)
    floors.FLOORS.forget()
    [lease] = driver().complete_many_and_claim([], executor=EXEC, queues=["plan_a"], limit=1)[2]
    after = _prepared_plan("done AS (", params)
    assert "Seq Scan on tenure_job" not in after, after
    assert "Index Scan using tenure_job_pkey on tenure_job j" in after, after
    # and the statement still runs: its name is kept, only its plan was made again
    _xid, done, _ = driver().complete_many_and_claim(
        [lease], executor=EXEC, queues=["plan_a"], limit=0
    )
    assert done == {lease.job_id}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache")
def test_the_key_checks_of_attempts_and_effects_are_planned_again_with_the_statements(
    settings: Any,
) -> None:
    """The attempt's and the ledger's keys to their job are foreign keys: the server checks
    every attempt a claim inserts and every effect an attempt intends, at commit, with plans of
    its own, cached per connection and, on an executor's connection (``force_generic_plan``),
    made at their first use. Made while the job table was nearly empty they read it whole,
    once per attempt and per effect, and dropping the prepared statements did not replace
    them: every plan of the connection is planned again every TENURE_REPLAN_SECONDS."""
    settings.TENURE_REPLAN_SECONDS = 3.0
    with connection.cursor() as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")
        cur.execute("ANALYZE tenure_job")  # empty: the statistics say no rows, no pages
    in_a.enqueue(n=0)
    floors.forget()
    [first] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)
    driver().effect_intend(first, "charge")  # both key checks planned on a one-row table
    in_b.enqueue_many([{"n": i} for i in range(5000)])
    in_a.enqueue(n=1)
    time.sleep(3.1)
    floors.forget()
    leases: list[Lease] = []

    def claim() -> None:
        leases.extend(driver().claim(executor=EXEC, queues=["plan_a"], limit=1))
        _check_keys_now()

    # Rows of the job table read by sequential scans to claim one job (5,002 while the
    # attempt's key check kept its first plan).
    assert _entries_read(claim, "tenure_job") == {"tenure_job": 0}
    [lease] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)

    def intend() -> None:
        driver().effect_intend(lease, "charge")
        _check_keys_now()

    assert _entries_read(intend, "tenure_job") == {"tenure_job": 0}


def _check_keys_now() -> None:
    """Run the foreign-key checks this transaction has deferred to its commit (Django's keys
    are ``DEFERRABLE INITIALLY DEFERRED``), so a rolled-back measurement counts them too."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
@pytest.mark.parametrize("search", ["reaper", "retention"])
def test_the_reaper_and_retention_stop_their_index_walks_at_their_time_bound(search: str) -> None:
    """Their time bounds are index conditions (the statement's time, not the volatile wall
    clock, which is only a filter): a sweep reads the expired leases or the old jobs, not
    every entry of the index, which under a held snapshot includes every job leased since."""
    from scheduler_core.storage.clock import DbNow

    if search == "reaper":
        with transaction.atomic():
            sql, params = driver().expired_leases(1.0)[:100].query.sql_with_params()
        index, column = "tenure_job_leases", "lease_expires_at"
    else:
        sql, params = pg_statements.PRUNE_FINISHED, ["succeeded", 3600.0, 1000, "succeeded"]
        index, column = "tenure_job_state", "updated_at"
    in_a.enqueue_many([{"n": i} for i in range(3000)])
    Job.objects.update(
        state="leased" if search == "reaper" else "succeeded",
        lease_expires_at=DbNow(60),
    )
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    plan = _plan(sql, list(params))
    conds = [line for line in plan.splitlines() if "Index Cond" in line]
    assert f"using {index}" in plan, plan
    assert any(column in line for line in conds), plan


def _index_buffers(index: str, sql: str, params: list[Any]) -> int:
    """Shared buffers the statement's reads of ``index`` touched (``EXPLAIN (ANALYZE,
    BUFFERS)``: index and rows visited), rolled back."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
        transaction.set_rollback(True)

    def walk(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Index Name") == index:
            own = int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
        return own + sum(walk(child) for child in node.get("Plans", []))

    return walk((plan[0] if isinstance(plan, list) else plan)["Plan"])


@contextlib.contextmanager
def held_snapshot() -> Iterator[None]:
    """A second session holding one snapshot (a long report, a forgotten ``REPEATABLE READ``)
    until the block ends."""
    s = connection.settings_dict
    reader = psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], dbname=s["NAME"], autocommit=False
    )
    try:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM tenure_job").fetchone()
        yield
    finally:
        reader.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's visibility rules")
def test_a_claim_seeks_past_the_entries_a_held_snapshot_keeps() -> None:
    """A session holding one snapshot (a long report, a forgotten REPEATABLE READ) keeps the
    claim index's entries of every job leased since: the claim from the start visits each
    one, the claim from its floors seeks past them."""
    with held_snapshot():
        in_a.enqueue_many([{"n": i} for i in range(3000)])
        while got := driver().claim(executor=EXEC, queues=["plan_a"], limit=100):
            for lease in got:
                driver().complete(lease)
        floor = driver().now()
        in_a.enqueue_many([{"n": i} for i in range(10)])
        shape = pg_statements.claim_shape(by_id=False, nqueues=1, floors=True)
        seek = f"WITH {pg_statements.claim_ctes(shape)} SELECT * FROM got"
        seek_params = pg_statements.claim_params(
            shape, executor=EXEC, queues=["plan_a"], limit=1, seeks=[("plan_a", 0, floor)]
        )
        from_start, from_floor = (
            _index_buffers("tenure_job_claim", *_claim_statement(["plan_a"], floors=False)),
            _index_buffers("tenure_job_claim", seek, seek_params),
        )
        assert from_start > 10 * from_floor, (from_start, from_floor)
        assert from_floor <= 10, from_floor


def test_floors_follow_claims_and_wakeups_and_yield_to_a_full_read_when_due() -> None:
    """Claims raise a floor, wake-ups lower it or add a priority; a full read comes first and
    every full-read interval; a short claim after a cut-off full read discovers the lower
    priorities."""
    fl = floors.ClaimFloors()
    b = time.monotonic() + 60  # the claims below come after the wake-ups they follow
    margin = dt.timedelta(seconds=conf.tenure_settings().CLAIM_FLOOR_MARGIN_SECONDS)
    every = conf.tenure_settings().CLAIM_FULL_SCAN_SECONDS
    assert fl.seeks(["q"], now=b + 0.0) == []  # never read: a full read first
    t = driver().now()

    def lease(priority: int, due: dt.datetime) -> Lease:
        return Lease(
            job_id=1,
            fence=1,
            attempt=1,
            attempt_id=1,
            kind="run",
            created_at=t,
            executor=EXEC,
            options=JobOptions(
                name="x",
                queue="q",
                payload={},
                lease_seconds=30,
                effect="at_least_once",
                max_attempts=1,
                priority=priority,
                run_at=due,
                timeout_seconds=0.0,
            ),
        )

    fl.learn(["q"], [lease(0, t)], limit=8, full=True, now=b + 0.0)  # short: saw everything
    assert fl.seeks(["q"], now=b + 1.0) == [("q", 0, t - margin)]
    fl.woken("q", 0, t - dt.timedelta(minutes=5))  # an enqueue that committed late
    fl.woken("q", 9, t)  # a priority not seen yet
    assert fl.seeks(["q"], now=b + 1.0) == [
        ("q", 0, t - dt.timedelta(minutes=5) - margin),
        ("q", 9, t - margin),
    ]
    fl.learn(["q"], [lease(0, t), lease(9, t)], limit=2, full=False, now=b + 1.5)
    assert fl.seeks(["q"], now=b + 1.5) == [("q", 0, t - margin), ("q", 9, t - margin)]
    # A full read cut off by its limit may have left lower priorities unseen: before the next
    # claim seeks, those below the lowest it took are discovered (not read again from the
    # start), so that claim cannot come back empty while a lower priority's job waits.
    fl.learn(["q"], [lease(9, t)], limit=1, full=True, now=b + 2.0)
    assert fl.undiscovered(["q"]) == [("q", 9)]
    assert fl.seeks(["q"], now=b + 2.2) != []  # still from the floors
    fl.discovered("q", [(3, t - dt.timedelta(minutes=1))])
    assert fl.undiscovered(["q"]) == []
    assert ("q", 3, t - dt.timedelta(minutes=1) - margin) in fl.seeks(["q"], now=b + 2.2)
    fl.learn(["q"], [], limit=1, full=True, now=b + 3.0)
    assert fl.seeks(["q"], now=b + 3.0 + every - 0.1) != []
    assert fl.seeks(["q"], now=b + 3.0 + every + 0.001) == []  # past the boundary (below)


def test_a_wakeup_during_a_claim_keeps_the_floor_at_its_job() -> None:
    """A claim sent before a late job's wake-up did not see that job: the claim's result may
    not raise the floor past it; a claim sent after may."""
    fl = floors.ClaimFloors()
    margin = dt.timedelta(seconds=conf.tenure_settings().CLAIM_FLOOR_MARGIN_SECONDS)
    t = driver().now()

    def lease(due: dt.datetime) -> Lease:
        return Lease(
            job_id=1,
            fence=1,
            attempt=1,
            attempt_id=1,
            kind="run",
            created_at=t,
            executor=EXEC,
            options=JobOptions(
                name="x",
                queue="q",
                payload={},
                lease_seconds=30,
                effect="at_least_once",
                max_attempts=1,
                priority=0,
                run_at=due,
                timeout_seconds=0.0,
            ),
        )

    fl.learn(["q"], [lease(t)], limit=8, full=True, now=time.monotonic())
    sent = time.monotonic()
    late = t - dt.timedelta(seconds=30)
    fl.woken("q", 0, late)  # arrives while the claim below is under way
    fl.learn(["q"], [lease(t + dt.timedelta(seconds=5))], limit=1, full=False, now=sent)
    assert fl.seeks(["q"], now=time.monotonic()) == [("q", 0, late - margin)]
    fl.learn(["q"], [lease(t + dt.timedelta(seconds=5))], limit=1, full=False, now=time.monotonic())
    assert fl.seeks(["q"], now=time.monotonic()) == [("q", 0, t + dt.timedelta(seconds=5) - margin)]


def test_a_full_read_lowers_a_floor_a_wakeup_for_a_later_job_set() -> None:
    """A process that knows no floor (just started, or on a new connection after a failover)
    hears the wake-up of a job due later (a retry's backoff): the floor it sets is above the
    jobs already waiting. The full read that follows took the oldest of them; its floor must
    win, or the claims between full reads seek past every waiting job and the queue drains a
    claim's limit per full-read interval (``make chaos-failover`` drained 8 jobs per 5 s)."""
    fl = floors.ClaimFloors()
    margin = dt.timedelta(seconds=conf.tenure_settings().CLAIM_FLOOR_MARGIN_SECONDS)
    t = driver().now()

    def lease(due: dt.datetime) -> Lease:
        return Lease(
            job_id=1,
            fence=1,
            attempt=1,
            attempt_id=1,
            kind="run",
            created_at=t,
            executor=EXEC,
            options=JobOptions(
                name="x",
                queue="q",
                payload={},
                lease_seconds=30,
                effect="at_least_once",
                max_attempts=1,
                priority=0,
                run_at=due,
                timeout_seconds=0.0,
            ),
        )

    fl.woken("q", 0, t + dt.timedelta(seconds=30))
    sent = time.monotonic()
    fl.learn(["q"], [lease(t - dt.timedelta(seconds=10))], limit=4, full=True, now=sent)
    assert fl.seeks(["q"], now=sent + 0.1) == [("q", 0, t - dt.timedelta(seconds=10) - margin)]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="claim floors are PostgreSQL's")
def test_a_job_enqueued_behind_the_floors_is_claimed_after_its_wakeup() -> None:
    """An enqueue that commits late (its due time already below the floors) and a job of a
    higher priority are taken by the very next claim: their wake-ups call for a full read."""
    in_a.enqueue_many([{"n": i} for i in range(5)])
    assert len(driver().claim(executor=EXEC, queues=["plan_a"], limit=5)) == 5
    assert floors.FLOORS.seeks(["plan_a"], now=time.monotonic()) != []
    late = in_a.enqueue(n=99, run_at=driver().now() - dt.timedelta(minutes=5))
    [got] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)
    assert got.job_id == late.pk
    urgent = in_a.enqueue(n=100, priority=9)
    in_a.enqueue(n=101)
    [got] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)
    assert got.job_id == urgent.pk


@pytest.fixture
def claim_shapes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The shape of every PostgreSQL claim made from here on, in order."""
    shapes: list[str] = []
    real = postgres.claim_shape

    def spy(*, by_id: bool, nqueues: int, floors: bool) -> str:
        shape = real(by_id=by_id, nqueues=nqueues, floors=floors)
        shapes.append(shape)
        return shape

    monkeypatch.setattr(postgres, "claim_shape", spy)
    return shapes


@pytest.mark.skipif(connection.vendor != "postgresql", reason="claim floors are PostgreSQL's")
def test_jobs_arriving_one_at_a_time_are_claimed_from_the_floors(claim_shapes: list[str]) -> None:
    """A job arrives, a claim of one takes it, an idle slot's claim comes up short. A full
    read that took its whole limit used to make that short claim send the next one back to
    the start of the index: every arrival was then claimed by a full read, which under a held
    snapshot walks every entry claimed since. Now only the first claim (and one per full-read
    interval) reads from the start."""
    floors.FLOORS.forget()
    for i in range(30):
        in_a.enqueue(n=i)
        [lease] = driver().claim(executor=EXEC, queues=["plan_a"], limit=1)
        assert driver().claim(executor=EXEC, queues=["plan_a"], limit=1) == []
        driver().complete(lease)
    full = [s for s in claim_shapes if s != pg_statements.CLAIM_FROM_FLOORS]
    assert len(claim_shapes) == 60
    assert len(full) <= 2, claim_shapes


@pytest.mark.skipif(connection.vendor != "postgresql", reason="claim floors are PostgreSQL's")
def test_a_lower_priority_a_cut_off_full_read_did_not_reach_is_discovered(
    claim_shapes: list[str],
) -> None:
    """Priorities 5 and 0 waiting; the first (full) read takes one job of priority 5 and is
    cut off by its limit. Before the next claim seeks, the priorities below 5 are discovered,
    so that claim takes the rest of priority 5 and then the priority-0 job from the floors,
    without a read from the start (a claim of one after the cut-off read, the storage suite's
    case, then finds the lower priority's job: it never comes back empty with work waiting)."""
    in_a.enqueue_many([{"n": i} for i in range(3)], priority=5)
    low = in_a.enqueue(n=99, priority=0)
    floors.FLOORS.forget()  # as in a process started after these were enqueued
    taken = [x.priority for x in driver().claim(executor=EXEC, queues=["plan_a"], limit=1)]
    assert taken == [5]
    got = driver().claim(executor=EXEC, queues=["plan_a"], limit=8)
    assert [x.priority for x in got] == [5, 5, 0]
    assert got[-1].job_id == low.pk
    assert claim_shapes == [pg_statements.CLAIM_ONE_QUEUE, pg_statements.CLAIM_FROM_FLOORS]


def test_a_full_read_that_takes_long_comes_no_more_often_than_twenty_times_its_time() -> None:
    """Under a held snapshot a full read reads every entry the snapshot keeps, so it grows with
    the snapshot's age; spaced by its own time it takes at most a twentieth of the process's
    time, however long the snapshot is held."""
    fl = floors.ClaimFloors()
    b = time.monotonic() + 60
    every = conf.tenure_settings().CLAIM_FULL_SCAN_SECONDS
    t = driver().now()
    got = Lease(
        job_id=1,
        fence=1,
        attempt=1,
        attempt_id=1,
        kind="run",
        created_at=t,
        executor=EXEC,
        options=JobOptions(
            name="x",
            queue="q",
            payload={},
            lease_seconds=30,
            effect="at_least_once",
            max_attempts=1,
            priority=0,
            run_at=t,
            timeout_seconds=0.0,
        ),
    )
    # A millisecond past each boundary: (b + 30.0) - b is below 30.0 for about a quarter of
    # the clock values b where b + 30 crosses a power of two (b in [8162, 8192): a CI run
    # 2 h 15 min after boot failed here on the exact boundary).
    fl.learn(["q"], [got], limit=8, full=True, now=b, elapsed=0.01)  # quick: the usual interval
    assert fl.seeks(["q"], now=b + every - 0.1) != []
    assert fl.seeks(["q"], now=b + every + 0.001) == []
    fl.learn(["q"], [got], limit=8, full=True, now=b, elapsed=1.5)  # 1.5 s: every 30 s
    assert fl.seeks(["q"], now=b + 29.9) != []
    assert fl.seeks(["q"], now=b + 30.001) == []


def _index_scans(plan: str) -> set[str]:
    return {
        line.split(" using ")[1].split(" on ")[0]
        for line in plan.splitlines()
        if " using " in line and " on tenure_job" in line
    }


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
@pytest.mark.parametrize("read", ["claim-from-the-start", "claim-from-the-floors", "reaper"])
def test_no_other_index_holds_the_rows_a_claim_or_the_reaper_looks_for(read: str) -> None:
    """The claim index is the only one holding waiting rows, the leases index and the queue's
    index of leases (a limited queue's count, 0016) the only ones holding leased rows (beside
    the primary keys, the job's and its spec's, which cannot answer these reads). With its own
    index out of the way a claim's plan can only read the table, and the reaper's only that
    other index of leases, which holds the same rows by queue and cannot stop at an expiry:
    no other index is there for a plan to prefer. The queue index had been: costed within 1 %
    of the claim index, a soak's generic plans switched to it for two minutes and read the
    ``waiting`` entries of every job a held snapshot kept, 61 ms per claim."""
    # As in a busy table: many jobs at rest, a few waiting or leased.
    in_a.enqueue_many([{"n": i} for i in range(3000)])
    few = list(Job.objects.order_by("-id").values_list("pk", flat=True)[:10])
    Job.objects.exclude(pk__in=few).update(state="succeeded")
    if read == "reaper":
        Job.objects.filter(pk__in=few).update(state="leased", lease_expires_at=driver().now())
        with transaction.atomic():
            sql, params = driver().expired_leases(1.0)[:100].query.sql_with_params()
        own = "tenure_job_leases"
    else:
        sql, params = _claim_statement(["plan_a"], floors=read.endswith("floors"))
        own = "tenure_job_claim"
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql, list(params))
        plan = "\n".join(r[0] for r in cur.fetchall())
        with_own = _index_scans(plan)
        cur.execute(f"DROP INDEX {own}")
        cur.execute("EXPLAIN " + sql, list(params))
        without = _index_scans("\n".join(r[0] for r in cur.fetchall()))
        transaction.set_rollback(True)
    assert own in with_own
    others = {"tenure_job_pkey", "tenure_job_spec_pkey"}
    if read == "reaper":
        assert "tenure_job_queue_leased" not in with_own, plan
        others |= {"tenure_job_queue_leased"}
    assert without <= others, without
    if read != "reaper":
        # Each claimed job's spec (its lease length, maximum runtime, payload) by its key.
        assert "tenure_job_spec_pkey" in with_own and "Seq Scan" not in plan, plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's visibility rules")
def test_a_sweep_starts_where_the_last_one_left_off_past_the_entries_a_held_snapshot_keeps() -> (
    None
):
    """Every lease a held snapshot saw renewed or ended keeps an entry, with an expiry long
    past, in the leases index: a sweep from the start reads each one every second, a sweep
    from the last one's bound does not."""
    from scheduler_core.services import reaper

    s = connection.settings_dict
    holder = psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], dbname=s["NAME"], autocommit=False
    )
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM tenure_job").fetchone()
        in_a.enqueue_many([{"n": i} for i in range(3000)])
        # Leased with an expiry a minute past, then ended: the versions the snapshot keeps.
        Job.objects.update(
            state="leased", lease_expires_at=driver().now() - dt.timedelta(seconds=60)
        )
        Job.objects.update(state="succeeded", lease_expires_at=None)
        assert reaper.reap_once() == {}  # the first sweep reads from the start
        since = reaper.WALK.since(now=time.monotonic())
        assert since is not None
        with transaction.atomic():
            full_sql, full_params = driver().expired_leases(0.0)[:500].query.sql_with_params()
            sql, params = driver().expired_leases(0.0, since=since)[:500].query.sql_with_params()
        full = _index_buffers("tenure_job_leases", full_sql, list(full_params))
        walked = _index_buffers("tenure_job_leases", sql, list(params))
    finally:
        holder.close()
    assert full > 20, full
    assert walked <= 3, (walked, full)


def test_the_reaper_reads_from_the_start_first_and_every_full_walk_interval() -> None:
    """A lease whose expiry is below the walk (a row a sweep skipped while another transaction
    held it) is found by the next sweep from the start, at most FULL_WALK_SECONDS later."""
    from scheduler_core.services import reaper

    walk = reaper.LeaseWalk()
    t0 = time.monotonic()
    bound = driver().now()
    assert walk.since(now=t0) is None
    walk.swept(since=None, bound=bound, now=t0)
    assert walk.since(now=t0 + 1) == bound - reaper.WALK_MARGIN
    # A later sweep's bound raises the walk; an earlier one never lowers it.
    walk.swept(since=bound, bound=bound + dt.timedelta(seconds=5), now=t0 + 1)
    walk.swept(since=bound, bound=bound - dt.timedelta(seconds=50), now=t0 + 2)
    assert walk.since(now=t0 + 3) == bound + dt.timedelta(seconds=5) - reaper.WALK_MARGIN
    # A millisecond past the interval: t0 + 60 - t0 can come out a hair under 60 in floats.
    assert walk.since(now=t0 + reaper.FULL_WALK_SECONDS + 0.001) is None


def _run_through_plan_b(n: int) -> None:
    """Enqueue ``n`` jobs in ``plan_b`` and run each through its claim and its completion,
    a hundred at a time (under a held snapshot: an entry of each left in the claim, leases
    and open-attempt indexes)."""
    in_b.enqueue_many([{"n": i} for i in range(n)])
    got = driver().claim(executor=EXEC, queues=["plan_b"], limit=100)
    while got:
        got = driver().complete_many_and_claim(got, executor=EXEC, queues=["plan_b"], limit=100)[2]


def _entries_read(op: Any, *indexes: str) -> dict[str, int]:
    """Entries of each of ``indexes`` that ``op``'s statements read, counted by the server for
    this transaction, rolled back."""
    count = "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)"
    with transaction.atomic(), connection.cursor() as cur:
        before = {}
        for index in indexes:
            cur.execute(count, [index])
            before[index] = cur.fetchone()[0]
        op()
        after = {}
        for index in indexes:
            cur.execute(count, [index])
            after[index] = cur.fetchone()[0] - before[index]
        transaction.set_rollback(True)
    return after


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's visibility rules")
@pytest.mark.parametrize(
    "write", ["complete", "complete_with_result", "complete_and_claim", "heartbeat", "fail"]
)
def test_an_attempts_own_writes_find_its_row_by_key_past_the_entries_a_held_snapshot_keeps(
    write: str,
) -> None:
    """Every write on behalf of an attempt names it by key and requires it still open. While a
    snapshot is held, the open attempts' key (``tenure_open_attempt``, 0017; the partial index
    of 0015 before it) keeps an entry for every attempt opened since;
    costed from statistics that count only the few attempts open, a bitmap of that whole index
    ANDed with the primary key's looked cheap, and every completion read all of those entries:
    in the hour's soak the queue fell behind by 25,000 jobs, p99 wait 168 s
    (records.still_open). Each write here reads none of them, nor any of the leases index's,
    which keeps an entry for every job leased since."""
    with held_snapshot():
        _run_through_plan_b(3000)
        # Statistics taken while no attempt is open and no job leased (autovacuum's, at any
        # moment of a quiet queue): the planner believes the open-attempt and leases indexes
        # empty.
        with connection.cursor() as cur:
            cur.execute("ANALYZE tenure_attempt, tenure_job")
        in_a.enqueue_many([{"n": i} for i in range(4)])
        leases = driver().claim(executor=EXEC, queues=["plan_a"], limit=4)
        lease = leases[0]
        ops = {
            "complete": lambda: driver().complete(lease),
            "complete_with_result": lambda: driver().complete(lease, result={"v": 1}),
            "complete_and_claim": lambda: driver().complete_many_and_claim(
                [lease], executor=EXEC, queues=["plan_a"], limit=1
            ),
            "heartbeat": lambda: driver().heartbeat(lease),
            "fail": lambda: driver().finish(
                lease, Decision(transition=states.FAIL, reason="x"), outcome="failed"
            ),
        }
        read = _entries_read(ops[write], "tenure_open_attempt_pkey", "tenure_job_leases")
        assert max(read.values()) < 10, read


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's visibility rules")
def test_a_limited_queues_count_reads_its_own_leases_only() -> None:
    """A claim of a queue with a ``max_leased`` limit counts that queue's leased jobs under its
    queue's lock. While a snapshot is held, the leases index (by expiry, every queue's) keeps an
    entry of every job leased since, in any queue; counted through it, each claim of a limited
    queue read all of them (3,000 here). By the queue's own index of leases (0016) it reads
    the entries its own queue left: none here, 20 after 20 of its jobs."""
    assert driver().write_queue("plan_a", expected_version=0, fields={"max_leased": 5})
    with held_snapshot():
        _run_through_plan_b(3000)
        with connection.cursor() as cur:
            cur.execute("ANALYZE tenure_job")
        in_a.enqueue_many([{"n": i} for i in range(30)])
        indexes = ("tenure_job_leases", "tenure_job_queue_leased")

        def claim_three() -> None:
            assert len(driver().claim_within_limits(["plan_a"], executor=EXEC, limit=3)) == 3

        assert max(_entries_read(claim_three, *indexes).values()) < 10
        for _ in range(4):
            for lease in driver().claim_within_limits(["plan_a"], executor=EXEC, limit=5):
                driver().complete(lease)
        read = _entries_read(claim_three, *indexes)
        assert read["tenure_job_leases"] < 10, read
        assert 20 <= read["tenure_job_queue_leased"] < 30, read


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's visibility rules")
def test_a_limited_queues_claim_seeks_past_the_entries_its_claimed_jobs_left(
    settings: Any,
) -> None:
    """A limited queue's claim seeks from floors of its own (``floors.LIMITED_FLOORS``): read
    from the start of the claim index, each one walked the entries of every job of its queue
    claimed since a snapshot was held (400 here); from the floors it reads the few it takes.
    A full read still comes first and on its own cadence; the open queues' claims, which pass
    over a limited queue at their gate, do not count as reads of it."""
    settings.TENURE_CLAIM_FULL_SCAN_SECONDS = 3600  # no full read due within the test
    settings.TENURE_CLAIM_FLOOR_MARGIN_SECONDS = 0.0
    assert driver().write_queue("plan_a", expected_version=0, fields={"max_leased": 50})

    def claim_three() -> None:
        assert len(driver().claim_within_limits(["plan_a"], executor=EXEC, limit=3)) == 3

    with held_snapshot():
        in_a.enqueue_many([{"n": i} for i in range(400)])
        full = _entries_read(claim_three, "tenure_job_claim")
        assert full["tenure_job_claim"] >= 3, full
        while got := driver().claim_within_limits(["plan_a"], executor=EXEC, limit=40):
            for lease in got:
                driver().complete(lease)
        time.sleep(0.01)
        in_a.enqueue_many([{"n": i} for i in range(30)])  # due after all of those
        # A claim of an open queue beside it: a full read of plan_b that passes over plan_a at
        # the gate, then plan_a's claim within its limits, from its own floors.
        for lease in driver().claim(executor=EXEC, queues=["plan_a", "plan_b"], limit=5):
            assert lease.queue == "plan_a"
            driver().complete(lease)
        read = _entries_read(claim_three, "tenure_job_claim")
        assert read["tenure_job_claim"] < 10, read
        # Its floors forgotten (a new process), the claim reads from the start, past them all.
        floors.forget()
        read = _entries_read(claim_three, "tenure_job_claim")
        assert read["tenure_job_claim"] >= 400, read
