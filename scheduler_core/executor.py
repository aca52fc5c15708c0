"""Running claimed attempts: one attempt end to end, the heartbeat, and the broker-less worker.

Every transport ends here: the broker-less :class:`Worker` claims batches itself; the Celery
and RQ adapters claim the one job a message names and call :func:`run_lease`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import queue as queue_mod
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    transaction,
)

from . import conf, failpoints, metrics, outcomes, registry, states, store
from .classify import PayloadMismatch, classify, retry_after_of
from .context import JobContext
from .db import connection as db_connection
from .exceptions import AttemptOverrun, Snooze, StaleAttempt
from .modes import EffectMode
from .outcomes import Decision, Reconciliation, Situation

log = logging.getLogger("tenure.executor")


# ---------------------------------------------------------------------------------------------
# Heartbeat: one thread per process renews every active lease
# ---------------------------------------------------------------------------------------------


@dataclass
class _Active:
    ctx: JobContext
    started: float
    last_renewed: float
    timeout: float | None
    late_logged: bool = False


class Heartbeater:
    """Renews the leases of this process's running attempts from one thread.

    A refused renewal (the fence moved on) marks the attempt lost and is recorded. A renewal
    that cannot reach the database is retried; once the lease would have run out by this
    process's monotonic clock the attempt marks itself lost (self-fencing), so it starts no
    new effect. An attempt past its job type's ``timeout`` stops being renewed.
    """

    def __init__(self, executor_id: str, *, beat_executor: bool = True) -> None:
        self.executor_id = executor_id
        self.beat_executor = beat_executor
        self._active: dict[int, _Active] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_executor_beat = 0.0

    def start(self) -> None:
        """Start the renewal thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tenure-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop renewing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def add(self, ctx: JobContext) -> None:
        """Renew ``ctx``'s lease until :meth:`remove`, at most until its maximum runtime."""
        now = time.monotonic()
        # Renewals count from when the claim was sent, not from now: the claim may have
        # waited in this process (a busy interpreter) before its attempt started. So does the
        # maximum runtime, as the database's deadline does.
        granted = min(ctx.lease.granted_at or now, now)
        timeout = ctx.lease.timeout_seconds or None
        with self._lock:
            self._active[ctx.lease.attempt_id] = _Active(ctx, granted, granted, timeout)

    def remove(self, ctx: JobContext) -> None:
        with self._lock:
            self._active.pop(ctx.lease.attempt_id, None)

    def active(self) -> list[JobContext]:
        with self._lock:
            return [a.ctx for a in self._active.values()]

    def _run(self) -> None:
        fraction = conf.get().HEARTBEAT_FRACTION
        try:
            while not self._stop.wait(0.2):
                self.tick(fraction)
        finally:
            db_connection.close()

    def tick(self, fraction: float) -> None:
        """Renew whatever is due (called by the thread; tests may call it directly)."""
        now = time.monotonic()
        with self._lock:
            items = list(self._active.values())
        for a in items:
            ctx = a.ctx
            if ctx.lost:
                continue
            lease_s = ctx.lease.lease_seconds
            if a.timeout is not None and now - a.started > a.timeout:
                # The database refuses renewals past the deadline too; stopping here first
                # keeps the attempt from starting effects on its own clock as well.
                ctx.mark_lost(f"exceeded its maximum runtime of {a.timeout:g}s")
                continue
            if now - a.last_renewed < lease_s * fraction:
                continue
            # The database computes the new expiry while running the statement, so the time
            # it was sent is a lower bound: the next renewal and the self-fence count from it.
            sent = time.monotonic()
            late = sent - a.last_renewed - lease_s * fraction
            if late > lease_s * 0.25 and not a.late_logged:
                a.late_logged = True
                log.warning("job %s: lease renewal %.2fs late", ctx.job_id, late)
                store.log_event(
                    "heartbeat_late", job=ctx.job_id, fence=ctx.lease.fence, late=round(late, 3)
                )
            try:
                store.heartbeat(ctx.lease)
                a.last_renewed = sent
                a.late_logged = False
                took = time.monotonic() - sent
                if took > lease_s * 0.25:
                    log.warning("job %s: lease renewal took %.2fs", ctx.job_id, took)
                    store.log_event(
                        "heartbeat_slow", job=ctx.job_id, fence=ctx.lease.fence, took=round(took, 3)
                    )
            except AttemptOverrun as e:
                store.record_stale(e, self.executor_id)
                ctx.mark_lost("past its maximum runtime (renewal refused)")
            except StaleAttempt as e:
                metrics.stale_refused(e.write)
                store.record_stale(e, self.executor_id)
                ctx.mark_lost("lease taken over (heartbeat refused)")
            except DatabaseError as e:
                log.warning("heartbeat for job %s failed: %s", ctx.job_id, e)
                db_connection.close()
                # Self-fence before the lease can have expired by the database's clock.
                if time.monotonic() - a.last_renewed > lease_s * 0.8:
                    ctx.mark_lost("could not renew the lease in time")
        if self.beat_executor and now - self._last_executor_beat > 2.0:
            self._last_executor_beat = now
            try:
                store.executor_beat(self.executor_id, active=len(items))
            except DatabaseError:
                db_connection.close()


