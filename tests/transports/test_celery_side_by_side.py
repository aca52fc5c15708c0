"""One Celery worker runs a project's own Celery tasks and Tenure's jobs side by side, so a
project moves from Celery one task at a time (docs/celery.md, "Moving over")."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import current_app

from scheduler_core.models import Attempt, Executor, Job
from tests.conftest import wait_until
from tests.transports import jobs
from tests.transports.conftest import BROKER_QUEUE, CELERY, PREFIX, RUN, Harness

pytestmark = [pytest.mark.process, pytest.mark.broker]


class TestSideBySide:
    spec_id = "celery-filesystem"

    def test_one_celery_worker_runs_the_projects_own_tasks_and_tenures_jobs(
        self, transport: Harness, tmp_path: Path
    ) -> None:
        legacy = f"{PREFIX}legacy"
        worker = transport._start(
            [
                CELERY,
                "-A",
                "tests.transports.celery_app_with_tasks",
                "worker",
                "-Q",
                f"{legacy},{BROKER_QUEUE}",
                "--pool",
                "prefork",
                "-c",
                "2",
                "-n",
                f"side-{RUN}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            "worker",
        )
        transport._wait_registered(worker)
        out = tmp_path / "sum.txt"
        current_app.send_task("tests.legacy.write_sum", args=(2, 3, str(out)), queue=legacy)
        tenure_job = jobs.noop.enqueue(n=1)
        wait_until(lambda: out.exists() and out.read_text() == "5", timeout=60)
        wait_until(lambda: Job.objects.get(pk=tenure_job.pk).state == "succeeded", timeout=60)
        # Tenure's attempt ran in that worker's pool, registered as a Celery executor.
        [attempt] = Attempt.objects.filter(job_id=tenure_job.pk)
        assert Executor.objects.filter(transport="celery", pk=attempt.executor).exists()
        assert worker.poll() is None
