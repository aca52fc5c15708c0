"""Demo jobs, discovered at start-up like any app's ``jobs.py``."""

from __future__ import annotations

import datetime as dt
import os
import time

from scheduler_core import Transient, job
from scheduler_core.api import registry
from scheduler_core.runtime.context import JobContext

from . import clients
from .models import LedgerEntry


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


# --- The effect protocol, one job per mode, each against a demo destination (demo/provider.py,
# demo/smtp_sink.py, demo.models.LedgerEntry). ``slow_reply_attempts`` makes the destination
# apply the first attempts' requests and answer only after the caller's timeout, for tests.


def _slow_reply(ctx: JobContext, timeout: float, attempts: int) -> float:
    return timeout + 1.0 if ctx.attempt <= attempts else 0.0


@job(
    name="demo.charge",
    effect="idempotent",
    max_attempts=8,
    lease_seconds=3,
    backoff_base=0.2,
    backoff_cap=2.0,
    # Keys live a day at the provider: retrying must stop well before that.
    max_age=3600,
)
def charge(
    ctx: JobContext,
    *,
    invoice_id: int,
    cents: int,
    timeout: float = 5.0,
    slow_reply_attempts: int = 0,
) -> None:
    """Charge an invoice at the provider under the effect key and the attempt's fence."""
    with ctx.effect("charge") as eff:
        if eff.done:
            return
        reply = clients.charge(
            ctx,
            key=eff.key,
            fence=eff.fence,
            body={"invoice_id": invoice_id, "cents": cents},
            timeout=timeout,
            slow_reply=_slow_reply(ctx, timeout, slow_reply_attempts),
        )
        eff.applied(destination_ref=str(reply.get("charge_id", "")))


def _transfer_lookup(ctx: JobContext, **payload: object) -> str:
    """Reconcile: ask the provider whether the transfer with this job's key was applied."""
    timeout = payload.get("timeout", 5.0)
    reply = clients.lookup(
        ctx,
        key=ctx.effect_key("transfer"),
        fence=ctx.fence,
        timeout=float(timeout) if isinstance(timeout, int | float) else 5.0,
    )
    status = reply.get("status")
    return status if status in ("applied", "not_applied") else "unknown"


@job(
    name="demo.charge_reconcilable",
    effect="reconcilable",
    reconcile=_transfer_lookup,
    max_attempts=8,
    lease_seconds=3,
    backoff_base=0.2,
    backoff_cap=2.0,
)
def charge_reconcilable(
    ctx: JobContext,
    *,
    invoice_id: int,
    cents: int,
    timeout: float = 5.0,
    slow_reply_attempts: int = 0,
) -> None:
    """Transfer at the provider's non-deduplicating endpoint; reconciled by lookup."""
    with ctx.effect("transfer") as eff:
        if eff.done:
            return
        reply = clients.transfer(
            ctx,
            key=eff.key,
            fence=eff.fence,
            body={"invoice_id": invoice_id, "cents": cents},
            timeout=timeout,
            slow_reply=_slow_reply(ctx, timeout, slow_reply_attempts),
        )
        eff.applied(destination_ref=str(reply.get("charge_id", "")))


def _send(
    ctx: JobContext, to: str, subject: str, text: str, timeout: float, slow_reply_attempts: int
) -> None:
    with ctx.effect("email") as eff:
        if eff.done:
            return
        message_id = clients.send_mail(
            key=eff.key,
            to=to,
            subject=subject,
            text=text,
            timeout=timeout,
            slow_reply=_slow_reply(ctx, timeout, slow_reply_attempts),
        )
        eff.applied(destination_ref=message_id)


@job(
    name="demo.email",
    effect="at_least_once",
    max_attempts=8,
    lease_seconds=3,
    backoff_base=0.2,
    backoff_cap=2.0,
)
def email(
    ctx: JobContext,
    *,
    to: str,
    subject: str = "Your invoice",
    text: str = "Thank you.",
    timeout: float = 5.0,
    slow_reply_attempts: int = 0,
) -> None:
    """Send one email through the SMTP sink; repeats possible, each recorded in the ledger."""
    _send(ctx, to, subject, text, timeout, slow_reply_attempts)


@job(
    name="demo.email_at_most_once",
    effect="at_most_once",
    max_attempts=8,
    lease_seconds=3,
    backoff_base=0.2,
    backoff_cap=2.0,
)
def email_at_most_once(
    ctx: JobContext,
    *,
    to: str,
    subject: str = "Your invoice",
    text: str = "Thank you.",
    timeout: float = 5.0,
    slow_reply_attempts: int = 0,
) -> None:
    """Send one email at most once; an unknown outcome is parked for an operator."""
    _send(ctx, to, subject, text, timeout, slow_reply_attempts)


