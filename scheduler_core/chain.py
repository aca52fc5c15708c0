"""A run of jobs in one Celery task: the message's job, then the queue's next due jobs, with
their successful completions written together.

A Celery message costs its transport's whole per-message work; one durable commit per job on
top of that would halve a pool process's rate. So, for up to ``TENURE_CELERY_CHAIN_SECONDS``
per message, the task claims the queue's next due jobs itself (in batches) and runs them one
after another. A successful attempt of a job that is not ``transactional`` is not committed on
its own: its completion waits, its lease still renewed, until the batch ends or
``TENURE_CELERY_COMMIT_WINDOW`` has passed since the first waiting completion, whichever comes
first; then one statement writes every waiting completion, each fenced by its own lease, and
claims the next batch, in one commit (:func:`scheduler_core.store.complete_many_and_claim`).

What that changes, and what it does not (``docs/transports.md``):

* Every write is still fenced; a completion whose lease was taken over is refused on its own
  and recorded, the others commit.
* A completion is visible (and its ``end`` event logged) only once its commit is known; a
  connection lost during ``COMMIT`` is read back as for a single completion.
* A process killed before that commit loses the waiting completions: those jobs stay leased
  until their leases expire, then run again, as a job does whose executor is killed after its
  handler returned and before its completion committed. The window is wider (up to the commit
  window plus the running handler), not new. ``transactional`` jobs commit with their handler's
  writes, as always; set the window to 0 to commit every completion on its own.
* Jobs claimed for the batch and not yet started are in the heartbeat too, so a slow handler
  does not let the rest of its batch expire; one whose renewal is refused is not run. A killed
  process holds them (at most ``BATCH_MAX``) until their leases expire.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError

from . import metrics, states, store
from .context import JobContext
from .exceptions import StaleAttempt
from .executor import Heartbeater, _complete_read_back, run_lease

log = logging.getLogger("tenure.chain")

BATCH_MAX = 64
"""The most jobs one completion statement claims for the next batch."""


class Chain:
    """Run ``first`` and then the next due jobs of its queue, committing completions together.

    ``seconds`` bounds how long the chain keeps claiming; ``window`` how long a successful
    completion may wait for the batch's commit (0: each commits on its own, with the claim of
    the next job). ``succeeded`` lists the jobs whose completions the chain wrote together and
    saw commit (a ``transactional`` job commits with its handler and is not among them).
    """

    def __init__(
        self,
        *,
        executor_id: str,
        queue: str,
        heartbeater: Heartbeater,
        seconds: float,
        window: float,
    ) -> None:
        self.executor_id = executor_id
        self.queues = [queue]
        self.hb = heartbeater
        self.until = time.monotonic() + seconds
        self.window = max(0.0, window)
        self.succeeded: list[int] = []
        self.outcome = ""
        self._pending: list[JobContext] = []
        self._first_pending_at = 0.0

    def run(self, first: store.Lease) -> str:
        """Run the chain; returns the last attempt's outcome."""
        batch = [first]
        queued: dict[int, JobContext] = {}
        try:
            while batch:
                # The batch's later jobs wait in this process: keep their leases renewed.
                queued = {lease.attempt_id: JobContext(lease) for lease in batch[1:]}
                for ctx in queued.values():
                    self.hb.add(ctx)
                started = time.monotonic()
                for i, lease in enumerate(batch):
                    store.log_event(
                        "claim", job=lease.job_id, fence=lease.fence, attempt_kind=lease.kind
                    )
                    waited = queued.pop(lease.attempt_id, None)
                    if waited is not None and waited.lost:
                        # Its renewal was refused (and recorded): another attempt owns it now.
                        self.hb.remove(waited)
                        self._ended(lease, "stale")
                        continue
                    out = run_lease(lease, heartbeater=self.hb, defer=self._defer)
                    if out != "deferred":
                        self._ended(lease, out)
                    overdue = time.monotonic() - self._first_pending_at >= self.window
                    if self._pending and overdue and i < len(batch) - 1:
                        self._flush(0)
                per_job = (time.monotonic() - started) / len(batch)
                batch = self._flush(self._next_size(per_job))
        finally:
            if self._pending:
                # An exception is on its way out: commit what succeeded, if the database lets us.
                self._flush(0)
            for ctx in queued.values():
                # Never started: stop renewing, so the leases expire and the reaper returns them.
                self.hb.remove(ctx)
        return self.outcome

    def _defer(self, ctx: JobContext) -> bool:
        if not self._pending:
            self._first_pending_at = time.monotonic()
        self._pending.append(ctx)
        return True

    def _next_size(self, per_job: float) -> int:
        """As many jobs as fit in the commit window at the last batch's pace (at least 1)."""
        if self.window <= 0:
            return 1
        if per_job <= 0:
            return BATCH_MAX
        return max(1, min(BATCH_MAX, int(self.window / per_job)))

    def _flush(self, limit: int) -> list[store.Lease]:
        """Write the waiting completions and claim up to ``limit`` next jobs, in one commit."""
        want = limit if time.monotonic() < self.until else 0
        if not self._pending:
            if want == 0:
                return []
            return store.claim(executor=self.executor_id, queues=self.queues, limit=want)
        pending = self._pending
        leases = [ctx.lease for ctx in pending]
        matched: set[int] = set()
        got: list[store.Lease] = []

        def write() -> int | None:
            # Each try starts afresh; what counts is the try whose commit is known.
            xid, done, claimed = store.complete_many_and_claim(
                leases, executor=self.executor_id, queues=self.queues, limit=want
            )
            matched.clear()
            matched.update(done)
            got[:] = claimed
            return xid

        def probe() -> store.Lease:
            return next((lease for lease in leases if lease.job_id in matched), leases[0])

        try:
            _complete_read_back(leases[0], write, xid_from_fn=True, probe=probe)
        except DatabaseError as e:
            log.warning(
                "could not write %d completions (%s); their jobs run again once their leases "
                "expire",
                len(pending),
                e,
            )
            self._drop_pending()
            return []
        self._pending = []
        for ctx in pending:
            self.hb.remove(ctx)
            lease = ctx.lease
            if lease.job_id in matched:
                self.succeeded.append(lease.job_id)
                self._ended(lease, "succeeded")
            else:
                err = StaleAttempt(lease.job_id, lease.fence, states.COMPLETE.name)
                metrics.stale_refused(err.write)
                store.record_stale(err, self.executor_id)
                self._ended(lease, "stale")
        return got

    def _drop_pending(self) -> None:
        for ctx in self._pending:
            self.hb.remove(ctx)
        self._pending = []

    def _ended(self, lease: store.Lease, outcome: str) -> None:
        store.log_event("end", job=lease.job_id, fence=lease.fence, outcome=outcome)
        self.outcome = outcome
