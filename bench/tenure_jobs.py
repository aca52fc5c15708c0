"""Tenure job types for the benchmarks (loaded through ``TENURE_JOB_MODULES``)."""

from __future__ import annotations

import time
from typing import Any

from scheduler_core import job

from . import ping


@job(name="bench.noop", lease_seconds=30, max_attempts=3)
def noop(ctx: Any, *, seq: int = -1) -> None:
    """Nothing, except reporting its start when the latency workload asks for it."""
    if seq >= 0:
        ping.started(seq)


@job(name="bench.noop_async", lease_seconds=30, max_attempts=3)
async def noop_async(ctx: Any, *, seq: int = -1) -> None:
    """:func:`noop` as an ``async def`` handler: what awaiting a coroutine costs a job."""
    if seq >= 0:
        ping.started(seq)


@job(name="bench.hold", lease_seconds=10, max_attempts=5)
def hold(ctx: Any, *, seconds: float = 60.0) -> None:
    """Hold the lease for ``seconds``: the recovery workload kills the executor meanwhile."""
    time.sleep(seconds)