# ---------------------------------------------------------------------------------------------
# One attempt, end to end
# ---------------------------------------------------------------------------------------------


def _outcome_label(decision: Decision) -> str:
    target = decision.transition.target
    if target == states.State.WAITING:
        return "retried" if decision.spend_attempt else "snoozed"
    return str(target.value)


def _complete_read_back(
    lease: store.Lease,
    fn: Callable[[], int | None],
    *,
    tries: int = 3,
    xid_from_fn: bool = False,
    probe: Callable[[], store.Lease] | None = None,
) -> None:
    """Run ``fn`` (ending with the fenced completion) in one transaction and commit it; when
    the connection breaks on the way, read the outcome back, never guess.

    On PostgreSQL the transaction's id is known before ``COMMIT`` (taken first, or, with
    ``xid_from_fn``, returned by ``fn``'s completion statement itself, which saves a round
    trip), so after a break during ``COMMIT`` the read-back waits until the server has decided
    that transaction (``txid_status``) before reading the attempt's row; a decided row then
    says whether the completion landed. ``in_commit`` is the failpoint between the
    completion's write and ``COMMIT``. ``probe`` names the attempt to read back when ``fn``
    completes several (one whose completion the statement matched).
    """
    for n in range(tries):
        xid: list[int] = []
        try:
            with transaction.atomic(using=store.DB):
                if not xid_from_fn:
                    xid.extend(_xid())
                got = fn()
                if xid_from_fn and got is not None:
                    xid.append(got)
                failpoints.hit("in_commit")
            return
        except (OperationalError, InterfaceError):
            db_connection.close()
            outcome = _read_back(probe() if probe else lease, xid[0] if xid else None)
            if outcome == "succeeded":
                log.warning("job %s: connection lost at commit; read back: committed", lease.job_id)
                return
            if outcome != "leased" or n == tries - 1:
                raise
            time.sleep(0.2 * 2**n)


