"""``run_scheduler``'s liveness with a real process: started, it is alive and the verdict has no
scheduler reason; SIGKILLed (no chance to record its stop), once its beat is older than the
threshold the verdict says down, naming the scheduler; SIGTERMed, it records its own stop. An
executor SIGKILLed the same way stops being live and is listed as stopped responding.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from scheduler_core.models import Executor
from scheduler_core.read import health, liveness
from tests.conftest import wait_until
from tests.process import jobs as proc_jobs

pytestmark = [pytest.mark.process, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STALE = 3.0
"""The liveness threshold of this test (seconds), in the test process and its children."""


def test_a_killed_scheduler_turns_the_verdict_down_after_the_threshold(
    spawn: Any, settings: Any
) -> None:
    settings.TENURE_EXECUTOR_STALE_SECONDS = STALE
    settings.TENURE_SWEEP_INTERVAL = 0.2
    env = {"TENURE_EXECUTOR_STALE_SECONDS": str(STALE), "TENURE_SWEEP_INTERVAL": "0.2"}
    p = spawn("run_scheduler", env=env, log="scheduler.log")
    status = wait_until(
        lambda: (s := liveness.scheduler_status()).alive and s, timeout=60, interval=0.1
    )
    assert status.count == 1
    assert "no_scheduler" not in {r.key for r in liveness.assess(pressure=None).reasons}
    row = Executor.objects.get(transport=liveness.SCHEDULER_TRANSPORT)
    assert (row.queues, row.stopped_at) == ("", None)
    # It beats every round: its row's time moves on.
    first = row.heartbeat_at
    wait_until(
        lambda: Executor.objects.get(pk=row.pk).heartbeat_at > first, timeout=10, interval=0.1
    )

    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    # Killed, it recorded nothing: still "alive" until its last beat is older than the threshold.
    assert Executor.objects.get(pk=row.pk).stopped_at is None
    verdict = wait_until(
        lambda: (a := liveness.assess(pressure=None)).verdict == "down" and a,
        timeout=STALE + 10,
        interval=0.2,
    )
    reason = next(r for r in verdict.reasons if r.key == "no_scheduler")
    assert "run_scheduler is not running" in reason.text and "s ago" in reason.text
    assert not verdict.scheduler.alive


def test_a_scheduler_stopped_with_sigterm_records_its_stop(spawn: Any, settings: Any) -> None:
    p = spawn("run_scheduler", "--interval", "0.2", log="scheduler.log")
    wait_until(lambda: liveness.scheduler_status().alive, timeout=60, interval=0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    status = liveness.scheduler_status()
    assert not status.alive
    assert status.stopped_at is not None
    reason = next(r for r in liveness.assess(pressure=None).reasons if r.key == "no_scheduler")
    assert "stopped at" in reason.text


def test_a_killed_executor_stops_being_live_and_is_listed_as_stopped_responding(
    spawn: Any, settings: Any
) -> None:
    settings.TENURE_EXECUTOR_STALE_SECONDS = STALE
    settings.TENURE_EXECUTOR_BEAT_SECONDS = 0.5
    env = {"TENURE_EXECUTOR_STALE_SECONDS": str(STALE), "TENURE_EXECUTOR_BEAT_SECONDS": "0.5"}
    p = spawn("run_executor", "--concurrency", "1", env=env, log="executor.log")
    [live] = wait_until(health.executors, timeout=60, interval=0.1)
    assert liveness.stopped_responding() == []
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    wait_until(lambda: not health.executors(), timeout=STALE + 10, interval=0.2)
    assert [e["id"] for e in liveness.stopped_responding()] == [live["id"]]
    # Work that comes due now has no one to run it: down, saying so.
    proc_jobs.noop.enqueue()
    reasons = {r.key for r in liveness.assess(pressure=None).reasons}
    assert "no_executor" in reasons
