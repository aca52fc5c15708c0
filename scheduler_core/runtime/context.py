"""What a handler sees: ``ctx`` with the work identity, the attempt and the effect ledger."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from asgiref.sync import sync_to_async

import scheduler_core.hooks as hooks
import scheduler_core.signals as signals
import scheduler_core.tracing as tracing

from ..domain.classify import is_ambiguous_in_flight, is_refused_before_send
from ..exceptions import JobCancelled, Permanent, Snooze, StaleAttempt, Transient
from ..models import Effect
from ..storage.drivers import driver
from ..storage.records import Lease

log = logging.getLogger("tenure.context")


@dataclass(frozen=True, kw_only=True)
class EffectRef:
    """The effect a reconcile function is asked about: its name, its key (the one the run
    attempts sent), the fence of the attempt that last started it and its ledger state."""

    name: str
    key: str
    fence: int
    state: str


class JobContext:
    """The handler's view of its attempt.

    ``ctx.job_id`` is the work identity, ``ctx.attempt`` the attempt number (from 1) and
    ``ctx.fence`` the fencing token this attempt holds. ``ctx.effect(name)`` opens a fenced
    effect record (see :class:`EffectScope`). ``ctx.cancelled`` and ``ctx.check_cancelled()``
    tell a handler that an operator asked it to stop (a cooperative cancel).
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.job_id = lease.job_id
        self.attempt = lease.number
        self.fence = lease.fence
        self.kind = lease.kind
        self.name = lease.name
        self.payload = lease.payload
        self._lost = threading.Event()
        self._on_lost: list[Callable[[], None]] = []
        self._on_lost_lock = threading.Lock()
        self._cancel = threading.Event()
        self.lost_reason = ""
        self.ambiguous = False
        """True once an effect ended with its outcome unknown in this attempt."""
        self.reconciling: EffectRef | None = None
        """In a reconcile attempt, the effect the reconcile function is being asked about (it
        is asked once per effect of unknown outcome; its answer settles that effect only)."""
        self.sender: Any = None
        """The job's type (what ``@job`` returned): the sender of the attempt's signals."""
        self.error: BaseException | None = None
        """The error the attempt's end was written for (None: it ended without one)."""
        self.span: Any = None
        """The attempt's span while tracing is on (:mod:`scheduler_core.tracing`)."""
        self.result: Any = None
        """What the handler returned, once it has returned and the value was found fit to
        keep (:func:`~scheduler_core.api.results.checked_result`): the completion stores it."""
        self.workflow_id = lease.workflow_id
        """The workflow this job is a step of (None: an ordinary job)."""
        self._parent_results: dict[str, Any] | None = None

    @property
    def lost(self) -> bool:
        """Whether this attempt has lost (or can no longer prove) ownership of the job."""
        return self._lost.is_set()

    def mark_lost(self, reason: str) -> None:
        """Called by the heartbeat when the lease was refused or could not be renewed."""
        with self._on_lost_lock:
            if self._lost.is_set():
                return
            self.lost_reason = reason
            self._lost.set()
            callbacks, self._on_lost = self._on_lost, []
        log.warning("job %s fence %s: attempt lost (%s)", self.job_id, self.fence, reason)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # the caller (the heartbeat) must go on renewing the others
                log.exception("job %s: a callback on the attempt's loss failed", self.job_id)

    def when_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once the attempt is lost (at once if it already is), on the
        thread that marks it lost; returns a function that withdraws it. How an ``async def``
        handler's coroutine is cancelled when its lease is lost
        (:mod:`scheduler_core.runtime.invoke`)."""
        with self._on_lost_lock:
            lost = self._lost.is_set()
            if not lost:
                self._on_lost.append(callback)
        if lost:
            callback()

        def withdraw() -> None:
            with self._on_lost_lock:
                if callback in self._on_lost:
                    self._on_lost.remove(callback)

        return withdraw

    @property
    def parent_results(self) -> dict[str, Any]:
        """In a workflow step: ``{parent step name: what its succeeded attempt returned}``
        (read once, on first use; a parent an operator resolved returned nothing: None).
        Empty for a step without parents and for an ordinary job."""
        if self._parent_results is None:
            self.load_parent_results()
        return self._parent_results or {}

    def load_parent_results(self) -> None:
        """Read :attr:`parent_results` now (the runtime does, before the handler runs)."""
        self._parent_results = (
            driver().parent_results(self.job_id) if self.workflow_id is not None else {}
        )

    @property
    def cancelled(self) -> bool:
        """Whether an operator has asked this attempt to stop (cheap, no query).

        The attempt learns it at its next lease renewal (the heartbeat), or when the database
        refuses an effect intent because of it. A handler that sees it should stop: raise
        through :meth:`check_cancelled`, or return. From then on no effect starts
        (``ctx.effect`` raises :class:`~scheduler_core.exceptions.JobCancelled`) and the job
        ends ``cancelled``, unless an effect had already been applied and the handler returns.
        """
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        """Raise :class:`~scheduler_core.exceptions.JobCancelled` if an operator asked this
        attempt to stop (cheap, no query): call it between steps; letting it propagate ends
        the job ``cancelled``."""
        if self._cancel.is_set():
            raise JobCancelled(
                f"job {self.job_id}: an operator asked the attempt to stop", job_id=self.job_id
            )

    def mark_cancel_requested(self) -> None:
        """Called when the heartbeat's renewal (or a refused effect intent) reports the
        operator's cancel request."""
        if not self._cancel.is_set():
            self._cancel.set()
            log.info("job %s fence %s: cancel requested by an operator", self.job_id, self.fence)

    def check(self, write: str = "check") -> None:
        """Raise :class:`StaleAttempt` if the attempt has lost its lease (cheap, no query).

        ``write`` names what the caller was about to write, for the refusal's record.
        """
        if self.lost:
            raise StaleAttempt(self.job_id, self.fence, write)

    def effect(self, name: str) -> EffectScope:
        """A fenced effect record: ``with ctx.effect("charge") as eff: ...`` in a plain
        handler, ``async with ctx.effect("charge") as eff: ...`` in an ``async def`` one."""
        if not name or len(name) > 100:
            raise ValueError("effect name must be 1..100 characters")
        return EffectScope(self, name)

    def effect_key(self, name: str) -> str:
        """The key of effect ``name`` of this job, without recording anything.

        The same in every attempt: a reconcile function uses it to ask the destination what
        became of the effect a run attempt started. An ``async def`` function awaits
        :meth:`aeffect_key` instead.
        """
        refuse_in_event_loop("ctx.effect_key(name)", "await ctx.aeffect_key(name)")
        return driver().effect_key(self.job_id, name)

    async def aeffect_key(self, name: str) -> str:
        """:meth:`effect_key` for an ``async def`` handler or reconcile function (the read
        runs on the attempt's own thread and database connection)."""
        return await sync_to_async(driver().effect_key)(self.job_id, name)