def commit_and_read_back(
    fn: Callable[[], int | None],
    *,
    landed: Callable[[], bool],
    xid_from_fn: bool = False,
    tries: int = 3,
    patience: float = 30.0,
) -> None:
    """Run ``fn`` in one transaction and commit it; return once the commit is known to have
    landed, and raise the database's error once every try is known to have rolled back or
    when that cannot be told within ``patience`` seconds.

    For transactions whose outcome is not one attempt's completion (a Celery chain's batch of
    completions with the claims made in the same statement, or a claim alone): what the
    caller learned from ``fn``'s statements stands only when this returns. When the
    connection breaks after ``fn`` returned, the outcome is read back: on PostgreSQL by the
    transaction's id (taken first, or returned by ``fn`` with ``xid_from_fn``) and
    ``txid_status``, waiting while the server says it is in progress; elsewhere ``landed``
    reads a row the transaction wrote. A break before ``fn`` returned sent no ``COMMIT``: that
    try rolled back and is made again. ``in_commit`` is the failpoint between the writes and
    ``COMMIT``.
    """

    def decided(xid: int | None) -> str:
        deadline = time.monotonic() + patience
        delay = 0.05
        while True:
            try:
                if xid is None:
                    return "committed" if landed() else "aborted"
                with db_connection.cursor() as cur:
                    cur.execute("SELECT txid_status(%s)", [xid])
                    status = cur.fetchone()[0]
                if status == "in progress":
                    raise _Undecided
                # None: the server no longer knows the transaction, too old to tell.
                return str(status) if status in ("committed", "aborted") else "unknown"
            except (OperationalError, InterfaceError, _Undecided) as e:
                log.info("transaction %s: reading the outcome back: %r; asking again", xid, e)
                db_connection.close()
                if time.monotonic() > deadline:
                    return "unknown"
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    for n in range(tries):
        xid: list[int] = []
        written = False
        try:
            with transaction.atomic(using=store.DB):
                if not xid_from_fn:
                    xid.extend(_xid())
                got = fn()
                if xid_from_fn and got is not None:
                    xid.append(got)
                written = True
                failpoints.hit("in_commit")
            return
        except (OperationalError, InterfaceError):
            db_connection.close()
            verdict = decided(xid[0] if xid else None) if written else "aborted"
            log.warning("connection lost at commit; read back: %s", verdict)
            if verdict == "committed":
                return
            if verdict == "unknown" or n == tries - 1:
                raise
            time.sleep(0.2 * 2**n)


def _xid() -> list[int]:
    """This transaction's id on PostgreSQL (assigned now; the completion writes anyway)."""
    if db_connection.vendor != "postgresql":
        return []
    with db_connection.cursor() as cur:
        cur.execute("SELECT txid_current()")
        return [int(cur.fetchone()[0])]


def _read_back(lease: store.Lease, xid: int | None = None, *, patience: float = 30.0) -> str:
    """``succeeded`` if this attempt's completion committed, ``leased`` if the job is still
    this attempt's, ``other`` if someone else moved it, ``unknown`` if the database could not
    be asked within ``patience`` seconds."""
    from .models import Attempt, Job

    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            if xid is not None:
                with db_connection.cursor() as cur:
                    cur.execute("SELECT txid_status(%s)", [xid])
                    status = cur.fetchone()[0]
                if status == "in progress":
                    # The server has not yet finished (or noticed the end of) that transaction.
                    raise _Undecided
            outcome = (
                Attempt.objects.filter(pk=lease.attempt_id)
                .values_list("outcome", flat=True)
                .first()
            )
            if outcome == "succeeded":
                return "succeeded"
            mine = Job.objects.filter(
                pk=lease.job_id, fence=lease.fence, state=states.State.LEASED
            ).exists()
            return "leased" if mine else "other"
        except (OperationalError, InterfaceError, _Undecided) as e:
            log.info("job %s: reading the outcome back: %r; asking again", lease.job_id, e)
            db_connection.close()
            if time.monotonic() > deadline:
                return "unknown"
            time.sleep(delay)
            delay = min(1.0, delay * 2)


class _Undecided(Exception):
    """The transaction being read back is still in progress on the server."""


class NextClaim:
    """Claim the executor's next job inside a successful attempt's completion transaction.

    One commit then ends one job and leases the next (one commit per job instead of two),
    with the same ownership decision as :func:`scheduler_core.store.claim`: the claimed rows
    commit with the completion or not at all. ``got`` holds the new leases only once that
    transaction is known to have committed (read back when the connection broke during
    ``COMMIT``); a rolled-back or undecided transaction leaves it empty. ``wanted`` says how
    many jobs to claim when the completion is written (0 once a stop was requested).
    """

    def __init__(self, *, executor: str, queues: Sequence[str], wanted: Callable[[], int]) -> None:
        self.executor = executor
        self.queues = list(queues)
        self._wanted = wanted
        self._pending: list[store.Lease] = []
        self.got: list[store.Lease] = []

    def claim_in_transaction(self) -> None:
        """Run the claim inside the open completion transaction (each try starts afresh)."""
        self._pending = []
        n = self._wanted()
        if n > 0:
            self._pending = store.claim(executor=self.executor, queues=self.queues, limit=n)

    def complete_and_claim(self, lease: store.Lease) -> int | None:
        """Write ``lease``'s completion and the claim in one statement
        (:func:`scheduler_core.store.complete_and_claim`); returns the transaction's id."""
        self._pending = []
        xid, self._pending = store.complete_and_claim(
            lease, executor=self.executor, queues=self.queues, limit=self._wanted()
        )
        return xid

    def committed(self) -> None:
        """The completion transaction committed: its claims stand."""
        self.got, self._pending = self._pending, []


