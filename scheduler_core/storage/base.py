"""The storage layer's contract: the values a driver hands out (:class:`Lease`,
:class:`Failure`, :class:`InFlightOwner`) and :class:`Driver`, the named operations every
database's driver implements (``storage/postgres.py``, ``storage/sqlite.py``).

A driver is the one place that writes a job's state, fence and lease. Each write names a
transition from :mod:`scheduler_core.domain.states`; the transition's source states become the
write's ``WHERE state IN (...)`` guard, and every write made on behalf of an attempt also
carries ``fence = <the attempt's fence>``. A write that matches no row raises
:class:`~scheduler_core.exceptions.StaleAttempt` (the caller stops and records the refusal with
:meth:`Driver.record_stale`); nothing is ever read and then written unconditionally. Lease
times come from the database's clock (:mod:`scheduler_core.storage.clock`), never a worker's.

The operations written with Django's ORM, which says the same thing on every database, are
defined here once; the ones whose SQL differs are abstract here and written by each driver.
Nothing here decides policy: what follows an attempt (retry, park, fail) arrives as a
:class:`~scheduler_core.domain.outcomes.Decision` made above, by the runtime and the services.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, DurationField, Exists, ExpressionWrapper, F, Max, OuterRef, Q

import scheduler_core.hooks as hooks

from ..conf import executor_stale_seconds, tenure_settings
from ..domain import outcomes, states
from ..domain import queues as queue_limits
from ..domain.modes import EffectMode
from ..domain.outcomes import Decision, Kind
from ..domain.payload_search import PayloadQuery
from ..exceptions import (
    AttemptOverrun,
    EffectsUnsettled,
    Indeterminate,
    JobCancelled,
    StaleAttempt,
)
from ..models import (
    Attempt,
    AuditEntry,
    CountSnapshot,
    Effect,
    EffectEvent,
    Executor,
    Installation,
    Job,
    MinuteStats,
    Queue,
    StaleWrite,
)
from .clock import DbNow, to_datetime

log = logging.getLogger("tenure.storage")


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a claim grants: the right to act for one attempt of one job, until it expires."""

    job_id: int
    fence: int
    attempt: int
    attempt_id: int
    kind: str
    name: str
    queue: str
    payload: dict[str, Any]
    lease_seconds: int
    effect: str
    max_attempts: int
    created_at: datetime
    executor: str
    timeout_seconds: float = 0.0
    """The attempt's maximum runtime (the job's ``timeout_seconds``); 0 when unknown. The
    database holds the deadline (``Job.deadline_at``); this lets the executor stop renewing
    on its own clock too."""
    priority: int = 0
    due_at: datetime | None = None
    """The job's ``run_at`` when it was claimed: where it stood in the claim order."""
    granted_at: float = field(default=0.0, compare=False)
    """This process's monotonic clock just before the claim was sent: the lease cannot
    expire before ``granted_at + lease_seconds`` (0 when unknown)."""
    claimed_at: datetime | None = field(default=None, compare=False)
    """When the claim took the job, by the database's clock (None when unknown)."""


@dataclass(frozen=True, kw_only=True)
class Failure:
    """What went wrong in an attempt, for its record."""

    error_class: str
    error_type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, kw_only=True)
class InFlightOwner:
    """An earlier owner of a job that may still act for it: its attempt was ended by the
    reaper (lease expired), and its executor is not known to have stopped. Paused between its
    last check and its call to the destination, it makes that call when it resumes; only a
    destination that checks the fencing token can refuse it."""

    attempt: int
    fence: int
    executor: str
    last_heartbeat: datetime | None
    reaped_at: datetime | None
    executor_last_seen: datetime | None
    """The executor's own last liveness beat (None: no row for it)."""


def new_executor_id(kind: str = "exec") -> str:
    """A unique executor identity: ``host:pid:uuid``."""
    return f"{socket.gethostname()}:{os.getpid()}:{kind}-{uuid.uuid4().hex[:10]}"


INSTALLATION_ID_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)

_installation: dict[str, str] = {}


def check_installation_id(value: str) -> str:
    """``value`` if it can name an installation in effect keys; else ``ValueError``."""
    if not 1 <= len(value) <= 40 or not set(value) <= INSTALLATION_ID_CHARS:
        raise ValueError(
            f"installation id {value!r} must be 1..40 letters, digits, '.', '_' or '-'"
        )
    return value


def _with_note(old: str, new: str) -> str:
    """The ledger's note keeps its history: each cause is appended, the newest kept whole."""
    return (f"{old}; {new}" if old else new)[-2000:]


LEASE_COLUMNS = (
    "id",
    "fence",
    "attempts",
    "next_kind",
    "name",
    "queue",
    "payload",
    "lease_seconds",
    "effect",
    "max_attempts",
    "created_at",
    "run_at",
    "heartbeat_at",
    "priority",
    "timeout_seconds",
    "attempt_id",
)
"""The columns of a claimed row every driver's claim returns, by these names: the job as the
claim left it, then its new attempt's id. :func:`leases_from_rows` reads them."""


CLAIM_SET = """
    state = 'leased', fence = {t}fence + 1, attempts = {t}attempts + 1, lease_owner = %s,
    lease_expires_at = {expiry}, deadline_at = {deadline}, heartbeat_at = {now},
    updated_at = {now}, version = {t}version + 1
"""
"""The claim's ``SET`` list, every driver's: ``{t}`` the table's alias with its dot (or
nothing), ``{now}``, ``{expiry}`` and ``{deadline}`` the vendor's expressions; its one
placeholder is the new owner."""

CLAIMED_JOB_COLUMNS = LEASE_COLUMNS[:-1]
"""The job columns a claim returns (:data:`LEASE_COLUMNS` without the attempt's id)."""

ATTEMPT_INSERT = """
    INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at,
        lease_expires_at, heartbeat_at, outcome, error_class, error_type, message, traceback)
    SELECT id, attempts, fence, next_kind, lease_owner, heartbeat_at, lease_expires_at,
        heartbeat_at, '', '', '', '', ''
"""
"""The Attempt row of each claimed job, read from the job as the claim left it (a driver
adds its ``FROM``)."""

HEARTBEAT_SQL = f"""
    UPDATE tenure_job SET lease_expires_at = {{expiry}}, heartbeat_at = {{now}}
    WHERE id = %s AND state = '{states.State.LEASED.value}' AND fence = %s
        AND deadline_at > {{now}}
    RETURNING cancel_requested_at
"""
"""The lease renewal, every driver's: ``{now}`` and ``{expiry}`` (the database's now plus the
lease, its one placeholder first) are the vendor's expressions; then the job id and the fence.
It returns whether an operator asked the attempt to stop, so the attempt learns it from the
renewal it makes anyway."""
RESTRICTED_QUEUE = "(tq.paused OR tq.max_leased IS NOT NULL OR tq.max_per_second IS NOT NULL)"
"""A ``tenure_queue`` row (alias ``tq``) that stops the plain claim: paused, or limited."""

