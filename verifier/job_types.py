"""The verifier's job types: one per effect mode, each against a demo destination, a job
that falls back to a second destination keeping its own keys, and one that declares no
maximum runtime.

They make the same calls as the demo jobs (through :mod:`demo.clients`, with its failure
classification) and add what fault injection needs: ``work`` seconds before the effect (so
kills and pauses find attempts in flight, some longer than a lease), ``hold`` seconds after
it and before the completion (a kill there leaves an effect done and unrecorded),
``fail_first`` planned transient failures, a planned permanent failure, ``slow``: the
destination applies the first attempt's request and answers only after the caller gave up,
and ``hang``: the first attempt hangs past its maximum runtime.

``chaos.fallback`` charges at the payment provider and falls back to the second provider,
whose keys are its own (``fallback_shares_key=False``). Its payload says at which attempts the
first provider answers 503 or refuses the connection (``a_down``, ``refuse``) and at which the
second applies and then times out (``b_slow``), so a planned share of these jobs meets the
first provider applying a charge and timing out, then turning the next attempt away: the case
where only a sticky unknown outcome keeps the fallback from charging a second time. ``case``
names the planned case (``FALLBACK_CASES`` in :mod:`.workload`) for the report.
``chaos.untimed`` is the idempotent job without ``timeout``: the installation's
``TENURE_DEFAULT_TIMEOUT_SECONDS`` (set by the verifier for its processes) ends its hung
attempts.

The end paths (``PATH_CASES`` in :mod:`.workload`): ``chaos.multi`` makes two effects, a charge
then its receipt, and its reconcile function is asked about each; ``chaos.snooze`` loses the
reply of its first attempt's charge, then snoozes until ``max_age``; ``chaos.overrun`` charges,
then runs past its maximum runtime with no attempt left; ``chaos.stubborn`` never answers a
cancel request.

Loaded only where ``TENURE_JOB_MODULES`` names this module (the verifier's processes). The
negative controls but ``fence`` run drivers of the verifier's own (:mod:`verifier.drivers`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from demo import clients
from demo.models import LedgerEntry
from scheduler_core import Permanent, Snooze, Transient, job
from scheduler_core.api.registry import JobType
from scheduler_core.runtime.context import EffectRef, JobContext

from .broker import BROKER_QUEUE
from .evidence import ASYNC_SUFFIX, BROKER_SUFFIX
from .plan import DOWN_URL_ENV

LEASE = int(os.environ.get("TENURE_CHAOS_LEASE", "4"))
UNTIMED_OPTIONS: dict[str, Any] = {
    "max_attempts": 10,
    "lease_seconds": LEASE,
    "backoff_base": 0.2,
    "backoff_cap": 2.0,
}
"""Options of a job type that declares no maximum runtime: the installation's default
(``TENURE_DEFAULT_TIMEOUT_SECONDS``) applies."""
OPTIONS: dict[str, Any] = {
    **UNTIMED_OPTIONS,
    # A hard maximum runtime: a hung handler's lease stops being renewed after it, so the
    # job is rescued while the hung thread still lives (catalogue 8).
    "timeout": 4 * LEASE,
}
FALLBACK_OPTIONS: dict[str, Any] = {**OPTIONS, "max_attempts": 6}
"""Fewer attempts, so a job whose first provider stays away is parked within the run."""
HANG_SECONDS = 6 * LEASE
"""How long a hung first attempt sleeps before its effect: past the maximum runtime, declared
or the installation's default (the verifier sets it to the same 4 leases)."""

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


# ---------------------------------------------------------------------------------------------
# A fallback to a second provider that keeps its own keys
# ---------------------------------------------------------------------------------------------


def _attempts(value: list[int] | None) -> frozenset[int]:
    return frozenset(value or ())


def _primary_down(ctx: JobContext, a_down: list[int] | None, refuse: bool) -> tuple[bool, str]:
    """Whether this attempt finds the first provider away: ``(answers 503, refusing address)``.
    Without the verifier's refusing address a refused connection becomes a 503: either way
    nothing is sent."""
    if ctx.attempt not in _attempts(a_down):
        return False, ""
    down_url = os.environ.get(DOWN_URL_ENV, "")
    if refuse and down_url:
        return False, down_url
    return True, ""


