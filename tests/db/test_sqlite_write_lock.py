"""On SQLite a ``transactional`` handler holds the database's one write lock for as long as its
transaction lasts, so that transaction is bounded (``scheduler_core/storage/sqlite_hold.py``):
past ``(0.8 - TENURE_HEARTBEAT_FRACTION)`` of the shortest lease of the attempts running when
it began, it is rolled back from outside, every statement the handler makes afterwards is
refused (none runs outside the transaction), the lock is free for the others' renewals, and
the attempt fails with ``WriteLockHeldTooLong``, transient.

Each test fails on the code before the bound: the lock was held until the handler returned,
and another attempt's renewal waited for it however long that was."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections

from demo.models import LedgerEntry
from scheduler_core import job
from scheduler_core.models import Attempt, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease
from scheduler_core.storage.sqlite_hold import bound_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "sqlite", reason="SQLite's one write lock: run with sqlite:///"
    ),
]

Q = "sqlite-lock"
began = threading.Event()
after: list[str] = []


@job(name="tests.sqlite_lock.short", queue=Q, lease_seconds=2)
def short(ctx: Any) -> None:
    """Another attempt, running meanwhile under a two-second lease."""


@job(name="tests.sqlite_lock.hold", queue=Q, effect="transactional", lease_seconds=30)
def hold(ctx: Any, *, seconds: float) -> None:
    LedgerEntry.objects.create(
        account="before", cents=1, effect_key="k", job_id=ctx.job_id, fence=1
    )
    began.set()
    time.sleep(seconds)
    try:
        LedgerEntry.objects.create(
            account="after", cents=1, effect_key="k", job_id=ctx.job_id, fence=1
        )
        after.append("written")
    except DatabaseError as e:  # the handler's author swallows it, and returns
        after.append(f"refused: {e}")


def _claim(job_id: int) -> Lease:
    [lease] = driver().claim(executor="t:1:lock", queues=[Q], job_id=job_id)
    return lease


def test_a_transactional_handler_holds_the_write_lock_no_longer_than_its_bound() -> None:
    began.clear()
    after.clear()
    other = _claim(short.enqueue().pk)  # leased, lease 2 s: the bound is 0.93 s
    held = hold.enqueue(seconds=4.0)
    lease = _claim(held.pk)
    out: list[str] = []

    def attempt() -> None:
        try:
            out.append(run_lease(lease))
        finally:
            connections.close_all()

    t = threading.Thread(target=attempt)
    t.start()
    assert began.wait(10)
    sent = time.monotonic()
    driver().heartbeat(other)  # waits for the lock
    waited = time.monotonic() - sent
    assert waited < bound_for(2) + 0.8, waited  # not the handler's 4 s
    t.join(20)
    assert out == ["retried"]
    # Nothing of the transaction is kept, and the statement the handler made after the lock
    # was taken back was refused, not run on its own outside the transaction.
    assert not LedgerEntry.objects.filter(job_id=held.pk).exists()
    assert len(after) == 1 and after[0].startswith("refused")
    a = Attempt.objects.get(job_id=held.pk)
    assert a.error_type.endswith("WriteLockHeldTooLong")
    assert (a.error_class, Job.objects.get(pk=held.pk).state) == ("transient", "waiting")
    assert "shortest lease" in a.message
    # The connection the handler ran on was usable again for the attempt's own end.


@job(name="tests.sqlite_lock.alone", queue=Q, effect="transactional", lease_seconds=2)
def alone(ctx: Any, *, seconds: float) -> None:
    LedgerEntry.objects.create(account="alone", cents=1, effect_key="k", job_id=ctx.job_id, fence=1)
    time.sleep(seconds)


def test_a_transactional_handler_with_no_other_attempt_running_is_not_bounded() -> None:
    # Longer than its own lease's bound: nothing else could be starved of a renewal.
    held = alone.enqueue(seconds=bound_for(2) + 0.5)
    assert run_lease(_claim(held.pk)) == "succeeded"
    assert LedgerEntry.objects.filter(job_id=held.pk).count() == 1


def test_a_short_transactional_handler_commits_as_before() -> None:
    began.clear()
    after.clear()
    _claim(short.enqueue().pk)
    held = hold.enqueue(seconds=0.0)
    assert run_lease(_claim(held.pk)) == "succeeded"
    assert sorted(LedgerEntry.objects.filter(job_id=held.pk).values_list("account", flat=True)) == [
        "after",
        "before",
    ]
