"""The demo is worth operating: its seed and one minute of its traffic, run by a real executor,
leave jobs in every state an operator acts on (succeeded, backed off then succeeded, failed,
indeterminate), a report on the pausable queue, invoices with an ``invoice_id``, a database
schedule and a code schedule when the demo's traffic is on."""

from __future__ import annotations

import os
import subprocess
import time
from types import SimpleNamespace
from typing import Any

import pytest

from demo import jobs as demo
from demo import seed
from scheduler_core.models import Attempt, Job, JobSpec, Schedule
from scheduler_core.runtime import worker
from tests.conftest import PYTHON, ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_seed_enqueues_every_kind_and_the_database_schedule_once() -> None:
    seed.seed()
    seed.seed()
    assert Job.objects.filter(name="demo.invoice", spec__payload__invoice_id=1005).count() == 1
    names = set(Job.objects.values_list("name", flat=True))
    assert {"demo.invoice", "demo.report", "demo.poison", "demo.lost_reply", "demo.long"} <= names
    assert Job.objects.get(name="demo.report").queue == demo.PAUSABLE_QUEUE
    row = Schedule.objects.get(name=seed.SCHEDULE_NAME)
    assert (row.cron, row.source, row.job_name) == ("* * * * *", "database", "demo.report")


def test_a_minute_of_traffic_leaves_every_state_to_act_on() -> None:
    demo.traffic(SimpleNamespace(job_id=30))  # type: ignore[arg-type]
    by_name: dict[str, list[Job]] = {}
    for j in Job.objects.all():
        by_name.setdefault(j.name, []).append(j)
    assert len(by_name["demo.invoice"]) == 6
    assert {"demo.flaky", "demo.report", "demo.poison", "demo.lost_reply", "demo.long"} <= set(
        by_name
    )
    # The long job runs minutes in the demo; a second here, its lease renewed meanwhile.
    JobSpec.objects.filter(job__name="demo.long").update(payload={"seconds": 1.0})

    queues = ["default", demo.BILLING_QUEUE, demo.PAUSABLE_QUEUE]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        worker.Worker(queues=queues, concurrency=4, burst=True, poll_interval=0.05).run()
        if not Job.objects.filter(state__in=["waiting", "leased"]).exists():
            break
        time.sleep(0.2)
    states = {n: {j.state for j in Job.objects.filter(name=n)} for n in by_name}
    assert states["demo.invoice"] == {"succeeded"}
    assert states["demo.flaky"] == {"succeeded"}
    assert states["demo.poison"] == {"failed"}
    assert states["demo.lost_reply"] == {"indeterminate"}
    assert states["demo.long"] == {"succeeded"}
    assert states["demo.report"] == {"succeeded"}
    flaky = Job.objects.get(name="demo.flaky")
    assert list(
        Attempt.objects.filter(job=flaky).order_by("number").values_list("outcome", flat=True)
    ) == ["retried", "retried", "succeeded"]


def test_the_traffic_batches_cover_every_kind_at_a_gentle_rate() -> None:
    minutes = [demo.traffic_batch(n) for n in range(30)]
    assert max(len(b) for b in minutes) <= 12
    kinds = {name for b in minutes for name, _ in b}
    assert kinds == {
        "demo.invoice",
        "demo.flaky",
        "demo.report",
        "demo.poison",
        "demo.lost_reply",
        "demo.long",
    }
    longs = [p["seconds"] for b in minutes for n, p in b if n == "demo.long"]
    assert all(120 <= float(s) <= 300 for s in longs)  # type: ignore[arg-type]


def test_the_code_schedule_is_declared_only_with_the_demo_traffic_on() -> None:
    from scheduler_core.api import registry

    jt: Any = registry.get("demo.traffic")
    assert (jt.schedule is not None) == demo.TRAFFIC
    # As make demo starts its processes: every minute.
    env = dict(os.environ, TENURE_DEMO_TRAFFIC="1", DJANGO_SETTINGS_MODULE="config.settings")
    out = subprocess.run(
        [
            PYTHON,
            str(ROOT / "manage.py"),
            "shell",
            "-c",
            "from scheduler_core.api import registry;"
            "print(registry.get('demo.traffic').schedule.interval_seconds)",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip().splitlines()[-1] == "60", out.stderr
