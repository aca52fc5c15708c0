"""Each health category comes from a real situation, in ``jobs_status --json`` and ``/metrics``."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from demo import jobs as demo
from scheduler_core import job
from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Job
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver
from tests.conftest import wait_until
from tests.process import jobs as proc_jobs

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

# Read-side settings for the status and metrics processes: a job due for a second is stuck.
METRICS_TOKEN = "health-test-scraper"
READ_ENV = {
    "TENURE_STUCK_AFTER_SECONDS": "1",
    "TENURE_FAILING_REPEATEDLY_ATTEMPTS": "3",
    "TENURE_METRICS_TOKEN": METRICS_TOKEN,
}


@job(name="tests.health.unserved", queue="unserved", max_attempts=1)
def unserved(ctx: Any) -> None:
    """A job on a queue no executor serves."""


def _state(pk: int) -> str:
    return Job.objects.get(pk=pk).state


def _status(spawn: Any, tmp_path: Path) -> dict[str, Any]:
    p = spawn("jobs_status", "--json", env=READ_ENV, log="status.log")
    assert p.wait(timeout=60) == 0
    text = (tmp_path / "status.log").read_text()
    return json.loads(text[text.index("{") :])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(spawn: Any) -> str:
    port = _free_port()
    spawn("runserver", f"127.0.0.1:{port}", "--noreload", env=READ_ENV, log="web.log")
    url = f"http://127.0.0.1:{port}/metrics"

    def get() -> str | None:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                assert r.headers["Content-Type"].startswith("text/plain")
                return str(r.read().decode())
        except OSError:
            return None

    return str(wait_until(get, timeout=60, interval=0.2))


def _sample(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, f"{name}{labels} not exposed"
    return float(m.group(1))


def test_every_health_category_from_a_real_situation_in_status_and_metrics(
    spawn: Any, tmp_path: Path
) -> None:
    # A stale write and a reaped lease, through the write seam.
    driver().executor_started("h:1:gone", transport="polling", queues=["x"], concurrency=1)
    leased = demo.noop.enqueue()
    [lease] = driver().claim(executor="h:1:gone", queues=["default"], job_id=leased.pk)
    Job.objects.filter(pk=leased.pk).update(
        lease_expires_at=driver().now() - dt.timedelta(seconds=1)
    )
    reaper.reap_once()
    with pytest.raises(StaleAttempt) as refused:
        driver().complete(lease)
    driver().record_stale(refused.value, "h:1:gone")
    # Cancelled, so the categories below are exact.
    operator.operator_action(
        leased.pk,
        action="cancel",
        expected_version=Job.objects.get(pk=leased.pk).version,
        actor="test",
        reason="not needed",
    )
    driver().executor_stopped("h:1:gone")

    scheduled = demo.noop.enqueue(run_at=driver().now() + dt.timedelta(hours=1))
    stuck = unserved.enqueue()  # due, and no executor serves its queue
    failing = demo.failing.enqueue(quick=3, pause=600)
    poison = demo.poison.enqueue()
    parked = demo.lost_reply.enqueue()

    # A failing job, a poison job and a lost reply, run by a real executor.
    c = spawn("run_executor", "--concurrency", "3")
    wait_until(
        lambda: (
            _state(poison.pk) == "failed"
            and _state(parked.pk) == "indeterminate"
            and Job.objects.filter(pk=failing.pk, state="waiting", attempts=3).exists()
        ),
        timeout=60,
    )
    c.send_signal(signal.SIGTERM)
    assert c.wait(timeout=30) == 0

    # One executor runs a long job with a live heartbeat; another is killed in the middle.
    running = demo.sleep.enqueue(seconds=120)
    a = spawn("run_executor", "--concurrency", "1")
    wait_until(lambda: _state(running.pk) == "leased", timeout=60)
    abandoned = demo.sleep.enqueue(seconds=120)
    b = spawn("run_executor", "--concurrency", "1")
    wait_until(lambda: _state(abandoned.pk) == "leased", timeout=60)
    b.send_signal(signal.SIGKILL)
    b.wait(timeout=10)
    # A third runs a job far past its one-second maximum runtime: overrunning, not running.
    overrun = proc_jobs.overrun.enqueue()
    spawn("run_executor", "--concurrency", "1", env={"TENURE_JOB_MODULES": "tests.process.jobs"})
    wait_until(lambda: _state(overrun.pk) == "leased", timeout=60)
    wait_until(
        lambda: Job.objects.filter(pk=overrun.pk, deadline_at__lt=driver().now()).exists(),
        timeout=10,
    )
    # No scheduler runs, so nothing reaps it: its heartbeat goes stale, then its lease expires.
    wait_until(
        lambda: Job.objects.filter(pk=abandoned.pk, lease_expires_at__lt=driver().now()).exists(),
        timeout=60,
    )

    health = _status(spawn, tmp_path)["health"]
    assert health == {
        "waiting_due": 1,  # the unserved job
        "waiting_scheduled": 1,
        "waiting_backing_off": 1,  # the failing job, waiting 600 s after its third failure
        "stuck": 1,
        "paused": 0,  # no queue is paused
        "concurrency_limited": 0,  # nor limited
        "rate_limited": 0,
        "running": 1,
        "overrunning": 1,
        "abandoned": 1,
        "failing_repeatedly": 1,
        "indeterminate": 1,
        "failed": 1,
    }, health
    assert Job.objects.get(pk=running.pk).state == "leased"
    assert a.poll() is None
    assert scheduled.pk and stuck.pk

    text = _scrape(spawn)
    for category, n in health.items():
        assert _sample(text, "tenure_jobs_health", f'{{category="{category}"}}') == n
    assert _sample(text, "tenure_jobs", '{state="leased"}') == 3
    assert _sample(text, "tenure_db_up") == 1
    assert _sample(text, "tenure_db_stale_writes_refused_total", '{write="complete"}') == 1
    assert _sample(text, "tenure_db_leases_reaped_total") == 1
    assert _sample(text, "tenure_executors_alive") >= 1
    # Attempt durations and claim latencies of the last hour, from every executor's records.
    assert _sample(text, "tenure_db_attempt_duration_seconds_gcount") >= 6
    assert _sample(text, "tenure_db_claim_latency_seconds_gcount") >= 4
    assert _sample(text, "tenure_db_claim_latency_seconds_bucket", '{le="+Inf"}') >= 4