def run_lease(
    lease: store.Lease,
    *,
    heartbeater: Heartbeater | None = None,
    rng: random.Random | None = None,
    next_claim: NextClaim | None = None,
    defer: Callable[[JobContext], bool] | None = None,
) -> str:
    """Run one claimed attempt and record its end through the write seam.

    Returns the attempt's outcome (``succeeded``, ``retried``, ``failed``, ``indeterminate``,
    ``snoozed`` or ``stale``). A refused write stops the attempt; nothing more is written for
    it and the refusal is recorded. With ``next_claim``, a successful attempt's completion
    transaction also claims the executor's next job (see :class:`NextClaim`). With ``defer``,
    a successful attempt of a job that is not ``transactional`` is handed to ``defer`` instead
    of being completed; when it accepts, the outcome is ``deferred``: the caller writes the
    completion later (:mod:`scheduler_core.chain`) and the attempt stays in ``heartbeater``.
    """
    rng = rng or random.Random()
    ctx = JobContext(lease)
    jt = registry.get(lease.name)
    if heartbeater is not None:
        heartbeater.add(ctx)
    started = time.monotonic()
    outcome = ""
    try:
        failpoints.hit("after_claim")
        if jt is None:
            outcome = _park_unregistered(ctx)
        elif lease.kind == outcomes.Kind.RECONCILE:
            outcome = _reconcile(ctx, jt, rng)
        else:
            outcome = _run(ctx, jt, rng, next_claim, defer)
    except StaleAttempt as e:
        metrics.stale_refused(e.write)
        store.record_stale(e, lease.executor)
        outcome = "stale"
    finally:
        metrics.attempt_finished(lease.name, time.monotonic() - started)
        # A deferred completion keeps its lease renewed until it is written.
        if heartbeater is not None and outcome != "deferred":
            heartbeater.remove(ctx)
    return outcome


def _handler(jt: registry.JobType, kind: str) -> Callable[..., Any]:
    """The function an attempt of ``kind`` calls: the fallback for a ``fallback`` attempt."""
    if kind == outcomes.Kind.FALLBACK and jt.fallback is not None:
        return jt.fallback
    return jt.func


def _run(
    ctx: JobContext,
    jt: registry.JobType,
    rng: random.Random,
    nxt: NextClaim | None = None,
    defer: Callable[[JobContext], bool] | None = None,
) -> str:
    lease = ctx.lease
    handler = _handler(jt, lease.kind)
    try:
        try:
            inspect.signature(handler).bind(ctx, **lease.payload)
        except TypeError as e:
            raise PayloadMismatch(str(e)) from None
        if jt.effect == EffectMode.TRANSACTIONAL:
            # The handler's writes, its ledger rows and the fenced completion commit together;
            # a refused completion rolls all of them back. Not retried here: the handler's
            # writes would have to be made again, which is the next attempt's job.
            def commit_all() -> None:
                _handler_idle_limit()
                handler(ctx, **lease.payload)
                failpoints.hit("before_complete")
                store.complete(lease)
                if nxt is not None:
                    nxt.claim_in_transaction()

            _complete_read_back(lease, commit_all, tries=1)
        else:
            handler(ctx, **lease.payload)
            failpoints.hit("before_complete")
            if defer is not None and defer(ctx):
                return "deferred"

            def complete() -> int | None:
                if nxt is not None:
                    return nxt.complete_and_claim(lease)
                return store.complete(lease)

            _complete_read_back(lease, complete, xid_from_fn=True)
        if nxt is not None:
            nxt.committed()
        return "succeeded"
    except StaleAttempt:
        raise
    except Snooze as s:
        if ctx.ambiguous:
            # An effect's outcome became unknown in this attempt: waiting would not settle
            # it, so the mode's rule for an ambiguous outcome applies.
            return _end_with_error(ctx, jt, s, rng)
        decision = outcomes.after_snooze(_situation(ctx, jt), s.seconds, policy=jt.retry_policy)
        store.finish(lease, decision, outcome=_outcome_label(decision))
        return _outcome_label(decision)
    except Exception as exc:
        # EffectsUnsettled (the completion refused while the ledger holds an effect that may
        # or may not have happened) lands here too: an Indeterminate, never a success.
        return _end_with_error(ctx, jt, exc, rng)


