"""Poison jobs are bounded: they end ``failed`` after their budget and never starve others."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from demo import jobs as demo
from scheduler_core.models import Attempt, Job
from tests.conftest import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

REAPER = {"TENURE_REAP_GRACE_SECONDS": "0", "TENURE_SWEEP_INTERVAL": "0.1"}
EXECUTORS = 3


def test_poison_and_self_killing_jobs_fail_after_their_budget_while_others_succeed(
    spawn: Any,
) -> None:
    poison = [demo.poison.enqueue(note=f"p{i}").pk for i in range(2)]
    suicide = [demo.suicide.enqueue().pk for _ in range(2)]
    others = [demo.sleep.enqueue(seconds=0.01).pk for _ in range(40)]
    bad = poison + suicide

    spawn("run_scheduler", "--interval", "0.1", env=REAPER)
    # One job at a time per executor, so a killed executor takes no innocent job with it.
    running: list[subprocess.Popen[bytes]] = []
    deaths = 0

    def supervise() -> bool:
        """Restart dead executors (as a service manager would); done when all are settled."""
        nonlocal deaths
        for p in list(running):
            if p.poll() is not None:
                running.remove(p)
                deaths += 1
        while len(running) < EXECUTORS:
            running.append(spawn("run_executor", "--concurrency", "1"))
        settled = Job.objects.filter(pk__in=bad, state="failed").count() == len(bad)
        done = Job.objects.filter(pk__in=others, state="succeeded").count() == len(others)
        return settled and done

    wait_until(supervise, timeout=120, interval=0.2)

    # Every other job succeeded, the first time, while the poison was still being retried.
    assert Job.objects.filter(pk__in=others, state="succeeded", attempts=1).count() == len(others)
    last_other = max(Job.objects.filter(pk__in=others).values_list("finished_at", flat=True))
    last_bad = max(Job.objects.filter(pk__in=suicide).values_list("finished_at", flat=True))
    assert last_other < last_bad

    for pk in poison:
        j = Job.objects.get(pk=pk)
        assert (j.state, j.attempts) == ("failed", 3)
        assert j.reason.startswith("attempts exhausted (3): transient: poison job")
        attempts = list(Attempt.objects.filter(job=j).order_by("fence"))
        assert [(a.fence, a.number, a.kind) for a in attempts] == [
            (1, 1, "run"),
            (2, 2, "run"),
            (3, 3, "run"),
        ]
        assert [a.outcome for a in attempts] == ["retried", "retried", "failed"]
        for a in attempts:
            # The failure record: class, type, message, traceback, who ran it, when.
            assert a.error_class == "transient"
            assert a.error_type == "builtins.RuntimeError"
            assert f"poison job {pk} fails on attempt {a.number}" in a.message
            assert "RuntimeError" in a.traceback
            assert a.traceback.count("\n") > 2
            assert a.executor.count(":") >= 2
            assert a.claimed_at <= a.heartbeat_at <= a.finished_at

    for pk in suicide:
        j = Job.objects.get(pk=pk)
        assert (j.state, j.attempts) == ("failed", 3)
        assert j.reason.startswith("attempts exhausted (3): lease expired")
        attempts = list(Attempt.objects.filter(job=j).order_by("fence"))
        assert [a.outcome for a in attempts] == ["lease_expired"] * 3
        # Each attempt killed the executor that ran it: three different processes.
        assert len({a.executor for a in attempts}) == 3
        assert all(a.finished_at is not None for a in attempts)

    # Six attempts killed six executors; nothing else did.
    time.sleep(0.5)
    supervise()
    assert deaths == 6
