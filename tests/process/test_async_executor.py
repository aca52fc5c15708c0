"""``async def`` handlers in real ``run_executor`` processes: plain and async jobs drained by
several executors, each completed once with its body run once; and SIGTERM, which gives an
async attempt still running after the grace back and cancels its coroutine (its ``finally``
runs before the process ends).

Both fail on the code before async handlers were awaited: the jobs "succeeded" with no body
run, and the executor's shutdown never reached the coroutine."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.db.models import Count

from demo.models import LedgerEntry
from scheduler_core.models import Attempt, Job
from tests.conftest import wait_until
from tests.process import jobs
from tests.process.test_executors import executor

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_executors_drain_plain_and_async_jobs_each_completed_once_each_body_once(
    spawn: Any,
) -> None:
    n = 150
    coroutines = [jobs.async_write.enqueue(n=i).pk for i in range(n)]
    plain = [jobs.noop.enqueue(n=i).pk for i in range(n)]
    procs = [executor(spawn, "--burst") for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=240) == 0
    ids = coroutines + plain
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == 2 * n
    per_job = Attempt.objects.filter(job_id__in=ids).values("job_id").annotate(c=Count("id"))
    assert {row["c"] for row in per_job} == {1}
    rows = LedgerEntry.objects.filter(job_id__in=coroutines)
    assert rows.count() == n
    assert sorted(rows.values_list("account", flat=True)) == sorted(f"async-{i}" for i in range(n))


def test_sigterm_gives_a_long_async_job_back_and_cancels_its_coroutine(spawn: Any) -> None:
    j = jobs.async_nap.enqueue(seconds=60)
    a = executor(spawn, "--grace", "0.5")
    wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased")
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=10) == 0
    job = Job.objects.get(pk=j.pk)
    assert (job.state, job.attempts, job.lease_owner) == ("waiting", 0, "")
    assert Attempt.objects.get(job_id=j.pk, fence=1).outcome == "released"
    marks = list(LedgerEntry.objects.filter(job_id=j.pk).values_list("account", flat=True))
    assert marks == ["finally"]