def _park_unregistered(ctx: JobContext) -> str:
    """No handler is registered for the job here: fail closed, park it for an operator."""
    decision = outcomes.unregistered(ctx.lease.name)
    failure = store.Failure(
        error_class="",
        error_type="",
        message=f"no handler registered as {ctx.lease.name!r} in this process",
    )
    log.warning("job %s: %s", ctx.job_id, decision.reason)
    store.finish(ctx.lease, decision, outcome=_outcome_label(decision), failure=failure)
    return _outcome_label(decision)


def end_with_error(ctx: JobContext, exc: BaseException, *, rng: random.Random | None = None) -> str:
    """End ``ctx``'s attempt as a failure with ``exc`` (classified, then decided by the job's
    policy and effect mode) through the write seam; returns the attempt's outcome.

    For code that runs attempts outside :func:`run_lease` (:mod:`scheduler_core.chain`, whose
    deferred completion the database may refuse with
    :class:`~scheduler_core.exceptions.EffectsUnsettled`).
    """
    jt = registry.get(ctx.lease.name)
    if jt is None:
        return _park_unregistered(ctx)
    return _end_with_error(ctx, jt, exc, rng or random.Random())


def _end_with_error(
    ctx: JobContext, jt: registry.JobType, exc: BaseException, rng: random.Random
) -> str:
    lease = ctx.lease
    failure_class = classify(
        exc,
        retry_on=jt.retry_on,
        permanent_on=jt.permanent_on,
        in_effect=ctx.ambiguous,
    )
    policy = jt.retry_policy
    situation = _situation(ctx, jt)
    decision = outcomes.after_failure(
        situation,
        failure_class,
        policy=policy,
        rng=rng,
        message=str(exc)[:500],
        retry_after=retry_after_of(exc),
        in_flight_grace=conf.get().REAP_GRACE_SECONDS,
    )
    failure = store.Failure(
        error_class=failure_class.value,
        error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )
    log.info(
        "job %s (%s) attempt %s: %s %s -> %s",
        lease.job_id,
        lease.name,
        lease.attempt,
        failure_class.value,
        failure.error_type,
        decision.transition.target.value,
    )
    store.finish(lease, decision, outcome=_outcome_label(decision), failure=failure)
    return _outcome_label(decision)


def _situation(ctx: JobContext, jt: registry.JobType) -> Situation:
    from .dbclock import db_now

    lease = ctx.lease
    mode = EffectMode(lease.effect)
    return Situation(
        mode=mode,
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        age_seconds=(db_now() - lease.created_at).total_seconds(),
        has_reconcile=jt.reconcile is not None,
        kind=lease.kind,
        has_fallback=jt.fallback is not None,
        fallback_shares_key=jt.fallback_shares_key,
        # The ledger's sticky answer, read on every failure: an earlier attempt's unknown
        # outcome is not erased by this attempt's "nothing sent" (a transactional job's
        # effect rolled back with its attempt, so it has none to ask about).
        unsettled_effect=ctx.ambiguous
        or (mode != EffectMode.TRANSACTIONAL and store.has_unsettled_effect(lease.job_id)),
    )


# Attempt outcomes of a reconcile attempt (the column holds 20 characters).
_RECONCILED = {
    Reconciliation.APPLIED: "reconciled_applied",
    Reconciliation.NOT_APPLIED: "reconciled_unapplied",
    Reconciliation.UNKNOWN: "reconciled_unknown",
}


