"""Tenure: a Django job scheduler for many competing executors that states its guarantees.

Public API::

    from scheduler_core import job, Transient, Permanent, Indeterminate

    @job(name="billing.charge", effect="idempotent", max_attempts=5, lease_seconds=30)
    def charge(ctx, *, invoice_id: int, cents: int) -> None: ...

    charge.enqueue(invoice_id=1, cents=500)
"""

from .exceptions import (
    ActionConflict,
    ActionRefused,
    EnqueueError,
    Indeterminate,
    Permanent,
    Snooze,
    StaleAttempt,
    Transient,
    UnknownJob,
)
from .modes import EffectMode
from .outcomes import Reconciliation
from .registry import JobType, enqueue, job

__all__ = [
    "ActionConflict",
    "ActionRefused",
    "EffectMode",
    "EnqueueError",
    "Indeterminate",
    "JobType",
    "Permanent",
    "Reconciliation",
    "Snooze",
    "StaleAttempt",
    "Transient",
    "UnknownJob",
    "enqueue",
    "job",
]
