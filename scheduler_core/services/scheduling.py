"""Schedule rows: validation, creation, pause and resume, the sync of code-declared schedules,
and firing due occurrences as jobs.

What a schedule means (occurrence identity, misfires, overlap, daylight saving time) is
:mod:`scheduler_core.domain.schedules`, pure. Here :func:`fire_due` advances a row with a
conditional write (``WHERE id = ... AND next_fire_at = <what it read>``) and enqueues its
occurrences in the same transaction through :func:`scheduler_core.api.enqueue.insert_job_of`, so
of any number of schedulers exactly one wins each step. :func:`fire_due` and
:func:`sync_code_schedules` take ``now`` for tests and otherwise read the database's clock.
Schedule rows are written here (they are not job state); the operator's actions on them
(:func:`set_paused`, :func:`run_now`) are version-checked and audited like the job actions.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.db.models import F

from ..api import registry
from ..api.enqueue import insert_job_of
from ..conf import tenure_settings
from ..domain.reasons import check_reason
from ..domain.schedules import (
    ScheduleSpec,
    first_fire_at,
    manual_occurrence_key,
    occurrence_key,
    plan,
)
from ..domain.states import State
from ..exceptions import ActionConflict, ActionRefused, EnqueueError
from ..models import Job, Schedule
from ..storage.drivers import driver

log = logging.getLogger("tenure.schedules")

_UTC = dt.UTC


def spec_of(row: Schedule) -> ScheduleSpec:
    """The spec a schedule row describes; ``ValueError`` when the row is invalid."""
    return ScheduleSpec(
        cron=row.cron or "",
        interval_seconds=row.interval_seconds,
        timezone=row.timezone or "UTC",
        misfire=row.misfire,
        catch_up_max=row.catch_up_max,
        overlap=row.overlap,
    )


def validate_row(row: Schedule) -> ScheduleSpec:
    """Check a schedule row an operator wrote: its timing, policies, job and payload.

    Raises ``ValueError`` with a message an operator can act on.
    """

    spec = spec_of(row)
    if not row.name or len(row.name) > 200:
        raise ValueError("schedule name must be 1..200 characters")
    jt = registry.get(row.job_name)
    if jt is None:
        raise ValueError(f"no job is registered as {row.job_name!r}")
    try:
        registry.validate_payload(jt, row.payload)
    except EnqueueError as e:
        raise ValueError(str(e)) from None
    return spec


def clean_schedule(row: Schedule) -> None:
    """:func:`validate_row` for forms: raises Django's ``ValidationError``."""

    try:
        validate_row(row)
    except ValueError as e:
        raise ValidationError(str(e)) from None


def create_schedule(
    *,
    name: str,
    job_name: str,
    payload: dict[str, Any] | None = None,
    cron: str = "",
    interval_seconds: int | None = None,
    timezone: str = "UTC",
    misfire: str = "run_once",
    catch_up_max: int = 1,
    overlap: str = "allow",
    paused: bool = False,
    now: dt.datetime | None = None,
) -> Schedule:
    """Validate and create a database schedule (``source="database"``).

    Raises ``ValueError`` and writes nothing when anything is invalid.
    """

    row = Schedule(
        name=name,
        job_name=job_name,
        payload={} if payload is None else payload,
        cron=cron,
        interval_seconds=interval_seconds,
        timezone=timezone,
        misfire=misfire,
        catch_up_max=catch_up_max,
        overlap=overlap,
        paused=paused,
        source="database",
    )
    spec = validate_row(row)
    row.cron = spec.cron
    row.next_fire_at = first_fire_at(spec, now or driver().now())
    row.save()
    return row


def set_paused(
    schedule_id: int, *, paused: bool, expected_version: int, actor: str, reason: str
) -> Schedule:
    """Pause or resume a schedule (an operator action: version-checked and audited).

    Occurrences missed while paused follow the misfire policy on resume. Raises
    :class:`~scheduler_core.exceptions.ActionConflict` when the row changed since the
    operator read ``expected_version``, :class:`ActionRefused` without a reason.
    """

    reason = check_reason(reason)
    with driver().atomic():
        n = Schedule.objects.filter(pk=schedule_id, version=expected_version).update(
            paused=paused, version=F("version") + 1, updated_at=dt.datetime.now(_UTC)
        )
        if n != 1:
            raise ActionConflict(
                f"schedule {schedule_id} changed since version {expected_version}; reload"
            )
        row = Schedule.objects.get(pk=schedule_id)
        driver().audit(
            job=None,
            actor=actor,
            action="pause_schedule" if paused else "resume_schedule",
            reason=reason,
            state_after="paused" if paused else "active",
            version_before=expected_version,
            detail={"schedule_id": row.pk, "schedule": row.name, "paused": paused},
        )
    return row