def _reconcile(ctx: JobContext, jt: registry.JobType, rng: random.Random) -> str:
    """Ask the destination what happened to the job's effect; never re-run blindly."""
    lease = ctx.lease
    if jt.reconcile is None:
        decision = outcomes.after_reconcile(Reconciliation.UNKNOWN)
        store.finish(lease, decision, outcome="reconciled_unknown")
        return "indeterminate"
    try:
        answer = Reconciliation(jt.reconcile(ctx, **lease.payload))
    except StaleAttempt:
        raise
    except Exception as exc:
        log.warning("job %s: reconcile failed: %s", lease.job_id, exc)
        return _reconcile_failed(ctx, jt, exc, rng)
    # The ledger's answer and the job's transition commit together.
    with transaction.atomic(using=store.DB):
        store.reconciled(lease, answer)
        decision = outcomes.after_reconcile(answer)
        store.finish(lease, decision, outcome=_RECONCILED[answer])
    return _outcome_label(decision)


def _reconcile_failed(
    ctx: JobContext, jt: registry.JobType, exc: BaseException, rng: random.Random
) -> str:
    """A lookup that raised: ask again later if the error was transient, else park."""
    lease = ctx.lease
    failure_class = classify(exc, retry_on=jt.retry_on, permanent_on=jt.permanent_on)
    decision = outcomes.after_reconcile_error(
        _situation(ctx, jt),
        failure_class,
        policy=jt.retry_policy,
        rng=rng,
        message=str(exc)[:500],
        retry_after=getattr(exc, "retry_after", None),
    )
    failure = store.Failure(
        error_class=failure_class.value,
        error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )
    store.finish(lease, decision, outcome=_outcome_label(decision), failure=failure)
    return _outcome_label(decision)


# ---------------------------------------------------------------------------------------------
# The broker-less worker
# ---------------------------------------------------------------------------------------------