def _second_provider(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    timeout: float = 1.5,
    slow: bool = False,
    a_down: list[int] | None = None,
    refuse: bool = False,
    b_slow: list[int] | None = None,
    case: str = "",
) -> None:
    """The fallback: charge at the second provider, which deduplicates by its own keys only."""
    if work > 0:
        time.sleep(work)
    with ctx.effect("charge") as eff:
        if not eff.done:
            reply = clients.second_charge(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": n, "cents": 100},
                timeout=timeout,
                slow_reply=timeout + 1.0 if ctx.attempt in _attempts(b_slow) else 0.0,
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))
    time.sleep(hold)


@job(
    name="chaos.fallback",
    effect="idempotent",
    fallback=_second_provider,
    fallback_shares_key=False,
    **FALLBACK_OPTIONS,
)
def fallback_charge(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    timeout: float = 1.5,
    slow: bool = False,
    a_down: list[int] | None = None,
    refuse: bool = False,
    b_slow: list[int] | None = None,
    case: str = "",
) -> None:
    """Charge at the payment provider; when it turns an attempt away with nothing applied,
    the next attempt is the fallback (:func:`_second_provider`), unless an earlier outcome is
    still unknown."""
    if work > 0:
        time.sleep(work)
    unavailable, base_url = _primary_down(ctx, a_down, refuse)
    with ctx.effect("charge") as eff:
        if not eff.done:
            reply = clients.charge(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": n, "cents": 100},
                timeout=timeout,
                slow_reply=_slow(ctx, slow, timeout),
                unavailable=unavailable,
                base_url=base_url,
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))
    time.sleep(hold)


# ---------------------------------------------------------------------------------------------
# The end paths: two effects with a lost reply, snoozing after a lost reply, overrunning the
# maximum runtime after the effect, and a cancel request the handler never answers
# ---------------------------------------------------------------------------------------------

MULTI_EFFECTS = ("charge", "receipt")
"""The effects of ``chaos.multi``, in the order its handler performs them."""
SNOOZE_MAX_AGE = 2.5 * LEASE
"""``chaos.snooze``'s ``max_age``: reached while its later attempts snooze."""
SNOOZE_SECONDS = 1.0
OVERRUN_TIMEOUT = 2 * LEASE
"""``chaos.overrun``'s maximum runtime; its handler sleeps past it after its effect."""
STUBBORN_TIMEOUT = 4 * LEASE


def _lookup_effect(ctx: JobContext, effect: EffectRef | None = None, **payload: Any) -> str:
    """Reconcile of ``chaos.multi``: ask the provider about the one effect it is asked about
    (``effect``); asked about the job as a whole (no effect in the ledger), about the first."""
    timeout = payload.get("timeout", 1.5)
    key = effect.key if effect is not None else ctx.effect_key(MULTI_EFFECTS[0])
    reply = clients.lookup(
        ctx,
        key=key,
        fence=ctx.fence,
        timeout=float(timeout) if isinstance(timeout, int | float) else 1.5,
    )
    status = reply.get("status")
    return status if status in ("applied", "not_applied") else "unknown"


@job(name="chaos.multi", effect="reconcilable", reconcile=_lookup_effect, **OPTIONS)
def multi(
    ctx: JobContext,
    *,
    n: int,
    work: float = 0.0,
    hold: float = 0.0,
    timeout: float = 1.5,
    lost: str = "",
) -> None:
    """Two transfers at the provider's non-deduplicating endpoint, a charge then its receipt,
    each reconciled by lookup. ``lost`` names the effect whose reply the first attempt loses
    (the destination applies it and answers after the caller's timeout)."""
    if work > 0:
        time.sleep(work)
    for name in MULTI_EFFECTS:
        with ctx.effect(name) as eff:
            if not eff.done:
                reply = clients.transfer(
                    ctx,
                    key=eff.key,
                    fence=eff.fence,
                    body={"invoice_id": n, "cents": 100 if name == "charge" else 1},
                    timeout=timeout,
                    slow_reply=_slow(ctx, lost == name, timeout),
                )
                eff.applied(destination_ref=str(reply.get("charge_id", "")))
    time.sleep(hold)


