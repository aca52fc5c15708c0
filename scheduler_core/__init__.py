"""Tenure: a Django job scheduler for many competing executors that states its guarantees.

Public API::

    from scheduler_core import job, Transient, Permanent, Indeterminate

    @job(name="billing.charge", effect="idempotent", max_attempts=5, lease_seconds=30)
    def charge(ctx, *, invoice_id: int, cents: int) -> None: ...

    charge.enqueue(invoice_id=1, cents=500)

The package's layers, bottom to top (each imports only below itself): ``domain`` (pure rules),
``models``, ``storage`` (one driver per database), ``api`` (registration, enqueue, policy),
``read`` (health, metrics), ``runtime`` (running attempts) and ``services`` (reaper,
schedules, retention, operator actions), then the edges (``transports``, ``management``).
"""

from .api.registry import JobType, enqueue, job
from .api.workflow import workflow
from .domain.modes import EffectMode
from .domain.outcomes import Reconciliation
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
    "workflow",
]
