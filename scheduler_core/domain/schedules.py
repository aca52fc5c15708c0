"""Recurring schedules: each occurrence becomes one job whose ``unique_key`` names it.

A schedule is a cron expression read in a timezone, or an interval in seconds. It is declared
in code (``@job(schedule="*/5 * * * *", schedule_tz="Europe/Berlin")`` or
``@job(schedule=timedelta(seconds=30))``) and synced into a :class:`~scheduler_core.models.Schedule`
row (``source="code"``), or created as a row by an operator (``source="database"``). Either
kind can be paused.

**Occurrence identity.** The occurrence of schedule ``<id>`` due at instant ``T`` is the job
whose ``unique_key`` is ``schedule:<id>@<T as ISO 8601 UTC>``. A scheduler advances the row's
``next_fire_at`` with a conditional write (``WHERE id = ... AND next_fire_at = <what it
read>``) and inserts the occurrence jobs in the same transaction, so of any number of
schedulers exactly one wins each step; the unique key refuses a second insert of the same
occurrence even if a row is reset.

**Misfires.** An occurrence is *late* when it is found more than
``TENURE_SCHEDULE_MISFIRE_GRACE_SECONDS`` after its time (the schedulers were stopped, the
schedule was paused, or the database was unreachable). Occurrences within the grace always
fire. Late ones follow the schedule's ``misfire`` policy: ``skip`` (none fire),
``run_once`` (one job stands for all of them — the latest — unless an on-time occurrence
fires anyway) or ``catch_up`` (the latest ``catch_up_max`` of them fire, oldest first).

**Overlap.** ``overlap="allow"`` fires every occurrence; ``overlap="skip"`` fires nothing while
an earlier occurrence of the schedule is still waiting or leased, and at most one occurrence
per step.

**Daylight saving time.** Cron fields are read on the wall clock of the schedule's timezone;
intervals are elapsed seconds and ignore it. When the clock jumps forward, a wall time that
does not exist fires once at the first valid instant after the jump (03:00 for
``30 2 * * *`` in Europe/Berlin) — unless the hour field is a wildcard (``*``, ``*/2``), in
which case the skipped hour is simply skipped because that many real hours have elapsed. When
the clock falls back, a wall time that occurs twice fires once, at its first occurrence —
unless the hour field is a wildcard, in which case each real hour fires.

This module is the pure part (:class:`ScheduleSpec`, :func:`plan`, occurrence keys): it reads
no clock and no database. Schedule rows, their sync and their firing are
:mod:`scheduler_core.services.scheduling`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from croniter import CroniterError, croniter

log = logging.getLogger("tenure.schedules")

MISFIRE_POLICIES = ("skip", "run_once", "catch_up")
OVERLAP_POLICIES = ("allow", "skip")
CATCH_UP_LIMIT = 1000
"""The most late occurrences ``catch_up`` may fire at once."""
MAX_INTERVAL_SECONDS = 366 * 86400
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# No timezone moves its clock by more than this in one transition.
_DST_SLACK = dt.timedelta(hours=3)
_SCAN_LIMIT = 10_000
_LATE_COUNT_LIMIT = 1_000
_ONE_SECOND = dt.timedelta(seconds=1)
_UTC = dt.UTC


# ---------------------------------------------------------------------------------------------
# The pure part: what a schedule is and when it fires
# ---------------------------------------------------------------------------------------------


def _normalise_cron(expr: str) -> str:
    return _ALIASES.get(expr.strip().lower(), " ".join(expr.split()))


def _zone(name: str) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("timezone must be an IANA name such as 'UTC' or 'Europe/Berlin'")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown timezone {name!r}: use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """When a schedule fires and what it does about late and overlapping occurrences.

    Exactly one of ``cron`` (five fields: minute hour day-of-month month day-of-week, or an
    alias such as ``@hourly``) and ``interval_seconds`` is set. Construction validates
    everything and raises ``ValueError`` with a message that says what is wrong.
    """

    cron: str = ""
    interval_seconds: int | None = None
    timezone: str = "UTC"
    misfire: str = "run_once"
    catch_up_max: int = 1
    overlap: str = "allow"

    def __post_init__(self) -> None:
        if bool(self.cron) == (self.interval_seconds is not None):
            raise ValueError("a schedule needs exactly one of a cron expression and an interval")
        if self.cron:
            if not isinstance(self.cron, str):
                raise ValueError("cron expression must be a string")
            expr = _normalise_cron(self.cron)
            if len(expr.split()) != 5:
                raise ValueError(
                    f"invalid cron expression {self.cron!r}: expected five fields "
                    "(minute hour day-of-month month day-of-week) or an alias like @hourly"
                )
            if not croniter.is_valid(expr):
                raise ValueError(
                    f"invalid cron expression {self.cron!r}: a field is out of range or "
                    "malformed (minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-7)"
                )
            object.__setattr__(self, "cron", expr)
        else:
            n = self.interval_seconds
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INTERVAL_SECONDS:
                raise ValueError(
                    f"interval must be a whole number of seconds in 1..{MAX_INTERVAL_SECONDS}"
                )
        _zone(self.timezone)
        if self.misfire not in MISFIRE_POLICIES:
            raise ValueError(
                f"misfire policy {self.misfire!r} is not one of {', '.join(MISFIRE_POLICIES)}"
            )
        c = self.catch_up_max
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= CATCH_UP_LIMIT:
            raise ValueError(f"catch_up_max must be an integer in 1..{CATCH_UP_LIMIT}")
        if self.overlap not in OVERLAP_POLICIES:
            raise ValueError(
                f"overlap policy {self.overlap!r} is not one of {', '.join(OVERLAP_POLICIES)}"
            )
        if self.cron:
            # An expression like "0 0 30 2 *" is well formed but never fires.
            try:
                self.next_after(dt.datetime(2000, 1, 1, tzinfo=_UTC))
            except ValueError:
                raise ValueError(f"cron expression {self.cron!r} never fires") from None

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        """The schedule's timezone."""
        return _zone(self.timezone)

    def describe(self) -> str:
        """A short human description, for logs and the dashboard."""
        if self.cron:
            return f"cron {self.cron!r} in {self.timezone}"
        return f"every {self.interval_seconds}s"

    def next_after(self, after: dt.datetime) -> dt.datetime:
        """The first fire instant strictly after ``after`` (an aware datetime), in UTC.

        For an interval schedule this is ``after + interval``: intervals are anchored on the
        row's ``next_fire_at``, which :func:`plan` advances by whole intervals.
        """
        after = after.astimezone(_UTC)
        if self.interval_seconds is not None:
            return after + dt.timedelta(seconds=self.interval_seconds)
        return _cron_next(self.cron, self.tz, after)


