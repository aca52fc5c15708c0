"""Error types a handler raises to classify its own failure, and the library's own errors."""

from __future__ import annotations


class JobError(Exception):
    """Base class of the three failure classes a handler may raise."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        """Seconds to wait before the next attempt; overrides the backoff when given."""


class Transient(JobError):
    """The work did not happen and may succeed later: retry with backoff, bounded."""


class Permanent(JobError):
    """The work cannot succeed by retrying: end the job ``failed`` after this attempt."""


class InvalidResult(Permanent):
    """A handler returned a value Tenure cannot keep as its job's result: not JSON, or larger
    than ``TENURE_MAX_RETURN_VALUE_BYTES``. The attempt fails (permanently: the handler has
    run, and running it again would return the same); nothing of the value is stored."""


class Indeterminate(JobError):
    """The effect may or may not have happened (a timeout after the request was sent).

    What follows depends on the job's effect mode: an idempotent job retries under the same
    key, a reconcilable one asks the destination, an at-most-once one is parked for an operator.
    """


class WriteLockHeldTooLong(Transient):
    """On SQLite, a ``transactional`` handler's transaction held the database's one write lock
    past its bound (a share of the shortest lease of the attempts then running, so that their
    renewals get through): it was rolled back, and the attempt fails, transient
    (``scheduler_core/storage/sqlite_hold.py``)."""


class Snooze(Exception):
    """Put the job back to wait ``seconds`` without spending an attempt."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds}s")
        self.seconds = seconds


class TenureError(Exception):
    """Base class of errors raised by the library to its callers."""


class EnqueueError(TenureError, ValueError):
    """Refused input at enqueue time. Nothing was written."""


class UnknownJob(EnqueueError):
    """No job is registered under that name."""


class WriteRefused(TenureError, TypeError):
    """A job row written through Django's model (``Job.save()``, ``Job.objects.create()``,
    ``bulk_create()``, ``job.delete()``) instead of through Tenure. Nothing was written."""


class StaleAttempt(TenureError):
    """A fenced write found the job no longer leased under this attempt's fence.

    The attempt has lost ownership (its lease expired and was reaped, or it was released);
    it must stop and write nothing more. The refusal is counted.
    """

    def __init__(self, job_id: int, fence: int, write: str) -> None:
        super().__init__(f"job {job_id}: {write} refused, fence {fence} is no longer current")
        self.job_id = job_id
        self.fence = fence
        self.write = write


class AttemptOverrun(StaleAttempt):
    """A write on behalf of an attempt that has passed its maximum runtime (``timeout``).

    The attempt still holds its fence, but it has lost the right to act: it may not renew its
    lease, complete, or start an effect. It stops like a stale attempt; the reaper moves the
    job on once the lease runs out.
    """

    def __init__(self, job_id: int, fence: int, write: str) -> None:
        super().__init__(job_id, fence, write)
        self.args = (
            f"job {job_id}: {write} refused, attempt with fence {fence} is past its maximum "
            "runtime",
        )


class EffectsUnsettled(Indeterminate):
    """A completion refused because an effect of the job may or may not have happened.

    The handler returned, but the ledger still holds an effect whose outcome is unknown (or
    an intent never settled): the job cannot be called succeeded. The attempt ends as an
    indeterminate failure instead, and the job's effect mode decides what follows.
    """

    def __init__(self, job_id: int, keys: list[str]) -> None:
        super().__init__(
            f"job {job_id}: the handler returned, but effect(s) {', '.join(keys)} may or may not "
            "have happened"
        )
        self.job_id = job_id
        self.keys = keys


class JobCancelled(TenureError):
    """The job was cancelled by an operator before it ran to an end.

    Raised to a running handler by ``ctx.check_cancelled()`` and by ``ctx.effect(...)`` once an
    operator asked the attempt to stop (the database refuses every effect intent after the
    request); a handler lets it propagate and the attempt ends the job ``cancelled``. It is also
    the last error of a cancelled ``django.tasks`` task's result (:mod:`scheduler_core.backends`).
    """

    def __init__(self, message: str = "", *, job_id: int | None = None, write: str = "") -> None:
        super().__init__(message or (f"job {job_id} was cancelled" if job_id else "cancelled"))
        self.job_id = job_id
        self.write = write
        """The write the database refused because of the request (``complete``,
        ``effect_intent``); empty when the handler raised it."""


class ActionConflict(TenureError):
    """An operator action lost a race: the job changed since the operator looked (HTTP 409)."""


class ActionRefused(TenureError):
    """An operator action is not allowed for the job's current state or mode (HTTP 400)."""
