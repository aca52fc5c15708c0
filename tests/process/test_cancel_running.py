"""A running job cancelled from the command line, in real processes: ``run_executor`` runs a
long cooperative job; ``manage.py jobs cancel`` records the request; the executor's heartbeat
thread learns it at its next renewal and the handler, checking ``ctx.check_cancelled()``, stops:
the job ends ``cancelled`` within about two heartbeats of the request, by the database's clock.

Fails on the code before running jobs could be cancelled (the command did not exist, and a
leased job refused every operator action)."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.models import Attempt, AuditEntry, Effect, Job
from tests.conftest import PYTHON, ROOT, wait_until
from tests.process import jobs_cancel

pytestmark = [pytest.mark.process, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ENV = {"TENURE_JOB_MODULES": "tests.process.jobs_cancel", "TENURE_POLL_INTERVAL": "0.05"}


def test_a_running_job_cancelled_from_the_cli_ends_cancelled_within_two_heartbeats(
    spawn: Any, child_env: dict[str, str], tmp_path: Path
) -> None:
    j = jobs_cancel.cooperative_long.enqueue(seconds=100.0)
    spawn("run_executor", "--concurrency", "2", env=ENV)
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased", timeout=60)
    first = Attempt.objects.get(job_id=j.pk)
    # Running for real: its heartbeat thread has renewed the lease at least once.
    wait_until(lambda: Job.objects.get(pk=j.pk).heartbeat_at > first.claimed_at, timeout=10)
    cli = subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), "jobs", "cancel", str(j.pk), "--reason", "stuck"],
        env={**child_env, **ENV},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert "cancel requested at" in cli.stdout
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "cancelled", timeout=30)
    row = Job.objects.get(pk=j.pk)
    attempt = Attempt.objects.get(job_id=j.pk)
    assert attempt.outcome == "cancelled"
    assert row.reason.startswith("cancelled by operator while running: the handler stopped")
    # A renewal every lease_seconds / 3 (0.67 s): learnt at the next one, ended at once.
    heartbeat = dt.timedelta(seconds=row.lease_seconds / 3)
    assert row.cancel_requested_at is not None and attempt.finished_at is not None
    took = attempt.finished_at - row.cancel_requested_at
    assert dt.timedelta(0) < took <= 2 * heartbeat + dt.timedelta(seconds=0.3), took
    # The effect applied before the request stays applied; the audit names the OS user.
    assert Effect.objects.get(job_id=j.pk).state == Effect.APPLIED
    assert AuditEntry.objects.get(job_id=j.pk).actor.startswith("cli:")
