"""Is it alive? The one place that decides the verdict (healthy, degraded or down, with its
reasons) and which executors and schedulers count as live.

The overview, ``jobs_status`` and ``/metrics`` all read :func:`assess`, so they cannot
disagree. Liveness is read from the ``Executor`` table: executors beat their row every
``EXECUTOR_BEAT_SECONDS``; ``run_scheduler`` registers a row of its own
(``transport="scheduler"``, no queues) and beats it at every maintenance round. Those rows are
never counted as consumers of work (:func:`scheduler_core.read.health.executors`,
``Driver.live_consumer_queues``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..conf import executor_stale_seconds, tenure_settings
from ..models import Executor
from ..storage.clock import DbNow
from ..storage.drivers import driver
from . import failover, health
from .queues import queue_overview

SCHEDULER_TRANSPORT = "scheduler"
"""The ``Executor.transport`` of ``run_scheduler``'s liveness row."""

STALE_BEATS = 3
"""A scheduler is stale once it missed at least this many rounds, whatever the settings say
(executors: ``conf.executor_stale_seconds``)."""

STOPPED_RESPONDING_WINDOW_SECONDS = 24 * 3600.0
"""Executors silent for longer than this (and never stopped) are no longer listed."""

HEALTHY, DEGRADED, DOWN = "healthy", "degraded", "down"
LEVELS: tuple[str, ...] = (HEALTHY, DEGRADED, DOWN)
"""The verdicts, least to most severe (their index is the ``tenure_verdict`` gauge)."""


def scheduler_stale_seconds() -> float:
    """Seconds after its last round that ``run_scheduler`` stops being live:
    ``EXECUTOR_STALE_SECONDS``, and never less than ``STALE_BEATS`` rounds of
    ``SWEEP_INTERVAL``."""
    s = tenure_settings()
    return max(s.EXECUTOR_STALE_SECONDS, STALE_BEATS * s.SWEEP_INTERVAL)


@dataclass(frozen=True)
class SchedulerStatus:
    """What is known of ``run_scheduler``: alive (some scheduler beat within
    :func:`scheduler_stale_seconds`), the latest beat and how long ago, and when the latest one
    stopped (None: it was killed, or never ran)."""

    alive: bool
    count: int
    last_beat: dt.datetime | None
    seconds_ago: float | None
    stopped_at: dt.datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "alive": self.alive,
            "count": self.count,
            "last_beat": self.last_beat.isoformat() if self.last_beat else None,
            "seconds_ago": None if self.seconds_ago is None else round(self.seconds_ago, 1),
            "stopped_at": self.stopped_at.isoformat() if self.stopped_at else None,
        }


def scheduler_status(now: dt.datetime | None = None) -> SchedulerStatus:
    """Whether any ``run_scheduler`` is alive, and its latest beat (the database's clock)."""
    now = now or driver().now()
    rows = list(
        Executor.objects.filter(transport=SCHEDULER_TRANSPORT)
        .order_by("-heartbeat_at")
        .values("heartbeat_at", "stopped_at")[:50]
    )
    stale = scheduler_stale_seconds()
    alive = [
        r
        for r in rows
        if r["stopped_at"] is None and (now - r["heartbeat_at"]).total_seconds() <= stale
    ]
    last = rows[0] if rows else None
    return SchedulerStatus(
        alive=bool(alive),
        count=len(alive),
        last_beat=last["heartbeat_at"] if last else None,
        seconds_ago=max(0.0, (now - last["heartbeat_at"]).total_seconds()) if last else None,
        stopped_at=last["stopped_at"] if last else None,
    )


def stopped_responding(*, limit: int = 20) -> list[dict[str, Any]]:
    """Executors that never recorded a stop but whose beat is older than
    :func:`executor_stale_seconds` (killed, frozen or cut off), most recently seen first."""
    rows = (
        Executor.objects.exclude(transport=SCHEDULER_TRANSPORT)
        .filter(
            stopped_at__isnull=True,
            heartbeat_at__lte=DbNow(-executor_stale_seconds()),
            heartbeat_at__gt=DbNow(-STOPPED_RESPONDING_WINDOW_SECONDS),
        )
        .order_by("-heartbeat_at", "id")[:limit]
    )
    return [
        {
            "id": e.id,
            "transport": e.transport,
            "queues": e.queues,
            "heartbeat_at": e.heartbeat_at.isoformat(),
        }
        for e in rows
    ]


@dataclass(frozen=True)
class Reason:
    """One reason for a verdict: its severity, a stable key and a sentence for a person."""

    level: str
    key: str
    text: str
    queue: str = ""
    """The queue the reason is about (its pause or limit), for a link; empty: none."""

    def as_dict(self) -> dict[str, str]:
        out = {"level": self.level, "key": self.key, "text": self.text}
        if self.queue:
            out["queue"] = self.queue
        return out


