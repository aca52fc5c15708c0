"""The read side: counts by state and health, executors, stale writes, what the database holds
back. No writes here; the dashboard, ``/metrics`` and ``jobs_status`` read through it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.apps import apps
from django.db.models import (
    BooleanField,
    Count,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    OuterRef,
    Q,
    Subquery,
)
from django.db.models.functions import Coalesce

from ..conf import executor_stale_seconds, tenure_settings
from ..domain.states import State
from ..models import Attempt, CountSnapshot, Executor, Job, Queue, StaleWrite
from ..storage.clock import DbNow, DbNowLessLeaseShare
from ..storage.drivers import driver
from ..storage.records import IndexSize, TableSpace
from . import failover


def state_counts() -> dict[str, int]:
    """Jobs per lifecycle state (every state present, zero when empty)."""
    counts = {s.value: 0 for s in State}
    for row in Job.objects.values("state").annotate(n=Count("id")):
        counts[row["state"]] = row["n"]
    return counts


HELD_CATEGORIES: tuple[str, ...] = ("paused", "concurrency_limited", "rate_limited")
"""Due jobs a queue's settings hold back, by what holds them (a part of no other waiting
category: they are neither "due" nor "stuck")."""

HEALTH_CATEGORIES: tuple[str, ...] = (
    "waiting_due",
    "waiting_scheduled",
    "waiting_backing_off",
    "stuck",
    "paused",
    "concurrency_limited",
    "rate_limited",
    "running",
    "overrunning",
    "abandoned",
    "failing_repeatedly",
    "indeterminate",
    "failed",
)
"""The categories ``health_counts`` reports, in the order the dashboard shows them."""

RECENT_SECONDS = 3600.0
"""How far back "succeeded recently" looks."""


def health_q(category: str) -> Q:
    """The filter that defines one health category (or ``succeeded_recently``, or
    ``due_now``: waiting and due, held back or not).

    One definition serves the counts and the dashboard's job list, so they cannot disagree.
    Every time is the database's. Raises ``KeyError`` for an unknown category.

    * Due jobs (``run_at <= now``) that their queue's settings hold back are counted under what
      holds them, first match wins: ``paused`` (an operator paused the queue),
      ``concurrency_limited`` (the queue has ``max_leased`` jobs leased already) and
      ``rate_limited`` (the queue has ``max_per_second`` and a claim consulted its bucket
      within ``STUCK_AFTER_SECONDS``: executors are asking and the limit answers; with no one
      asking, its jobs are due and, in time, stuck).
    * ``waiting_due``: waiting, due now and held back by nothing; ``waiting_scheduled``:
      waiting for a future first attempt; ``waiting_backing_off``: waiting for a future retry
      after at least one spent attempt. These three and the held categories partition
      ``waiting``.
    * ``stuck``: due, held back by nothing, and unclaimed for longer than
      ``STUCK_AFTER_SECONDS`` (a part of ``waiting_due``): no executor is taking the job's
      queue.
    * ``running``: leased, within its maximum runtime, lease unexpired and heartbeat fresh;
      ``overrunning``: leased past its maximum runtime (it may no longer renew, complete or
      start an effect; the reaper moves it on once its lease runs out); ``abandoned``: leased
      within its maximum runtime, with the lease expired or the heartbeat stale (two renewals
      missed). The three partition ``leased``.
    * ``failing_repeatedly``: unfinished with at least ``FAILING_REPEATEDLY_ATTEMPTS`` failed
      attempts behind it (a leased job's current attempt is not counted).
    * ``indeterminate`` and ``failed``: those states.
    """
    s = tenure_settings()
    leased = Q(state=State.LEASED)
    waiting = Q(state=State.WAITING)
    fresh = Q(heartbeat_at__gte=DbNowLessLeaseShare(2.0 * s.HEARTBEAT_FRACTION))
    alive = Q(lease_expires_at__gt=DbNow()) & fresh
    # A leased job's deadline is always set (the claim writes it); NULL counts as within.
    overrun = Q(deadline_at__lte=DbNow())
    n = s.FAILING_REPEATEDLY_ATTEMPTS
    # An uncorrelated ``IN (SELECT ...)``: evaluated once per statement as a hashed set, and
    # costed so; a correlated EXISTS here lifts the overview over the JIT threshold
    # (docs/architecture.md, "Why some statements look as they do").
    rows = Queue.objects.filter(paused=False)
    paused = Q(queue__in=Queue.objects.filter(paused=True).values("name"))
    full = Q(
        queue__in=rows.filter(max_leased__isnull=False, max_leased__lte=_leased_in_queue()).values(
            "name"
        )
    )
    asked = Q(
        queue__in=rows.filter(
            max_per_second__isnull=False, tokens_at__gt=DbNow(-s.STUCK_AFTER_SECONDS)
        ).values("name")
    )
    held = paused | full | asked
    due = waiting & Q(run_at__lte=DbNow())
    return {
        "due_now": due,
        "waiting_due": due & ~held,
        "waiting_scheduled": waiting & Q(run_at__gt=DbNow()) & Q(attempts=0),
        "waiting_backing_off": waiting & Q(run_at__gt=DbNow()) & Q(attempts__gt=0),
        "stuck": waiting & Q(run_at__lt=DbNow(-s.STUCK_AFTER_SECONDS)) & ~held,
        "paused": due & paused,
        "concurrency_limited": due & ~paused & full,
        "rate_limited": due & ~paused & ~full & asked,
        "running": leased & ~overrun & alive,
        "overrunning": leased & overrun,
        "abandoned": leased & ~overrun & ~alive,
        "failing_repeatedly": (waiting & Q(attempts__gte=n)) | (leased & Q(attempts__gt=n)),
        "indeterminate": Q(state=State.INDETERMINATE),
        "failed": Q(state=State.FAILED),
        "succeeded_recently": Q(state=State.SUCCEEDED, finished_at__gt=DbNow(-RECENT_SECONDS)),
    }[category]


def _leased_in_queue() -> Any:
    """How many jobs of the outer ``Queue`` row's queue are leased now (a subquery)."""
    return Coalesce(
        Subquery(
            Job.objects.filter(queue=OuterRef("name"), state=State.LEASED)
            .order_by()
            .values("queue")
            .annotate(n=Count("id"))
            .values("n")[:1],
            output_field=IntegerField(),
        ),
        0,
    )


# The categories that are a whole state: counted by state (through the state index), not
# row by row with the clock conditions the others need.
_WHOLE_STATES = {"indeterminate": State.INDETERMINATE, "failed": State.FAILED}


def health_counts() -> dict[str, int]:
    """Derived categories that tell normal waiting from abandoned or failing work."""
    live = [State.WAITING, State.LEASED, *_WHOLE_STATES.values()]
    return _counted(Job.objects.in_states(live))[1]


def _counted(jobs: Any) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One scan of ``jobs``: counts per (queue, name, state), and the health categories.

    The time-dependent categories are filters of the same scan (one definition each, in
    :func:`health_q`); the categories that are a whole state are read from the state counts.
    """
    timed = [c for c in HEALTH_CATEGORIES if c not in _WHOLE_STATES]
    rows: list[dict[str, Any]] = [
        dict(r)
        for r in jobs.values("queue", "name", "state").annotate(
            n=Count("id"), **{c: Count("id", filter=health_q(c)) for c in timed}
        )
    ]
    counts = {c: sum(int(r[c]) for r in rows) for c in timed}
    for c, st in _WHOLE_STATES.items():
        counts[c] = sum(int(r["n"]) for r in rows if r["state"] == st.value)
    # Each row keeps its due count, so the overview's queues section reads its per-queue
    # figures from this scan (queue_counts) rather than scanning the live rows again.
    grouped = [
        {
            "queue": r["queue"],
            "name": r["name"],
            "state": r["state"],
            "n": r["n"],
            "due": r["waiting_due"] + sum(r[c] for c in HELD_CATEGORIES),
            **{c: r[c] for c in HELD_CATEGORIES},
        }
        for r in rows
    ]
    return grouped, {c: counts[c] for c in HEALTH_CATEGORIES}


def succeeded_recently() -> int:
    """Jobs that succeeded within the last ``RECENT_SECONDS`` (by the database's clock)."""
    # updated_at is written with finished_at and only grows, so it bounds the scan through the
    # (state, updated_at) index; finished_at keeps the count exact.
    # The bound is read from the database's clock first and passed as a value: an expression
    # of clock_timestamp() (volatile) could not bound an index scan, and this would read
    # every succeeded job.
    since = driver().now() - dt.timedelta(seconds=RECENT_SECONDS)
    return Job.objects.filter(health_q("succeeded_recently"), updated_at__gt=since).count()


def job_rows_estimate() -> int:
    """The database's estimate of the job table's size (PostgreSQL's statistics, kept by
    autovacuum); -1 when unknown (SQLite, or never analysed)."""
    return driver().estimated_jobs()


def counts_are_snapshotted() -> bool:
    """Whether the job table is big enough that succeeded jobs are counted by the scheduler's
    snapshot rather than on each dashboard load (see ``EXACT_COUNTS_BELOW``)."""
    return job_rows_estimate() >= tenure_settings().EXACT_COUNTS_BELOW


SNAPSHOT_STATES = (State.SUCCEEDED, State.CANCELLED)
"""History that only grows and that no one acts on: counted by the scheduler's snapshot on a
big table. Failed and indeterminate jobs, which need an operator, are always counted live."""


def overview_counts() -> tuple[list[dict[str, Any]], Any, dict[str, int]]:
    """Job counts per (queue, name, state), the time the succeeded and cancelled counts were
    taken (None: counted just now) and the health categories (as :func:`health_counts`), from
    one scan.

    On a big job table the succeeded and cancelled rows come from the snapshot
    ``run_scheduler`` refreshes every ``COUNTS_REFRESH_SECONDS``; every other state is counted
    live, through the state index, because those sets stay small. With no snapshot yet,
    everything is counted live. The health categories are filters of the same scan.
    """

    snap: list[dict[str, Any]] = []
    taken = None
    live = Job.objects.all()
    if counts_are_snapshotted():
        snap = [dict(r) for r in CountSnapshot.objects.values("queue", "name", "state", "n")]
        taken = CountSnapshot.objects.aggregate(t=Max("taken_at"))["t"]
        if taken is not None:
            # The other states, each read through its own index (in_states), not NOT IN.
            live = live.in_states(st for st in State if st not in SNAPSHOT_STATES)
        else:
            snap = []
    grouped, categories = _counted(live)
    return grouped + snap, taken, categories


def fold_counts(rows: list[dict[str, Any]], field: str | None) -> Any:
    """Fold :func:`overview_counts` rows into per-state counts (``field=None``) or a
    per-``field`` table of per-state counts (every state present, zero when empty)."""
    if field is None:
        counts = {st.value: 0 for st in State}
        for r in rows:
            counts[r["state"]] = counts.get(r["state"], 0) + r["n"]
        return counts
    table: dict[str, dict[str, int]] = {}
    for r in sorted(rows, key=lambda r: r[field]):
        per = table.setdefault(r[field], {st.value: 0 for st in State})
        per[r["state"]] = per.get(r["state"], 0) + r["n"]
    return table


def queue_counts(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per queue, from :func:`overview_counts` rows: ``waiting``, ``due`` (waiting and due now,
    held back or not), ``leased`` and each of :data:`HELD_CATEGORIES` -- the figures
    :func:`scheduler_core.read.queues.queue_overview` counts."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        if r["state"] not in (State.WAITING, State.LEASED):
            continue
        per = out.setdefault(
            r["queue"],
            {"waiting": 0, "due": 0, "leased": 0, **{c: 0 for c in HELD_CATEGORIES}},
        )
        if r["state"] == State.WAITING:
            per["waiting"] += r["n"]
            per["due"] += r.get("due", 0)
            for c in HELD_CATEGORIES:
                per[c] += r.get(c, 0)
        else:
            per["leased"] += r["n"]
    return out


def leases_by_owner(owners: list[str], *, limit: int = 20) -> dict[str, list[dict[str, Any]]]:
    """The jobs each of ``owners`` holds a lease on (at most ``limit`` each, soonest expiry
    first), with whether the lease has expired by the database's clock."""
    out: dict[str, list[dict[str, Any]]] = {o: [] for o in owners}
    rows = (
        Job.objects.filter(state=State.LEASED, lease_owner__in=owners)
        .annotate(
            expired=ExpressionWrapper(Q(lease_expires_at__lte=DbNow()), output_field=BooleanField())
        )
        .order_by("lease_expires_at", "id")
        .values("id", "name", "fence", "lease_owner", "lease_expires_at", "expired")
    )
    for r in rows:
        if len(out[r["lease_owner"]]) < limit:
            out[r["lease_owner"]].append(dict(r))
    return out


def executors() -> list[dict[str, Any]]:
    """Live executors (not stopped, beaten within ``conf.executor_stale_seconds()``) with their
    active attempt counts; ``run_scheduler``'s own liveness rows are not executors."""
    stale = executor_stale_seconds()
    rows = Executor.objects.filter(stopped_at__isnull=True, heartbeat_at__gt=DbNow(-stale)).exclude(
        transport="scheduler"
    )
    return [
        {
            "id": e.id,
            "transport": e.transport,
            "queues": e.queues,
            "concurrency": e.concurrency,
            "active": e.active,
            "heartbeat_at": e.heartbeat_at.isoformat(),
        }
        for e in rows.order_by("id")
    ]


def stale_writes() -> dict[str, Any]:
    """Refused stale writes recorded by every executor, by write kind."""
    by_kind = {
        r["write"]: r["n"] for r in StaleWrite.objects.values("write").annotate(n=Count("id"))
    }
    return {"total": sum(by_kind.values()), "by_write": by_kind}


def status() -> dict[str, Any]:
    """Everything ``jobs_status --json`` prints."""
    execs = executors()
    return {
        "states": state_counts(),
        "health": health_counts(),
        "executors": {"alive": len(execs), "list": execs},
        "stale_writes_refused": stale_writes(),
        "database": database_pressure(),
        "failover": failover.failover(),
    }


# ---------------------------------------------------------------------------------------------
# Figures for /metrics (scheduler_core.read.metrics reads these at scrape time)
# ---------------------------------------------------------------------------------------------

SAMPLE_LIMIT = 20_000
"""The most attempts a scrape reads for the recent-duration and claim-latency figures."""


def leases_reaped() -> int:
    """Attempts ended because their lease expired (recorded by every scheduler)."""

    return Attempt.objects.filter(outcome="lease_expired").count()


def recent_attempt_durations(*, limit: int = SAMPLE_LIMIT) -> list[float]:
    """Seconds from claim to end of attempts that finished within ``RECENT_SECONDS``."""

    rows = (
        Attempt.objects.filter(finished_at__gt=DbNow(-RECENT_SECONDS))
        .order_by("-finished_at")
        .values_list("claimed_at", "finished_at")[:limit]
    )
    return [max(0.0, (end - start).total_seconds()) for start, end in rows if end is not None]


def recent_claim_latencies(*, limit: int = SAMPLE_LIMIT) -> list[float]:
    """Seconds from due time to claim, for claims made within ``RECENT_SECONDS``.

    A job's ``run_at`` is the due time of its latest claim until the job waits again, so only
    each job's latest attempt of a job that is not waiting (or cancelled) is measured.
    """

    rows = (
        Attempt.objects.filter(claimed_at__gt=DbNow(-RECENT_SECONDS), fence=F("job__fence"))
        .exclude(job__state__in=[State.WAITING, State.CANCELLED])
        .order_by("-claimed_at")
        .values_list("job__run_at", "claimed_at")[:limit]
    )
    return [max(0.0, (claimed - due).total_seconds()) for due, claimed in rows]


# ---------------------------------------------------------------------------------------------
# What the database holds back (PostgreSQL)
# ---------------------------------------------------------------------------------------------


def tenure_tables() -> list[str]:
    """The tables of Tenure's models."""
    return sorted({m._meta.db_table for m in apps.get_app_config("scheduler_core").get_models()})


def index_sizes() -> list[IndexSize]:
    """The B-tree indexes of Tenure's tables, each with its size and what its entries need
    (PostgreSQL; empty where the database reuses freed pages itself): what ``/metrics`` shows,
    and what ``run_scheduler``'s index upkeep decides from
    (:mod:`scheduler_core.services.indexes`)."""
    return driver().index_sizes(tenure_tables())


def table_spaces() -> list[TableSpace]:
    """Tenure's tables, each heap's size beside the statistics' estimate of what its rows need
    (PostgreSQL, tables with statistics; empty where the database reuses freed pages itself):
    what ``/metrics`` shows, and the gate of ``run_scheduler``'s table compaction
    (:mod:`scheduler_core.services.tables`)."""
    d = driver()
    return [s for s in (d.table_space(t) for t in tenure_tables()) if s is not None]


HELD_BACK_AFTER_SECONDS = 60.0
"""A snapshot held longer than this, with dead rows piling up behind it, is reported as
holding the queue back."""
HELD_BACK_DEAD_ROWS = 10_000


def database_pressure() -> dict[str, Any] | None:
    """The oldest snapshot this database's vacuum must respect, and the dead rows of the job
    table it cannot yet remove; None where the database keeps no old row versions (SQLite:
    readers there hold no rows back).

    ``held_back`` is true when a snapshot has been held longer than
    ``HELD_BACK_AFTER_SECONDS`` and the job table carries more than ``HELD_BACK_DEAD_ROWS``
    dead rows: claims still seek past them (``storage/floors.py``), completions find their
    rows by key and the reaper and retention stop at their time bounds, but the table and its
    indexes grow until the snapshot ends, and so do the dashboard's counts. ``oldest`` names
    the session (pid, application, state, its transaction's start), so an operator can find
    and end it.
    """
    raw = driver().database_pressure()
    if not raw:
        return None
    session, table = raw["session"], raw["table"]
    oldest = None
    age = 0.0
    if session is not None:
        age = float(session["seconds"] or 0.0)
        started = session["xact_start"]
        oldest = {
            "pid": session["pid"],
            "application": session["application_name"] or "",
            "state": session["state"] or "",
            "transaction_started": started.isoformat() if started else None,
            "seconds": round(age, 1),
        }
    dead = int(table.get("n_dead_tup") or 0)
    last_vacuum = table.get("last_autovacuum")
    return {
        "oldest_snapshot": oldest,
        "oldest_snapshot_seconds": round(age, 1),
        "job_dead_rows": dead,
        "job_live_rows": int(table.get("n_live_tup") or 0),
        "job_table_bytes": int(table.get("bytes") or 0),
        "job_autovacuums": int(table.get("autovacuum_count") or 0),
        "job_last_autovacuum": last_vacuum.isoformat() if last_vacuum else None,
        "held_back": age > HELD_BACK_AFTER_SECONDS and dead > HELD_BACK_DEAD_ROWS,
    }
