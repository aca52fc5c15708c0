"""Job types for the process tests; child processes import them via TENURE_JOB_MODULES."""

from __future__ import annotations

import time
from typing import Any

from scheduler_core import job


@job(name="tests.proc.noop", lease_seconds=30, max_attempts=3)
def noop(ctx: Any, *, n: int = 0) -> None:
    """Nothing: for drains."""


@job(name="tests.proc.hold_first", lease_seconds=2, max_attempts=5)
def hold_first(ctx: Any, *, seconds: float = 30.0) -> None:
    """Hold the first attempt for ``seconds`` then record an effect; later attempts are quick.

    The effect is a fenced ledger write, so a paused first attempt that resumes after losing
    its lease is refused before it can start it.
    """
    if ctx.attempt == 1:
        time.sleep(seconds)
    with ctx.effect("mark"):
        pass


@job(name="tests.proc.hold_first_4s", lease_seconds=4, max_attempts=5)
def hold_first_4s(ctx: Any, *, seconds: float = 30.0) -> None:
    """:func:`hold_first` with a 4 s lease: a bound of 1.5 leases leaves the reaper's round and
    the next claim 2 s, enough for processes that a loaded machine schedules late."""
    if ctx.attempt == 1:
        time.sleep(seconds)
    with ctx.effect("mark"):
        pass


@job(name="tests.proc.sleep", lease_seconds=2, max_attempts=5)
def sleep(ctx: Any, *, seconds: float = 1.0) -> None:
    """Sleep on every attempt."""
    time.sleep(seconds)


@job(name="tests.proc.hang_first", lease_seconds=2, max_attempts=5)
def hang_first(ctx: Any, *, seconds: float = 6.0) -> None:
    """Hang the first attempt (its heartbeat thread alive) for ``seconds``, then try the
    effect; declares no maximum runtime, so the project's default ends the attempt."""
    if ctx.attempt == 1:
        time.sleep(seconds)
    with ctx.effect("mark"):
        pass


def _transfer(ctx: Any, *, invoice_id: int) -> None:
    from demo import clients

    with ctx.effect("transfer") as eff:
        if not eff.done:
            reply = clients.transfer(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": invoice_id, "cents": 100},
                timeout=5.0,
                slow_reply=0.0,
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))


transfer_at_most_once = job(
    name="tests.proc.transfer_at_most_once", effect="at_most_once", lease_seconds=3
)(_transfer)
"""At most once against the demo provider's fenced (not deduplicated) transfer endpoint."""


@job(name="tests.proc.overrun", lease_seconds=60, timeout=1, max_attempts=1)
def overrun(ctx: Any, *, seconds: float = 120.0) -> None:
    """Run far past a one-second maximum runtime (its lease is long, so it shows overrunning
    for most of a minute before the reaper could move it)."""
    time.sleep(seconds)


async def _mark(ctx: Any, account: str) -> None:
    from demo.models import LedgerEntry

    await LedgerEntry.objects.acreate(
        account=account, cents=1, effect_key=account, job_id=ctx.job_id, fence=ctx.fence
    )


@job(name="tests.proc.async_write", effect="transactional", lease_seconds=30, max_attempts=3)
async def async_write(ctx: Any, *, n: int = 0) -> None:
    """An async handler whose row, written through Django's async ORM, commits with its
    completion."""
    import asyncio

    await asyncio.sleep(0)
    await _mark(ctx, f"async-{n}")


@job(name="tests.proc.async_nap", lease_seconds=60, max_attempts=3)
async def async_nap(ctx: Any, *, seconds: float = 60.0) -> None:
    """Sleep a long time under a long lease; a cancelled coroutine records its ``finally``."""
    import asyncio

    try:
        await asyncio.sleep(seconds)
        await _mark(ctx, "woke-up")
    finally:
        await _mark(ctx, "finally")


@job(name="tests.proc.renewing", lease_seconds=6, max_attempts=3)
def renewing(ctx: Any, *, seconds: float = 10.0) -> None:
    """Run for ``seconds`` under a six-second lease kept by renewals, then record an effect."""
    time.sleep(seconds)
    with ctx.effect("mark"):
        pass


@job(
    name="tests.proc.tx_hold",
    effect="transactional",
    lease_seconds=30,
    max_attempts=2,
    backoff_base=0.5,
)
def tx_hold(ctx: Any, *, seconds: float = 12.0) -> None:
    """A transactional handler that writes, then works for ``seconds`` inside its transaction
    (on SQLite, holding the database's one write lock)."""
    from demo.models import LedgerEntry

    LedgerEntry.objects.create(
        account="tx", cents=1, effect_key="tx", job_id=ctx.job_id, fence=ctx.fence
    )
    time.sleep(seconds)
