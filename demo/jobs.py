"""Demo jobs, discovered at start-up like any app's ``jobs.py``."""

from __future__ import annotations

import time

from scheduler_core import Transient, job


@job(name="demo.noop", effect="at_least_once", max_attempts=3, lease_seconds=30)
def noop(ctx: object) -> None:
    """Do nothing: the cheapest job, for drains and benchmarks."""


@job(name="demo.sleep", effect="at_least_once", max_attempts=3, lease_seconds=5)
def sleep(ctx: object, *, seconds: float = 1.0) -> None:
    """Sleep, for lease and signal tests."""
    time.sleep(seconds)


@job(
    name="demo.flaky",
    effect="at_least_once",
    max_attempts=4,
    lease_seconds=10,
    backoff_base=0.2,
    backoff_cap=2.0,
)
def flaky(ctx: object, *, fail_times: int = 2) -> None:
    """Fail transiently ``fail_times`` times, then succeed."""
    attempt = getattr(ctx, "attempt", 1)
    if attempt <= fail_times:
        raise Transient(f"attempt {attempt} of {fail_times} planned failures")
