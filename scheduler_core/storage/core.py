"""The core of every driver: its connection and transactions, and the fenced writes on behalf of
an attempt (renewal, finish, refusals) with the reads they need. The operations each database
writes in its own SQL are declared in :mod:`.vendor_ops`; the contract is :mod:`.contract`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, F, OuterRef, Q

import scheduler_core.hooks as hooks

from ..conf import tenure_settings
from ..domain import states
from ..domain.outcomes import Decision, Kind
from ..exceptions import (
    AttemptOverrun,
    EffectsUnsettled,
    JobCancelled,
    StaleAttempt,
)
from ..models import (
    Attempt,
    AuditEntry,
    Effect,
    EffectEvent,
    Job,
    StaleWrite,
)
from .clock import DbNow, to_datetime
from .records import (
    CLAIMED_JOB_COLUMNS,
    SPEC_COLUMNS,
    Failure,
    Holds,
    Lease,
    lease_from_row,
    still_open,
)
from .vendor_ops import VendorOps
from .workflows import WorkflowOps

log = logging.getLogger("tenure.storage")

_MOVES_STEPS = (*states.TERMINAL, states.State.INDETERMINATE)
"""The ends of a workflow step's attempt that move its workflow's other steps."""


class DriverCore(VendorOps, WorkflowOps):
    """The named operations on one database alias, for one vendor.

    Every operation runs on :attr:`alias`. Those with ``lease`` are fenced writes on behalf of
    that attempt; the others name what they touch. Vendor drivers override the operations
    marked *vendor* (:class:`~.vendor_ops.VendorOps`) and set the capability flags.
    """

    vendor = ""
    """The Django vendor this driver speaks to (``connection.vendor``)."""
    skips_locked_rows = False
    """Capability: candidate rows can be locked ``SKIP LOCKED`` (many claimers and reapers
    take disjoint rows); without it the database serialises writers."""
    one_writer = False
    """Capability: the database has one write lock, which a write transaction holds from its
    first statement to its end (a writer waits for every other)."""
    has_transaction_ids = False
    """Capability: a transaction's id can be read before ``COMMIT`` and its outcome asked
    afterwards (:meth:`transaction_id`, :meth:`transaction_status`)."""
    now_sql = ""
    """The database-clock expression for this vendor's raw SQL (``%`` escaped)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    # -- connections and transactions ----------------------------------------------------------

    @property
    def connection(self) -> Any:
        """This thread's Django connection to :attr:`alias`."""
        return connections[self.alias]

    def atomic(self, *, savepoint: bool = True) -> AbstractContextManager[Any]:
        """A transaction (or savepoint) on :attr:`alias`; with ``savepoint`` False, inside
        another it adds nothing (an error inside ends the enclosing one)."""
        return transaction.atomic(using=self.alias, savepoint=savepoint)

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current transaction on :attr:`alias` commits (at once outside
        one)."""
        transaction.on_commit(fn, using=self.alias)

    # -- fenced writes on behalf of an attempt, and the reads they need ------------------------

    def _mine(self, lease: Lease, transition: states.Transition | None = None) -> Any:
        """The job row, only while it is still ``lease``'s: the guard of every attempt write.

        ``transition`` (default: any write that keeps the job leased) supplies the source states.
        """
        sources = transition.sources if transition else {states.State.LEASED}
        # The state as ``(…) IS TRUE``: written plainly, the leases index (leased jobs only)
        # could serve it and be read whole, past every entry a held snapshot keeps
        # (records.still_open says how the open-attempt index was).
        qs = Job.objects.using(self.alias).filter(
            Holds(Q(state__in=list(sources))), pk=lease.job_id
        )
        return qs.filter(**self._fence_of(lease))

    def _fence_of(self, lease: Lease) -> dict[str, Any]:
        """The fence part of every attempt write's guard, as ORM lookups: the job's fence is
        still this attempt's (a driver's own statements say the same in their text)."""
        return {"fence": lease.fence}

    def refusal(self, lease: Lease, write: str) -> StaleAttempt | EffectsUnsettled | JobCancelled:
        """Why a fenced write on behalf of ``lease`` matched no row, as the exception to raise.

        :class:`StaleAttempt` when the job is no longer leased under this fence (or, for a write
        that needs it, the lease has expired); :class:`AttemptOverrun` when the attempt still holds
        the fence but is past its maximum runtime; for a completion, :class:`EffectsUnsettled`
        when the ledger holds an effect that may or may not have happened, and
        :class:`~scheduler_core.exceptions.JobCancelled` when an operator asked the attempt to
        stop and no effect of the job was applied (a completion would claim work called off;
        the caller ends the job ``cancelled``). Read only after a refusal, so the common path
        pays nothing for it.
        """
        mine = self._mine(lease)
        if not mine.exists():
            return StaleAttempt(lease.job_id, lease.fence, write)
        if mine.filter(deadline_at__lte=DbNow()).exists():
            return AttemptOverrun(lease.job_id, lease.fence, write)
        if write == states.COMPLETE.name:
            keys = sorted(self.unsettled_of_job(lease.job_id).values_list("key", flat=True))
            if keys:
                return EffectsUnsettled(lease.job_id, keys)
            if mine.filter(cancel_requested_at__isnull=False).exists():
                return JobCancelled(
                    f"job {lease.job_id}: an operator asked the attempt to stop and no effect "
                    "was applied",
                    job_id=lease.job_id,
                    write=write,
                )
        return StaleAttempt(lease.job_id, lease.fence, write)

    def renew_lease(self, lease: Lease) -> list[dict[str, Any]]:
        """*Vendor.* The lease renewal (each database's ``RENEW_LEASE``) for ``lease``: its rows (one, or none when refused)."""
        raise NotImplementedError

    def heartbeat(self, lease: Lease) -> bool:
        """Extend the lease by ``lease_seconds`` from the database's now; returns whether an
        operator has asked the attempt to stop (``Job.cancel_requested_at``), read by the
        renewal statement itself.

        Raises :class:`StaleAttempt` when the job is no longer leased under this fence, and
        :class:`AttemptOverrun` once the attempt is past its maximum runtime: a lease is never
        renewed past the attempt's deadline, so a hung handler is not held forever (a cancel
        request it ignores ends there too).
        """
        with transaction.atomic(using=self.alias):
            rows = self.renew_lease(lease)
            if len(rows) != 1:
                raise self.refusal(lease, "heartbeat")
            # The attempt's row holds the same lease as the job's, to the microsecond.
            Attempt.objects.using(self.alias).filter(still_open(), pk=lease.attempt_id).update(
                heartbeat_at=to_datetime(rows[0]["heartbeat_at"]),
                lease_expires_at=to_datetime(rows[0]["lease_expires_at"]),
            )
        return rows[0]["cancel_requested_at"] is not None

    def assert_current(
        self, lease: Lease, write: str, *, lease_valid: bool = True, not_cancelled: bool = False
    ) -> None:
        """Lock the job row and check ``lease`` still owns it (and, by default, is unexpired and
        within its maximum runtime; with ``not_cancelled``, that no operator asked it to stop).

        Used before an effect starts: a paused attempt whose lease ran out, or a hung one past its
        maximum runtime, cannot begin one, even if the reaper has not yet moved the job; nor can
        an attempt asked to stop (:class:`~scheduler_core.exceptions.JobCancelled`).
        """
        qs = self._mine(lease)
        if lease_valid:
            qs = qs.filter(lease_expires_at__gt=DbNow(), deadline_at__gt=DbNow())
        if not_cancelled:
            qs = qs.filter(cancel_requested_at__isnull=True)
        # A no-op write takes the row lock, so the check holds until this transaction ends.
        if qs.update(heartbeat_at=F("heartbeat_at")) != 1:
            raise (
                self._refused_intent(lease, write) if not_cancelled else self.refusal(lease, write)
            )

    def _refused_intent(self, lease: Lease, write: str) -> Exception:
        """Why an effect intent was refused: the attempt's ownership first, then a cancel
        request (read only after a refusal)."""
        why = self.refusal(lease, write)
        if (
            type(why) is StaleAttempt
            and self._mine(lease).filter(cancel_requested_at__isnull=False).exists()
        ):
            return JobCancelled(
                f"job {lease.job_id}: no effect starts after an operator asked the attempt to stop",
                job_id=lease.job_id,
                write=write,
            )
        return why

    def finish(
        self,
        lease: Lease,
        decision: Decision,
        *,
        outcome: str,
        failure: Failure | None = None,
        expired_for: float | None = None,
        result: Any = None,
    ) -> None:
        """End ``lease``'s attempt with ``decision``'s transition, fenced.

        Joins an open transaction (transactional jobs complete inside the handler's transaction),
        so a refusal raised here rolls the handler's writes back with it. ``expired_for`` (the
        reaper's) adds "and the lease expired at least that many seconds ago" to the guard.
        ``result`` (a completion's) is written on the attempt's row only when the guarded
        update matched.
        """
        t = decision.transition
        fields: dict[str, Any] = {
            "state": t.target,
            "updated_at": DbNow(),
            "version": F("version") + 1,
            "lease_owner": "",
            "lease_expires_at": None,
            "reason": decision.reason[:2000],
        }
        if failure is not None:
            fields["last_error"] = f"{failure.error_type}: {failure.message}"[:2000]
        if t.target == states.State.WAITING:
            fields["run_at"] = DbNow(decision.delay)
            # The dispatcher sends a fresh hint once the job is due again.
            fields["hinted_at"] = None
            fields["next_kind"] = decision.next_kind.value
            if not decision.spend_attempt:
                fields["attempts"] = F("attempts") - 1
        else:
            fields["next_kind"] = Kind.RUN.value
        if t.target in states.TERMINAL:
            fields["finished_at"] = DbNow()
        guard = self._mine(lease, t)
        if expired_for is not None:
            guard = guard.filter(lease_expires_at__lt=DbNow(-expired_for))
        if t == states.COMPLETE:
            # Succeeded means the effect happened once: not past the attempt's maximum runtime,
            # and never while the ledger says an effect may or may not have happened; after a
            # cancel request, only when an effect had been applied (the work was done).
            guard = (
                guard.filter(deadline_at__gt=DbNow())
                .exclude(Exists(self.unsettled_of_job(OuterRef("pk"))))
                .filter(
                    Q(cancel_requested_at__isnull=True)
                    | Exists(self.applied_of_job(OuterRef("pk")))
                )
            )
        if t in (states.CANCEL, states.REAP_CANCEL):
            # An attempt ends its job cancelled only after an operator asked it to stop.
            guard = guard.filter(cancel_requested_at__isnull=False)
        # No savepoint (two round trips per attempt): a refusal writes nothing and is raised after
        # the block, so an enclosing transaction (the reaper's loop) goes on; a database error
        # inside ends the enclosing transaction, as it does on PostgreSQL in any case.
        with transaction.atomic(using=self.alias, savepoint=False):
            mine = guard.update(**fields) == 1
            if mine:
                self._close_attempt(lease.attempt_id, outcome, failure, result)
                if t.target != states.State.SUCCEEDED:
                    # Whatever this attempt intended and did not settle may or may not have
                    # happened: say so in the ledger, whatever the job's next state.
                    self._mark_unsettled(lease, duplicate_possible=decision.duplicate_possible)
                if lease.workflow_id is not None and t.target in _MOVES_STEPS:
                    # The other steps move in this transaction: a refused end moves none.
                    self.step_ended(lease.job_id, t.target)
        if not mine:
            if t == states.COMPLETE:
                raise self.refusal(lease, t.name)
            raise StaleAttempt(lease.job_id, lease.fence, t.name)

    def complete_and_claim(
        self,
        lease: Lease,
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        result: Any = None,
    ) -> tuple[int | None, list[Lease]]:
        """:func:`complete` ``lease`` and :func:`claim` up to ``limit`` more jobs in the caller's
        transaction; the claims stand only if that transaction commits.

        On PostgreSQL both are one prepared statement (the claim's and the completion's ``WITH``
        parts together), returning the transaction's id as :func:`complete` does. A refused
        completion raises :class:`StaleAttempt`; the caller's rollback then undoes the claims too.
        """
        xid, matched, got = self.complete_many_and_claim(
            [lease],
            executor=executor,
            queues=queues,
            limit=limit,
            results=None if result is None else {lease.attempt_id: result},
        )
        if lease.job_id not in matched:
            raise self.refusal(lease, states.COMPLETE.name)
        return xid, got

    def _close_attempt(
        self, attempt_id: int, outcome: str, failure: Failure | None, result: Any = None
    ) -> None:
        fields: dict[str, Any] = {"outcome": outcome, "finished_at": DbNow()}
        if result is not None:
            fields["return_value"] = result
        if failure is not None:
            limit = tenure_settings().TRACEBACK_MAX_CHARS
            fields.update(
                error_class=failure.error_class,
                error_type=failure.error_type[:200],
                message=failure.message[:4000],
                traceback=failure.traceback[-limit:],
            )
        Attempt.objects.using(self.alias).filter(still_open(), pk=attempt_id).update(**fields)

    def _mark_unsettled(self, lease: Lease, *, duplicate_possible: bool) -> None:
        """An attempt ended without settling its effect intents: their outcome is unknown, and
        stays so (``in_doubt``) until a stated fact settles it."""
        left = list(
            Effect.objects.using(self.alias)
            .filter(job_id=lease.job_id, state=Effect.INTENDED)
            .values_list("pk", flat=True)
        )
        if not left:
            return
        extra: dict[str, Any] = {"duplicate_possible": True} if duplicate_possible else {}
        Effect.objects.using(self.alias).filter(pk__in=left, state=Effect.INTENDED).update(
            state=Effect.UNKNOWN, in_doubt=True, updated_at=DbNow(), **extra
        )
        for pk in left:
            self._event(
                pk,
                lease,
                EffectEvent.LEFT_UNSETTLED,
                Effect.UNKNOWN,
                in_doubt=True,
                note=f"attempt {lease.number} (fence {lease.fence}) ended without recording the "
                "outcome of its intent",
            )

    def _event(
        self,
        effect_id: int,
        lease: Lease | None,
        event: str,
        state_after: str,
        *,
        in_doubt: bool,
        note: str = "",
        actor: str = "",
    ) -> None:
        """Append one entry to the ledger's history (in the caller's transaction)."""
        EffectEvent.objects.using(self.alias).create(
            effect_id=effect_id,
            attempt_id=lease.attempt_id if lease and lease.attempt_id else None,
            fence=lease.fence if lease else None,
            event=event,
            state_after=state_after,
            in_doubt_after=in_doubt,
            actor=actor[:150],
            note=note[:2000],
            created_at=DbNow(),
        )

    def record_stale(self, err: StaleAttempt, executor: str = "") -> None:
        """Record a refused write as evidence (``jobs_status`` counts these)."""
        log.warning("stale write refused: %s (executor %s)", err, executor)
        hooks.event("refused", job=err.job_id, fence=err.fence, write=err.write, executor=executor)
        try:
            StaleWrite.objects.using(self.alias).create(
                job_id=err.job_id, fence=err.fence, write=err.write[:30], executor=executor[:200]
            )
        except Exception:  # the evidence is best effort; the refusal itself already held
            log.exception("could not record stale write for job %s", err.job_id)

    def _older_than(self, when: datetime, seconds: float) -> bool:
        return bool((self.now() - when).total_seconds() > seconds)

    def lease_of(self, job: Job) -> Lease:
        """The lease ``job`` (a leased row) was claimed under, for a write on its behalf by
        someone other than its owner (the reaper)."""
        attempt_id = (
            Attempt.objects.using(self.alias)
            .filter(job_id=job.pk, fence=job.fence)
            .values_list("pk", flat=True)
            .first()
        )
        row = {c: getattr(job, c) for c in CLAIMED_JOB_COLUMNS}
        row.update({c: getattr(job.spec, c) for c in SPEC_COLUMNS}, attempt_id=attempt_id or 0)
        # A claim leaves run_at as it found it: while leased, it is where the job stood. Not
        # the claim's: the row's heartbeat is the last renewal, not the claim's time, and
        # a write on someone else's behalf continues no trace of the job's.
        row.update(heartbeat_at=None, trace_context=None)
        return lease_from_row(row, executor=job.lease_owner, sent=0.0)

    def queue_of(self, job_id: int) -> str | None:
        """The queue of job ``job_id`` (None when there is no such job)."""
        return (
            Job.objects.using(self.alias).filter(pk=job_id).values_list("queue", flat=True).first()
        )

    def leased_job(self, lease: Lease) -> Job | None:
        """``lease``'s job while it is still leased under that fence (else None)."""
        return self._mine(lease).first()  # type: ignore[no-any-return]

    def audit(self, **fields: Any) -> AuditEntry:
        """Append one entry to the operators' audit trail (in the caller's transaction)."""
        return AuditEntry.objects.using(self.alias).create(**fields)

    def unsettled_of_job(self, job: Any) -> Any:
        """The ledger rows of ``job`` (a value, or ``OuterRef("pk")`` in a subquery) whose effect
        may or may not have happened: the one definition of "unsettled"."""
        return Effect.objects.using(self.alias).filter(
            job_id=job, state__in=[Effect.INTENDED, Effect.UNKNOWN]
        )

    def applied_of_job(self, job: Any) -> Any:
        """The ledger rows of ``job`` (a value, or ``OuterRef("pk")``) recorded applied."""
        return Effect.objects.using(self.alias).filter(job_id=job, state=Effect.APPLIED)
