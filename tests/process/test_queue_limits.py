"""Queue limits and pause across real executor processes (PostgreSQL, where executors on
every host share one store): with three ``run_executor`` processes, a queue limited to two
leased jobs never has more than two leased at once, and pausing it stops every process's
claims while the running jobs finish."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

from scheduler_core.models import Attempt, Job
from scheduler_core.services import queues
from tests.conftest import wait_until
from tests.process import jobs

pytestmark = [
    pytest.mark.process,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="executors on many hosts share PostgreSQL"
    ),
]

JOBS_ENV = {"TENURE_JOB_MODULES": "tests.process.jobs", "TENURE_POLL_INTERVAL": "0.05"}
QUEUE = "default"
ACTOR = "test:operator"


def _executors(spawn: Any, n: int = 3, concurrency: int = 4) -> None:
    for _ in range(n):
        spawn("run_executor", "--queues", QUEUE, "--concurrency", str(concurrency), env=JOBS_ENV)


def _leased() -> int:
    return Job.objects.filter(queue=QUEUE, state="leased").count()


def test_max_leased_holds_across_three_executor_processes(spawn: Any) -> None:
    ids = [j for j in jobs.sleep.enqueue_many([{"seconds": 0.25} for _ in range(24)])]
    queues.set_limits(
        QUEUE, max_leased=2, max_per_second=None, actor=ACTOR, reason="test", expected_version=0
    )
    # One job at a time each: reaching two leased takes two processes, and three could
    # lease three without the limit.
    _executors(spawn, concurrency=1)
    samples = []
    deadline = time.monotonic() + 120
    while Job.objects.filter(pk__in=ids, state="succeeded").count() < len(ids):
        samples.append(_leased())
        assert time.monotonic() < deadline, "the queue did not drain"
        time.sleep(0.01)
    assert max(samples) <= 2, max(samples)
    # Reached, so it was the limit that held; with one job per process, by two processes.
    assert max(samples) == 2
    owners = Attempt.objects.filter(job_id__in=ids).values_list("executor", flat=True)
    assert len(set(owners)) >= 2


def test_pause_stops_claims_in_every_process_and_resume_drains(spawn: Any) -> None:
    ids = [j for j in jobs.sleep.enqueue_many([{"seconds": 0.3} for _ in range(200)])]
    _executors(spawn)
    wait_until(lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() >= 5, 60)
    paused = queues.pause(QUEUE, actor=ACTOR, reason="test")
    # Claims already under way when the pause committed may still land; then none.
    time.sleep(1.0)
    wait_until(lambda: _leased() == 0, 30)
    claimed = Attempt.objects.filter(job_id__in=ids).count()
    time.sleep(2.0)
    assert Attempt.objects.filter(job_id__in=ids).count() == claimed
    waiting = Job.objects.filter(pk__in=ids, state="waiting").count()
    assert waiting > 0
    queues.resume(QUEUE, actor=ACTOR, reason="test", expected_version=paused.queue.version)
    wait_until(lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == len(ids), 120)
