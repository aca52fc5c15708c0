"""Claim floors (scheduler_core/storage/floors.py): a wake-up binds every claim sent before it,
whether or not it lowered the floor and whatever claims return before them. Each test fails on
the code before (a wake-up pinned only when it lowered the floor, and only until the next
claim sent after it returned), where the job it announced was left below the floor until the
next full read: workflow steps made due by their parents' completions waited seconds there."""

from __future__ import annotations

import datetime as dt
import time

from scheduler_core.domain.options import JobOptions
from scheduler_core.storage.floors import ClaimFloors
from scheduler_core.storage.records import Lease

Q = "q"
T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _lease(due: float) -> Lease:
    return Lease(
        job_id=1,
        fence=1,
        attempt=1,
        attempt_id=1,
        kind="run",
        created_at=T0,
        executor="e",
        options=JobOptions(
            name="x",
            queue=Q,
            payload={},
            lease_seconds=30,
            effect="at_least_once",
            max_attempts=1,
            run_at=_at(due),
            timeout_seconds=0.0,
        ),
    )


def _floors_at(due: float) -> ClaimFloors:
    """Floors of queue ``Q`` at ``due``, after a full read."""
    f = ClaimFloors()
    f.learn([Q], [_lease(due + 0.1)], limit=8, full=True, now=time.monotonic())
    return f


def _floor(f: ClaimFloors) -> dt.datetime:
    seeks = {(q, p): at for q, p, at in f.seeks([Q], now=time.monotonic())}
    return seeks[(Q, 0)]


def test_a_wake_up_above_the_floor_binds_a_claim_sent_before_it() -> None:
    f = _floors_at(10.0)
    sent = time.monotonic()
    f.woken(Q, 0, _at(10.5))  # above the floor: it lowers nothing
    # The claim could not see that job; it took only jobs due later.
    f.learn([Q], [_lease(12.0)], limit=8, full=False, now=sent)
    assert _floor(f) <= _at(10.5)


def test_a_claim_returning_late_keeps_a_wake_up_another_claim_passed() -> None:
    f = _floors_at(10.0)
    slow = time.monotonic()  # sent first, returns last (its transaction waited on a lock)
    time.sleep(0.001)
    f.woken(Q, 0, _at(9.0))  # lowers the floor to its job
    fast = time.monotonic()
    f.learn([Q], [_lease(8.5)], limit=8, full=False, now=fast)  # saw the job, took others
    f.learn([Q], [_lease(12.0)], limit=8, full=False, now=slow)
    assert _floor(f) <= _at(9.0)


def test_a_claim_sent_after_a_wake_up_raises_the_floor_past_it() -> None:
    f = _floors_at(10.0)
    f.woken(Q, 0, _at(10.5))
    time.sleep(0.001)
    f.learn([Q], [_lease(12.0)], limit=8, full=False, now=time.monotonic())
    assert _floor(f) > _at(11.0)


def test_a_full_read_that_takes_a_job_below_the_floor_brings_the_floor_down_to_it() -> None:
    """A job left below the floor (skipped while another claim held it, then given back) is
    found by the next full read; the floors then seek from it, so the jobs left beside it are
    not each left to a full read of their own."""
    f = _floors_at(10.0)
    f.learn([Q], [_lease(20.0)], limit=8, full=False, now=time.monotonic())
    assert _floor(f) > _at(19.0)
    f.learn([Q], [_lease(12.0)], limit=8, full=True, now=time.monotonic())
    assert _floor(f) <= _at(12.0)
