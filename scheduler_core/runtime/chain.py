"""A run of jobs in one Celery task: the message's job, then the queue's next due jobs, with
their successful completions written together; and the warden thread that bounds what such a
run holds while one of its handlers runs long.

A Celery message costs its transport's whole per-message work; one durable commit per job on
top of that would halve a pool process's rate. So, for up to ``TENURE_CELERY_CHAIN_SECONDS``
per message, the task claims the queue's next due jobs itself (in batches) and runs them one
after another. A successful attempt of a job that is not ``transactional`` is not committed on
its own: its completion waits, its lease still renewed, until the batch ends or
``TENURE_CELERY_COMMIT_WINDOW`` has passed since the first waiting completion, whichever comes
first; then one statement writes every waiting completion, each fenced by its own lease, and
claims the next batch, in one commit (:func:`scheduler_core.storage.base.Driver.complete_many_and_claim`).

What that changes, and what it does not (``docs/transports.md``):

* Every write is still fenced; a completion whose lease was taken over is refused on its own
  and recorded, the others commit. A completion refused while the job's ledger holds an
  effect that may or may not have happened ends its attempt as that ambiguous failure, under
  the job's effect mode, never as a success.
* A completion is visible (and its ``end`` event logged) only once its commit is known; a
  connection lost during ``COMMIT`` is read back, and so are the claims made in the same
  transaction (or in a claim's own transaction): they are run only when it committed.
* A handler never holds the waiting completions for longer than the window: while the chain
  runs a handler, the process's :class:`Warden` commits them (without claiming) once the window
  has passed. A process killed before that loses the completions whose handlers returned
  within the last window (on SQLite, during a ``transactional`` handler, since it began) or
  whose write was under way: those jobs stay leased until their leases expire, then run
  again, as a job does whose executor is killed after its handler returned and before its
  completion committed. ``transactional`` jobs commit with their handler's writes, as always;
  set the window to 0 to commit every completion on its own.
* Jobs claimed for the batch and not yet started are in the heartbeat too, and one whose
  renewal is refused is not run. Once the handler running before them has run for
  ``TENURE_CELERY_QUEUED_HOLD_SECONDS``, the warden gives them back (waiting again, no attempt
  spent); the chain never starts a job given back. A killed process holds them at most until
  their leases expire.
* The chain stops claiming when its ``stopping`` callable says so (the Celery adapter: the
  worker is shutting down, or the pool process lost its parent); jobs it claimed and had not
  started are then given back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError

import scheduler_core.hooks as hooks

from ..api import registry
from ..conf import tenure_settings
from ..domain.modes import EffectMode
from ..exceptions import StaleAttempt
from ..read import metrics
from ..storage.drivers import driver
from ..storage.records import Lease
from .attempt import run_lease
from .context import JobContext
from .group import write_completions
from .heartbeat import Heartbeater

log = logging.getLogger("tenure.chain")

BATCH_MAX = 64
"""The most jobs one completion statement claims for the next batch."""


def _never() -> bool:
    return False


class Chain:
    """Run ``first`` and then the next due jobs of its queue, committing completions together.

    ``seconds`` bounds how long the chain keeps claiming; ``window`` how long a successful
    completion may wait for the batch's commit (0: each commits on its own, with the claim of
    the next job); ``hold`` how long a handler may run before the jobs queued behind it are
    given back (default ``TENURE_CELERY_QUEUED_HOLD_SECONDS``). ``stopping`` is asked before
    every claim and before every queued job starts: once it says so, the chain claims nothing
    more and gives its queued jobs back. ``warden`` (default: this process's) keeps both
    bounds while a handler runs. ``succeeded`` lists the jobs whose completions the chain
    wrote together and saw commit (a ``transactional`` job commits with its handler and is
    not among them); it is complete once :meth:`run` has returned.
    """

    def __init__(
        self,
        *,
        executor_id: str,
        queue: str,
        heartbeater: Heartbeater,
        seconds: float,
        window: float,
        hold: float | None = None,
        stopping: Callable[[], bool] = _never,
        warden: Warden | None = None,
    ) -> None:
        self.executor_id = executor_id
        self.queues = [queue]
        self.hb = heartbeater
        self.until = time.monotonic() + seconds
        self.window = max(0.0, window)
        self.hold = max(0.0, tenure_settings().CELERY_QUEUED_HOLD_SECONDS if hold is None else hold)
        self.stopping = stopping
        self.warden = warden
        self.succeeded: list[int] = []
        self.outcome = ""
        # Shared with the warden thread. ``_lock`` guards the fields below it and is held only
        # briefly; ``_writing`` is held for a whole write, so each waiting completion and each
        # queued job is taken, and written, by exactly one thread.
        self._writing = threading.Lock()
        self._lock = threading.Lock()
        self._pending: list[JobContext] = []
        self._first_pending_at = 0.0
        self._queued: dict[int, JobContext] = {}
        self._running_since: float | None = None
        self._warden_may_write = False

    # -- the main thread ----------------------------------------------------------------------

    def run(self, first: Lease) -> str:
        """Run the chain; returns the last attempt's outcome."""
        warden = self.warden or process_warden()
        warden.watch(self)
        batch = [first]
        try:
            while batch:
                for lease in batch:
                    hooks.event(
                        "claim", job=lease.job_id, fence=lease.fence, attempt_kind=lease.kind
                    )
                # The batch's jobs wait in this process: keep their leases renewed.
                queued = {lease.attempt_id: JobContext(lease) for lease in batch}
                for ctx in queued.values():
                    self.hb.add(ctx)
                with self._lock:
                    self._queued = queued
                started = time.monotonic()
                ran = 0
                for i, lease in enumerate(batch):
                    if self.stopping():
                        self._give_back(self._take_queued(), why="worker shutting down")
                        break
                    waited = self._start(lease)
                    if waited is None:
                        continue  # given back by the warden while the job before it ran
                    if waited.lost:
                        # Its renewal was refused (and recorded): another attempt owns it now.
                        self._stopped_running()
                        self.hb.remove(waited)
                        self._ended(lease, "stale")
                        continue
                    warden.poke(self)
                    try:
                        out = run_lease(lease, heartbeater=self.hb, defer=self._defer)
                    finally:
                        self._stopped_running()
                    ran += 1
                    if out != "deferred":
                        self._ended(lease, out)
                    if i < len(batch) - 1 and self._overdue():
                        self._flush(0)
                per_job = (time.monotonic() - started) / max(1, ran)
                batch = self._flush(self._next_size(per_job))
        finally:
            warden.unwatch(self)
            # An exception may be on its way out: commit what succeeded, if the database lets
            # us, and give back what never started.
            self._flush(0)
            self._give_back(self._take_queued(), why="chain ended before starting it")
        return self.outcome

    def _start(self, lease: Lease) -> JobContext | None:
        """Take ``lease`` off the queue to run it now, unless the warden gave it back."""
        jt = registry.get(lease.name)
        # Where the database has one write lock (SQLite), a transactional handler holds it for
        # its whole run (bounded: storage/sqlite_hold.py): any write of the warden's would wait
        # on it, so the warden waits too.
        exclusive = jt is not None and jt.effect == EffectMode.TRANSACTIONAL and driver().one_writer
        with self._lock:
            ctx = self._queued.pop(lease.attempt_id, None)
            if ctx is not None:
                self._running_since = time.monotonic()
                self._warden_may_write = not exclusive
        return ctx

    def _stopped_running(self) -> None:
        with self._lock:
            self._running_since = None

    def _defer(self, ctx: JobContext) -> bool:
        with self._lock:
            # The handler has returned: from here on the main thread writes, not the warden.
            self._running_since = None
            if not self._pending:
                self._first_pending_at = time.monotonic()
            self._pending.append(ctx)
        return True

    def _overdue(self) -> bool:
        with self._lock:
            return bool(self._pending) and (
                time.monotonic() - self._first_pending_at >= self.window
            )

    def _next_size(self, per_job: float) -> int:
        """As many jobs as fit in the commit window at the last batch's pace (at least 1)."""
        if self.window <= 0:
            return 1
        if per_job <= 0:
            return BATCH_MAX
        return max(1, min(BATCH_MAX, int(self.window / per_job)))

    def _flush(self, limit: int) -> list[Lease]:
        """Write the waiting completions and claim up to ``limit`` next jobs, in one commit."""
        with self._writing:
            want = limit if time.monotonic() < self.until and not self.stopping() else 0
            with self._lock:
                pending, self._pending = self._pending, []
            if not pending and want == 0:
                return []
            return self._write(pending, want, main=True)

    # -- the warden's side --------------------------------------------------------------------

    def due_at(self) -> float | None:
        """When, by this process's monotonic clock, the warden must next act for this chain
        (None: nothing to do while no handler runs)."""
        with self._lock:
            if self._running_since is None or not self._warden_may_write:
                return None
            times = []
            if self._pending:
                times.append(self._first_pending_at + self.window)
            if self._queued:
                times.append(self._running_since + self.hold)
            return min(times, default=None)

    def tend(self) -> None:
        """Called by the warden thread: while a handler runs, commit the waiting completions
        once the window has passed (claiming nothing) and give the queued jobs back once the
        handler has run for ``hold``."""
        with self._writing:
            now = time.monotonic()
            with self._lock:
                if self._running_since is None or not self._warden_may_write:
                    return
                pending: list[JobContext] = []
                if self._pending and now >= self._first_pending_at + self.window:
                    pending, self._pending = self._pending, []
                queued: list[JobContext] = []
                if self._queued and now >= self._running_since + self.hold:
                    queued = list(self._queued.values())
                    self._queued = {}
            if pending:
                self._write(pending, 0, main=False)
            if queued:
                self._give_back(
                    queued, why=f"the job before it ran longer than {self.hold:g}s", main=False
                )

    # -- writes (under ``_writing``, by either thread) ----------------------------------------

    def _write(self, pending: list[JobContext], want: int, *, main: bool) -> list[Lease]:
        written = write_completions(
            pending,
            executor_id=self.executor_id,
            queues=self.queues,
            want=want,
            heartbeater=self.hb,
        )
        for lease, outcome in written.ended:
            if outcome == "succeeded":
                self.succeeded.append(lease.job_id)
            self._ended(lease, outcome, main=main)
        return written.got

    def _take_queued(self) -> list[JobContext]:
        with self._lock:
            queued = list(self._queued.values())
            self._queued = {}
        return queued

    def _give_back(self, queued: list[JobContext], *, why: str, main: bool = True) -> None:
        """Give back jobs claimed for the batch that never started: waiting again at once,
        no attempt spent (:func:`scheduler_core.storage.base.Driver.release_unstarted`)."""
        for n, ctx in enumerate(queued):
            self.hb.remove(ctx)
            lease = ctx.lease
            if ctx.lost:
                self._ended(lease, "stale", main=main)  # its refused renewal is recorded
                continue
            try:
                driver().release_unstarted(lease, why=why)
            except StaleAttempt as e:
                metrics.stale_refused(e.write)
                driver().record_stale(e, self.executor_id)
                self._ended(lease, "stale", main=main)
            except DatabaseError as e:
                log.warning(
                    "could not give back %d claimed jobs (%s); they wait for their leases",
                    len(queued) - n,
                    e,
                )
                for rest in queued[n + 1 :]:
                    self.hb.remove(rest)
                return
            else:
                self._ended(lease, "released", main=main)

    def _ended(self, lease: Lease, outcome: str, *, main: bool = True) -> None:
        hooks.event("end", job=lease.job_id, fence=lease.fence, outcome=outcome)
        if main:
            # The warden only ends jobs the main thread has moved past; the chain's outcome is
            # the last job's, which the main thread ends.
            self.outcome = outcome


class Warden:
    """A thread that keeps a chain's bounds while its main thread is inside a handler: it
    commits the waiting completions once the commit window has passed, and gives back the
    queued jobs once the handler has run for the hold. One per process
    (:func:`process_warden`), started when first needed; it has its own database connection,
    which it closes whenever no chain is running."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._chains: list[Chain] = []
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._connected = False
        # When the thread looks again: None while it waits for a notification, 0 while it is
        # not waiting at all (it will look again anyway).
        self._wake_at: float | None = 0.0

    def watch(self, chain: Chain) -> None:
        """Keep ``chain``'s bounds until :meth:`unwatch`; starts the thread if needed."""
        with self._cv:
            self._chains.append(chain)
            if self._thread is None or not self._thread.is_alive():
                self._stopped = False
                self._thread = threading.Thread(target=self._run, name="tenure-warden", daemon=True)
                self._thread.start()
            self._cv.notify()

    def unwatch(self, chain: Chain) -> None:
        """Stop watching ``chain``."""
        with self._cv:
            if chain in self._chains:
                self._chains.remove(chain)
            self._cv.notify()

    def poke(self, chain: Chain) -> None:
        """``chain``'s times changed: look again, if they are earlier than the thread was going
        to (a backlog of quick jobs then costs no thread switch per job)."""
        due = chain.due_at()
        with self._cv:
            if due is not None and (self._wake_at is None or due < self._wake_at):
                self._cv.notify()

    def stop(self) -> None:
        """Stop the thread (it closes its connection)."""
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    due: list[Chain] = []
                    while not self._stopped:
                        now = time.monotonic()
                        times = [(c.due_at(), c) for c in self._chains]
                        due = [c for t, c in times if t is not None and t <= now]
                        if due or (not self._chains and self._connected):
                            break
                        later = [t for t, _ in times if t is not None]
                        self._wake_at = min(later) if later else None
                        self._cv.wait(self._wake_at - now if self._wake_at is not None else None)
                    self._wake_at = 0.0
                    if self._stopped:
                        return
                if not due:
                    # No chain runs: hold no connection while idle.
                    driver().connection.close()
                    self._connected = False
                    continue
                for chain in due:
                    self._connected = True
                    try:
                        chain.tend()
                    except Exception:  # the thread must outlive any one failure
                        log.exception("warden: could not tend a chain")
                        time.sleep(0.1)
        finally:
            driver().connection.close()


_wardens: dict[int, Warden] = {}
_wardens_lock = threading.Lock()


def process_warden() -> Warden:
    """This process's warden (a forked child gets its own)."""
    with _wardens_lock:
        pid = os.getpid()
        w = _wardens.get(pid)
        if w is None:
            w = _wardens[pid] = Warden()
        return w