@job(
    name="chaos.snooze",
    effect="idempotent",
    max_age=SNOOZE_MAX_AGE,
    **{**OPTIONS, "max_attempts": 20},
)
def snooze(ctx: JobContext, *, n: int, timeout: float = 1.5) -> None:
    """The first attempt charges and loses the reply; every later one snoozes until the
    job's ``max_age`` passes, with the charge's outcome still unknown."""
    if ctx.attempt > 1:
        raise Snooze(SNOOZE_SECONDS)
    with ctx.effect("charge") as eff:
        if not eff.done:
            reply = clients.charge(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": n, "cents": 100},
                timeout=timeout,
                slow_reply=timeout + 1.0,
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))


@job(
    name="chaos.overrun",
    effect="idempotent",
    **{**OPTIONS, "max_attempts": 1, "timeout": OVERRUN_TIMEOUT},
)
def overrun(ctx: JobContext, *, n: int, timeout: float = 1.5) -> None:
    """Charge, then run past the maximum runtime with no attempt left."""
    with ctx.effect("charge") as eff:
        if not eff.done:
            reply = clients.charge(
                ctx,
                key=eff.key,
                fence=eff.fence,
                body={"invoice_id": n, "cents": 100},
                timeout=timeout,
                slow_reply=0.0,
            )
            eff.applied(destination_ref=str(reply.get("charge_id", "")))
    time.sleep(OVERRUN_TIMEOUT + 2 * LEASE)


@job(
    name="chaos.stubborn",
    effect="idempotent",
    **{**OPTIONS, "timeout": STUBBORN_TIMEOUT},
)
def stubborn(ctx: JobContext, *, n: int, work: float = 0.0, overrun: bool = False) -> None:
    """Works ``work`` seconds and never looks at ``ctx.cancelled``: an operator's request to
    stop goes unanswered. With ``overrun`` the first attempt runs past its maximum runtime, so
    the request is still unanswered when the lease ends."""
    time.sleep(STUBBORN_TIMEOUT + 2 * LEASE if overrun and ctx.attempt == 1 else work)


# No ``timeout``: the installation's default maximum runtime ends its hung attempts.
untimed = job(name="chaos.untimed", effect="idempotent", **UNTIMED_OPTIONS)(idempotent.func)


@job(name="chaos.noop", queue="sweep", effect="transactional", max_attempts=3, lease_seconds=LEASE)
def noop(ctx: JobContext, *, n: int = 0) -> None:
    """Nothing: the broker sweep's real job, on a queue only the sweep's Celery worker serves."""


# The broker twins are announced through the run's own Redis and run by its Celery workers,
# never claimed by the broker-less executors (which serve ``default``).


def _broker_twin(jt: JobType, options: dict[str, Any]) -> JobType:
    """The same handler, effect mode, reconcile function and fallback as ``jt``, registered
    with ``options`` (its own), on the broker queue."""
    return job(
        name=jt.name + BROKER_SUFFIX,
        queue=BROKER_QUEUE,
        effect=jt.effect.value,
        reconcile=jt.reconcile,
        fallback=jt.fallback,
        fallback_shares_key=jt.fallback_shares_key,
        **options,
    )(jt.func)


BROKER_TWINS = (
    *(
        _broker_twin(jt, OPTIONS)
        for jt in (transactional, idempotent, reconcilable, at_least_once, at_most_once)
    ),
    _broker_twin(fallback_charge, FALLBACK_OPTIONS),
    _broker_twin(untimed, UNTIMED_OPTIONS),
)


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The same five job types written ``async def``
# ---------------------------------------------------------------------------------------------

# Each makes the same call to the same destination as its plain twin, awaiting its work and
# the call (the demo clients block, so the call runs on a thread of the loop's own), and
# writes the ledger with ``async with``: run by the broker-less executors on their threads'
# event loops, cancelled at the maximum runtime (a hung first attempt) and when the lease is
# lost, every outcome checked against the same invariants.


