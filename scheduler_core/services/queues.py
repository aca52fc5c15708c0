"""Operator actions on queues — pause, resume, set limits — for the dashboard and the command
line alike.

Each action is checked here (a reason, limits that mean something, the version the operator
saw) and written through the storage driver with its audit row in one transaction: a stale
page changes nothing and raises :class:`~scheduler_core.exceptions.ActionConflict`, bad input
raises :class:`~scheduler_core.exceptions.ActionRefused`, also changing nothing. The claim
itself enforces what is written (:meth:`scheduler_core.storage.base.Driver.claim`): a paused
queue's jobs are claimed by no executor or transport, and a limited queue's within its limits
across every executor; jobs already running finish normally.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..domain.queues import LimitError, check_limits
from ..domain.reasons import check_reason
from ..exceptions import ActionConflict, ActionRefused
from ..models import AuditEntry, Queue
from ..read.queues import is_known_queue, known_queues
from ..storage.clock import DbNow
from ..storage.drivers import driver

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
"""A queue's name as jobs declare it: 1..100 letters, digits, ``.``, ``_``, ``:`` or ``-``."""


@dataclass(frozen=True, kw_only=True)
class QueueSettings:
    """One queue's operator settings as the console and the command line show them."""

    name: str
    paused: bool = False
    paused_by: str = ""
    paused_reason: str = ""
    paused_at: datetime | None = None
    max_leased: int | None = None
    max_per_second: float | None = None
    version: int = 0
    """0: the queue has no settings row (never configured); the version to send back."""
    updated_at: datetime | None = None

    @property
    def limited(self) -> bool:
        """Whether a claim of this queue counts against limits."""
        return self.max_leased is not None or self.max_per_second is not None


@dataclass(frozen=True, kw_only=True)
class QueueActionResult:
    """A queue after an operator action, and the action's audit row."""

    queue: QueueSettings
    audit: AuditEntry


def settings_of(row: Queue | None, name: str) -> QueueSettings:
    """The settings ``row`` holds for queue ``name`` (None: the defaults, version 0)."""
    if row is None:
        return QueueSettings(name=name)
    return QueueSettings(
        name=row.name,
        paused=row.paused,
        paused_by=row.paused_by,
        paused_reason=row.paused_reason,
        paused_at=row.paused_at,
        max_leased=row.max_leased,
        max_per_second=row.max_per_second,
        version=row.version,
        updated_at=row.updated_at,
    )


def queue_settings(name: str) -> QueueSettings:
    """Queue ``name``'s settings now."""
    return settings_of(driver().queue_row(name), name)


def all_queue_settings() -> dict[str, QueueSettings]:
    """Every configured queue's settings, by name."""
    return {row.name: settings_of(row, row.name) for row in driver().queue_rows()}


def pause(
    queue: str,
    *,
    actor: str,
    reason: str,
    expected_version: int | None = None,
    create: bool = False,
) -> QueueActionResult:
    """Pause ``queue``: from the commit on, no executor or transport claims its jobs; the
    ones running finish. Refused if it is paused already, and for a queue Tenure does not
    know (:func:`scheduler_core.read.queues.is_known_queue`: a typo) unless ``create``."""

    def change(before: QueueSettings) -> dict[str, Any]:
        if before.paused:
            raise ActionRefused(
                f"queue {queue} is paused already (by {before.paused_by}: {before.paused_reason})"
            )
        return {
            "paused": True,
            "paused_by": actor[:150],
            "paused_reason": reason,
            "paused_at": DbNow(),
        }

    return _act(
        queue,
        "pause_queue",
        change,
        actor=actor,
        reason=reason,
        expected=expected_version,
        create=create,
    )