def _insert_occurrence(
    row: Schedule, jt: Any, *, unique_key: str, run_at: dt.datetime | None
) -> Any:
    """Enqueue one occurrence of ``row`` as a job of its type ``jt`` under ``unique_key``
    (timed occurrences and "run now" alike); None when that key already names a job."""
    return insert_job_of(
        jt, payload=row.payload, run_at=run_at, unique_key=unique_key, schedule_id=row.pk
    )


BUSY_STATES = (State.WAITING, State.LEASED)
"""An occurrence in one of these states is still to finish: ``overlap="skip"`` waits for it."""


def busy_occurrences(schedule_id: int) -> list[Job]:
    """The schedule's occurrence jobs (timed or manual) still waiting or leased, oldest first."""
    return list(
        Job.objects.filter(schedule_id=schedule_id, state__in=BUSY_STATES).order_by("id")[:20]
    )


def run_now(
    schedule_id: int, *, expected_version: int, actor: str, reason: str
) -> tuple[Schedule, Job]:
    """Enqueue one manual occurrence of a schedule now (an operator action).

    The job gets its own unique key (:func:`~scheduler_core.domain.schedules.manual_occurrence_key`),
    so it never takes the place of a timed occurrence, and leaves the schedule's timing alone.
    Conditioned on the row's ``expected_version`` (the version is bumped, so a second submit of
    the same page is a conflict, not a second job), audited in the same transaction. Refused
    (:class:`ActionRefused`, nothing written) without a reason, for a row that does not
    validate, and under ``overlap="skip"`` while an occurrence is still waiting or leased;
    :class:`ActionConflict` when the row changed since the operator read it.
    """

    reason = check_reason(reason)
    d = driver()
    with d.atomic():
        row = Schedule.objects.filter(pk=schedule_id).first()
        if row is None:
            raise ActionRefused(f"schedule {schedule_id} does not exist")
        if row.version != expected_version:
            raise ActionConflict(
                f"schedule {schedule_id} changed since version {expected_version}; reload"
            )
        try:
            spec = validate_row(row)
        except ValueError as e:
            raise ActionRefused(f"schedule {row.name} cannot run: {e}") from None
        busy = busy_occurrences(row.pk)
        if spec.overlap == "skip" and busy:
            which = ", ".join(f"job {j.pk} ({j.state})" for j in busy)
            raise ActionRefused(
                f"schedule {row.name} does not overlap its occurrences (overlap=skip) and "
                f"{which} has not finished; wait for it, or cancel it first"
            )
        n = Schedule.objects.filter(pk=row.pk, version=expected_version).update(
            version=F("version") + 1, updated_at=dt.datetime.now(_UTC)
        )
        if n != 1:
            raise ActionConflict(
                f"schedule {schedule_id} changed since version {expected_version}; reload"
            )
        jt = registry.get(row.job_name)
        assert jt is not None  # validate_row checked it
        now = d.now()
        key = manual_occurrence_key(row.pk, now, uuid.uuid4().hex[:12])
        job = _insert_occurrence(row, jt, unique_key=key, run_at=None)
        driver().audit(
            job=job,
            actor=actor,
            action="run_schedule_now",
            reason=reason,
            state_after=job.state,
            version_before=expected_version,
            detail={"schedule_id": row.pk, "schedule": row.name, "unique_key": key},
        )
        row.refresh_from_db()
    return row, job


_warned: set[tuple[int, str]] = set()


def _warn_once(row: Schedule, message: str) -> None:
    """Log a schedule problem once per process, not every round."""
    if (row.pk, message) not in _warned:
        _warned.add((row.pk, message))
        log.error("schedule %s (%s) is not fired: %s", row.name, row.pk, message)


