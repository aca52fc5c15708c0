"""Real executor processes and real signals against the claim protocol."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count

from scheduler_core.models import Attempt, Job, StaleWrite
from tests.conftest import wait_until
from tests.process import jobs

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

JOBS_ENV = {"TENURE_JOB_MODULES": "tests.process.jobs", "TENURE_POLL_INTERVAL": "0.05"}
FAST_REAPER = {**JOBS_ENV, "TENURE_REAP_GRACE_SECONDS": "0", "TENURE_SWEEP_INTERVAL": "0.1"}


def executor(spawn: Any, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return spawn("run_executor", "--concurrency", "4", *extra, env={**JOBS_ENV, **(env or {})})


def test_four_executors_drain_2000_jobs_each_completed_once(spawn: Any) -> None:
    n = int(os.environ.get("TENURE_DRAIN_JOBS", "2000"))
    ids = [jobs.noop.enqueue(n=i).pk for i in range(n)]
    procs = [executor(spawn, "--burst") for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=240) == 0
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == n
    completions = (
        Attempt.objects.filter(job_id__in=ids, outcome="succeeded")
        .values("job_id")
        .annotate(c=Count("id"))
    )
    assert {row["c"] for row in completions} == {1}
    assert len(completions) == n
    # Every job was claimed once: no job ever held two fences.
    assert set(Job.objects.filter(pk__in=ids).values_list("fence", flat=True)) == {1}
    # More than one executor took part.
    assert Attempt.objects.filter(job_id__in=ids).values("executor").distinct().count() >= 2


def test_sigkilled_executor_job_is_claimed_again_within_one_and_a_half_leases(spawn: Any) -> None:
    j = jobs.hold_first_4s.enqueue(seconds=30)
    a = executor(spawn)
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased")
    # The replacement and the reaper are up before the kill, so start-up time is not measured.
    spawn("run_scheduler", "--interval", "0.1", env=FAST_REAPER)
    executor(spawn)
    first = Attempt.objects.get(job_id=j.pk, fence=1)
    wait_until(lambda: Job.objects.get(pk=j.pk).heartbeat_at > first.claimed_at, timeout=10)
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "succeeded", timeout=30)
    first.refresh_from_db()
    second = Attempt.objects.get(job_id=j.pk, fence=2)
    assert first.outcome == "lease_expired"
    assert second.outcome == "succeeded"
    # Bound by the database's clock: the last renewal of the dead owner to the new claim.
    lease = jobs.hold_first_4s.lease_seconds
    gap = (second.claimed_at - first.heartbeat_at).total_seconds()
    assert gap <= 1.5 * lease, f"reclaimed {gap:.2f}s after the last heartbeat"


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _sqlite_writable() -> bool:
    """Whether a write transaction can begin on the test database within 0.5 s."""
    try:
        with sqlite3.connect(connection.settings_dict["NAME"], timeout=0.5) as raw:
            raw.execute("BEGIN IMMEDIATE")
            raw.rollback()
        return True
    except sqlite3.OperationalError:
        return False


def stop_outside_a_write(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc``; on SQLite, at a moment it holds no write transaction.

    SQLite has one write lock for the whole database, and an idle executor takes it for each
    claim (every 50 ms here): a process stopped inside one holds it while stopped, and every
    other process's write waits — the reaper's too — which no setting of Tenure's can undo
    (PostgreSQL ends such a transaction after ``idle_in_transaction_session_timeout``). So on
    SQLite the stop is taken back and tried again until the database can still be written."""
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: _stopped(proc.pid), timeout=5, interval=0.005)
        if connection.vendor != "sqlite" or _sqlite_writable():
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.013)
    raise AssertionError("the executor held SQLite's write lock at every stop")


