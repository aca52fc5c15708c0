"""The job spec: :class:`JobOptions`, everything a job is accepted as — its type's options
(``@job``) with the per-call ones (``enqueue``, ``using``) and its payload — in one typed value
that goes from the enqueue to the database's rows and comes back from them on a claim's
:class:`~scheduler_core.storage.records.Lease`. Its one mapping to columns is
:mod:`scheduler_core.storage.records` (``row_values``, ``options_from_row``); each driver's
statements take their column lists from there."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """What one job is accepted as and runs under. Each field is the column of the same name
    (the job row's or its spec row's: ``storage.records.JOB_OPTION_COLUMNS`` says which), so a
    new option is a field here, its column (a migration) and its type in each driver's column
    list."""

    name: str
    """The job type (the registered handler's name)."""
    queue: str
    max_attempts: int
    """The attempt budget (an operator's retry raises it on the row; a claim reads it back)."""
    lease_seconds: int
    effect: str
    """The effect mode's value (``EffectMode``)."""
    timeout_seconds: float
    """The maximum runtime of one attempt, in seconds."""
    priority: int = 0
    run_at: datetime | None = None
    """When the job is due: None at insert means the database's now; read back from a row it
    is the row's due time (where a claimed job stood in the claim order)."""
    payload: dict[str, Any] = field(default_factory=dict)
    """The handler's keyword arguments (empty in a batch's template: each job has its own)."""
    workflow_id: int | None = None
    """The workflow the job is a step of (None: an ordinary job)."""
    trace_context: dict[str, str] | None = field(default=None, compare=False)
    """The enqueue span's context its attempts' spans descend from (None: tracing off). Not
    part of what makes two specs equal: it names a trace, not the work."""
