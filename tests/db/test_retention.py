"""Retention of finished jobs (``run_scheduler`` prunes them) and the dashboard's count of
succeeded jobs on a big table (a snapshot the scheduler refreshes)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from scheduler_core import job
from scheduler_core.models import Attempt, AuditEntry, CountSnapshot, Effect, Job
from scheduler_core.read import health
from scheduler_core.runtime import attempt
from scheduler_core.services import maintenance
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:retention"
DAY = 24 * 3600.0


@job(name="tests.retention.ok", queue="retention", max_attempts=2)
def ok(ctx: Any, *, n: int = 0) -> None:
    """Record an effect, then succeed."""
    with ctx.effect("note") as eff:
        eff.applied()


def _finish(n: int, state: str = "succeeded") -> list[int]:

    ids = [ok.enqueue(n=i).pk for i in range(n)]
    for lease in driver().claim(executor=EXEC, queues=["retention"], limit=n):
        attempt.run_lease(lease)
    if state != "succeeded":
        Job.objects.filter(pk__in=ids).update(state=state)
    return ids


def _age(ids: list[int], days: float) -> None:
    Job.objects.filter(pk__in=ids).update(
        updated_at=timezone.now() - dt.timedelta(days=days),
        finished_at=timezone.now() - dt.timedelta(days=days),
    )


def test_old_succeeded_jobs_are_deleted_with_their_attempts_and_ledger() -> None:
    old, recent = _finish(3), _finish(2)
    _age(old, 8)
    assert Effect.objects.filter(job_id__in=old).count() == 3
    assert driver().prune_finished("succeeded", 7 * DAY) == 3
    assert not Job.objects.filter(pk__in=old).exists()
    assert not Attempt.objects.filter(job_id__in=old).exists()
    assert not Effect.objects.filter(job_id__in=old).exists()
    assert Job.objects.filter(pk__in=recent).count() == 2
    assert driver().prune_finished("succeeded", 7 * DAY) == 0


def test_pruning_is_batched_and_keeps_what_it_must() -> None:
    done = _finish(5)
    _age(done, 40)
    failed = _finish(1, state="failed")
    _age(failed, 10)  # within the failed retention (30 days)
    parked = _finish(1, state="indeterminate")
    _age(parked, 400)
    waiting = [ok.enqueue(n=99).pk]
    _age(waiting, 400)
    # An operator acted on this one: its audit trail must keep naming it.
    AuditEntry.objects.create(job_id=done[0], actor="op", action="resolve", reason="checked")
    assert driver().prune_finished("succeeded", 7 * DAY, limit=2) == 2
    assert driver().prune_finished("succeeded", 7 * DAY, limit=2) == 2
    assert driver().prune_finished("succeeded", 7 * DAY, limit=2) == 0
    assert list(Job.objects.filter(pk__in=done).values_list("id", flat=True)) == [done[0]]
    assert driver().prune_finished("failed", 30 * DAY) == 0
    assert Job.objects.filter(pk__in=failed + parked + waiting).count() == 3
    with pytest.raises(ValueError):
        driver().prune_finished("indeterminate", DAY)


def test_the_scheduler_prunes_per_the_retention_settings(settings: Any) -> None:
    done = _finish(2)
    _age(done, 2)
    settings.TENURE_RETAIN_SUCCEEDED_SECONDS = 0  # keep forever
    assert maintenance.run_once()["pruned"] == {}
    settings.TENURE_RETAIN_SUCCEEDED_SECONDS = DAY
    assert maintenance.run_once()["pruned"] == {"succeeded": 2}
    assert not Job.objects.filter(pk__in=done).exists()


def test_big_tables_show_succeeded_and_cancelled_counts_from_the_scheduler_snapshot(
    settings: Any,
) -> None:
    _finish(3)
    ok.enqueue(n=100)
    # Below the threshold every count is live and exact.
    rows, as_of, _ = health.overview_counts()
    assert as_of is None
    assert health.fold_counts(rows, None)["succeeded"] == 3
    # Above it (every table counts as big here), the scheduler's snapshot serves succeeded.
    settings.TENURE_EXACT_COUNTS_BELOW = -1
    rows, as_of, _ = health.overview_counts()
    assert as_of is None  # no snapshot yet: counted live
    assert maintenance.refresh_counts() is True
    assert maintenance.refresh_counts() is False  # fresh enough
    _finish(2)
    ok.enqueue(n=101)
    rows, as_of, _ = health.overview_counts()
    assert as_of is not None
    counts = health.fold_counts(rows, None)
    assert counts["succeeded"] == 3  # as of the snapshot
    assert counts["waiting"] == 2  # live
    assert CountSnapshot.objects.get(queue="retention").n == 3
    settings.TENURE_COUNTS_REFRESH_SECONDS = 0
    maintenance._CountCost.seconds = 0.0  # the last count's time would space this one out
    Job.objects.filter(pk=ok.enqueue(n=102).pk).update(state="cancelled")
    assert maintenance.refresh_counts() is True
    rows, _, _ = health.overview_counts()
    counts = health.fold_counts(rows, None)
    assert (counts["succeeded"], counts["cancelled"], counts["waiting"]) == (5, 1, 2)
    # Cancelled history is snapshotted too; failed and indeterminate jobs are always live.
    assert set(CountSnapshot.objects.values_list("state", flat=True)) == {"succeeded", "cancelled"}


def test_a_count_that_takes_long_comes_no_more_often_than_twenty_times_its_time(
    settings: Any,
) -> None:
    """On a big history the recount is spaced by its own cost, whatever
    ``TENURE_COUNTS_REFRESH_SECONDS`` says."""
    settings.TENURE_EXACT_COUNTS_BELOW = -1
    settings.TENURE_COUNTS_REFRESH_SECONDS = 30
    _finish(1)
    maintenance._CountCost.seconds = 0.0
    assert maintenance.refresh_counts() is True
    assert maintenance._CountCost.seconds > 0.0
    # The count is a minute old, twice the setting.
    CountSnapshot.objects.update(taken_at=driver().now() - dt.timedelta(seconds=60))
    try:
        maintenance._CountCost.seconds = 10.0  # as if the last count took 10 s: wait 200 s
        assert maintenance.refresh_counts() is False
        maintenance._CountCost.seconds = 2.0  # 40 s
        assert maintenance.refresh_counts() is True
    finally:
        maintenance._CountCost.seconds = 0.0
