"""The broker-less worker (``manage.py run_executor``): claims due jobs in batches and runs them
on threads, wakes on the database's notifications or polls, writes its threads' completions
together, and on SIGTERM stops claiming, lets running attempts finish within a grace and
releases the rest."""

from __future__ import annotations

import contextlib
import logging
import queue as queue_mod
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError

import scheduler_core.hooks as hooks

from ..conf import tenure_settings
from ..exceptions import StaleAttempt
from ..read import metrics
from ..storage.drivers import driver
from ..storage.records import Lease, new_executor_id
from .attempt import release, run_lease
from .completion import NextClaim
from .connections import drop_connection_if_broken, limit_idle_transactions, register_executor
from .context import JobContext
from .group import write_completions
from .heartbeat import Heartbeater
from .process_signals import StopOnSignal

log = logging.getLogger("tenure.executor")

CLEANUP_SECONDS = 1.0
"""How long a stopping executor waits, after giving its unfinished attempts back, for their
threads to end (a cancelled coroutine's cleanup)."""


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

    With ``group_commit`` (``TENURE_EXECUTOR_GROUP_COMMIT``, on by default) a thread whose
    attempt succeeded (a job that is not ``transactional``) hands the completion to the
    worker's loop and takes its next job at once; the loop writes every completion handed to it
    since its last write in one statement, each fenced by its own lease, together with the
    claim of as many jobs as there are free threads, in one commit
    (:func:`write_completions`). A completion waits at most for the write under way when it
    was handed over; a process killed before its write commits loses it, and the job runs again
    once its lease expires, as when a process dies between a handler's return and its own
    commit (``docs/guarantees.md``, "Completions written together"). Without it each thread
    commits its completion with the claim of its own next job (:class:`NextClaim`).
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
        group_commit: bool | None = None,
    ) -> None:
        s = tenure_settings()
        self.queues = list(queues)
        self.concurrency = max(1, concurrency)
        self.poll_interval = s.POLL_INTERVAL if poll_interval is None else poll_interval
        self.grace = s.SHUTDOWN_GRACE_SECONDS if grace is None else grace
        self.burst = burst
        self.claim_next = claim_next
        """Claim the next job in each successful attempt's completion transaction."""
        self.group_commit = s.EXECUTOR_GROUP_COMMIT if group_commit is None else group_commit
        """Write the threads' successful completions together from the worker's loop."""
        self.executor_id = executor_id or new_executor_id("exec")
        self.heartbeater = Heartbeater(self.executor_id)
        self.stats = WorkerStats()
        self._todo: queue_mod.Queue[Lease | None] = queue_mod.Queue()
        self._busy = 0
        self._busy_lock = threading.Lock()
        # Completions handed over by the threads, written by the loop (under _busy_lock).
        self._handed: list[JobContext] = []
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
        """SIGTERM and SIGINT stop the executor, SIGUSR1 writes its threads' stacks
        (:mod:`.process_signals`: no handler takes a lock)."""
        StopOnSignal(self.request_stop).install()

    def _register(self) -> None:
        """Write the executor's liveness row, waiting (with backoff, never spinning) for a
        database that is not up yet, so executors may start before it."""
        register_executor(
            self.executor_id,
            transport="polling",
            queues=self.queues,
            concurrency=self.concurrency,
            wait=self._stopping.wait,
        )

    # -- loop -----------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        """Run until stopped (or, in burst mode, until nothing is due and nothing runs)."""
        limit_idle_transactions()
        driver().connection.close()  # reopened with the limit
        self._register()
        log.info(
            "executor %s: queues=%s concurrency=%d", self.executor_id, self.queues, self.concurrency
        )
        self.heartbeater.start()
        # The loop writes every completion: the wake-ups its commits send go from a thread of
        # their own, so the loop claims again without waiting for them.
        driver().start_wakeup_sender(on_wakeup=self._heard)
        for i in range(self.concurrency):
            t = threading.Thread(target=self._work, name=f"tenure-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        listener = _Listener(self.queues, self._wake)
        listener.start()
        backoff = 0.0
        try:
            while not self._stopping.is_set():
                # Cleared before looking, so a wake-up (or a completion handed over) that
                # arrives meanwhile is not lost.
                self._wake.clear()
                handed = self._take_handed()
                free = self.concurrency - self._busy_count()
                got = 0
                if handed or free > 0:
                    try:
                        got = self._write(handed, free) if handed else self._claim(free)
                        backoff = 0.0
                    except DatabaseError as e:
                        # The database is down or refusing: back off, never spin.
                        backoff = min(10.0, max(0.2, backoff * 2))
                        log.warning("claim failed (%s); retrying in %.1fs", e, backoff)
                        driver().connection.close()
                        self._stopping.wait(backoff)
                        continue
                idle = got == 0 and not handed and self._busy_count() == 0
                if self.burst and idle and not self._has_handed():
                    break
                # Either nothing more is due or every slot is busy: wait for NOTIFY, a freed
                # slot, a completion handed over, or the poll interval.
                self._wake.wait(self.poll_interval)
        finally:
            listener.stop()
            self._shutdown()
        return self.stats

    def _heard(self, queue: str) -> None:
        """A wake-up this process announces (a job its own commit made due): the loop claims
        at once, as a wake-up from another process would have it."""
        if queue in self.queues:
            self._wake.set()

    def _busy_count(self) -> int:
        with self._busy_lock:
            return self._busy

    def _take_handed(self) -> list[JobContext]:
        with self._busy_lock:
            handed, self._handed = self._handed, []
        return handed

    def _has_handed(self) -> bool:
        with self._busy_lock:
            return bool(self._handed)

    def _hand_over(self, ctx: JobContext) -> bool:
        """``run_lease``'s ``defer``: the loop writes this successful completion."""
        with self._busy_lock:
            self._handed.append(ctx)
        self._wake.set()
        return True

    def _claim(self, free: int) -> int:
        leases = driver().claim(executor=self.executor_id, queues=self.queues, limit=free)
        self._queue_up(leases)
        return len(leases)

    def _write(self, handed: list[JobContext], free: int) -> int:
        """Write ``handed``'s completions and claim up to ``free`` jobs, in one commit."""
        want = 0 if self._stopping.is_set() else free
        written = write_completions(
            handed,
            executor_id=self.executor_id,
            queues=self.queues,
            want=want,
            heartbeater=self.heartbeater,
        )
        for lease, outcome in written.ended:
            self._ended(lease, outcome)
        self._queue_up(written.got)
        return len(written.got)

    def _queue_up(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            self._took(lease)
            self._todo.put(lease)
        metrics.claimed(leases)

    def _took(self, lease: Lease) -> None:
        """Count a committed claim against this executor's slots."""
        with self._busy_lock:
            self._busy += 1
        self.stats.claimed += 1
        hooks.event("claim", job=lease.job_id, fence=lease.fence, attempt_kind=lease.kind)

    def _ended(self, lease: Lease, outcome: str) -> None:
        """Record the end of an attempt whose outcome is known."""
        with self._busy_lock:
            self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
        hooks.event("end", job=lease.job_id, fence=lease.fence, outcome=outcome)

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
        defer = self._hand_over if self.group_commit else None
        while True:
            lease: Lease | None = self._todo.get()
            if lease is None:
                break
            # A finished attempt may hand this thread the next job, claimed in its completion
            # transaction; the thread runs it at once, so its slot never sits idle.
            while lease is not None:
                nxt = self._next_claim()
                try:
                    drop_connection_if_broken()
                    outcome = run_lease(
                        lease,
                        heartbeater=self.heartbeater,
                        rng=rng,
                        next_claim=nxt,
                        defer=defer,
                    )
                    if outcome != "deferred":
                        self._ended(lease, outcome)
                except Exception:
                    hooks.event("end", job=lease.job_id, fence=lease.fence, outcome="error")
                    # The database failed while ending the attempt: its lease will expire and
                    # the reaper moves it on. Nothing is lost, only delayed.
                    log.exception("job %s: could not record the attempt's end", lease.job_id)
                    driver().connection.close()
                finally:
                    following = nxt.got if nxt is not None else []
                    for extra in following:
                        self._took(extra)
                    metrics.claimed(following)
                    with self._busy_lock:
                        self._busy -= 1
                    if not following:
                        self._wake.set()
                lease = following[0] if following else None
                for extra in following[1:]:
                    self._todo.put(extra)
        driver().connection.close()

    def _shutdown(self) -> None:
        deadline = time.monotonic() + (self.grace if self._stopping.is_set() else 0)
        while (self._busy_count() or self._has_handed()) and time.monotonic() < deadline:
            self._flush_handed()
            time.sleep(0.05)
        # Completions handed over are written, never released: their handlers returned.
        self._flush_handed()
        for ctx in self.heartbeater.active():
            ctx.mark_lost("executor shut down before the attempt finished")
            try:
                release(ctx.lease)
                log.info("executor %s: released job %s", self.executor_id, ctx.job_id)
            except StaleAttempt as e:
                driver().record_stale(e, self.executor_id)
            except DatabaseError:
                log.exception("could not release job %s; its lease will expire", ctx.job_id)
        self.heartbeater.stop()
        for _ in self._threads:
            self._todo.put(None)
        # Marked lost, an async def handler's coroutine was cancelled: give its cleanup (its
        # finally blocks, the tasks it started) a moment to run before the process ends. A
        # plain handler's thread cannot be stopped, and is not waited for past this.
        until = time.monotonic() + CLEANUP_SECONDS
        for t in self._threads:
            t.join(timeout=max(0.0, until - time.monotonic()))
        driver().stop_wakeup_sender()
        with contextlib.suppress(DatabaseError):
            driver().executor_stopped(self.executor_id)
        log.info(
            "executor %s: stopped after %d claims %s",
            self.executor_id,
            self.stats.claimed,
            self.stats.outcomes,
        )

    def _flush_handed(self) -> None:
        """Write the completions handed over, claiming nothing."""
        handed = self._take_handed()
        if handed:
            self._write(handed, 0)


class _Listener:
    """Wakes the worker when a job of its queues is announced (the driver's notifications; a
    database without them has none, and the worker polls)."""

    def __init__(self, queues: Sequence[str], wake: threading.Event) -> None:
        self.queues = set(queues)
        self.wake = wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tenure-listen", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        for woken in driver().listen(self._stop.is_set):
            if woken is not None and woken[0] in self.queues:
                self.wake.set()