LIMITED_QUEUE = "(NOT tq.paused AND (tq.max_leased IS NOT NULL OR tq.max_per_second IS NOT NULL))"
"""A ``tenure_queue`` row (alias ``tq``) whose jobs are claimed within its limits
(:meth:`Driver.claim_within_limits`)."""


def open_queue(queue: str) -> str:
    """The claim's gate, every driver's: the job's queue (``queue``: a placeholder, or the
    column of the queue being read) has no ``tenure_queue`` row that pauses or limits it. A
    primary-key probe of a table that holds only the queues an operator configured, once per
    queue read where ``queue`` is not the job's own column (a filter evaluated once, which
    keeps the claim index's ordered walk); a queue without a row has no limits."""
    return (
        f"NOT EXISTS (SELECT 1 FROM tenure_queue AS tq WHERE tq.name = {queue} "
        f"AND {RESTRICTED_QUEUE})"
    )


PRUNABLE = (states.State.SUCCEEDED.value, states.State.FAILED.value)
"""The states whose jobs retention deletes."""


ROLLUP_COUNTS = ("succeeded", "failed", "indeterminate", "retried", "claims")
"""The counted columns of a ``MinuteStats`` row."""

ALL_STATES = tuple(st.value for st in states.State)
"""Every job state, so a filter on the state index's second column can use it."""

ROLLUP_MARGIN = timedelta(seconds=60)
"""How much earlier than an attempt's claim or end its job's ``updated_at`` may be: the two
are stamped by separate statements of one transaction."""

WAIT_UNKNOWN_STATES = (states.State.WAITING.value, states.State.CANCELLED.value)
"""A job in these states no longer carries its latest claim's due time (``run_at``)."""

_ROLLUP_DIRECT = {"succeeded", "failed", "indeterminate", "retried"}


