"""The heartbeat: one thread per process renews the leases of its running attempts, self-fences
an attempt whose lease would run out by this process's clock, stops renewing one past its
maximum runtime, tells an attempt an operator asked to stop (the renewal reports it), and
beats the executor's liveness row."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError

import scheduler_core.hooks as hooks

from ..conf import tenure_settings
from ..exceptions import AttemptOverrun, StaleAttempt
from ..read import metrics
from ..storage.drivers import driver
from .context import JobContext

log = logging.getLogger("tenure.executor")

FORK_GUARD = threading.Lock()
"""Held by the heartbeat thread while it talks to the database, and by ``os.fork()`` (RQ's work
horses, a prefork pool) while it forks: a child forked while another thread is inside the
database driver's C code can inherit that code's locks held, and the child's first database
call then waits forever (SQLite takes a process-wide lock on its allocations). A fork waits
for the beat under way, a few milliseconds; a beat waits for the fork."""

os.register_at_fork(
    before=FORK_GUARD.acquire,
    after_in_parent=FORK_GUARD.release,
    after_in_child=FORK_GUARD.release,
)


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
        fraction = tenure_settings().HEARTBEAT_FRACTION
        try:
            while not self._stop.wait(0.2):
                with FORK_GUARD:
                    self.tick(fraction)
        finally:
            with FORK_GUARD:
                driver().connection.close()

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
                hooks.event(
                    "heartbeat_late", job=ctx.job_id, fence=ctx.lease.fence, late=round(late, 3)
                )
            try:
                if driver().heartbeat(ctx.lease):
                    ctx.mark_cancel_requested()
                a.last_renewed = sent
                a.late_logged = False
                took = time.monotonic() - sent
                if took > lease_s * 0.25:
                    log.warning("job %s: lease renewal took %.2fs", ctx.job_id, took)
                    hooks.event(
                        "heartbeat_slow", job=ctx.job_id, fence=ctx.lease.fence, took=round(took, 3)
                    )
            except AttemptOverrun as e:
                driver().record_stale(e, self.executor_id)
                ctx.mark_lost("past its maximum runtime (renewal refused)")
            except StaleAttempt as e:
                metrics.stale_refused(e.write)
                driver().record_stale(e, self.executor_id)
                ctx.mark_lost("lease taken over (heartbeat refused)")
            except DatabaseError as e:
                log.warning("heartbeat for job %s failed: %s", ctx.job_id, e)
                driver().connection.close()
                # Self-fence before the lease can have expired by the database's clock.
                if time.monotonic() - a.last_renewed > lease_s * 0.8:
                    ctx.mark_lost("could not renew the lease in time")
        if (
            self.beat_executor
            and now - self._last_executor_beat > tenure_settings().EXECUTOR_BEAT_SECONDS
        ):
            self._last_executor_beat = now
            try:
                driver().executor_beat(self.executor_id, active=len(items))
            except DatabaseError:
                driver().connection.close()
