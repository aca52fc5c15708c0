"""Job types for the transport contract; child processes import them via TENURE_JOB_MODULES."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgiref.sync import sync_to_async

from scheduler_core import job

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@job(name="tests.transports.noop", lease_seconds=30, max_attempts=3)
def noop(ctx: Any, *, n: int = 0) -> None:
    """Nothing: for drains and duplicate deliveries."""


@job(name="tests.transports.hold_first", lease_seconds=2, max_attempts=5, backoff_base=0.1)
def hold_first(ctx: Any, *, seconds: float = 30.0) -> None:
    """Hold the first attempt (so a kill lands mid-job); later attempts return at once.

    A two-second lease renewed by heartbeats: a live owner keeps it, a dead one loses it fast.
    """
    if ctx.attempt == 1:
        time.sleep(seconds)


@job(name="tests.transports.nap", lease_seconds=60, max_attempts=3)
def nap(ctx: Any, *, seconds: float = 2.0) -> None:
    """Sleep under a long lease, so a shutdown that waited for lease expiry would show."""
    time.sleep(seconds)


@task()
def multiply(a: int, b: int, *, plus: int = 0) -> dict[str, int]:
    """A django.tasks task (TenureBackend): positional and keyword arguments, a return value."""
    return {"product": a * b + plus}


async def _mark(ctx: Any, account: str) -> None:
    from demo.models import LedgerEntry

    await LedgerEntry.objects.acreate(
        account=account, cents=1, effect_key=account, job_id=ctx.job_id, fence=ctx.fence
    )


@job(name="tests.transports.async_write", effect="transactional", lease_seconds=30)
async def async_write(ctx: Any, *, n: int = 0) -> None:
    """An async handler whose row (Django's async ORM) commits with its completion."""
    await asyncio.sleep(0.01)
    await _mark(ctx, f"async-{n}")


@job(name="tests.transports.async_overrun", lease_seconds=30, timeout=1.0, max_attempts=1)
async def async_overrun(ctx: Any) -> None:
    """Sleeps past its one-second maximum runtime: cancelled there; its ``finally`` records it."""
    try:
        await asyncio.sleep(60)
        await _mark(ctx, "woke-up")
    finally:
        await _mark(ctx, "finally")


@task()
async def async_multiply(a: int, b: int) -> dict[str, Any]:
    """An async django.tasks task."""
    await sync_to_async(time.sleep)(0.01)
    return {"product": a * b}


@job(name="tests.transports.step", lease_seconds=30, max_attempts=3)
def step(ctx: Any, *, label: str) -> dict[str, Any]:
    """A workflow step: returns its label and the names of the parents whose results it saw."""
    return {"label": label, "parents": sorted(ctx.parent_results)}
