"""Is it alive? The verdict's rules (``scheduler_core.read.liveness.assess``), executors whose
beat stopped, and ``run_scheduler``'s own liveness row (recorded, stopped, never a consumer)."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from scheduler_core.models import Executor
from scheduler_core.read import health, liveness, metrics
from scheduler_core.services.maintenance import Maintenance
from scheduler_core.storage.drivers import driver
from tests.hand_rows import hand_job

pytestmark = pytest.mark.django_db(transaction=True)

QUIET = {c: 0 for c in health.HEALTH_CATEGORIES}
PRESSURE_HELD = {"held_back": True, "oldest_snapshot_seconds": 300.0, "job_dead_rows": 50_000}


def _scheduler_alive() -> Maintenance:
    m = Maintenance(interval=0)
    m.beat()
    return m


def _executor(executor_id: str = "h:1:live", queues: tuple[str, ...] = ("default",)) -> None:
    driver().executor_started(executor_id, transport="polling", queues=list(queues), concurrency=1)


def _silence(executor_id: str, seconds: float) -> None:
    """Move the row's last beat ``seconds`` into the past (as a killed process leaves it)."""
    Executor.objects.filter(pk=executor_id).update(
        heartbeat_at=driver().now() - dt.timedelta(seconds=seconds)
    )


def _keys(a: liveness.Assessment) -> set[str]:
    return {r.key for r in a.reasons}


def test_healthy_when_an_executor_and_the_scheduler_are_live_and_nothing_is_wrong() -> None:
    _executor()
    _scheduler_alive()
    a = liveness.assess()
    assert (a.verdict, a.reasons, a.live_executors) == ("healthy", [], 1)
    assert a.scheduler.alive


def test_down_when_no_executor_is_live_while_work_is_due() -> None:
    _scheduler_alive()
    a = liveness.assess(categories={**QUIET, "waiting_due": 3}, executors=[], pressure=None)
    assert a.verdict == "down"
    assert _keys(a) == {"no_executor"}
    assert "3 jobs are due" in a.reasons[0].text
    # Nothing due: no executor is not, by itself, a fault.
    assert liveness.assess(categories=QUIET, executors=[], pressure=None).verdict == "healthy"


def test_down_when_the_scheduler_never_ran_or_stopped() -> None:
    _executor()
    a = liveness.assess(pressure=None)
    assert (a.verdict, _keys(a)) == ("down", {"no_scheduler"})
    assert "never run" in a.reasons[0].text
    m = _scheduler_alive()
    assert liveness.assess(pressure=None).verdict == "healthy"
    driver().executor_stopped(m.scheduler_id)
    a = liveness.assess(pressure=None)
    assert (a.verdict, _keys(a)) == ("down", {"no_scheduler"})
    assert "stopped at" in a.reasons[0].text
    assert a.scheduler.stopped_at is not None


def test_a_scheduler_whose_beat_stopped_is_not_running(settings: Any) -> None:
    settings.TENURE_EXECUTOR_STALE_SECONDS = 5.0
    settings.TENURE_SWEEP_INTERVAL = 1.0
    _executor()
    m = _scheduler_alive()
    _silence(m.scheduler_id, 4.0)
    assert liveness.scheduler_status().alive
    _silence(m.scheduler_id, 6.0)
    a = liveness.assess(pressure=None)
    assert not a.scheduler.alive
    assert _keys(a) == {"no_scheduler"}
    assert "s ago" in a.reasons[0].text


@pytest.mark.parametrize(
    ("category", "words"),
    [
        ("stuck", "due but unclaimed"),
        ("abandoned", "abandoned"),
        ("overrunning", "maximum runtime"),
        ("failing_repeatedly", "failing repeatedly"),
        ("indeterminate", "waiting for an operator"),
    ],
)
def test_degraded_for_each_job_category_that_needs_attention(category: str, words: str) -> None:
    _scheduler_alive()
    a = liveness.assess(categories={**QUIET, category: 2}, executors=[{"id": "x"}], pressure=None)
    assert (a.verdict, _keys(a)) == ("degraded", {category})
    assert words in a.reasons[0].text and a.reasons[0].text.startswith("2 ")


def test_degraded_when_the_database_holds_the_queue_back() -> None:
    _scheduler_alive()
    a = liveness.assess(categories=QUIET, executors=[{"id": "x"}], pressure=PRESSURE_HELD)
    assert (a.verdict, _keys(a)) == ("degraded", {"database_pressure"})
    assert "300 s" in a.reasons[0].text