def rollup_outcome(outcome: str, latest: bool, job_state: str) -> str | None:
    """What an ended attempt counts as in the history: ``succeeded``, ``failed``,
    ``indeterminate`` or ``retried``, or None (snoozed, released, cancelled).

    An attempt's own outcome says so when it ended the job or retried it; one ended by the
    reaper (``lease_expired``) or a reconcile lookup counts as what its job became when it is
    still the job's latest attempt, else as retried (another attempt followed it)."""
    if outcome in _ROLLUP_DIRECT:
        return outcome
    if outcome == "lease_expired" or outcome.startswith("reconciled_"):
        if latest and job_state in ("succeeded", "failed", "indeterminate"):
            return job_state
        return "retried" if not latest or job_state == "waiting" else None
    return None


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` (sorted), interpolated linearly between the closest
    ranks as PostgreSQL's ``percentile_cont`` is; None when empty."""
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def leases_from_rows(rows: Sequence[dict[str, Any]], *, executor: str, sent: float) -> list[Lease]:
    """Leases from claimed rows (each a mapping of :data:`LEASE_COLUMNS`), in the claim's order
    (priority, then due time, then id): a statement returns them in any order. ``sent`` is this
    process's monotonic clock just before the claim was sent."""
    leases = []
    for r in sorted(rows, key=lambda r: (-r["priority"], to_datetime(r["run_at"]), r["id"])):
        payload = r["payload"]
        if isinstance(payload, str | bytes):
            payload = json.loads(payload)
        leases.append(
            Lease(
                job_id=r["id"],
                fence=r["fence"],
                attempt=r["attempts"],
                attempt_id=r["attempt_id"],
                kind=r["next_kind"],
                name=r["name"],
                queue=r["queue"],
                payload=payload,
                lease_seconds=r["lease_seconds"],
                effect=r["effect"],
                max_attempts=r["max_attempts"],
                created_at=to_datetime(r["created_at"]),
                executor=executor,
                timeout_seconds=float(r["timeout_seconds"]),
                priority=r["priority"],
                due_at=to_datetime(r["run_at"]),
                granted_at=sent,
                claimed_at=to_datetime(r["heartbeat_at"]),
            )
        )
    return leases


def named_rows(cursor: Any) -> list[dict[str, Any]]:
    """A DB-API cursor's remaining rows as mappings of column name to value."""
    cols = [c[0] for c in cursor.description]
    return [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]


class Driver:
    """The named operations on one database alias, for one vendor.

    Every operation runs on :attr:`alias`. Those with ``lease`` are fenced writes on behalf of
    that attempt; the others name what they touch. Vendor drivers override the operations
    marked *vendor* (abstract here) and set the capability flags.
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

    # -- connections and transactions ----------------------------------------------------

    @property
    def connection(self) -> Any:
        """This thread's Django connection to :attr:`alias`."""
        return connections[self.alias]

    def atomic(self) -> AbstractContextManager[Any]:
        """A transaction (or savepoint) on :attr:`alias`."""
        return transaction.atomic(using=self.alias)

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current transaction on :attr:`alias` commits (at once outside
        one)."""
        transaction.on_commit(fn, using=self.alias)

    def now(self) -> datetime:
        """The database's clock (an aware datetime)."""
        with self.connection.cursor() as cur:
            cur.execute("SELECT " + self.now_sql, [])
            return to_datetime(cur.fetchone()[0])  # type: ignore[no-any-return]

    def transaction_id(self) -> int | None:
        """*Vendor.* This transaction's id, assigned now (None without the capability)."""
        return None

    def transaction_status(self, xid: int) -> str | None:
        """*Vendor.* ``committed``, ``aborted`` or ``in progress`` for transaction ``xid``
        (None: too old to tell, or no such capability)."""
        return None

    def configure_executor_connection(self, connection: Any) -> None:
        """*Vendor.* Settings an executor's connection needs, applied as it opens (the
        server ends an executor's idle transactions; hot statements planned once)."""

    def limit_handler_idle(self) -> None:
        """*Vendor.* Inside a ``transactional`` handler's transaction: the handler may work
        between statements for longer than an executor's own transactions may idle."""

    # -- claims and completions (vendor) ------------------------------------------------

    def claim(
        self,
        *,
        executor: str,
        queues: Sequence[str] = ("default",),
        limit: int = 1,
        job_id: int | None = None,
    ) -> list[Lease]:
        """*Vendor.* Claim up to ``limit`` due waiting jobs (or exactly ``job_id``) in one
        statement: each claimed job's fence grows by one, its lease runs from the database's
        clock, and an Attempt row is written in the same transaction."""
        raise NotImplementedError

    def complete(self, lease: Lease) -> int | None:
        """*Vendor.* Mark ``lease``'s job succeeded (fenced): :meth:`finish`'s writes for
        ``COMPLETE``, refused past the attempt's deadline or while the ledger holds an effect
        that may or may not have happened. Returns the transaction's id where the driver has
        one (to read the outcome back after a lost ``COMMIT`` reply)."""
        raise NotImplementedError

    def complete_many_and_claim(
        self, leases: Sequence[Lease], *, executor: str, queues: Sequence[str], limit: int
    ) -> tuple[int | None, set[int], list[Lease]]:
        """*Vendor.* :meth:`complete` each of ``leases`` and :meth:`claim` up to ``limit`` more
        jobs in the caller's transaction: one commit for many completions. Each completion is
        fenced on its own; a refused one is left out (the caller asks :meth:`refusal` why once
        the rest has committed). Returns the transaction's id (None without one), the ids of
        the jobs completed and the new leases, which stand only if the transaction commits."""
        raise NotImplementedError

    def claim_limited_queue(
        self, queue: str, *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """*Vendor.* :meth:`claim` of ``queue``'s due jobs (or exactly ``job_id`` of it)
        without the gate that keeps paused and limited queues out of the plain claim: only
        :meth:`claim_within_limits` calls it, holding the queue's row and with ``limit`` what
        the limits allow."""
        raise NotImplementedError

    # -- wake-ups (vendor) ----------------------------------------------------------------

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        """*Vendor.* Once the caller's transaction commits, tell listening executors a job of
        ``queue`` waits (nothing if it rolls back, or where the database has no
        notifications)."""

    def listen(self, stop: Callable[[], bool]) -> Iterator[tuple[str, int, datetime] | None]:
        """*Vendor.* Wake-ups as ``(queue, priority, due time)``, on a connection of their
        own; yields None at least every second so the caller can look at ``stop``. Ends at
        once where the database has no notifications (executors poll)."""
        return iter(())

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        """*Vendor.* This process learned that a job of ``queue`` waits (a wake-up): where
        the driver seeks claims from per-process floors, lower them to it."""

    def forget_floors(self) -> None:
        """*Vendor.* Drop what this process learned about where claims start (tests)."""

    # -- enqueue and retention (vendor) ---------------------------------------------------

    def insert_job(self, fields: dict[str, Any]) -> Job | None:
        """*Vendor.* Insert one waiting job (``fields``: the job's columns, ``run_at`` None
        for the database's now) in the caller's transaction; None when its ``unique_key`` is
        taken already (nothing written)."""
        raise NotImplementedError

    def insert_jobs(
        self, fields: dict[str, Any], payloads: Sequence[dict[str, Any]]
    ) -> list[tuple[int, datetime]]:
        """*Vendor.* Insert one waiting job per payload (the other columns from ``fields``) in
        one statement in the caller's transaction; ``(id, run_at)`` of each, in payload order."""
        raise NotImplementedError

    def prune_finished(self, state: str, older_than: float, *, limit: int = 1000) -> int:
        """*Vendor.* Delete up to ``limit`` jobs in ``state`` (succeeded or failed) last changed
        more than ``older_than`` seconds ago by the database's clock, with their attempts and
        ledger rows, keeping jobs an operator acted on and jobs whose ledger holds an effect
        that may or may not have happened. Returns how many jobs were deleted."""
        raise NotImplementedError

    # -- what the database itself says (vendor) -------------------------------------------

    def database_pressure(self) -> dict[str, Any]:
        """*Vendor.* The oldest snapshot vacuum must respect and the job table's dead rows
        (empty where the database keeps no old row versions)."""
        return {}

    def estimated_jobs(self) -> int:
        """*Vendor.* The database's estimate of the job table's rows (-1: none kept)."""
        return -1

    # -- reads for the console (vendor) -----------------------------------------------------

    def payload_contains(self, query: PayloadQuery) -> Q:
        """*Vendor.* The condition on ``Job`` that its payload contains ``query``'s fragment
        (:mod:`scheduler_core.domain.payload_search`: every leaf present with an equal value,
        a number never equal to a string)."""
        raise NotImplementedError

    # -- fenced writes, the ledger, the reaper's reads, hints, executors, operators -------

    def _mine(self, lease: Lease, transition: states.Transition | None = None) -> Any:
        """The job row, only while it is still ``lease``'s: the guard of every attempt write.

        ``transition`` (default: any write that keeps the job leased) supplies the source states.
        """
        sources = transition.sources if transition else {states.State.LEASED}
        qs = Job.objects.using(self.alias).filter(pk=lease.job_id, state__in=list(sources))
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
        """*Vendor.* :data:`HEARTBEAT_SQL` for ``lease``: its rows (one, or none when refused)."""
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
            Attempt.objects.using(self.alias).filter(pk=lease.attempt_id).update(
                heartbeat_at=DbNow(), lease_expires_at=DbNow(lease.lease_seconds)
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
    ) -> None:
        """End ``lease``'s attempt with ``decision``'s transition, fenced.

        Joins an open transaction (transactional jobs complete inside the handler's transaction),
        so a refusal raised here rolls the handler's writes back with it. ``expired_for`` (the
        reaper's) adds "and the lease expired at least that many seconds ago" to the guard.
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
        if t == states.CANCEL:
            # An attempt ends its job cancelled only after an operator asked it to stop.
            guard = guard.filter(cancel_requested_at__isnull=False)
        # No savepoint (two round trips per attempt): a refusal writes nothing and is raised after
        # the block, so an enclosing transaction (the reaper's loop) goes on; a database error
        # inside ends the enclosing transaction, as it does on PostgreSQL in any case.
        with transaction.atomic(using=self.alias, savepoint=False):
            mine = guard.update(**fields) == 1
            if mine:
                self._close_attempt(lease.attempt_id, outcome, failure)
                if t.target != states.State.SUCCEEDED:
                    # Whatever this attempt intended and did not settle may or may not have
                    # happened: say so in the ledger, whatever the job's next state.
                    self._mark_unsettled(lease, duplicate_possible=decision.duplicate_possible)
        if not mine:
            if t == states.COMPLETE:
                raise self.refusal(lease, t.name)
            raise StaleAttempt(lease.job_id, lease.fence, t.name)

    def complete_and_claim(
        self, lease: Lease, *, executor: str, queues: Sequence[str], limit: int
    ) -> tuple[int | None, list[Lease]]:
        """:func:`complete` ``lease`` and :func:`claim` up to ``limit`` more jobs in the caller's
        transaction; the claims stand only if that transaction commits.

        On PostgreSQL both are one prepared statement (the claim's and the completion's ``WITH``
        parts together), returning the transaction's id as :func:`complete` does. A refused
        completion raises :class:`StaleAttempt`; the caller's rollback then undoes the claims too.
        """
        xid, matched, got = self.complete_many_and_claim(
            [lease], executor=executor, queues=queues, limit=limit
        )
        if lease.job_id not in matched:
            raise self.refusal(lease, states.COMPLETE.name)
        return xid, got

    def _close_attempt(self, attempt_id: int, outcome: str, failure: Failure | None) -> None:
        fields: dict[str, Any] = {"outcome": outcome, "finished_at": DbNow()}
        if failure is not None:
            limit = tenure_settings().TRACEBACK_MAX_CHARS
            fields.update(
                error_class=failure.error_class,
                error_type=failure.error_type[:200],
                message=failure.message[:4000],
                traceback=failure.traceback[-limit:],
            )
        Attempt.objects.using(self.alias).filter(pk=attempt_id, finished_at__isnull=True).update(
            **fields
        )

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
                note=f"attempt {lease.attempt} (fence {lease.fence}) ended without recording the "
                "outcome of its intent",
            )

    def unsettled_of_job(self, job: Any) -> Any:
        """The ledger rows of ``job`` (a value, or ``OuterRef("pk")`` in a subquery) whose effect
        may or may not have happened: the one definition of "unsettled"."""
        return Effect.objects.using(self.alias).filter(
            job_id=job, state__in=[Effect.INTENDED, Effect.UNKNOWN]
        )

    def applied_of_job(self, job: Any) -> Any:
        """The ledger rows of ``job`` (a value, or ``OuterRef("pk")``) recorded applied."""
        return Effect.objects.using(self.alias).filter(job_id=job, state=Effect.APPLIED)

    def has_unsettled_effect(self, job_id: int) -> bool:
        """Whether an effect of the job may or may not have happened: its intent was recorded and
        no outcome since, or an attempt's outcome was unknown and no stated fact (a
        reconciliation's answer, the destination's acknowledgement, an operator's verified fact)
        has settled it. Every decision that asks "may this effect have happened?" asks this."""
        return bool(self.unsettled_of_job(job_id).exists())

    def unsettled_effects(self, job_id: int) -> list[Effect]:
        """The job's ledger rows that may or may not have happened, by name."""
        return list(self.unsettled_of_job(job_id).order_by("name"))

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

    def installation_id(self) -> str:
        """This installation's name in effect keys: ``TENURE_INSTALLATION_ID`` if set, else the
        identity made once for this database (:class:`~scheduler_core.models.Installation`)."""
        configured = tenure_settings().INSTALLATION_ID
        if configured:
            return check_installation_id(configured)
        cached = _installation.get(self.alias)
        if cached is None:
            row = (
                Installation.objects.using(self.alias)
                .filter(pk=1)
                .values_list("key", flat=True)
                .first()
            )
            if row is None:
                # The migrations make it; a database emptied since (a test flush) gets a new one.
                try:
                    with transaction.atomic(using=self.alias):
                        Installation.objects.using(self.alias).create(
                            id=1, key=secrets.token_hex(6)
                        )
                except IntegrityError:
                    pass  # another process made it first
                row = Installation.objects.using(self.alias).values_list("key", flat=True).get(pk=1)
            cached = _installation[self.alias] = str(row)
        return cached

    def _new_key(self, job_id: int, name: str) -> str:
        return f"tenure-{self.installation_id()}-{job_id}-{name}"

    def effect_key(self, job_id: int, name: str) -> str:
        """The effect's key: the installation, the work identity and the effect's name, never the
        attempt (``tenure-<installation>-<job id>-<name>``). An effect keeps the key it was first
        recorded with, whatever the installation's name became since."""
        recorded = (
            Effect.objects.using(self.alias)
            .filter(job_id=job_id, name=name)
            .values_list("key", flat=True)
            .first()
        )
        return str(recorded) if recorded is not None else self._new_key(job_id, name)

    def _in_job_transaction(self, lease: Lease) -> bool:
        """Whether this is a transactional job's attempt, running inside its own transaction."""
        return lease.effect == EffectMode.TRANSACTIONAL and connections[self.alias].in_atomic_block

    def effect_intend(self, lease: Lease, name: str) -> Effect:
        """Record the intent to perform effect ``name`` before the external call (fenced).

        Refused (:class:`StaleAttempt`) when the attempt no longer owns the job or its lease has
        expired by the database's clock, so a paused attempt cannot start a new effect, and
        (:class:`AttemptOverrun`) past the attempt's maximum runtime, and
        (:class:`~scheduler_core.exceptions.JobCancelled`) once an operator asked the attempt to
        stop: the statement's guard says ``cancel_requested_at IS NULL``. Returns the ledger row;
        a row already ``applied`` is returned unchanged for the caller to skip.

        An earlier intent whose outcome is not known (``intended`` or ``unknown``) is followed
        according to the job's mode: ``idempotent`` starts again under the same key;
        ``at_least_once`` starts again and the row records that a duplicate is possible and why;
        ``reconcilable`` and ``at_most_once`` refuse with
        :class:`~scheduler_core.exceptions.Indeterminate`, so only a reconcile attempt or an
        operator who checked the destination can unblock the effect. Starting again keeps the row
        ``in_doubt``: what this attempt then learns cannot erase the earlier unknown.

        A transactional job inside its transaction writes nothing here: its effect is a write in
        that same transaction, recorded ``applied`` by :func:`effect_settle` and committed with the
        completion or not at all. The ownership check then reads without locking, so an attempt
        paused mid-transaction holds no lock its replacement needs.
        """
        if self._in_job_transaction(lease):
            live = self._mine(lease).filter(
                lease_expires_at__gt=DbNow(),
                deadline_at__gt=DbNow(),
                cancel_requested_at__isnull=True,
            )
            if not live.exists():
                raise self._refused_intent(lease, "effect_intent")
            existing = (
                Effect.objects.using(self.alias).filter(job_id=lease.job_id, name=name).first()
            )
            return existing or Effect(
                key=self._new_key(lease.job_id, name),
                job_id=lease.job_id,
                name=name,
                state=Effect.INTENDED,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
            )
        with transaction.atomic(using=self.alias):
            self.assert_current(lease, "effect_intent", not_cancelled=True)
            row = Effect.objects.using(self.alias).filter(job_id=lease.job_id, name=name).first()
            if row is None:
                row = Effect.objects.using(self.alias).create(
                    key=self._new_key(lease.job_id, name),
                    job_id=lease.job_id,
                    name=name,
                    state=Effect.INTENDED,
                    attempt_id=lease.attempt_id,
                    fence=lease.fence,
                    created_at=DbNow(),
                    updated_at=DbNow(),
                )
                self._event(row.pk, lease, EffectEvent.INTENDED, Effect.INTENDED, in_doubt=False)
                row.refresh_from_db()
                return row
            if row.state == Effect.APPLIED:
                return row
            mode = EffectMode(lease.effect)
            unsettled = row.unsettled
            note = row.note
            cause = ""
            if unsettled:
                if mode in (EffectMode.AT_MOST_ONCE, EffectMode.RECONCILABLE):
                    raise Indeterminate(
                        f"effect {row.key} was left {row.state} by fence {row.fence}; a "
                        f"{mode.value} job does not start it again until it is settled"
                    )
                if mode == EffectMode.AT_LEAST_ONCE:
                    cause = (
                        f"duplicate possible: attempt {lease.attempt} (fence {lease.fence}) starts "
                        f"the effect again after fence {row.fence} left it {row.state}"
                    )
                else:
                    cause = (
                        f"attempt {lease.attempt} (fence {lease.fence}) retries under the same key "
                        f"after fence {row.fence} left it {row.state}"
                    )
                note = _with_note(note, cause)
            in_doubt = row.in_doubt or unsettled
            Effect.objects.using(self.alias).filter(pk=row.pk).update(
                state=Effect.INTENDED,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
                intents=F("intents") + 1,
                in_doubt=in_doubt,
                duplicate_possible=row.duplicate_possible
                or (unsettled and mode == EffectMode.AT_LEAST_ONCE),
                note=note,
                updated_at=DbNow(),
            )
            self._event(
                row.pk, lease, EffectEvent.INTENDED, Effect.INTENDED, in_doubt=in_doubt, note=cause
            )
            row.refresh_from_db()
            return row

    def effect_settle(
        self,
        lease: Lease,
        key: str,
        state: str,
        *,
        destination_ref: str = "",
        note: str = "",
        name: str = "",
    ) -> str:
        """Record what this attempt learned of an effect (``applied``, ``not_applied`` or
        ``unknown``), fenced; returns the row's state afterwards.

        The answer is sticky: once an attempt's outcome was unknown (``in_doubt``), a later
        attempt that sent nothing (``not_applied``) leaves the row ``unknown``, since the earlier
        request may still have landed. Only a stated fact settles it: ``applied`` here (the
        destination acknowledged the request, a replay included), a reconciliation's answer
        (:func:`reconciled`) or an operator's verified fact. Every step is kept in the ledger's
        history (:class:`~scheduler_core.models.EffectEvent`).

        Inside a transactional job's transaction only ``applied`` is written (the row is created
        then), since any other outcome rolls the whole transaction back.
        """
        if self._in_job_transaction(lease):
            if state != Effect.APPLIED:
                return state
            fields: dict[str, Any] = {
                "state": Effect.APPLIED,
                "in_doubt": False,
                "attempt_id": lease.attempt_id,
                "fence": lease.fence,
                "destination_ref": destination_ref[:300],
                "note": note[:2000],
                "updated_at": DbNow(),
            }
            row_id = (
                Effect.objects.using(self.alias)
                .filter(key=key)
                .values_list("pk", flat=True)
                .first()
            )
            if row_id is not None:
                Effect.objects.using(self.alias).filter(pk=row_id).update(**fields)
            else:
                if not name:
                    raise ValueError("a transactional effect's first outcome needs its name")
                # A concurrent stale attempt's row would make this insert fail: its transaction
                # rolls back whole, as it must.
                row_id = (
                    Effect.objects.using(self.alias)
                    .create(key=key, job_id=lease.job_id, name=name, created_at=DbNow(), **fields)
                    .pk
                )
            self._event(
                row_id, lease, EffectEvent.APPLIED, Effect.APPLIED, in_doubt=False, note=note
            )
            return Effect.APPLIED
        with transaction.atomic(using=self.alias):
            self.assert_current(lease, "effect_outcome", lease_valid=False)
            row = (
                Effect.objects.using(self.alias)
                .filter(key=key, fence=lease.fence)
                .exclude(state=Effect.APPLIED)
                .first()
            )
            if row is None:
                raise StaleAttempt(lease.job_id, lease.fence, "effect_outcome")
            event = {
                Effect.APPLIED: EffectEvent.APPLIED,
                Effect.NOT_APPLIED: EffectEvent.NOT_SENT,
                Effect.UNKNOWN: EffectEvent.UNKNOWN,
            }[state]
            in_doubt = state == Effect.UNKNOWN or (state == Effect.NOT_APPLIED and row.in_doubt)
            if state == Effect.APPLIED:
                in_doubt = False
            after = Effect.UNKNOWN if in_doubt else state
            if state == Effect.NOT_APPLIED and in_doubt:
                note = _with_note(
                    note,
                    f"attempt {lease.attempt} (fence {lease.fence}) sent nothing, but an earlier "
                    "outcome is still unknown: the effect may have happened",
                )
            fields = {"state": after, "in_doubt": in_doubt, "updated_at": DbNow()}
            if destination_ref:
                fields["destination_ref"] = destination_ref[:300]
            if note:
                fields["note"] = _with_note(row.note, note)
            Effect.objects.using(self.alias).filter(pk=row.pk, fence=lease.fence).update(**fields)
            self._event(row.pk, lease, event, after, in_doubt=in_doubt, note=note)
        return after

    def reconciled(self, lease: Lease, answer: outcomes.Reconciliation) -> None:
        """Record a reconcile attempt's answer on the job's unsettled effects (fenced): a stated
        fact, so it settles them (``unknown`` changes nothing)."""
        state = {
            outcomes.Reconciliation.APPLIED: Effect.APPLIED,
            outcomes.Reconciliation.NOT_APPLIED: Effect.NOT_APPLIED,
        }.get(answer)
        if state is None:
            return
        with transaction.atomic(using=self.alias):
            self.assert_current(lease, "effect_outcome", lease_valid=False)
            for pk in list(self.unsettled_of_job(lease.job_id).values_list("pk", flat=True)):
                Effect.objects.using(self.alias).filter(pk=pk).update(
                    state=state,
                    in_doubt=False,
                    note=f"reconciled by attempt {lease.attempt}",
                    updated_at=DbNow(),
                )
                self._event(
                    pk,
                    lease,
                    EffectEvent.RECONCILED,
                    state,
                    in_doubt=False,
                    note=f"the destination's lookup answered {answer.value}",
                )

    def expired_leases(self, grace: float) -> Any:
        """The leased jobs whose lease expired more than ``grace`` seconds ago, oldest expiry
        first, locked ``SKIP LOCKED`` on PostgreSQL (call inside a transaction)."""
        qs = (
            Job.objects.using(self.alias)
            # A bound the leases index can stop at: with the wall clock as a mere filter, every
            # sweep read the whole index, and under a held snapshot that is an entry for every
            # job leased since (the reaper's write re-checks the expiry with the wall clock).
            .filter(state=states.State.LEASED, lease_expires_at__lt=DbNow(-grace, search=True))
            .order_by("lease_expires_at")
        )
        if self.skips_locked_rows:
            qs = qs.select_for_update(skip_locked=True)
        return qs

    def release_unstarted(self, lease: Lease, *, why: str) -> None:
        """Give back a claimed attempt whose handler never started (a Celery chain's queued job):
        the job waits again at once, the attempt is not spent, and its kind is kept. Nothing of
        this attempt can have happened, so no effect rule is asked; effects an earlier attempt
        left unsettled stay as the ledger has them. Fenced."""
        decision = Decision(
            transition=states.RELEASE, reason=why, spend_attempt=False, next_kind=Kind(lease.kind)
        )
        self.finish(lease, decision, outcome="released")

    def take_due_hints(
        self, *, limit: int = 500, queues: frozenset[str] | None = None
    ) -> list[tuple[int, str]]:
        """Pick due waiting jobs of ``queues`` (None: every queue) whose hint is missing, was sent
        for an earlier due time (before a retry), or is old, and mark them hinted now.

        "Old" grows with the wait: a hint is sent again once ``REDISPATCH_AFTER_SECONDS`` have
        passed and at least as long as the job had been due when its last hint went, so a job
        that stays unclaimed gets hints at due + 10 s, 20 s, 40 s, 80 s … (a bounded number,
        however long it waits), never one per round. Returns ``(job_id, queue)`` pairs to publish.
        Two dispatchers may both pick a job; the second hint is absorbed by the claim.
        """
        if queues is not None and not queues:
            return []
        resend = tenure_settings().REDISPATCH_AFTER_SECONDS
        with transaction.atomic(using=self.alias):
            waited_at_last_hint = ExpressionWrapper(
                F("hinted_at") - F("run_at"), output_field=DurationField()
            )
            since_last_hint = ExpressionWrapper(
                DbNow() - F("hinted_at"), output_field=DurationField()
            )
            qs = (
                Job.objects.using(self.alias)
                .filter(state=states.State.WAITING, run_at__lte=DbNow())
                .annotate(waited=waited_at_last_hint, since=since_last_hint)
                .filter(
                    Q(hinted_at__isnull=True)
                    | Q(hinted_at__lt=F("run_at"))
                    | (Q(hinted_at__lt=DbNow(-resend)) & Q(since__gt=F("waited")))
                )
                .order_by("-priority", "run_at", "id")
            )
            if queues is not None:
                qs = qs.filter(queue__in=sorted(queues))
            # A paused queue's jobs are claimed by no one: a hint would only be dropped. Once
            # resumed, their hints are old, so the next round sends them.
            qs = qs.exclude(Exists(Queue.objects.filter(name=OuterRef("queue"), paused=True)))
            if self.skips_locked_rows:
                qs = qs.select_for_update(skip_locked=True, of=("self",))
            picked = list(qs.values_list("id", "queue")[:limit])
            if picked:
                Job.objects.using(self.alias).filter(
                    pk__in=[p[0] for p in picked], state=states.State.WAITING
                ).update(hinted_at=DbNow())
        return picked

    def executor_started(
        self, executor_id: str, *, transport: str, queues: Sequence[str], concurrency: int
    ) -> None:
        """Register a live executor."""
        Executor.objects.using(self.alias).update_or_create(
            id=executor_id,
            defaults={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "transport": transport,
                "queues": ",".join(queues),
                "concurrency": concurrency,
                "active": 0,
                "started_at": DbNow(),
                "heartbeat_at": DbNow(),
                "stopped_at": None,
            },
        )

    def executor_beat(self, executor_id: str, *, active: int) -> None:
        """Refresh an executor's liveness row."""
        Executor.objects.using(self.alias).filter(pk=executor_id).update(
            heartbeat_at=DbNow(), active=active
        )

    def executor_stopped(self, executor_id: str) -> None:
        """Mark an executor stopped."""
        Executor.objects.using(self.alias).filter(pk=executor_id).update(
            stopped_at=DbNow(), active=0
        )

    def in_flight_owners(self, job_id: int, *, limit: int = 20) -> list[InFlightOwner]:
        """The job's earlier owners that may still be in flight (see :class:`InFlightOwner`),
        newest first. An executor is known gone only once it recorded its own stop."""
        reaped = list(
            Attempt.objects.using(self.alias)
            .filter(job_id=job_id, outcome="lease_expired")
            .order_by("-fence")
            .values("number", "fence", "executor", "heartbeat_at", "finished_at")[:limit]
        )
        rows = {
            e.id: e
            for e in Executor.objects.using(self.alias).filter(
                id__in={a["executor"] for a in reaped}
            )
        }
        out = []
        for a in reaped:
            ex = rows.get(a["executor"])
            if ex is not None and ex.stopped_at is not None:
                continue
            out.append(
                InFlightOwner(
                    attempt=a["number"],
                    fence=a["fence"],
                    executor=a["executor"],
                    last_heartbeat=a["heartbeat_at"],
                    reaped_at=a["finished_at"],
                    executor_last_seen=ex.heartbeat_at if ex is not None else None,
                )
            )
        return out

    def refresh_count_snapshot(self, *, older_than: float) -> bool:
        """Recount succeeded and cancelled jobs per (queue, type) into :class:`CountSnapshot` if
        the last count is older than ``older_than`` seconds; returns whether it recounted.

        The count is one scan of the job table; replacing the rows is one transaction, so the
        dashboard sees the old snapshot or the new one, never a mix.
        """
        last = CountSnapshot.objects.using(self.alias).aggregate(t=Max("taken_at"))["t"]
        if last is not None and not self._older_than(last, older_than):
            return False
        rows = (
            Job.objects.using(self.alias)
            .filter(state__in=[states.State.SUCCEEDED, states.State.CANCELLED])
            .values("queue", "name", "state")
            .annotate(n=Count("id"))
        )
        with transaction.atomic(using=self.alias):
            taken = self.now()
            CountSnapshot.objects.using(self.alias).all().delete()
            CountSnapshot.objects.using(self.alias).bulk_create(
                CountSnapshot(
                    queue=r["queue"], name=r["name"], state=r["state"], n=r["n"], taken_at=taken
                )
                for r in rows
            )
        return True

    # -- history (the console's per-minute charts) -----------------------------------------

    def minute_rollup(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """The per-(minute, queue, job type) figures of ``[start, end)`` (whole minutes): the
        attempts that ended in each minute by what they meant (:func:`rollup_outcome`), the
        claims made in it and their queue wait p50 and p95 in milliseconds.

        The queue wait is the claim time less the due time; the due time is the job's
        ``run_at``, which stays the due time of its latest claim until the job waits again,
        so it is measured over the claims that are still their job's latest (as
        ``/metrics``' claim latency is). Minutes and groups with nothing are left out.

        This implementation reads the rows and computes the percentiles here (SQLite);
        PostgreSQL's does it in one statement.
        """
        out: dict[tuple[datetime, str, str], dict[str, Any]] = {}

        def row(at: datetime, queue: str, name: str) -> dict[str, Any]:
            minute = at.replace(second=0, microsecond=0)
            return out.setdefault(
                (minute, queue, name),
                {
                    "minute": minute,
                    "queue": queue,
                    "name": name,
                    **{k: 0 for k in ROLLUP_COUNTS},
                    "waits": [],
                },
            )

        # Only jobs written since the range began can have an attempt claimed or ended in it
        # (a claim and an end write the job's updated_at, which only grows): the job table's
        # (state, updated_at) index bounds what is read, not the whole attempt table.
        attempts = Attempt.objects.using(self.alias).filter(
            job__state__in=ALL_STATES, job__updated_at__gte=start - ROLLUP_MARGIN
        )
        for e in attempts.filter(finished_at__gte=start, finished_at__lt=end).values(
            "finished_at", "outcome", "fence", "job__fence", "job__state", "job__queue", "job__name"
        ):
            kind = rollup_outcome(e["outcome"], e["fence"] == e["job__fence"], e["job__state"])
            if kind is not None and e["finished_at"] is not None:
                row(e["finished_at"], e["job__queue"], e["job__name"])[kind] += 1
        for a in attempts.filter(claimed_at__gte=start, claimed_at__lt=end).values(
            "claimed_at",
            "fence",
            "job__fence",
            "job__state",
            "job__run_at",
            "job__queue",
            "job__name",
        ):
            r = row(a["claimed_at"], a["job__queue"], a["job__name"])
            r["claims"] += 1
            if a["fence"] == a["job__fence"] and a["job__state"] not in WAIT_UNKNOWN_STATES:
                wait = (a["claimed_at"] - a["job__run_at"]).total_seconds() * 1000.0
                r["waits"].append(max(0.0, wait))
        rows = []
        for r in out.values():
            waits = sorted(r.pop("waits"))
            r["wait_p50_ms"] = percentile(waits, 0.50)
            r["wait_p95_ms"] = percentile(waits, 0.95)
            rows.append(r)
        return sorted(rows, key=lambda r: (r["minute"], r["queue"], r["name"]))

    def save_minute_stats(self, rows: Sequence[dict[str, Any]], *, through: datetime) -> None:
        """Write ``rows`` (from :meth:`minute_rollup`), replacing any row of the same minute,
        queue and type (so a minute rolled up twice counts once), and move the watermark to
        ``through`` (the end of the range), in one transaction."""
        fields = [*ROLLUP_COUNTS, "wait_p50_ms", "wait_p95_ms"]
        objs = [
            MinuteStats(
                minute=r["minute"], queue=r["queue"], name=r["name"], **{f: r[f] for f in fields}
            )
            for r in rows
        ]
        # The watermark: a row with no queue or type at the end of the range rolled up.
        objs.append(MinuteStats(minute=through, queue="", name=""))
        with transaction.atomic(using=self.alias):
            MinuteStats.objects.using(self.alias).filter(queue="", name="").exclude(
                minute=through
            ).delete()
            MinuteStats.objects.using(self.alias).bulk_create(
                objs,
                update_conflicts=True,
                unique_fields=["minute", "queue", "name"],
                update_fields=fields,
            )

    def history_watermark(self) -> datetime | None:
        """The end of the last range rolled up into ``MinuteStats`` (None: none yet)."""
        return (  # type: ignore[no-any-return]
            MinuteStats.objects.using(self.alias)
            .filter(queue="", name="")
            .aggregate(t=Max("minute"))["t"]
        )

    def prune_minute_stats(self, before: datetime) -> int:
        """Delete the history rows of minutes before ``before``; how many."""
        n, _ = MinuteStats.objects.using(self.alias).filter(minute__lt=before).delete()
        return int(n)

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
        return Lease(
            job_id=job.pk,
            fence=job.fence,
            attempt=job.attempts,
            attempt_id=attempt_id or 0,
            kind=job.next_kind,
            name=job.name,
            queue=job.queue,
            payload=job.payload,
            lease_seconds=job.lease_seconds,
            effect=job.effect,
            max_attempts=job.max_attempts,
            created_at=job.created_at,
            executor=job.lease_owner,
            timeout_seconds=job.timeout_seconds,
        )

    def leased_job(self, lease: Lease) -> Job | None:
        """``lease``'s job while it is still leased under that fence (else None)."""
        return self._mine(lease).first()  # type: ignore[no-any-return]

    def live_consumer_queues(self, transport: str) -> frozenset[str]:
        """The broker queues that live executors of ``transport`` consume, from their
        liveness rows (beaten within ``conf.executor_stale_seconds()``, not stopped); a
        scheduler's row (``transport="scheduler"``) consumes nothing."""
        rows = (
            Executor.objects.using(self.alias)
            .filter(
                transport=transport,
                stopped_at__isnull=True,
                heartbeat_at__gt=DbNow(-executor_stale_seconds()),
            )
            .exclude(transport="scheduler")
            .values_list("queues", flat=True)
        )
        return frozenset(q for row in rows for q in row.split(",") if q)

    def operator_transition(
        self,
        job_id: int,
        *,
        expected_version: int,
        transition: states.Transition,
        fields: dict[str, Any],
    ) -> bool:
        """An operator's transition of one job: written only while the job still has
        ``expected_version`` and a state the transition leaves; whether it was."""
        fields = {**fields, "updated_at": DbNow(), "version": F("version") + 1}
        n = (
            Job.objects.using(self.alias)
            .filter(pk=job_id, version=expected_version, state__in=list(transition.sources))
            .update(state=transition.target, **fields)
        )
        return bool(n == 1)

    def record_operator_fact(
        self, effect: Effect, *, effect_state: str, actor: str, reason: str
    ) -> None:
        """Settle one ledger row with a fact an operator verified, with its history entry."""
        note = f"operator {actor} verified {effect_state}: {reason}"
        Effect.objects.using(self.alias).filter(pk=effect.pk).update(
            state=effect_state,
            in_doubt=False,
            note=_with_note(effect.note, note),
            updated_at=DbNow(),
        )
        self._event(
            effect.pk,
            None,
            EffectEvent.OPERATOR,
            effect_state,
            in_doubt=False,
            note=reason,
            actor=actor,
        )

    # -- queues: pause and limits -----------------------------------------------------------

    def limited_queues(self, queues: Sequence[str], *, job_id: int | None = None) -> list[str]:
        """Of ``queues`` (or, with ``job_id``, that waiting job's queue), those claimed within
        limits (:data:`LIMITED_QUEUE`), by name. Drivers whose claim statement cannot say it
        ask this after a claim that came back short."""
        qs = Queue.objects.using(self.alias).filter(paused=False)
        qs = qs.filter(Q(max_leased__isnull=False) | Q(max_per_second__isnull=False))
        if job_id is not None:
            qs = qs.filter(
                name__in=Job.objects.using(self.alias)
                .filter(pk=job_id, state=states.State.WAITING)
                .values("queue")
            )
        else:
            qs = qs.filter(name__in=list(queues))
        return sorted(qs.values_list("name", flat=True))

    def claim_within_limits(
        self, names: Sequence[str], *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """Claim up to ``limit`` jobs of the limited queues ``names`` (or exactly ``job_id``),
        each within its limits, in one transaction (the caller's, if one is open).

        Each queue's row is locked first (``FOR UPDATE`` on PostgreSQL; SQLite's write lock
        is held already), so claimers of a limited queue take turns: the leased jobs are
        counted after the lock, by a statement that sees every claim committed before it, and
        the token bucket is read and written under it, refilled by the database's clock
        (:func:`scheduler_core.domain.queues.allowance`). Queues paused or freed of their limits
        since are skipped: the plain claim takes the latter."""
        if limit < 1 or not names:
            return []
        got: list[Lease] = []
        with self.atomic():
            rows = list(
                Queue.objects.using(self.alias)
                .select_for_update()
                .filter(name__in=sorted(set(names)), paused=False)
                .filter(Q(max_leased__isnull=False) | Q(max_per_second__isnull=False))
                .order_by("name")
            )
            if not rows:
                return []
            now = self.now()
            for q in rows:
                want = limit - len(got)
                if want < 1:
                    break
                leased = 0
                if q.max_leased is not None:
                    leased = (
                        Job.objects.using(self.alias)
                        .filter(queue=q.name, state=states.State.LEASED)
                        .count()
                    )
                allowed = queue_limits.allowance(
                    want=want,
                    max_leased=q.max_leased,
                    leased=leased,
                    max_per_second=q.max_per_second,
                    tokens=q.tokens,
                    tokens_at=q.tokens_at,
                    now=now,
                )
                taken = []
                if allowed.jobs > 0:
                    taken = self.claim_limited_queue(
                        q.name, executor=executor, limit=allowed.jobs, job_id=job_id
                    )
                if q.max_per_second is not None:
                    Queue.objects.using(self.alias).filter(pk=q.name).update(
                        tokens=queue_limits.after_claim(allowed.tokens, len(taken)), tokens_at=now
                    )
                got.extend(taken)
        return got

    def queue_row(self, name: str, *, lock: bool = False) -> Queue | None:
        """The operator's settings row of queue ``name`` (None: the queue has none, so no
        pause and no limits); ``lock`` holds it until the transaction ends."""
        qs = Queue.objects.using(self.alias).filter(pk=name)
        if lock:
            qs = qs.select_for_update()
        return qs.first()

    def queue_rows(self) -> list[Queue]:
        """Every queue's settings row, by name."""
        return list(Queue.objects.using(self.alias).order_by("name"))

    def write_queue(
        self, name: str, *, expected_version: int | None, fields: dict[str, Any]
    ) -> bool:
        """Write an operator's change of queue ``name``'s settings: only while its row still
        has ``expected_version`` (0: the queue has no row yet, which this creates; None: any
        version); whether it was written. The version grows by one with each change, and the
        row stays once made, so a page that saw an older version is always refused. Changing
        the rate limit refills its bucket (full from now)."""
        fields = {**fields, "updated_at": DbNow()}
        if "max_per_second" in fields:
            fields.update(tokens=0.0, tokens_at=None)
        qs = Queue.objects.using(self.alias).filter(pk=name)
        if expected_version == 0:
            if qs.exists():
                return False
            try:
                with transaction.atomic(using=self.alias):
                    Queue.objects.using(self.alias).create(name=name, version=1, **fields)
            except IntegrityError:
                return False  # made meanwhile by another operator
            return True
        if expected_version is not None:
            qs = qs.filter(version=expected_version)
        return bool(qs.update(version=F("version") + 1, **fields) == 1)

    def audit(self, **fields: Any) -> AuditEntry:
        """Append one entry to the operators' audit trail (in the caller's transaction)."""
        return AuditEntry.objects.using(self.alias).create(**fields)

    def record_return_value(self, lease: Lease, value: Any) -> None:
        """Keep what ``lease``'s handler returned on its attempt's row, fenced like every
        attempt write: refused (:class:`StaleAttempt`, :class:`AttemptOverrun`) once the job is
        no longer leased under this fence or the attempt is past its maximum runtime.

        ``value`` is JSON already checked by the caller (:mod:`scheduler_core.backends`). It is
        written before the completion, in the caller's transaction when there is one (a
        ``transactional`` job's); a task's result is the value of the attempt whose completion
        was accepted, so one left by an attempt that did not complete is never read as the
        result.
        """
        mine = self._mine(lease).filter(deadline_at__gt=DbNow())
        n = (
            Attempt.objects.using(self.alias)
            .filter(pk=lease.attempt_id, finished_at__isnull=True)
            .filter(Exists(mine))
            .update(return_value=value)
        )
        if n != 1:
            raise self.refusal(lease, "return_value")