@job(
    name="demo.ledger_credit",
    effect="transactional",
    max_attempts=8,
    lease_seconds=3,
    backoff_base=0.2,
    backoff_cap=2.0,
)
def ledger_credit(ctx: JobContext, *, account: str, cents: int) -> None:
    """Credit an account in the job database; commits with the job's completion or not at all."""
    with ctx.effect("credit") as eff:
        if eff.done:
            return
        entry = LedgerEntry.objects.create(
            account=account, cents=cents, effect_key=eff.key, job_id=ctx.job_id, fence=ctx.fence
        )
        eff.applied(destination_ref=f"ledger:{entry.pk}")


@job(name="demo.poison", effect="at_least_once", max_attempts=3, backoff_base=0.1, backoff_cap=0.5)
def poison(ctx: JobContext, *, note: str = "") -> None:
    """Fail on every attempt with an error nobody classified: retried, then ``failed``."""
    raise RuntimeError(f"poison job {ctx.job_id} fails on attempt {ctx.attempt} {note}".strip())


@job(name="demo.suicide", effect="at_least_once", max_attempts=3, lease_seconds=2)
def suicide(ctx: JobContext) -> None:
    """Kill the executor running it on every attempt: the reaper bounds it, then ``failed``."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@job(name="demo.failing", effect="at_least_once", max_attempts=10)
def failing(ctx: JobContext, *, quick: int = 3, pause: float = 60.0) -> None:
    """Fail transiently on every attempt: the first ``quick`` retries come at once, later ones
    after ``pause`` seconds (the failure's own ``retry_after``)."""
    wait = 0.0 if ctx.attempt < quick else pause
    raise Transient(f"still failing (attempt {ctx.attempt})", retry_after=wait)


@job(name="demo.lost_reply", effect="at_most_once", max_attempts=3)
def lost_reply(ctx: JobContext) -> None:
    """Send a request whose reply never comes: at most once, so the job is parked."""
    with ctx.effect("send"):
        raise TimeoutError("the destination did not reply")


# --- A demo worth operating: steady traffic of every kind (``make demo``). ``demo.traffic`` is
# declared with a schedule (every minute) only when ``TENURE_DEMO_TRAFFIC`` is set, as
# demo/run.py does, so test runs that load the demo app fire nothing on their own.

TRAFFIC = os.environ.get("TENURE_DEMO_TRAFFIC", "").lower() in ("1", "true", "yes")
PAUSABLE_QUEUE = "reports"
"""A queue of its own for the reports, to pause and resume from the console."""
BILLING_QUEUE = "billing"


@job(name="demo.invoice", queue=BILLING_QUEUE, effect="at_least_once", max_attempts=3)
def invoice(ctx: JobContext, *, invoice_id: int, cents: int = 0) -> None:
    """Book an invoice (quick); its payload's ``invoice_id`` is what an operator searches for."""
    time.sleep(0.05)


@job(name="demo.report", queue=PAUSABLE_QUEUE, effect="at_least_once", max_attempts=3)
def report(ctx: JobContext, *, kind: str = "hourly") -> None:
    """Build a report (a second's work) on the pausable queue."""
    time.sleep(1.0)


@job(
    name="demo.long",
    effect="at_least_once",
    max_attempts=2,
    lease_seconds=15,
    timeout=900,
)
def long_running(ctx: JobContext, *, seconds: float = 180.0) -> None:
    """Run for ``seconds`` (minutes), its lease renewed by heartbeats all along; stops early
    when the context says the job was asked to stop."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if getattr(ctx, "cancelled", False):
            return
        time.sleep(1.0)


def traffic_batch(n: int) -> list[tuple[str, dict[str, object]]]:
    """The jobs one minute of demo traffic enqueues (the ``n``-th minute): invoices that
    succeed, a job that fails twice and backs off before it succeeds, a report on the
    pausable queue, and, on some minutes, a job that fails for good, one whose reply is lost
    (indeterminate: at most once) and one that runs for two to five minutes."""
    batch: list[tuple[str, dict[str, object]]] = [
        ("demo.invoice", {"invoice_id": 2000 + n * 10 + i, "cents": 100 * (i + 1)})
        for i in range(6)
    ]
    batch.append(("demo.flaky", {"fail_times": 2}))
    batch.append(("demo.report", {"kind": "minutely"}))
    if n % 2 == 0:
        batch.append(("demo.poison", {"note": f"minute {n}"}))
    if n % 3 == 0:
        batch.append(("demo.lost_reply", {}))
    if n % 5 == 0:
        batch.append(("demo.long", {"seconds": float(120 + (n * 37) % 180)}))
    return batch


@job(
    name="demo.traffic",
    effect="at_least_once",
    max_attempts=3,
    schedule=dt.timedelta(minutes=1) if TRAFFIC else None,
    overlap="skip",
)
def traffic(ctx: JobContext) -> None:
    """Enqueue one minute of demo traffic (:func:`traffic_batch`)."""
    for name, payload in traffic_batch(int(ctx.job_id)):
        registry.enqueue(name, payload)
