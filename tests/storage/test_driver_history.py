"""The driver contract, the console's history: ``minute_rollup`` over attempts the claim and the
completion wrote, ``save_minute_stats`` (replace, watermark), ``history_watermark`` and
``prune_minute_stats``."""

from __future__ import annotations

import datetime as dt

import pytest

from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import MinuteStats
from scheduler_core.storage.drivers import driver

from . import QUEUE, claim_one, plain, reap

pytestmark = pytest.mark.django_db(transaction=True)

MIN = dt.timedelta(minutes=1)


def _window() -> tuple[dt.datetime, dt.datetime]:
    """Whole minutes around now (the rollup takes any range of whole minutes)."""
    now = driver().now().replace(second=0, microsecond=0)
    return now - MIN, now + 2 * MIN


def test_minute_rollup_counts_what_the_claim_and_the_completion_wrote() -> None:
    d = driver()
    lease = claim_one()
    d.finish(lease, Decision(transition=states.COMPLETE), outcome="succeeded")
    reaped = claim_one()
    reap(reaped)  # waits again: the reaped attempt counts as retried
    start, end = _window()
    rows = d.minute_rollup(start, end)
    total = {k: sum(r[k] for r in rows) for k in ("succeeded", "retried", "claims", "failed")}
    assert total == {"succeeded": 1, "retried": 1, "claims": 2, "failed": 0}
    assert {(r["queue"], r["name"]) for r in rows} == {(QUEUE, plain.name)}
    waits = [r["wait_p50_ms"] for r in rows if r["wait_p50_ms"] is not None]
    # Only the succeeded job's claim is still its job's latest with a known due time.
    assert len(waits) == 1 and waits[0] >= 0.0
    assert all(start <= r["minute"] < end for r in rows)
    assert d.minute_rollup(end, end + MIN) == []


def test_save_minute_stats_replaces_rows_and_moves_the_watermark() -> None:
    d = driver()
    assert d.history_watermark() is None
    start, end = _window()
    row = {
        "minute": start,
        "queue": QUEUE,
        "name": plain.name,
        "succeeded": 2,
        "failed": 1,
        "indeterminate": 0,
        "retried": 0,
        "claims": 3,
        "wait_p50_ms": 5.0,
        "wait_p95_ms": 9.0,
    }
    d.save_minute_stats([row], through=end - MIN)
    d.save_minute_stats([{**row, "succeeded": 4}], through=end)
    saved = MinuteStats.objects.exclude(queue="").get()
    assert (saved.succeeded, saved.failed, saved.claims, saved.wait_p95_ms) == (4, 1, 3, 9.0)
    assert d.history_watermark() == end
    assert MinuteStats.objects.filter(queue="").count() == 1


def test_prune_minute_stats_deletes_the_minutes_before_the_bound() -> None:
    d = driver()
    start, _ = _window()
    for k in range(4):
        MinuteStats.objects.create(minute=start - k * MIN, queue=QUEUE, name=plain.name)
    assert d.prune_minute_stats(start - MIN) == 2
    assert sorted(MinuteStats.objects.values_list("minute", flat=True)) == [start - MIN, start]