def _hour_is_wildcard(expr: str) -> bool:
    return expr.split()[1].startswith("*")


def _instants(wall: dt.datetime, tz: zoneinfo.ZoneInfo, wildcard_hour: bool) -> list[dt.datetime]:
    """The UTC instants a matching wall-clock time stands for (the DST rules above)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(_UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(_UTC)
    if first == second:
        return [first]
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        # The clock fell back: this wall time happens twice (``first`` is the earlier).
        earlier, later = sorted((first, second))
        return [earlier, later] if wildcard_hour else [earlier]
    # The clock jumped forward over this wall time: it does not exist.
    if wildcard_hour:
        return []
    return [_transition(min(first, second), max(first, second), tz)]


def _transition(lo: dt.datetime, hi: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The instant in ``(lo, hi]`` where ``tz``'s offset changes (to the second)."""
    before = lo.astimezone(tz).utcoffset()
    while hi - lo > _ONE_SECOND:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    # Offsets change on whole seconds, and ``lo < change <= hi < lo + 1s``.
    return hi.replace(microsecond=0)


def _cron_next(expr: str, tz: zoneinfo.ZoneInfo, after: dt.datetime) -> dt.datetime:
    wildcard = _hour_is_wildcard(expr)
    local = after.astimezone(tz).replace(tzinfo=None)
    offsets = {(after + k * _DST_SLACK).astimezone(tz).utcoffset() for k in (-1, 0, 1)}
    if len(offsets) == 1:
        # No clock change near ``after``: wall times map to instants in order, so the first
        # matching wall time after ``after``'s own is the answer.
        try:
            it = croniter(expr, local)
            for _ in range(_SCAN_LIMIT):
                later = [i for i in _instants(it.get_next(dt.datetime), tz, wildcard) if i > after]
                if later:
                    return min(later)
        except CroniterError as e:
            raise ValueError(f"cron expression {expr!r} has no fire time after {after}") from e
    # Walk the wall clock from a little before ``after``: around a fall-back the same wall
    # time maps to two instants, so the earliest instant after ``after`` may come from a
    # wall time that is earlier than ``after``'s own.
    it = croniter(expr, local - _DST_SLACK)
    best: dt.datetime | None = None
    try:
        for _ in range(_SCAN_LIMIT):
            wall = it.get_next(dt.datetime)
            for instant in _instants(wall, tz, wildcard):
                if instant > after and (best is None or instant < best):
                    best = instant
            if best is not None and wall > best.astimezone(tz).replace(tzinfo=None) + _DST_SLACK:
                return best
    except CroniterError as e:
        if best is not None:
            return best
        raise ValueError(f"cron expression {expr!r} has no fire time after {after}") from e
    if best is None:
        raise ValueError(f"cron expression {expr!r} has no fire time after {after}")
    return best


