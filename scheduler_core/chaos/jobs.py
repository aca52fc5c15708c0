"""The verifier's job types: one per effect mode, each against a demo destination.

They make the same calls as the demo jobs (through :mod:`demo.clients`, with its failure
classification) and add what fault injection needs: ``work`` seconds before the effect (so
kills and pauses find attempts in flight, some longer than a lease), ``hold`` seconds after
it and before the completion (a kill there leaves an effect done and unrecorded),
``fail_first`` planned transient failures, a planned permanent failure, and ``slow``: the
destination applies the first attempt's request and answers only after the caller gave up.

Loaded only where ``TENURE_JOB_MODULES`` names this module (the verifier's processes).
"""

from __future__ import annotations

import os
import time
from typing import Any

from demo import clients
from demo.models import LedgerEntry
from scheduler_core import Permanent, Transient, job
from scheduler_core.context import JobContext
from scheduler_core.registry import JobType

from .broker import BROKER_QUEUE
from .evidence import BROKER_SUFFIX

LEASE = int(os.environ.get("TENURE_CHAOS_LEASE", "4"))
OPTIONS: dict[str, Any] = {
    "max_attempts": 10,
    "lease_seconds": LEASE,
    "backoff_base": 0.2,
    "backoff_cap": 2.0,
    # A hard maximum runtime: a hung handler's lease stops being renewed after it, so the
    # job is rescued while the hung thread still lives (catalogue 8).
    "timeout": 4 * LEASE,
}
HANG_SECONDS = 6 * LEASE
"""How long a hung first attempt sleeps before its effect: past the maximum runtime."""

PLANNED_TRANSIENT = "planned transient failure"
PLANNED_PERMANENT = "planned permanent failure"


def _prelude(
    ctx: JobContext, work: float, fail_first: int, permanent: bool, hang: bool = False
) -> None:
    if hang and ctx.attempt == 1:
        # Hung, with the heartbeat thread alive: only the maximum runtime ends the lease; the
        # effect after the sleep is then refused by the fence.
        time.sleep(HANG_SECONDS)
    if permanent:
        raise Permanent(PLANNED_PERMANENT)
    if ctx.attempt <= fail_first:
        raise Transient(f"{PLANNED_TRANSIENT} {ctx.attempt} of {fail_first}")
    if work > 0:
        time.sleep(work)


def _slow(ctx: JobContext, slow: bool, timeout: float) -> float:
    """The destination's reply delay: past the caller's timeout on the first attempt only."""
    return timeout + 1.0 if slow and ctx.attempt == 1 else 0.0


@job(name="chaos.transactional", effect="transactional", **OPTIONS)
def transactional(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    fail_first: int = 0,
    permanent: bool = False,
    slow: bool = False,
    timeout: float = 1.5,
    hang: bool = False,
) -> None:
    """Credit a ledger row in the job's own transaction."""
    _prelude(ctx, work, fail_first, permanent, hang)
    with ctx.effect("credit") as eff:
        if not eff.done:
            entry = LedgerEntry.objects.create(
                account=f"chaos-{n}",
                cents=100,
                effect_key=eff.key,
                job_id=ctx.job_id,
                fence=ctx.fence,
            )
            eff.applied(destination_ref=f"ledger:{entry.pk}")
    time.sleep(hold)


@job(name="chaos.idempotent", effect="idempotent", **OPTIONS)
def idempotent(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    fail_first: int = 0,
    permanent: bool = False,
    slow: bool = False,
    timeout: float = 1.5,
    hang: bool = False,
) -> None:
    """Charge at the provider under the effect key (idempotency key) and the fence."""
    _prelude(ctx, work, fail_first, permanent, hang)
    with ctx.effect("charge") as eff:
        if not eff.done:
            reply = clients.charge(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": n, "cents": 100},
                timeout=timeout,
                slow_reply=_slow(ctx, slow, timeout),
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))
    time.sleep(hold)


def _lookup(ctx: JobContext, **payload: Any) -> str:
    """Reconcile: ask the provider whether this job's transfer was applied."""
    timeout = payload.get("timeout", 1.5)
    reply = clients.lookup(
        ctx,
        key=ctx.effect_key("transfer"),
        fence=ctx.fence,
        timeout=float(timeout) if isinstance(timeout, int | float) else 1.5,
    )
    status = reply.get("status")
    return status if status in ("applied", "not_applied") else "unknown"


@job(name="chaos.reconcilable", effect="reconcilable", reconcile=_lookup, **OPTIONS)
def reconcilable(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    fail_first: int = 0,
    permanent: bool = False,
    slow: bool = False,
    timeout: float = 1.5,
    hang: bool = False,
) -> None:
    """Transfer at the provider's non-deduplicating endpoint; reconciled by lookup."""
    _prelude(ctx, work, fail_first, permanent, hang)
    with ctx.effect("transfer") as eff:
        if not eff.done:
            reply = clients.transfer(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": n, "cents": 100},
                timeout=timeout,
                slow_reply=_slow(ctx, slow, timeout),
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))
    time.sleep(hold)


def _mail(ctx: JobContext, n: int, slow: bool, timeout: float) -> None:
    with ctx.effect("email") as eff:
        if not eff.done:
            message_id = clients.send_mail(
                key=eff.key,
                to=f"customer-{n}@example.test",
                subject=f"chaos {n}",
                text="Thank you.",
                timeout=timeout,
                slow_reply=_slow(ctx, slow, timeout),
            )
            eff.applied(destination_ref=message_id)


@job(name="chaos.at_least_once", effect="at_least_once", **OPTIONS)
def at_least_once(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    fail_first: int = 0,
    permanent: bool = False,
    slow: bool = False,
    timeout: float = 1.5,
    hang: bool = False,
) -> None:
    """Send one email; a repeat after an unknown outcome is possible and recorded."""
    _prelude(ctx, work, fail_first, permanent, hang)
    _mail(ctx, n, slow, timeout)
    time.sleep(hold)


@job(name="chaos.at_most_once", effect="at_most_once", **OPTIONS)
def at_most_once(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    fail_first: int = 0,
    permanent: bool = False,
    slow: bool = False,
    timeout: float = 1.5,
    hang: bool = False,
) -> None:
    """Send one email at most once; an unknown outcome is parked for an operator."""
    _prelude(ctx, work, fail_first, permanent, hang)
    _mail(ctx, n, slow, timeout)
    time.sleep(hold)


@job(name="chaos.noop", queue="sweep", effect="transactional", max_attempts=3, lease_seconds=LEASE)
def noop(ctx: JobContext, *, n: int = 0) -> None:
    """Nothing: the broker sweep's real job, on a queue only the sweep's Celery worker serves."""


# The broker twins are announced through the run's own Redis and run by its Celery workers,
# never claimed by the broker-less executors (which serve ``default``).


def _broker_twin(jt: JobType) -> JobType:
    """The same handler and effect mode as ``jt``, on the broker queue."""
    return job(
        name=jt.name + BROKER_SUFFIX,
        queue=BROKER_QUEUE,
        effect=jt.effect.value,
        reconcile=jt.reconcile,
        **OPTIONS,
    )(jt.func)


BROKER_TWINS = tuple(
    _broker_twin(jt)
    for jt in (transactional, idempotent, reconcilable, at_least_once, at_most_once)
)
