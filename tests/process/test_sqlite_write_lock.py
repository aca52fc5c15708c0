"""On SQLite, a ``transactional`` handler that would hold the database's one write lock for
twice another attempt's lease, in a real ``run_executor``: the other attempt's renewals stay
less than its lease apart and it ends ``succeeded`` in one attempt, while the long transaction
is rolled back at its bound, its attempt failing, visibly, with ``WriteLockHeldTooLong``.

Fails on the code before the bound: the lock was held for the handler's whole run, the other
attempt's renewal and effect intent waited behind it, and its lease ran out."""

from __future__ import annotations

import time
from typing import Any

import pytest

from demo.models import LedgerEntry
from scheduler_core.models import Attempt, Job
from scheduler_core.storage.drivers import driver
from tests.conftest import wait_until
from tests.process import jobs
from tests.process.test_executors import executor

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_long_transactional_handler_does_not_cost_another_attempt_its_lease(
    spawn: Any, vendor: str
) -> None:
    if vendor != "sqlite":
        pytest.skip("SQLite's one write lock: run with sqlite:///")
    lease = jobs.renewing.lease_seconds
    other = jobs.renewing.enqueue(seconds=10.0)
    executor(spawn)
    wait_until(lambda: Job.objects.get(pk=other.pk).state == "leased", timeout=30)
    held = jobs.tx_hold.enqueue(seconds=2.0 * lease)
    # How long ago the other attempt last renewed, by the database's clock, while it runs
    # (reads are not blocked by the writer in SQLite's write-ahead log).
    worst = 0.0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        row = Job.objects.values("state", "heartbeat_at").get(pk=other.pk)
        if row["state"] != "leased":
            break
        if row["heartbeat_at"] is not None:
            worst = max(worst, (driver().now() - row["heartbeat_at"]).total_seconds())
        time.sleep(0.05)
    assert Job.objects.get(pk=other.pk).state == "succeeded"
    assert list(Attempt.objects.filter(job_id=other.pk).values_list("fence", "outcome")) == [
        (1, "succeeded")
    ]
    assert worst < lease, f"the other attempt went {worst:.2f}s without a renewal"
    # The long transaction was rolled back at its bound while the other attempt ran: its
    # write is gone, and the attempt says why.
    first = wait_until(
        lambda: Attempt.objects.filter(job_id=held.pk, fence=1).exclude(outcome="").first(),
        timeout=30,
    )
    assert first.error_type.endswith("WriteLockHeldTooLong"), first.error_type
    assert first.outcome == "retried"
    assert not LedgerEntry.objects.filter(job_id=held.pk, fence=1).exists()