def resume(
    queue: str, *, actor: str, reason: str, expected_version: int | None = None
) -> QueueActionResult:
    """Resume ``queue``: its due jobs are claimed again (within its limits, if any). Refused
    if it is not paused."""

    def change(before: QueueSettings) -> dict[str, Any]:
        if not before.paused:
            raise ActionRefused(f"queue {queue} is not paused")
        return {"paused": False, "paused_by": "", "paused_reason": "", "paused_at": None}

    return _act(
        queue, "resume_queue", change, actor=actor, reason=reason, expected=expected_version
    )


def set_limits(
    queue: str,
    *,
    max_leased: int | None,
    max_per_second: float | None,
    actor: str,
    reason: str,
    expected_version: int | None,
    create: bool = False,
) -> QueueActionResult:
    """Set ``queue``'s limits across every executor: at most ``max_leased`` of its jobs leased
    at once and at most ``max_per_second`` claims per second (None clears a limit). A new rate
    starts with a full bucket (one second's worth). Refused for a queue Tenure does not know
    unless ``create`` (as :func:`pause`)."""
    try:
        check_limits(max_leased, max_per_second)
    except LimitError as e:
        raise ActionRefused(str(e)) from None
    rate = float(max_per_second) if max_per_second is not None else None

    def change(before: QueueSettings) -> dict[str, Any]:
        if before.max_leased == max_leased and before.max_per_second == rate:
            raise ActionRefused(f"queue {queue} has these limits already")
        return {"max_leased": max_leased, "max_per_second": rate}

    return _act(
        queue,
        "limit_queue",
        change,
        actor=actor,
        reason=reason,
        expected=expected_version,
        create=create,
    )


def _last_change(queue: str) -> str:
    """Who made the queue's latest change and why, from the audit trail (for a refusal)."""
    last = (
        AuditEntry.objects.filter(job__isnull=True, detail__queue=queue)
        .order_by("-created_at", "-id")
        .first()
    )
    if last is None:
        return ""
    return (
        f": {last.action.replace('_queue', '')} by {last.actor}, {last.reason!r}, at "
        f"{last.created_at:%Y-%m-%d %H:%M:%S} UTC"
    )


def _snapshot(s: QueueSettings) -> dict[str, Any]:
    """What the audit keeps of a queue's settings, before and after."""
    return {
        "paused": s.paused,
        "paused_by": s.paused_by,
        "paused_reason": s.paused_reason,
        "max_leased": s.max_leased,
        "max_per_second": s.max_per_second,
        "version": s.version,
    }


def _act(
    queue: str,
    action: str,
    change: Callable[[QueueSettings], dict[str, Any]],
    *,
    actor: str,
    reason: str,
    expected: int | None,
    create: bool = False,
) -> QueueActionResult:
    """Check, write and audit one queue action in one transaction (see the module's text)."""
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise ActionRefused(f"{queue!r} is not a queue name")
    reason = check_reason(reason)
    if not (actor or "").strip():
        raise ActionRefused("an actor is required")
    d = driver()
    with d.atomic():
        before = settings_of(d.queue_row(queue, lock=True), queue)
        if expected is not None and expected != before.version:
            raise ActionConflict(
                f"queue {queue} changed since version {expected} (now version "
                f"{before.version}{_last_change(queue)}); reload and decide again"
            )
        fields = change(before)
        if before.version == 0 and not create and not is_known_queue(queue):
            known = ", ".join(known_queues()) or "none"
            raise ActionRefused(
                f"no queue named {queue!r} is known (no job type routes to it, and it has no "
                f"jobs, schedules or settings; known: {known}). To configure it before any job "
                "uses it, create it explicitly (--create)"
            )
        if not d.write_queue(queue, expected_version=before.version, fields=fields):
            raise ActionConflict(f"queue {queue} changed meanwhile; reload and decide again")
        after = settings_of(d.queue_row(queue), queue)
        audit = d.audit(
            job=None,
            actor=actor[:150],
            action=action,
            reason=reason,
            version_before=before.version,
            detail={"queue": queue, "before": _snapshot(before), "after": _snapshot(after)},
        )
    return QueueActionResult(queue=after, audit=audit)
