"""History: ``run_scheduler``'s rollup of finished attempts into ``MinuteStats`` (per minute,
queue and job type: outcomes, claims, queue wait p50 / p95), re-run without double counting,
caught up after a stop, and kept only ``TENURE_HISTORY_KEEP_SECONDS``.

Attempts are written with chosen times (a minute in the past), as the claim and the
completion leave them, so each figure is known in advance.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection, transaction

from scheduler_core.models import Attempt, Job, MinuteStats
from scheduler_core.services import history, maintenance
from scheduler_core.storage import pg_statements
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.history import ROLLUP_MARGIN
from tests.hand_rows import hand_job

pytestmark = pytest.mark.django_db(transaction=True)

S = dt.timedelta(seconds=1)
MIN = dt.timedelta(minutes=1)


def _minute(ago: int) -> dt.datetime:
    """The start of the minute ``ago`` minutes before the database's current one."""
    return history.minute_floor(driver().now()) - ago * MIN


def _job(
    *,
    queue: str = "q1",
    name: str = "t.one",
    state: str = "succeeded",
    run_at: dt.datetime,
    attempts: list[dict[str, Any]],
) -> Job:
    """A job with its attempts (fences 1, 2, ...), the job left at the last one's fence."""
    now = driver().now()
    j = hand_job(
        name=name,
        queue=queue,
        state=state,
        run_at=run_at,
        fence=len(attempts),
        attempts=len(attempts),
        created_at=run_at,
        updated_at=now,
    )
    for i, a in enumerate(attempts, start=1):
        Attempt.objects.create(
            job=j,
            number=i,
            fence=i,
            executor="h:1:x",
            claimed_at=a["claimed"],
            finished_at=a.get("finished"),
            outcome=a.get("outcome", ""),
        )
    return j


def _rows(minute: dt.datetime) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (r["queue"], r["name"]): r
        for r in MinuteStats.objects.filter(minute=minute).exclude(queue="").values()
    }


def test_rollup_counts_each_outcome_and_claim_per_minute_queue_and_type() -> None:
    m = _minute(5)
    # Succeeded, failed and indeterminate in minute m (queue q1, type t.one).
    for outcome in ("succeeded", "failed", "indeterminate"):
        _job(
            state=outcome,
            run_at=m + 1 * S,
            attempts=[{"claimed": m + 2 * S, "finished": m + 3 * S, "outcome": outcome}],
        )
    # Retried in m, then succeeded in m + 1.
    _job(
        run_at=m + 40 * S,
        attempts=[
            {"claimed": m + 4 * S, "finished": m + 5 * S, "outcome": "retried"},
            {"claimed": m + 50 * S, "finished": m + 61 * S, "outcome": "succeeded"},
        ],
    )
    # Another queue and type: reaped (lease expired) into indeterminate, its latest attempt.
    _job(
        queue="q2",
        name="t.two",
        state="indeterminate",
        run_at=m,
        attempts=[{"claimed": m + 10 * S, "finished": m + 30 * S, "outcome": "lease_expired"}],
    )
    written = history.rollup(m, m + 2 * MIN)

    rows = _rows(m)
    one = rows[("q1", "t.one")]
    assert (one["succeeded"], one["failed"], one["indeterminate"], one["retried"]) == (1, 1, 1, 1)
    assert one["claims"] == 5  # four first claims and the retry's second claim
    two = rows[("q2", "t.two")]
    assert (two["indeterminate"], two["claims"], two["retried"]) == (1, 1, 0)
    later = _rows(m + MIN)[("q1", "t.one")]
    assert (later["succeeded"], later["claims"]) == (1, 0)
    assert written == 3
    # The watermark says where the next round starts.
    assert driver().history_watermark() == m + 2 * MIN