@dataclass
class WorkerStats:
    """What a worker did, by attempt outcome."""

    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class Worker:
    """Claims due jobs in batches and runs them on ``concurrency`` threads.

    Wakes on ``NOTIFY`` (PostgreSQL) or every ``poll_interval`` seconds. On SIGTERM or SIGINT
    it stops claiming, waits up to ``grace`` seconds for running attempts, then releases the
    rest through the write seam (so no job waits for a full lease) and exits.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 4,
        poll_interval: float | None = None,
        grace: float | None = None,
        burst: bool = False,
        executor_id: str | None = None,
        claim_next: bool = True,
    ) -> None:
        s = conf.get()
        self.queues = list(queues)
        self.concurrency = max(1, concurrency)
        self.poll_interval = s.POLL_INTERVAL if poll_interval is None else poll_interval
        self.grace = s.SHUTDOWN_GRACE_SECONDS if grace is None else grace
        self.burst = burst
        self.claim_next = claim_next
        """Claim the next job in each successful attempt's completion transaction."""
        self.executor_id = executor_id or store.new_executor_id("exec")
        self.heartbeater = Heartbeater(self.executor_id)
        self.stats = WorkerStats()
        self._todo: queue_mod.Queue[store.Lease | None] = queue_mod.Queue()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- control --------------------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        """Stop claiming; running attempts get ``grace`` seconds to finish."""
        if not self._stopping.is_set():
            log.info("executor %s: stopping (grace %.1fs)", self.executor_id, self.grace)
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def _register(self) -> None:
        """Write the executor's liveness row, waiting (with backoff, never spinning) for a
        database that is not up yet, so executors may start before it."""
        backoff = 0.5
        while True:
            try:
                store.executor_started(
                    self.executor_id,
                    transport="polling",
                    queues=self.queues,
                    concurrency=self.concurrency,
                )
                return
            except DatabaseError as e:
                if self._stopping.is_set():
                    raise
                log.warning("database unreachable at start (%s); retrying in %.1fs", e, backoff)
                db_connection.close()
                self._stopping.wait(backoff)
                backoff = min(10.0, backoff * 2)

    # -- loop -----------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        """Run until stopped (or, in burst mode, until nothing is due and nothing runs)."""
        limit_idle_transactions()
        db_connection.close()  # reopened with the limit
        self._register()
        log.info(
            "executor %s: queues=%s concurrency=%d", self.executor_id, self.queues, self.concurrency
        )
        self.heartbeater.start()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._work, name=f"tenure-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        listener = _Listener(self.queues, self._wake)
        listener.start()
        backoff = 0.0
        try:
            while not self._stopping.is_set():
                # Cleared before claiming, so a wake-up that arrives meanwhile is not lost.
                self._wake.clear()
                free = self.concurrency - self._busy_count()
                got = 0
                if free > 0:
                    try:
                        got = self._claim(free)
                        backoff = 0.0
                    except DatabaseError as e:
                        # The database is down or refusing: back off, never spin.
                        backoff = min(10.0, max(0.2, backoff * 2))
                        log.warning("claim failed (%s); retrying in %.1fs", e, backoff)
                        db_connection.close()
                        self._stopping.wait(backoff)
                        continue
                if self.burst and got == 0 and self._busy_count() == 0:
                    break
                # Either nothing more is due or every slot is busy: wait for NOTIFY, a freed
                # slot, or the poll interval.
                self._wake.wait(self.poll_interval)
        finally:
            listener.stop()
            self._shutdown()
        return self.stats

    def _busy_count(self) -> int:
        with self._busy_lock:
            return self._busy

    def _claim(self, free: int) -> int:
        leases = store.claim(executor=self.executor_id, queues=self.queues, limit=free)
        for lease in leases:
            self._took(lease)
            self._todo.put(lease)
        if leases:
            metrics.claimed(len(leases))
        return len(leases)

    def _took(self, lease: store.Lease) -> None:
        """Count a committed claim against this executor's slots."""
        with self._busy_lock:
            self._busy += 1
        self.stats.claimed += 1
        store.log_event("claim", job=lease.job_id, fence=lease.fence, attempt_kind=lease.kind)

    def _next_claim(self) -> NextClaim | None:
        """A claim of one more job for the slot an attempt is about to free, made in that
        attempt's completion transaction; none while stopping."""
        if self._stopping.is_set() or not self.claim_next:
            return None

        def wanted() -> int:
            # Checked again at the claim itself: a stop requested while the attempt ran
            # means no new work is taken.
            return 0 if self._stopping.is_set() else 1

        return NextClaim(executor=self.executor_id, queues=self.queues, wanted=wanted)

    def _work(self) -> None:
        rng = random.Random()
        while True:
            lease: store.Lease | None = self._todo.get()
            if lease is None:
                break
            # A finished attempt may hand this thread the next job, claimed in its completion
            # transaction; the thread runs it at once, so its slot never sits idle.
            while lease is not None:
                nxt = self._next_claim()
                try:
                    drop_connection_if_broken()
                    outcome = run_lease(
                        lease, heartbeater=self.heartbeater, rng=rng, next_claim=nxt
                    )
                    self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
                    store.log_event("end", job=lease.job_id, fence=lease.fence, outcome=outcome)
                except Exception:
                    store.log_event("end", job=lease.job_id, fence=lease.fence, outcome="error")
                    # The database failed while ending the attempt: its lease will expire and
                    # the reaper moves it on. Nothing is lost, only delayed.
                    log.exception("job %s: could not record the attempt's end", lease.job_id)
                    db_connection.close()
                finally:
                    following = nxt.got if nxt is not None else []
                    for extra in following:
                        self._took(extra)
                    if following:
                        metrics.claimed(len(following))
                    with self._busy_lock:
                        self._busy -= 1
                    if not following:
                        self._wake.set()
                lease = following[0] if following else None
                for extra in following[1:]:
                    self._todo.put(extra)
        db_connection.close()

    def _shutdown(self) -> None:
        deadline = time.monotonic() + (self.grace if self._stopping.is_set() else 0)
        while self._busy_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        for ctx in self.heartbeater.active():
            ctx.mark_lost("executor shut down before the attempt finished")
            try:
                store.release(ctx.lease)
                log.info("executor %s: released job %s", self.executor_id, ctx.job_id)
            except StaleAttempt as e:
                store.record_stale(e, self.executor_id)
            except DatabaseError:
                log.exception("could not release job %s; its lease will expire", ctx.job_id)
        self.heartbeater.stop()
        for _ in self._threads:
            self._todo.put(None)
        with contextlib.suppress(DatabaseError):
            store.executor_stopped(self.executor_id)
        log.info(
            "executor %s: stopped after %d claims %s",
            self.executor_id,
            self.stats.claimed,
            self.stats.outcomes,
        )