def refuse_in_event_loop(call: str, instead: str) -> None:
    """Raise :class:`~scheduler_core.exceptions.Permanent` naming ``instead`` when ``call``, a
    synchronous read or write of Tenure's database, is made from a running event loop (an
    ``async def`` handler): Django would refuse it there with ``SynchronousOnlyOperation``,
    and it would fail the same way in every attempt."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise Permanent(
        f"{call} is synchronous and was called from an async def handler; write {instead}"
    )


def effect_recorded(ctx: JobContext, effect: str, key: str, state: str) -> None:
    """Send ``effect_recorded`` for ``ctx``'s ledger write of ``effect`` in ``state`` once that
    write commits (a ``transactional`` job's commits with the job's transaction)."""
    if not signals.effect_recorded.receivers:
        return
    lease = ctx.lease
    arguments = {
        "job_id": lease.job_id,
        "name": lease.name,
        "queue": lease.queue,
        "attempt": lease.number,
        "fence": lease.fence,
        "effect": effect,
        "key": key,
        "state": state,
    }
    sender = ctx.sender
    after_commit(lambda: signals.send(signals.effect_recorded, sender, **arguments))


def after_commit(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the open transaction on Tenure's database commits, at once outside one
    (without opening a connection to ask)."""
    conn = driver().connection
    if conn.in_atomic_block:
        conn.on_commit(fn)
    else:
        fn()