def first_fire_at(spec: ScheduleSpec, now: dt.datetime) -> dt.datetime:
    """The first occurrence of a new schedule: the next cron time, or one interval from now
    (whole seconds)."""
    return spec.next_after(now.astimezone(_UTC).replace(microsecond=0))


def occurrence_key(schedule_id: int, fire_at: dt.datetime) -> str:
    """The occurrence's identity, used as its job's ``unique_key``."""
    stamp = fire_at.astimezone(_UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if fire_at.microsecond:
        stamp += f".{fire_at.astimezone(_UTC).microsecond:06d}"
    return f"schedule:{schedule_id}@{stamp}Z"


def manual_occurrence_key(schedule_id: int, at: dt.datetime, token: str) -> str:
    """The identity of an occurrence an operator asked for ("run now"), used as its job's
    ``unique_key``: it names the schedule and the instant asked, and ``token`` (unique per
    request) keeps it apart from every timed occurrence and from another request."""
    stamp = at.astimezone(_UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"schedule:{schedule_id}:manual@{stamp}Z:{token}"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one step of a due schedule does."""

    fire: tuple[dt.datetime, ...]
    """Occurrences to enqueue, oldest first."""
    next_fire_at: dt.datetime
    """The first occurrence after ``now``."""
    due: int
    """How many occurrences were due (for cron, late ones counted only up to a limit)."""
    late: int
    """How many of them were late (past the misfire grace; for cron, up to a limit)."""

    @property
    def skipped(self) -> int:
        """Due occurrences the misfire policy left out."""
        return max(0, self.due - len(self.fire))


def _cron_between(
    spec: ScheduleSpec,
    lo: dt.datetime,
    hi: dt.datetime,
    *,
    inclusive: bool,
    limit: int = _SCAN_LIMIT,
) -> Iterator[dt.datetime]:
    """Cron occurrences in ``[lo, hi]`` (or ``[lo, hi)``), oldest first, at most ``limit``."""
    t = spec.next_after(lo - dt.timedelta(microseconds=1))
    for _ in range(limit):
        if t > hi or (t == hi and not inclusive):
            return
        yield t
        t = spec.next_after(t)


def _cron_last(spec: ScheduleSpec, lo: dt.datetime, hi: dt.datetime, n: int) -> list[dt.datetime]:
    """The latest ``n`` cron occurrences in ``[lo, hi)``, oldest first, scanning a window
    that grows until it holds ``n`` of them or reaches ``lo`` (never the whole history)."""
    if n <= 0 or hi <= lo:
        return []
    window = dt.timedelta(hours=1)
    while True:
        start = max(lo, hi - window)
        found = list(_cron_between(spec, start, hi, inclusive=False))
        if len(found) >= n or start == lo:
            return found[-n:]
        window *= 4


def plan(spec: ScheduleSpec, *, next_fire_at: dt.datetime, now: dt.datetime, grace: float) -> Plan:
    """Decide which due occurrences of a schedule to fire at ``now`` and where it goes next.

    ``next_fire_at`` is the row's first unfired occurrence. Occurrences in
    ``[now - grace, now]`` are on time and fire; earlier ones are late and follow
    ``spec.misfire`` (see the module docstring). Pure: no clock, no database.
    """
    t0 = next_fire_at.astimezone(_UTC)
    now = now.astimezone(_UTC)
    if t0 > now:
        return Plan(fire=(), next_fire_at=t0, due=0, late=0)
    cutoff = now - dt.timedelta(seconds=max(0.0, grace))
    keep = {"skip": 0, "run_once": 1, "catch_up": spec.catch_up_max}[spec.misfire]
    if spec.interval_seconds is not None:
        step = dt.timedelta(seconds=spec.interval_seconds)
        last = math.floor((now - t0) / step)
        due = last + 1
        first_on_time = max(0, math.ceil((cutoff - t0) / step))
        on_time = [t0 + i * step for i in range(first_on_time, last + 1)]
        late = min(first_on_time, due)
        late_kept = [t0 + i * step for i in range(max(0, late - keep), late)]
        nxt = t0 + due * step
    else:
        on_time = list(_cron_between(spec, max(t0, cutoff), now, inclusive=True))
        late_kept = _cron_last(spec, t0, min(cutoff, now), keep) if t0 < cutoff else []
        late = 0
        if t0 < cutoff:
            # Counted for the log only, and only so far.
            for _ in _cron_between(spec, t0, cutoff, inclusive=False, limit=_LATE_COUNT_LIMIT):
                late += 1
        due = late + len(on_time)
        nxt = spec.next_after(now)
    if spec.misfire == "run_once" and on_time:
        # The on-time occurrence is the one run that stands for the late ones.
        late_kept = []
    return Plan(fire=tuple(late_kept + on_time), next_fire_at=nxt, due=due, late=late)


def spec_for_job(
    job_name: str,
    schedule: Any,
    *,
    tz: str = "UTC",
    misfire: str = "run_once",
    catch_up_max: int = 1,
    overlap: str = "allow",
) -> ScheduleSpec | None:
    """The spec of ``@job(schedule=...)``: a cron string or a ``timedelta`` of whole seconds.

    Raises ``ValueError`` naming the job when anything is invalid.
    """
    if schedule is None:
        return None
    try:
        if isinstance(schedule, ScheduleSpec):
            return schedule
        if isinstance(schedule, str):
            return ScheduleSpec(
                cron=schedule,
                timezone=tz,
                misfire=misfire,
                catch_up_max=catch_up_max,
                overlap=overlap,
            )
        if isinstance(schedule, dt.timedelta):
            seconds = schedule.total_seconds()
            if seconds != int(seconds):
                raise ValueError("an interval schedule must be a whole number of seconds")
            return ScheduleSpec(
                interval_seconds=int(seconds),
                timezone=tz,
                misfire=misfire,
                catch_up_max=catch_up_max,
                overlap=overlap,
            )
        raise ValueError("schedule must be a cron string or a datetime.timedelta")
    except ValueError as e:
        raise ValueError(f"job {job_name}: {e}") from None