def limit_idle_transactions() -> None:
    """In this executor process, have PostgreSQL end any of its transactions left idle longer
    than ``EXECUTOR_IDLE_TX_TIMEOUT_MS`` (every connection opened from now on), and plan the
    prepared hot statements once per connection (with ``TENURE_PREPARED_STATEMENTS``).

    An executor stopped or cut off between a statement and its ``COMMIT`` would otherwise hold
    the job rows that statement locked, and the reaper (which skips locked rows) could not
    rescue them until the server noticed, up to the server-wide limit. Idempotent.
    """
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection, dispatch_uid="tenure.executor.idle_tx")


def _on_connection(sender: Any, connection: Any, **_: Any) -> None:
    if connection.vendor != "postgresql":
        return
    s = conf.get()
    with connection.cursor() as cur:
        if s.EXECUTOR_IDLE_TX_TIMEOUT_MS > 0:
            cur.execute(
                f"SET idle_in_transaction_session_timeout = {int(s.EXECUTOR_IDLE_TX_TIMEOUT_MS)}"
            )
        if s.PREPARED_STATEMENTS:
            # Only the claim and the completion are prepared on the server (store._pg_rows).
            # Left to choose, PostgreSQL kept planning them afresh on every call once the
            # table held 20,000 jobs (its generic plan looked dearer on paper), about 0.4 ms
            # per job of a 1.2-1.6 ms drain loop; their generic plans look rows up by key.
            cur.execute("SET plan_cache_mode = force_generic_plan")


def _handler_idle_limit() -> None:
    """Inside a transactional job's transaction: the handler may work between statements."""
    if db_connection.vendor != "postgresql" or conf.get().EXECUTOR_IDLE_TX_TIMEOUT_MS <= 0:
        return
    ms = int(conf.get().HANDLER_IDLE_TX_TIMEOUT_MS)
    with db_connection.cursor() as cur:
        cur.execute(f"SET LOCAL idle_in_transaction_session_timeout = {ms}")


def drop_connection_if_broken() -> None:
    """Keep this thread's connection from one attempt to the next unless it is unusable.

    Django's ``close_old_connections`` would also close it for its age, which with
    ``CONN_MAX_AGE = 0`` means before every attempt: a new connection per job cost more than
    the job. The broker-less worker threads and the Celery adapter call this before each
    attempt. A connection left outside its autocommit mode, or that saw an error and no longer
    answers, is closed as Django would; one that dies while idle fails the next write, which
    the attempt's read-back and the reaper already handle.
    """
    conn = db_connection
    if conn.connection is None:
        return
    if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
        conn.close()
    elif conn.errors_occurred:
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()


class _Listener:
    """PostgreSQL ``LISTEN`` for wake-ups; a no-op elsewhere (polling covers it)."""

    def __init__(self, queues: Sequence[str], wake: threading.Event) -> None:
        self.queues = set(queues)
        self.wake = wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if db_connection.vendor != "postgresql":
            return
        self._thread = threading.Thread(target=self._run, name="tenure-listen", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psycopg

        params = db_connection.get_connection_params()
        delay = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {store.WAKEUP_CHANNEL}")
                    delay = 0.5
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0):
                            woken = store.read_wakeup(n.payload)
                            if woken is not None and woken[0] in self.queues:
                                # The claim floors learn where the job stands, so the next
                                # claim's seek reaches it.
                                store.FLOORS.woken(*woken)
                                self.wake.set()
            except Exception as e:  # reconnect with backoff; polling still runs meanwhile
                log.debug("listener reconnecting after %s", e)
                self._stop.wait(delay)
                delay = min(10.0, delay * 2)