def test_rollup_percentiles_of_the_queue_wait() -> None:
    m = _minute(4)
    # Twenty claims in minute m waited 0, 1, ..., 19 s after their due time.
    for i in range(20):
        due = m + 30 * S - i * S
        _job(
            run_at=due,
            attempts=[{"claimed": m + 30 * S, "finished": m + 31 * S, "outcome": "succeeded"}],
        )
    history.rollup(m, m + MIN)
    row = _rows(m)[("q1", "t.one")]
    assert row["claims"] == 20
    # Linear interpolation between ranks (PostgreSQL's percentile_cont, Python on SQLite).
    assert row["wait_p50_ms"] == pytest.approx(9500.0)
    assert row["wait_p95_ms"] == pytest.approx(18050.0)


def test_rolling_a_minute_up_again_does_not_double_count() -> None:
    m = _minute(3)
    for _ in range(3):
        _job(run_at=m, attempts=[{"claimed": m + S, "finished": m + 2 * S, "outcome": "succeeded"}])
    history.rollup(m, m + MIN)
    history.rollup(m, m + MIN)
    history.rollup(m - MIN, m + MIN)
    assert _rows(m)[("q1", "t.one")]["succeeded"] == 3
    assert MinuteStats.objects.filter(minute=m).exclude(queue="").count() == 1
    # The round itself: once the minutes are rolled up, the next round writes nothing.
    assert history.rollup_once() >= 0
    assert history.rollup_once() == 0
    assert _rows(m)[("q1", "t.one")]["succeeded"] == 3


def test_a_scheduler_that_was_stopped_catches_up_from_its_watermark() -> None:
    now = driver().now()
    m = history.minute_floor(now) - 10 * MIN
    _job(run_at=m, attempts=[{"claimed": m + S, "finished": m + 2 * S, "outcome": "succeeded"}])
    # A round ten minutes ago rolled up to m + 1 minute, then the scheduler stopped.
    history.rollup_once(now=m + MIN + 20 * S)
    assert driver().history_watermark() == m + MIN
    # Meanwhile attempts ended in three later minutes.
    for k in (2, 4, 7):
        at = m + k * MIN
        _job(
            run_at=at,
            attempts=[{"claimed": at + S, "finished": at + 2 * S, "outcome": "failed"}],
            state="failed",
        )
    history.rollup_once(now=now)
    for k in (2, 4, 7):
        assert _rows(m + k * MIN)[("q1", "t.one")]["failed"] == 1
    assert _rows(m)[("q1", "t.one")]["succeeded"] == 1
    # The minute that has not ended (and its lag) waits for a later round.
    assert driver().history_watermark() <= history.minute_floor(now)


def test_the_first_round_reaches_back_only_as_far_as_the_history_is_kept(settings: Any) -> None:
    settings.TENURE_HISTORY_KEEP_SECONDS = 600.0
    old = _minute(30)
    recent = _minute(5)
    for at in (old, recent):
        _job(
            run_at=at,
            attempts=[{"claimed": at + S, "finished": at + 2 * S, "outcome": "succeeded"}],
        )
    history.rollup_once()
    assert _rows(old) == {}
    assert _rows(recent)[("q1", "t.one")]["succeeded"] == 1


def test_rows_older_than_the_kept_window_are_pruned(settings: Any) -> None:
    settings.TENURE_HISTORY_KEEP_SECONDS = 3600.0
    now = driver().now()
    for ago in (0, 30, 59, 61, 120, 600):
        MinuteStats.objects.create(
            minute=history.minute_floor(now) - ago * MIN, queue="q1", name="t.one", succeeded=1
        )
    deleted = history.prune_once()
    assert deleted == 3
    kept = MinuteStats.objects.exclude(queue="").values_list("minute", flat=True)
    assert min(kept) >= now - dt.timedelta(seconds=3600)


def test_the_maintenance_round_rolls_history_up() -> None:
    m = _minute(2)
    _job(run_at=m, attempts=[{"claimed": m + S, "finished": m + 2 * S, "outcome": "succeeded"}])
    result = maintenance.run_once()
    assert result["history_rows"] >= 1
    assert _rows(m)[("q1", "t.one")]["succeeded"] == 1