def test_sigstopped_owner_resumes_after_replacement_and_every_write_is_refused(
    spawn: Any,
) -> None:
    j = jobs.hold_first.enqueue(seconds=3)
    a = executor(spawn)
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased")
    spawn("run_scheduler", "--interval", "0.1", env=FAST_REAPER)
    executor(spawn)
    time.sleep(0.3)
    stop_outside_a_write(a)
    try:
        wait_until(lambda: Job.objects.get(pk=j.pk).state == "succeeded", timeout=30)
    finally:
        a.send_signal(signal.SIGCONT)
    # The resumed owner wakes inside its sleep, then tries its heartbeat, its effect intent
    # and (never reached) its completion: each write it attempts is refused and recorded.
    wait_until(lambda: StaleWrite.objects.filter(job_id=j.pk, fence=1).exists(), timeout=20)
    time.sleep(4)
    refused = set(StaleWrite.objects.filter(job_id=j.pk, fence=1).values_list("write", flat=True))
    assert {"heartbeat", "effect_intent"} <= refused
    final = Job.objects.get(pk=j.pk)
    assert (final.state, final.fence) == ("succeeded", 2)
    winner = Attempt.objects.get(job_id=j.pk, fence=2)
    assert winner.outcome == "succeeded"
    # The stale attempt's effect never began; the ledger row is the replacement's.
    effect = final.effect_set.get()
    assert (effect.state, effect.fence, effect.intents) == ("applied", 2, 1)
    assert Attempt.objects.get(job_id=j.pk, fence=1).outcome == "lease_expired"


def test_sigterm_lets_a_short_job_finish_within_the_grace(spawn: Any) -> None:
    j = jobs.sleep.enqueue(seconds=1.0)
    a = executor(spawn, "--grace", "10")
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased")
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=15) == 0
    assert Job.objects.get(pk=j.pk).state == "succeeded"


def test_sigterm_releases_a_long_job_without_waiting_for_its_lease(spawn: Any) -> None:
    j = jobs.sleep.enqueue(seconds=60)
    a = executor(spawn, "--grace", "0.5")
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased")
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=10) == 0
    job = Job.objects.get(pk=j.pk)
    assert (job.state, job.attempts, job.lease_owner) == ("waiting", 0, "")
    assert Attempt.objects.get(job_id=j.pk, fence=1).outcome == "released"


def test_a_hung_handler_without_a_declared_timeout_is_ended_at_the_default_maximum_runtime(
    spawn: Any, settings: Any
) -> None:
    """Fault 42 (docs/faults.md): the heartbeat thread lives, the handler does not progress, and the job type
    declares no timeout. The project's default (2 s here) ends the attempt: it shows as
    overrunning, never running forever; the reaper rescues the job; the hung thread's late
    effect is refused by the fence."""
    from scheduler_core.read import health

    settings.TENURE_DEFAULT_TIMEOUT_SECONDS = 2.0
    j = jobs.hang_first.enqueue(seconds=8.0)
    assert j.timeout_seconds == 2.0
    executor(spawn, env={"TENURE_REAP_GRACE_SECONDS": "0.5"})
    spawn(
        "run_scheduler",
        "--interval",
        "0.1",
        env={**FAST_REAPER, "TENURE_REAP_GRACE_SECONDS": "0.5"},
    )
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased", timeout=30)
    wait_until(lambda: health.health_counts()["overrunning"] == 1, timeout=10, interval=0.05)
    assert health.health_counts()["running"] == 0
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "succeeded", timeout=30)
    first = Attempt.objects.get(job_id=j.pk, fence=1)
    assert first.outcome == "lease_expired"
    assert Job.objects.get(pk=j.pk).fence == 2
    # The hung first attempt wakes at 8 s and tries its effect: refused, nothing recorded.
    wait_until(
        lambda: StaleWrite.objects.filter(job_id=j.pk, fence=1, write="effect_intent").exists(),
        timeout=20,
    )
    from scheduler_core.models import Effect

    assert list(Effect.objects.filter(job_id=j.pk).values_list("fence", "state")) == [
        (2, "applied")
    ]