class EffectScope:
    """Context manager around one business effect.

    On entry it records the intent (a fenced write refused once the attempt is stale or its
    lease expired by the database's clock). ``eff.key`` is derived from the installation, the
    job and the effect's name — the same for every retry, reconcile attempt, operator retry and fallback —
    and ``eff.fence`` is the fencing token to pass to the destination. ``eff.done`` is true
    when the ledger already records the effect applied (skip the call then). On a normal exit
    the effect is recorded ``applied``; on an exception it is recorded ``not_applied`` when
    the error says nothing was sent (``Transient``, ``Permanent``, a refused connection) and
    ``unknown`` otherwise. A handler that learns from the destination that its fencing token
    is stale raises :class:`StaleAttempt`: nothing more is written for the attempt.

    In a ``transactional`` job the scope runs inside the job's transaction: the ledger row is
    written ``applied`` on exit and commits with the completion, or rolls back with it.

    An ``async def`` handler enters it with ``async with``: the same writes, run on the
    attempt's own thread and connection (inside the job's transaction where there is one)
    while the coroutine waits. The plain ``with`` form there raises
    :class:`~scheduler_core.exceptions.Permanent` before writing anything.
    """

    def __init__(self, ctx: JobContext, name: str) -> None:
        self.ctx = ctx
        self.name = name
        self.key = ""
        """The effect's key, known once the scope is entered (the ledger row holds it)."""
        self.fence = ctx.fence
        self.done = False
        self.destination_ref = ""
        self.note = ""
        self._span: Any = None

    def __enter__(self) -> EffectScope:
        refuse_in_event_loop('with ctx.effect("...")', 'async with ctx.effect("...")')
        return self._enter()

    async def __aenter__(self) -> EffectScope:
        return await sync_to_async(self._enter)()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await sync_to_async(self._exit)(exc)

    def _enter(self) -> EffectScope:
        self.ctx.check("effect_intent")
        if self.ctx.span is not None:
            self._span = tracing.start_effect(
                self.name,
                {"tenure.job.id": self.ctx.job_id, "tenure.fence": self.ctx.fence},
            )
        try:
            row = driver().effect_intend(self.ctx.lease, self.name)
        except JobCancelled:
            # The database refused the intent because an operator asked the attempt to stop.
            self.ctx.mark_cancel_requested()
            self._ended("", "refused")
            raise
        except BaseException:
            self._ended("", "refused")
            raise
        self.key = row.key
        self.done = row.state == Effect.APPLIED
        if self.done:
            self._ended(row.key, Effect.APPLIED)
        else:
            self._recorded(Effect.INTENDED)
            hooks.failpoint("before_effect")
        return self

    def _recorded(self, state: str) -> None:
        effect_recorded(self.ctx, self.name, self.key, state)

    def _ended(self, key: str, state: str) -> None:
        span, self._span = self._span, None
        tracing.end_effect(span, key, state)

    def applied(self, destination_ref: str = "", note: str = "") -> None:
        """Attach the destination's reference (for example its charge id) to the record."""
        self.destination_ref = destination_ref
        self.note = note

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    def _exit(self, exc: BaseException | None) -> None:
        if self.done:
            return
        if exc is None:
            hooks.failpoint("after_effect")
            try:
                driver().effect_settle(
                    self.ctx.lease,
                    self.key,
                    Effect.APPLIED,
                    destination_ref=self.destination_ref,
                    note=self.note,
                    name=self.name,
                )
            except BaseException:
                self._ended(self.key, "refused")
                raise
            self._ended(self.key, Effect.APPLIED)
            self._recorded(Effect.APPLIED)
            return
        if isinstance(exc, StaleAttempt):
            self._ended(self.key, "refused")
            return
        # The handler's own Transient/Permanent/Snooze assert nothing happened; otherwise the
        # classifier's rule decides whether the request can have left (one rule, one place).
        nothing_sent = isinstance(exc, Transient | Permanent | Snooze) or is_refused_before_send(
            exc
        )
        state = Effect.NOT_APPLIED if nothing_sent else Effect.UNKNOWN
        if state == Effect.UNKNOWN:
            self.ctx.ambiguous = True
        note = f"{type(exc).__name__}: {exc}"
        if is_ambiguous_in_flight(exc):
            note = f"may have reached the destination: {note}"
        try:
            # "Nothing sent" by this attempt does not erase an earlier unknown outcome: the
            # ledger keeps the row unknown (the driver's effect_settle), and the job's decision then
            # reads it (has_unsettled_effect).
            driver().effect_settle(self.ctx.lease, self.key, state, note=note)
        except StaleAttempt as stale:
            self._ended(self.key, "refused")
            driver().record_stale(stale, self.ctx.lease.executor)
        except Exception:  # the original error matters more than the ledger note
            self._ended(self.key, "refused")
            log.exception("job %s: could not record effect outcome", self.ctx.job_id)
        else:
            self._ended(self.key, state)
            self._recorded(state)