def test_down_outranks_degraded_and_every_reason_is_kept() -> None:
    a = liveness.assess(
        categories={**QUIET, "waiting_due": 1, "stuck": 1, "indeterminate": 1},
        executors=[],
        pressure=None,
    )
    assert a.verdict == "down"
    assert _keys(a) == {"no_executor", "no_scheduler", "stuck", "indeterminate"}
    assert [r.level for r in a.reasons][:2] == ["down", "down"]


def test_a_stuck_job_in_the_store_degrades_the_verdict(settings: Any) -> None:
    settings.TENURE_STUCK_AFTER_SECONDS = 60.0
    _executor()
    _scheduler_alive()
    now = driver().now()
    hand_job(name="t.stuck", run_at=now - dt.timedelta(seconds=120), created_at=now, updated_at=now)
    a = liveness.assess(pressure=None)
    assert a.verdict == "degraded"
    assert {"stuck"} <= _keys(a)


def test_an_executor_whose_beat_stopped_is_not_live(settings: Any) -> None:
    settings.TENURE_EXECUTOR_STALE_SECONDS = 10.0
    _executor("h:1:fresh", ("a",))
    _executor("h:2:silent", ("b",))
    _silence("h:2:silent", 11.0)
    assert [e["id"] for e in health.executors()] == ["h:1:fresh"]
    assert [e["id"] for e in liveness.stopped_responding()] == ["h:2:silent"]
    assert driver().live_consumer_queues("polling") == frozenset({"a"})
    a = liveness.assess(pressure=None)
    assert a.live_executors == 1
    assert [e["id"] for e in a.stopped_responding] == ["h:2:silent"]
    # One that recorded its stop is neither live nor "stopped responding": it is gone.
    driver().executor_stopped("h:2:silent")
    assert liveness.stopped_responding() == []


def test_the_stale_threshold_is_never_less_than_three_beats(settings: Any) -> None:
    settings.TENURE_EXECUTOR_STALE_SECONDS = 1.0
    settings.TENURE_EXECUTOR_BEAT_SECONDS = 2.0
    _executor("h:1:slow")
    _silence("h:1:slow", 5.0)
    assert [e["id"] for e in health.executors()] == ["h:1:slow"]
    _silence("h:1:slow", 6.5)
    assert health.executors() == []


def test_the_scheduler_row_is_recorded_stopped_and_never_a_consumer(settings: Any) -> None:
    settings.TENURE_TRANSPORT = "celery"
    m = Maintenance(interval=0)
    m.run(rounds=2)
    row = Executor.objects.get(pk=m.scheduler_id)
    assert (row.transport, row.queues, row.concurrency) == ("scheduler", "", 0)
    assert row.stopped_at is not None  # the loop recorded its own stop
    # While it runs it is alive, and still no executor and no consumer of any queue.
    m2 = _scheduler_alive()
    assert liveness.scheduler_status().alive
    assert health.executors() == []
    assert driver().live_consumer_queues("scheduler") == frozenset()
    assert driver().live_consumer_queues("celery") == frozenset()
    assert health.status()["executors"]["alive"] == 0
    text = _scrape()
    assert "tenure_executors_alive 0.0" in text
    assert "tenure_scheduler_alive 1.0" in text
    driver().executor_stopped(m2.scheduler_id)
    assert not liveness.scheduler_status().alive


def _scrape() -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.exposition_registry()).decode()


def test_metrics_and_jobs_status_carry_the_verdict_and_its_reasons() -> None:
    now = driver().now()
    hand_job(name="t.due", run_at=now, created_at=now, updated_at=now)
    text = _scrape()
    assert "tenure_verdict 2.0" in text
    assert 'tenure_verdict_reason{reason="no_executor"} 1.0' in text
    assert 'tenure_verdict_reason{reason="no_scheduler"} 1.0' in text
    out = io.StringIO()
    call_command("jobs_status", "--json", stdout=out)
    verdict = json.loads(out.getvalue())["verdict"]
    assert verdict["verdict"] == "down"
    assert {r["key"] for r in verdict["reasons"]} == {"no_executor", "no_scheduler"}
    out = io.StringIO()
    call_command("jobs_status", stdout=out)
    assert "verdict:  down" in out.getvalue()
    assert "scheduler: not running (never seen)" in out.getvalue()
