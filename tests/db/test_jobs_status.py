"""``manage.py jobs_status --json`` reports counts, executors and refused stale writes."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Job
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver
from tests.process import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _status() -> dict[str, Any]:
    out = io.StringIO()
    call_command("jobs_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_status_counts_states_executors_and_stale_writes() -> None:
    for _ in range(3):
        jobs.noop.enqueue()
    driver().executor_started("h:1:x", transport="polling", queues=["default"], concurrency=2)
    [lease] = driver().claim(executor="h:1:x", limit=1)
    Job.objects.filter(pk=lease.job_id).update(
        lease_expires_at=driver().now() - dt.timedelta(seconds=1)
    )
    reaper.reap_once()
    with pytest.raises(StaleAttempt) as refused:
        driver().complete(lease)
    driver().record_stale(refused.value, "h:1:x")

    status = _status()
    assert status["states"]["waiting"] == 3
    assert set(status["states"]) == {
        "waiting",
        "leased",
        "succeeded",
        "failed",
        "indeterminate",
        "cancelled",
    }
    assert status["executors"]["alive"] == 1
    assert status["executors"]["list"][0]["id"] == "h:1:x"
    assert status["stale_writes_refused"] == {"total": 1, "by_write": {"complete": 1}}
    assert "health" in status


def test_stopped_executors_are_not_counted_alive() -> None:
    driver().executor_started("h:2:y", transport="polling", queues=["default"], concurrency=1)
    driver().executor_stopped("h:2:y")
    assert _status()["executors"]["alive"] == 0
