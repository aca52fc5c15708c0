"""The health categories' definitions, row by row, against the database's clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from scheduler_core import job
from scheduler_core.models import Job
from scheduler_core.read import health, liveness
from scheduler_core.read.jobs import JobFilter
from scheduler_core.read.queues import queue_overview
from scheduler_core.services import queues
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.health.defs", queue="health-defs", lease_seconds=30, max_attempts=10)
def defs(ctx: Any) -> None:
    """Never run: the tests move rows by hand to each situation."""


def _leased(**kw: Any) -> Job:
    j = defs.enqueue()
    driver().claim(executor="h:1:t", queues=["health-defs"], job_id=j.pk)
    Job.objects.filter(pk=j.pk).update(**kw)
    return j


def _in(category: str) -> set[int]:
    return set(Job.objects.filter(health.health_q(category)).values_list("pk", flat=True))


def test_a_stale_heartbeat_is_abandoned_before_the_lease_runs_out() -> None:
    now = driver().now()

    def renewed(ago: float) -> dict[str, dt.datetime]:
        # What the last renewal, ``ago`` seconds back, left: both columns from one reading.
        at = now - dt.timedelta(seconds=ago)
        return {"heartbeat_at": at, "lease_expires_at": at + dt.timedelta(seconds=30)}

    fresh = _leased(**renewed(0))
    # 30 s lease, renewals every 10 s: one missed (15 s) is still running, two (25 s) are not,
    # though the lease has 5 s left.
    late = _leased(**renewed(15))
    silent = _leased(**renewed(25))
    expired = _leased(**renewed(31))
    assert _in("running") == {fresh.pk, late.pk}
    assert _in("abandoned") == {silent.pk, expired.pk}


def test_staleness_follows_each_jobs_own_lease_length() -> None:
    # The same 25 s of silence: stale under a 30 s lease, fresh under a 60 s one (renewals
    # every 20 s, so one missed).
    now = driver().now()
    beat = now - dt.timedelta(seconds=25)
    short = _leased(heartbeat_at=beat, lease_expires_at=beat + dt.timedelta(seconds=30))
    long = _leased(heartbeat_at=beat, lease_expires_at=beat + dt.timedelta(seconds=60))
    assert short.pk in _in("abandoned") and long.pk in _in("running")


def test_waiting_splits_into_due_scheduled_and_backing_off() -> None:
    now = driver().now()
    due = defs.enqueue()
    retried_due = defs.enqueue()
    Job.objects.filter(pk=retried_due.pk).update(attempts=2)
    scheduled = defs.enqueue(run_at=now + dt.timedelta(hours=1))
    backing = defs.enqueue(run_at=now + dt.timedelta(hours=1))
    Job.objects.filter(pk=backing.pk).update(attempts=1)
    assert _in("waiting_due") == {due.pk, retried_due.pk}
    assert _in("waiting_scheduled") == {scheduled.pk}
    assert _in("waiting_backing_off") == {backing.pk}


def test_stuck_is_due_and_unclaimed_longer_than_the_threshold(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    recent = defs.enqueue()
    old = defs.enqueue()
    Job.objects.filter(pk=old.pk).update(run_at=driver().now() - dt.timedelta(seconds=61))
    assert _in("stuck") == {old.pk}
    assert _in("waiting_due") >= {recent.pk, old.pk}


def test_failing_repeatedly_counts_failed_attempts_not_the_running_one(settings: Any) -> None:
    settings.TENURE_FAILING_REPEATEDLY_ATTEMPTS = 3
    waiting_3 = defs.enqueue()
    Job.objects.filter(pk=waiting_3.pk).update(attempts=3)
    waiting_2 = defs.enqueue()
    Job.objects.filter(pk=waiting_2.pk).update(attempts=2)
    leased_3 = _leased(attempts=3)  # two failures behind it, the third attempt is running
    leased_4 = _leased(attempts=4)
    assert _in("failing_repeatedly") == {waiting_3.pk, leased_4.pk}
    assert leased_3.pk not in _in("failing_repeatedly")


def test_counts_match_the_definitions() -> None:
    defs.enqueue()
    defs.enqueue(run_at=driver().now() + dt.timedelta(hours=1))
    counts = health.health_counts()
    assert set(counts) == set(health.HEALTH_CATEGORIES)
    assert counts["waiting_due"] == 1 and counts["waiting_scheduled"] == 1


def test_a_claim_observes_its_latency_from_due_time_by_the_database_clock() -> None:
    from scheduler_core.read import metrics

    def between_5_and_10() -> float:
        buckets = {
            s.labels["le"]: s.value
            for m in metrics.CLAIM_LATENCY.collect()
            for s in m.samples
            if s.name.endswith("_bucket")
        }
        return buckets["10.0"] - buckets["5.0"]

    j = defs.enqueue()
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=7))
    before = between_5_and_10()
    # The runtime counts each committed claim with its leases (due and claimed by the
    # database's clock).
    metrics.claimed(driver().claim(executor="h:1:t", queues=["health-defs"], job_id=j.pk))
    assert between_5_and_10() == before + 1  # due 7 s before the claim


def _limit(**kw: Any) -> None:
    queues.set_limits(
        "health-defs",
        max_leased=kw.get("max_leased"),
        max_per_second=kw.get("max_per_second"),
        actor="op",
        reason="test",
        expected_version=None,
    )


def _old(seconds: float = 120) -> Job:
    j = defs.enqueue()
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=seconds))
    return j


def test_a_rate_limited_queues_due_jobs_are_held_by_the_limit_not_stuck(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    _limit(max_per_second=0.001)
    # A claim consults the bucket: executors are asking, the limit answers.
    driver().claim_within_limits(["health-defs"], executor="h:1:t", limit=5)
    old = _old()
    held = {old.pk} | {j.pk for j in Job.objects.filter(queue="health-defs", state="waiting")}
    assert _in("rate_limited") == held
    assert _in("stuck") == set() and _in("waiting_due") == set()
    verdict = liveness.assess(pressure=None)
    assert "stuck" not in {r.key for r in verdict.reasons}
    (reason,) = [r for r in verdict.reasons if r.key == "held_back"]
    assert reason.queue == "health-defs" and "claims per second" in reason.text


def test_a_rate_limited_queue_nobody_claims_from_is_stuck(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    _limit(max_per_second=5)
    old = _old()
    assert _in("rate_limited") == set()
    assert _in("stuck") == {old.pk}


def test_a_queue_at_its_concurrency_limit_holds_its_due_jobs(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    _leased()
    old = _old()
    assert _in("stuck") == {old.pk}
    _limit(max_leased=1)
    assert _in("concurrency_limited") == {old.pk}
    assert _in("stuck") == set() and _in("waiting_due") == set()
    row = {r["name"]: r for r in queue_overview()}["health-defs"]
    assert row["held_by"]["concurrency_limited"] == 1 and row["due"] == 1 and row["held"] == 1
    assert "at most 1 leased at once (1 now)" in row["holds"]


def test_a_paused_queues_due_jobs_are_paused_not_due(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    old = _old()
    queues.pause("health-defs", actor="op", reason="maintenance")
    assert _in("paused") == {old.pk}
    assert _in("waiting_due") == set() and _in("stuck") == set()


def test_the_categories_partition_waiting_jobs(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    now = driver().now()
    _old()
    defs.enqueue(run_at=now + dt.timedelta(hours=1))
    _leased()
    _limit(max_leased=1)
    waiting = set(Job.objects.filter(state="waiting").values_list("pk", flat=True))
    parts = [
        _in(c)
        for c in (
            "waiting_due",
            "waiting_scheduled",
            "waiting_backing_off",
            *health.HELD_CATEGORIES,
        )
    ]
    assert sum(len(p) for p in parts) == len(waiting) and set().union(*parts) == waiting


def test_the_overview_and_the_list_count_each_category_alike(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60
    _old()
    defs.enqueue()
    _leased()
    _limit(max_leased=1)
    counts = health.health_counts()
    for category in health.HEALTH_CATEGORIES:
        assert JobFilter(health=category).queryset().count() == counts[category], category
