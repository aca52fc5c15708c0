"""Several attempts' completions written together, with the claim of the next jobs, in one
statement and one commit: the broker-less worker's group write and a Celery chain's."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import DatabaseError

import scheduler_core.hooks as hooks

from ..exceptions import EffectsUnsettled, JobCancelled, StaleAttempt
from ..models import Attempt
from ..read import metrics
from ..storage.drivers import driver
from ..storage.records import Lease
from .attempt import end_cancelled, end_with_error
from .completion import commit_and_read_back
from .context import JobContext
from .heartbeat import Heartbeater
from .observe import abandoned, finished

log = logging.getLogger("tenure.executor")


@dataclass
class Written:
    """What one write of several completions (and a claim) did, once its commit is known.

    ``ended`` pairs each attempt whose end is now known with its outcome (``succeeded``, or
    how a refused completion ended: ``stale``, or the ambiguous failure its effect mode
    decides); an attempt absent from it is left to its lease, which then expires and the
    reaper applies the job's rules. ``got`` holds the jobs claimed in the same commit.
    """

    ended: list[tuple[Lease, str]] = field(default_factory=list)
    got: list[Lease] = field(default_factory=list)


def write_completions(
    pending: Sequence[JobContext],
    *,
    executor_id: str,
    queues: Sequence[str],
    want: int,
    heartbeater: Heartbeater,
) -> Written:
    """Write the completions of ``pending`` (attempts whose handlers returned) and claim up to
    ``want`` jobs of ``queues``, in one statement and one commit
    (:func:`scheduler_core.storage.base.Driver.complete_many_and_claim`); take every one of ``pending`` out of
    ``heartbeater``.

    Each completion is fenced by its own lease; one the statement left out is asked why
    (:func:`scheduler_core.storage.base.Driver.refusal`) once the rest has committed: taken over or past its
    maximum runtime, it is recorded as a refused write; refused while the job's ledger holds an
    effect that may or may not have happened, the attempt ends as that ambiguous failure under
    the job's effect mode, never as a success. A commit whose outcome cannot be told (the
    database lost) leaves every attempt to its lease and runs none of the claims.
    """
    leases = [ctx.lease for ctx in pending]
    results = {c.lease.attempt_id: c.result for c in pending if c.result is not None}
    matched: set[int] = set()
    got: list[Lease] = []

    def write() -> int | None:
        # Each try starts afresh; what counts is the try whose commit is known. With no
        # completion to write this is the claim alone, still in a transaction of its own whose
        # id says, after a lost reply, whether the claims stand.
        matched.clear()
        got.clear()
        hooks.failpoint("before_group_commit")
        xid, done, claimed = driver().complete_many_and_claim(
            leases, executor=executor_id, queues=queues, limit=want, results=results
        )
        matched.update(done)
        got.extend(claimed)
        return xid

    def landed() -> bool:
        # Without a transaction id (SQLite), a row the transaction wrote tells.
        attempts = Attempt.objects.using(driver().alias)
        done = [lease for lease in leases if lease.job_id in matched]
        if done:
            return bool(attempts.filter(pk=done[0].attempt_id, outcome="succeeded").exists())
        if got:
            g = got[0]
            return bool(
                attempts.filter(
                    pk=g.attempt_id, job_id=g.job_id, fence=g.fence, executor=g.executor
                ).exists()
            )
        return True  # it wrote nothing: nothing of it can stand or be lost

    try:
        commit_and_read_back(write, landed=landed, xid_from_fn=True)
    except DatabaseError as e:
        # Not written, or not known to be: the jobs stay leased under these attempts until
        # their leases expire, then run again; claims made with them are not run.
        log.warning(
            "could not write %d completions (%s); they are left to their leases, and %d jobs "
            "claimed with them are not run",
            len(pending),
            e,
            len(got),
        )
        for ctx in pending:
            heartbeater.remove(ctx)
            abandoned(ctx, e)
        return Written()
    out = Written(got=list(got))
    for ctx in pending:
        heartbeater.remove(ctx)
        if ctx.lease.job_id in matched:
            out.ended.append((ctx.lease, "succeeded"))
            finished(ctx, ctx.sender, "succeeded")
        else:
            outcome = _refused_completion(ctx, executor_id)
            if outcome is not None:
                out.ended.append((ctx.lease, outcome))
                finished(ctx, ctx.sender, outcome)
            else:
                abandoned(ctx, RuntimeError("completion refused, and why could not be read"))
    return out


def _refused_completion(ctx: JobContext, executor_id: str) -> str | None:
    """A completion a committed group write left out: ask why and act on the answer; the
    attempt's outcome, or None when why could not be read (left to its lease)."""
    lease = ctx.lease
    try:
        why = driver().refusal(lease, "complete")
        if isinstance(why, EffectsUnsettled):
            # The handler returned, but an effect may or may not have happened: the attempt
            # ends as that ambiguous failure, under the job's effect mode.
            return end_with_error(ctx, why)
        if isinstance(why, JobCancelled):
            # An operator asked the attempt to stop and no effect was applied: cancelled.
            return end_cancelled(ctx, why)
        # Taken over, or past its maximum runtime (AttemptOverrun).
        metrics.stale_refused(why.write)
        driver().record_stale(why, executor_id)
        return "stale"
    except StaleAttempt as e:
        metrics.stale_refused(e.write)
        driver().record_stale(e, executor_id)
        return "stale"
    except DatabaseError as e:
        log.warning("job %s: completion refused, and why could not be read (%s)", lease.job_id, e)
        return None