def test_waiting_jobs_claimed_before_are_rolled_up_and_new_ones_are_not_read() -> None:
    """A job back to waiting after an attempt (retried, snoozed) counts its claim and what the
    attempt meant; on PostgreSQL the rollup finds such jobs through the retried index, which
    holds no new job, so a backlog of new jobs is not read each minute."""
    m = _minute(3)
    # Retried in m and waiting for its next attempt.
    _job(
        state="waiting",
        run_at=m + 40 * S,
        attempts=[{"claimed": m + 2 * S, "finished": m + 3 * S, "outcome": "retried"}],
    )
    # Snoozed in m: attempts count back, the fence does not.
    snoozed = _job(
        state="waiting",
        run_at=m + 50 * S,
        attempts=[{"claimed": m + 4 * S, "finished": m + 5 * S, "outcome": "snoozed"}],
    )
    Job.objects.filter(pk=snoozed.pk).update(attempts=0)
    # A backlog that was never claimed.
    for i in range(200):
        _job(state="waiting", run_at=m + i * S, attempts=[])
    history.rollup(m, m + MIN)
    row = _rows(m)[("q1", "t.one")]
    assert (row["retried"], row["claims"], row["succeeded"]) == (1, 2, 0)
    if connection.vendor != "postgresql":
        return
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
        cur.execute("SET LOCAL enable_seqscan = off")
        params = {"start": m, "end": m + MIN, "since": m - ROLLUP_MARGIN}
        cur.execute("EXPLAIN " + pg_statements.MINUTE_ROLLUP, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    assert "tenure_job_retried" in plan
    assert "tenure_job_claim" not in plan


def _attempt_rows_read(plan: dict[str, Any]) -> int:
    """Rows of ``tenure_attempt`` an ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan node and those
    under it read: returned or removed by a filter, every loop."""
    own = 0
    if plan.get("Relation Name") == "tenure_attempt":
        loops = int(plan.get("Actual Loops", 1))
        own = loops * (int(plan["Actual Rows"]) + int(plan.get("Rows Removed by Filter", 0)))
    return own + sum(_attempt_rows_read(p) for p in plan.get("Plans", []))


_BULK_SQL = """
WITH j AS (
    INSERT INTO tenure_job (name, queue, priority, run_at, state, fence, lease_owner, attempts,
        max_attempts, next_kind, version, created_at, updated_at, finished_at, last_error, reason)
    SELECT 't.one', 'q1', 0, %(at)s, 'succeeded', 1, '', 1, 3, 'run', 3, %(at)s, %(at)s, %(at)s,
        '', ''
    FROM generate_series(1, %(n)s)
    RETURNING id
)
INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at, finished_at,
    outcome, error_class, error_type, message, traceback)
SELECT id, 1, 1, 'run', 'h:1:x', %(at)s, %(at)s, 'succeeded', '', '', '', '' FROM j
"""


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_the_rollup_reads_no_attempt_outside_its_minutes() -> None:
    """A round's rollup reads the attempts of the jobs its minutes can hold, not every attempt
    kept: with 1,000 jobs finished in its minute and 30,000 an hour earlier it reads about the
    1,000 (it read all 31,000, one scan of the attempt table a minute, which grows with the
    history kept)."""
    m = _minute(3)
    with connection.cursor() as cur:
        cur.execute(_BULK_SQL, {"at": m - 60 * MIN, "n": 30_000})
        cur.execute(_BULK_SQL, {"at": m + 30 * S, "n": 1_000})
        cur.execute("ANALYZE tenure_job")
        cur.execute("ANALYZE tenure_attempt")
    history.rollup(m, m + MIN)
    assert _rows(m)[("q1", "t.one")]["succeeded"] == 1_000
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL jit = off")
        params = {"start": m, "end": m + MIN, "since": m - ROLLUP_MARGIN}
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + pg_statements.MINUTE_ROLLUP, params)
        plan = cur.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    assert _attempt_rows_read(plan) <= 2_000
