"""The Django signals Tenure sends, and the one way it sends them (:func:`send`).

Each is sent once what it announces has committed — outside the enqueue's, the claim's and the
completion's transaction (``transaction.on_commit`` where one is open, at once otherwise) —
and never for a write the database refused: an attempt whose completion was refused as stale
sends no ``attempt_finished``. A receiver that raises is logged (Django's ``django.dispatch``
logger, at ``ERROR``, with the traceback) and changes nothing: the attempt goes on as if no
receiver were connected. ``sender`` is the job's type (what ``@job`` returned), so
``attempt_finished.connect(receiver, sender=charge)`` hears one job type only; it is None for
a job whose type is not registered in the process.

``docs/reference/signals.md`` lists each signal's arguments.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

job_enqueued = Signal()
"""A job was accepted: its enqueue's transaction committed. Arguments: ``job_id``, ``name``,
``queue``, ``priority``, ``unique_key`` (None without one). Not sent when a ``unique_key``
already accepted returned the existing job."""

attempt_started = Signal()
"""An attempt's claim committed and its handler (or reconcile function) is about to run.
Arguments: ``job_id``, ``name``, ``queue``, ``attempt`` (its number, from 1), ``fence``,
``kind`` (``run``, ``reconcile`` or ``fallback``)."""

attempt_finished = Signal()
"""An attempt's end was written and committed. Arguments: those of ``attempt_started``,
``outcome`` (``succeeded``, ``retried``, ``snoozed``, ``failed``, ``indeterminate``,
``cancelled``, ``reconciled``, ``lease_expired``), ``state`` (the job's state after it) and
``error`` (the exception that ended it, or None; None too for ``lease_expired``, which the
reaper writes in another process)."""

job_finished = Signal()
"""An attempt's end left the job at rest: ``succeeded``, ``failed``, ``cancelled``, or
``indeterminate`` (waiting for an operator). Sent after that attempt's ``attempt_finished``,
with the same arguments."""

effect_recorded = Signal()
"""The ledger recorded an effect's intent or outcome. Arguments: ``job_id``, ``name`` (the
job's type), ``queue``, ``attempt``, ``fence``, ``effect`` (the effect's name), ``key``,
``state`` (``intended``, ``applied``, ``not_applied``, ``unknown``). In a ``transactional``
job it is sent once the job's transaction commits, and not at all when it rolls back."""

ALL: tuple[Signal, ...] = (
    job_enqueued,
    attempt_started,
    attempt_finished,
    job_finished,
    effect_recorded,
)
"""Every signal Tenure sends."""


def send(signal: Signal, sender: Any, **arguments: Any) -> None:
    """Send ``signal`` to its receivers; one that raises is logged, not raised."""
    if signal.receivers:
        signal.send_robust(sender, **arguments)