def sync_code_schedules(*, now: dt.datetime | None = None) -> int:
    """Create or update the rows of schedules declared with ``@job(schedule=...)``.

    Idempotent and safe in many processes: a row is created once (its name is unique) and
    updated only when the declaration changed, conditioned on the row's ``version``. A change
    of timing restarts the schedule from ``now``; ``paused`` is the operator's and is kept.
    A row of the same name created by an operator is left alone. Returns rows written.
    """

    declared = {n: jt for n, jt in registry.all_types().items() if jt.schedule is not None}
    if not declared:
        return 0
    rows = {r.name: r for r in Schedule.objects.filter(name__in=list(declared))}
    written = 0
    for name, jt in declared.items():
        spec = jt.schedule
        assert spec is not None
        fields: dict[str, Any] = {
            "job_name": name,
            "cron": spec.cron,
            "interval_seconds": spec.interval_seconds,
            "timezone": spec.timezone,
            "misfire": spec.misfire,
            "catch_up_max": spec.catch_up_max,
            "overlap": spec.overlap,
        }
        row = rows.get(name)
        if row is None:
            now = now or driver().now()
            try:
                with driver().atomic():
                    Schedule.objects.create(
                        name=name,
                        payload={},
                        source="code",
                        next_fire_at=first_fire_at(spec, now),
                        **fields,
                    )
                written += 1
            except IntegrityError:
                pass  # another scheduler created it first
            continue
        if row.source != "code":
            _warn_once(row, "a database schedule has the name of a code-declared one")
            continue
        if all(getattr(row, k) == v for k, v in fields.items()):
            continue
        timing = ("cron", "interval_seconds", "timezone")
        if any(getattr(row, k) != fields[k] for k in timing):
            now = now or driver().now()
            fields["next_fire_at"] = first_fire_at(spec, now)
        written += Schedule.objects.filter(pk=row.pk, version=row.version).update(
            **fields, version=F("version") + 1, updated_at=dt.datetime.now(_UTC)
        )
    return written


def fire_due(*, now: dt.datetime | None = None, limit: int = 200) -> int:
    """Enqueue every due occurrence of every active schedule; returns how many were new.

    Safe in any number of processes at once (see the module docstring). ``now`` defaults to
    the database's clock; tests pass a frozen one.
    """

    now = now or driver().now()
    grace = tenure_settings().SCHEDULE_MISFIRE_GRACE_SECONDS
    for row in Schedule.objects.filter(paused=False, next_fire_at__isnull=True):
        try:
            spec = spec_of(row)
        except ValueError as e:
            _warn_once(row, str(e))
            continue
        Schedule.objects.filter(pk=row.pk, next_fire_at__isnull=True).update(
            next_fire_at=first_fire_at(spec, now), version=F("version") + 1, updated_at=now
        )
    fired = 0
    due = Schedule.objects.filter(paused=False, next_fire_at__lte=now).order_by("next_fire_at")
    for row in due[:limit]:
        fired += _fire_one(row, now=now, grace=grace)
    return fired


def _fire_one(row: Schedule, *, now: dt.datetime, grace: float) -> int:
    """One conditional step of one schedule; returns how many occurrence jobs were new."""

    try:
        spec = validate_row(row)
    except ValueError as e:
        # Not advanced: once the problem is fixed the misfire policy covers the gap.
        _warn_once(row, str(e))
        return 0
    jt = registry.get(row.job_name)
    assert jt is not None  # validate_row checked it
    if row.source == "code" and jt.schedule is None:
        # Declared by code this process does not run (a deploy in progress): leave it.
        return 0
    assert row.next_fire_at is not None
    p = plan(spec, next_fire_at=row.next_fire_at, now=now, grace=grace)
    times = list(p.fire)
    with driver().atomic():
        if spec.overlap == "skip" and times:
            busy = Job.objects.filter(
                schedule_id=row.pk, state__in=[State.WAITING, State.LEASED]
            ).exists()
            times = [] if busy else times[-1:]
        advanced = Schedule.objects.filter(
            pk=row.pk, next_fire_at=row.next_fire_at, paused=False
        ).update(
            next_fire_at=p.next_fire_at,
            last_fire_at=times[-1] if times else row.last_fire_at,
            version=F("version") + 1,
            updated_at=now,
        )
        if advanced != 1:
            return 0  # another scheduler took this step
        new = 0
        for t in times:
            key = occurrence_key(row.pk, t)
            if Job.objects.filter(unique_key=key).exists():
                continue
            _insert_occurrence(row, jt, unique_key=key, run_at=t)
            new += 1
    if p.skipped or len(times) < len(p.fire):
        log.info(
            "schedule %s: %d due, %d late, fired %d (misfire=%s, overlap=%s)",
            row.name,
            p.due,
            p.late,
            new,
            spec.misfire,
            spec.overlap,
        )
    return new