async def _aprelude(
    ctx: JobContext, work: float, fail_first: int, permanent: bool, hang: bool = False
) -> None:
    if hang and ctx.attempt == 1:
        # Hung past the maximum runtime: the coroutine is cancelled there.
        await asyncio.sleep(HANG_SECONDS)
    if permanent:
        raise Permanent(PLANNED_PERMANENT)
    if ctx.attempt <= fail_first:
        raise Transient(f"{PLANNED_TRANSIENT} {ctx.attempt} of {fail_first}")
    if work > 0:
        await asyncio.sleep(work)


async def _atransactional(ctx: JobContext, *, n: int, **p: Any) -> None:
    await _aprelude(ctx, p["work"], p["fail_first"], p["permanent"], p["hang"])
    async with ctx.effect("credit") as eff:
        if not eff.done:
            entry = await LedgerEntry.objects.acreate(
                account=f"chaos-{n}",
                cents=100,
                effect_key=eff.key,
                job_id=ctx.job_id,
                fence=ctx.fence,
            )
            eff.applied(destination_ref=f"ledger:{entry.pk}")
    await asyncio.sleep(p["hold"])


def _provider(call: Callable[..., dict[str, Any]], name: str) -> Callable[..., Any]:
    async def handler(ctx: JobContext, *, n: int, **p: Any) -> None:
        await _aprelude(ctx, p["work"], p["fail_first"], p["permanent"], p["hang"])
        async with ctx.effect(name) as eff:
            if not eff.done:
                reply = await asyncio.to_thread(
                    call,
                    ctx,
                    key=eff.key,
                    fence=eff.fence,
                    body={"invoice_id": n, "cents": 100},
                    timeout=p["timeout"],
                    slow_reply=_slow(ctx, p["slow"], p["timeout"]),
                )
                eff.applied(destination_ref=str(reply.get("charge_id", "")))
        await asyncio.sleep(p["hold"])

    return handler


async def _amail(ctx: JobContext, *, n: int, **p: Any) -> None:
    await _aprelude(ctx, p["work"], p["fail_first"], p["permanent"], p["hang"])
    async with ctx.effect("email") as eff:
        if not eff.done:
            message_id = await asyncio.to_thread(
                clients.send_mail,
                key=eff.key,
                to=f"customer-{n}@example.test",
                subject=f"chaos {n}",
                text="Thank you.",
                timeout=p["timeout"],
                slow_reply=_slow(ctx, p["slow"], p["timeout"]),
            )
            eff.applied(destination_ref=message_id)
    await asyncio.sleep(p["hold"])


async def _alookup(ctx: JobContext, **payload: Any) -> str:
    """Reconcile, awaited: ask the provider whether this job's transfer was applied."""
    timeout = payload.get("timeout", 1.5)
    reply = await asyncio.to_thread(
        clients.lookup,
        ctx,
        key=await ctx.aeffect_key("transfer"),
        fence=ctx.fence,
        timeout=float(timeout) if isinstance(timeout, int | float) else 1.5,
    )
    status = reply.get("status")
    return status if status in ("applied", "not_applied") else "unknown"


def _with_defaults(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind the plain twins' signature (every payload name, with its default)."""

    async def handler(
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
        await fn(
            ctx,
            n=n,
            work=work,
            hold=hold,
            fail_first=fail_first,
            permanent=permanent,
            slow=slow,
            timeout=timeout,
            hang=hang,
        )

    return handler


ASYNC_TWINS = tuple(
    job(
        name=twin.name + ASYNC_SUFFIX,
        effect=twin.effect.value,
        reconcile=_alookup if twin.reconcile is not None else None,
        **OPTIONS,
    )(_with_defaults(fn))
    for twin, fn in (
        (transactional, _atransactional),
        (idempotent, _provider(clients.charge, "charge")),
        (reconcilable, _provider(clients.transfer, "transfer")),
        (at_least_once, _amail),
        (at_most_once, _amail),
    )
)
"""The ``async def`` twins of the five job types, on the broker-less executors' queue."""
