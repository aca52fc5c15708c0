"""What an attempt tells beyond its rows: the host's logs (a failure at ``WARNING`` when a retry
follows, at ``ERROR`` when it does not, with its traceback and the attempt's identity in
``extra``), the signals of :mod:`scheduler_core.signals` and the attempt's span
(:mod:`scheduler_core.tracing`). Called once an attempt's end has committed, never for a write
the database refused; nothing here may fail an attempt."""

from __future__ import annotations

import logging
from typing import Any

import scheduler_core.signals as signals
import scheduler_core.tracing as tracing

from ..domain import states
from ..storage.records import Lease
from .context import JobContext, after_commit

log = logging.getLogger("tenure.executor")

RESTING = frozenset(s.value for s in states.RESTING)
"""Outcomes that leave the job at rest (the job's state is the outcome's word)."""

QUIET = frozenset({"stale", "deferred", "released"})
"""Outcomes that send no ``attempt_finished``: a refused write (another attempt owns the job),
a completion not yet written, an attempt given back unfinished."""


def extra(lease: Lease, outcome: str, error_class: str = "") -> dict[str, Any]:
    """A log record's ``extra`` for ``lease``'s attempt (keys prefixed ``tenure_``)."""
    return {
        "tenure_job_id": lease.job_id,
        "tenure_job_name": lease.name,
        "tenure_queue": lease.queue,
        "tenure_attempt": lease.number,
        "tenure_fence": lease.fence,
        "tenure_attempt_kind": lease.kind,
        "tenure_outcome": outcome,
        "tenure_error_class": error_class,
        "tenure_executor": lease.executor,
    }


def _arguments(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "name": lease.name,
        "queue": lease.queue,
        "attempt": lease.number,
        "fence": lease.fence,
        "kind": lease.kind,
    }


def _attributes(lease: Lease) -> dict[str, Any]:
    return {
        "tenure.job.id": lease.job_id,
        "tenure.job.name": lease.name,
        "tenure.queue": lease.queue,
        "tenure.attempt": lease.number,
        "tenure.fence": lease.fence,
        "tenure.attempt.kind": lease.kind,
    }


def logged_end(
    lease: Lease,
    outcome: str,
    target: states.State,
    *,
    error: BaseException | None = None,
    error_class: str = "",
    why: str = "",
    failure: bool = False,
) -> None:
    """Log an attempt's end that was written: ``ERROR`` when it leaves the job failed or
    indeterminate, ``WARNING`` when the job waits again after an error or another
    ``failure`` (a retry follows), ``INFO`` otherwise; with the error's traceback."""
    if target in (states.State.FAILED, states.State.INDETERMINATE):
        level = logging.ERROR
    elif target == states.State.WAITING and (error is not None or error_class or failure):
        level = logging.WARNING
    else:
        level = logging.INFO
    if not log.isEnabledFor(level):
        return
    what = f"{type(error).__module__}.{type(error).__qualname__}: {error}" if error else why
    log.log(
        level,
        "job %s (%s) attempt %s fence %s: %s -> %s%s",
        lease.job_id,
        lease.name,
        lease.number,
        lease.fence,
        what,
        target.value,
        f" ({error_class})" if error_class else "",
        exc_info=(type(error), error, error.__traceback__) if error is not None else None,
        extra=extra(lease, outcome, error_class),
    )


def started(ctx: JobContext, sender: Any) -> None:
    """``ctx``'s claim has committed and its handler is about to run: its span starts (the
    child of its enqueue's) and ``attempt_started`` is sent."""
    lease = ctx.lease
    if tracing.active():
        try:
            ctx.span = tracing.start_attempt(lease.trace_context, _attributes(lease), lease.name)
        except Exception:
            log.exception("job %s: could not start the attempt's span", lease.job_id)
    if signals.attempt_started.receivers:
        arguments = _arguments(lease)
        after_commit(lambda: signals.send(signals.attempt_started, sender, **arguments))


def finished(ctx: JobContext, sender: Any, outcome: str) -> None:
    """``ctx``'s end is known: its span ends, and unless the end was not its own to write
    (:data:`QUIET`) ``attempt_finished`` is sent, then ``job_finished`` when the job is at
    rest."""
    tracing.end_attempt(ctx.span, outcome, ctx.error)
    ctx.span = None
    if outcome in QUIET:
        return
    sent = signals.attempt_finished.receivers or signals.job_finished.receivers
    if not sent:
        return
    arguments = {
        **_arguments(ctx.lease),
        "outcome": outcome,
        "state": outcome if outcome in RESTING else states.State.WAITING.value,
        "error": ctx.error,
    }

    def announce() -> None:
        signals.send(signals.attempt_finished, sender, **arguments)
        if arguments["state"] in RESTING:
            signals.send(signals.job_finished, sender, **arguments)

    after_commit(announce)


def reaped(lease: Lease, sender: Any, target: states.State, why: str) -> None:
    """The reaper ended ``lease``'s attempt (its lease expired, or its maximum runtime passed)
    and moved the job to ``target``: logged as a failure of the attempt, and announced
    (``attempt_finished`` with the outcome ``lease_expired``, then ``job_finished`` when the
    job is at rest) once that write has committed."""
    outcome = "lease_expired"
    logged_end(lease, outcome, target, why=why, failure=target != states.State.CANCELLED)
    if not (signals.attempt_finished.receivers or signals.job_finished.receivers):
        return
    arguments = {
        **_arguments(lease),
        "outcome": outcome,
        "state": target.value,
        "error": None,
    }

    def announce() -> None:
        signals.send(signals.attempt_finished, sender, **arguments)
        if target.value in RESTING:
            signals.send(signals.job_finished, sender, **arguments)

    after_commit(announce)


def abandoned(ctx: JobContext, error: BaseException) -> None:
    """``ctx``'s end could not be written (the database failed): its span ends with the error;
    no signal is sent (the reaper moves the job on once its lease expires)."""
    tracing.end_attempt(ctx.span, "error", error)
    ctx.span = None