@dataclass(frozen=True)
class Assessment:
    """The verdict with its reasons, and the liveness figures it was made from."""

    verdict: str
    reasons: list[Reason]
    scheduler: SchedulerStatus
    live_executors: int
    stopped_responding: list[dict[str, Any]] = field(default_factory=list)

    @property
    def level_index(self) -> int:
        """0 healthy, 1 degraded, 2 down."""
        return LEVELS.index(self.verdict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": [r.as_dict() for r in self.reasons],
            "scheduler": self.scheduler.as_dict(),
            "live_executors": self.live_executors,
            "stopped_responding": self.stopped_responding,
        }


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def assess(
    *,
    categories: dict[str, int] | None = None,
    executors: list[dict[str, Any]] | None = None,
    pressure: dict[str, Any] | bool | None = False,
    failed_over: dict[str, Any] | None = None,
    queue_rows: list[dict[str, Any]] | None = None,
) -> Assessment:
    """The verdict, from the health categories, the live executors and the database's
    pressure (each read here unless the caller already has it; ``pressure`` a bool: read it).

    * **down**: no live executor while jobs are due (``waiting_due``); ``run_scheduler`` not
      running (nothing reaps expired leases or fires schedules).
    * **degraded**: stuck, abandoned or overrunning jobs; jobs failing repeatedly;
      indeterminate jobs waiting for an operator; workflow steps held by an indeterminate
      step before them; the database holding the queue back (an old snapshot with dead rows
      piling up, ``health.database_pressure``); the store failed over within
      ``failover.NOTICE_SECONDS`` (``failed_over``, read here unless given: which jobs may have
      run twice is for a person to see).
    * **healthy**: none of these.

    Due jobs a queue's pause or limits hold back are not stuck: each such queue is named in a
    reason of its own, at the level of the rest (it degrades nothing), saying what holds it
    (``queue_rows``: :func:`scheduler_core.read.queues.queue_overview`, read here when any
    job is held back and the caller has none).
    """
    c = health.health_counts() if categories is None else categories
    execs = health.executors() if executors is None else executors
    db = health.database_pressure() if isinstance(pressure, bool) else pressure
    sched = scheduler_status()
    reasons: list[Reason] = []
    due = int(c.get("waiting_due", 0))
    if not execs and due:
        reasons.append(
            Reason(
                DOWN,
                "no_executor",
                f"No live executor while {_n(due, 'job is', 'jobs are')} due: nothing runs them.",
            )
        )
    if not sched.alive:
        if sched.last_beat is None:
            since = "it has never run against this database"
        elif sched.stopped_at is not None:
            since = f"stopped at {sched.stopped_at:%Y-%m-%d %H:%M:%S} UTC"
        else:
            since = (
                f"last beat {sched.last_beat:%Y-%m-%d %H:%M:%S} UTC, "
                f"{sched.seconds_ago or 0:.0f} s ago"
            )
        reasons.append(
            Reason(
                DOWN,
                "no_scheduler",
                f"run_scheduler is not running ({since}): expired leases are not reaped and "
                "schedules do not fire.",
            )
        )
    degraded = [
        ("stuck", "job due but unclaimed for too long", "jobs due but unclaimed for too long"),
        ("abandoned", "job abandoned by its executor", "jobs abandoned by their executors"),
        ("overrunning", "job past its maximum runtime", "jobs past their maximum runtime"),
        ("failing_repeatedly", "job failing repeatedly", "jobs failing repeatedly"),
        (
            "indeterminate",
            "indeterminate job waiting for an operator",
            "indeterminate jobs waiting for an operator",
        ),
    ]
    for key, one, many in degraded:
        n = int(c.get(key, 0))
        if n:
            reasons.append(Reason(DEGRADED, key, _n(n, one, many) + "."))
    if int(c.get("indeterminate", 0)):
        # Only a step after an indeterminate one is held: none can be without one.
        held = driver().held_steps()
        if held:
            reasons.append(
                Reason(
                    DEGRADED,
                    "held_steps",
                    _n(
                        held,
                        "workflow step held by an unknown outcome",
                        "workflow steps held by an unknown outcome",
                    )
                    + " (a step before it is indeterminate): it runs once an operator settles "
                    "that step.",
                )
            )
    if db and db.get("held_back"):
        reasons.append(
            Reason(
                DEGRADED,
                "database_pressure",
                f"The database is holding the queue back: a snapshot held "
                f"{db['oldest_snapshot_seconds']:.0f} s, {db['job_dead_rows']} dead job rows.",
            )
        )
    fo = failover.failover() if failed_over is None else failed_over
    if failover.recent(fo, now=driver().now()):
        reasons.append(Reason(DEGRADED, "failover", failover.sentence(fo)))
    if any(int(c.get(h, 0)) for h in health.HELD_CATEGORIES):
        for row in queue_overview() if queue_rows is None else queue_rows:
            if row["held"]:
                reasons.append(
                    Reason(
                        HEALTHY, "held_back", f"Queue {row['name']}: {row['holds']}.", row["name"]
                    )
                )
    verdict = max((r.level for r in reasons), key=LEVELS.index, default=HEALTHY)
    return Assessment(
        verdict=verdict,
        reasons=reasons,
        scheduler=sched,
        live_executors=len(execs),
        stopped_responding=stopped_responding(),
    )
