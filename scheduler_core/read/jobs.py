"""The read side of jobs: the filtered, keyset-paginated job list, one job's record (attempts,
ledger, owners, audit), what changed since an operator read it, and the overview's figures. The
console and ``manage.py jobs list|show`` read through these, so each says a job's state once.

Counts and categories come from :mod:`scheduler_core.read.health`, so the list and the overview
share one definition of each category. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from ..api import registry
from ..conf import executor_stale_seconds
from ..domain import payload_search
from ..domain.modes import GUARANTEES, EffectMode, Guarantee
from ..domain.states import State
from ..models import (
    Attempt,
    AuditEntry,
    Effect,
    EffectEvent,
    Executor,
    Job,
    Schedule,
    in_states,
)
from ..storage.drivers import driver
from ..storage.records import InFlightOwner
from . import health, liveness, queues
from .results import results_of

PAGE_SIZE_DEFAULT = 50
PAGE_SIZE_MAX = 200
ATTEMPTS_SHOWN = 100
AUDIT_SHOWN = 200
EVENTS_SHOWN = 500
"""The newest ledger history entries a job's page shows (across its effects)."""
HEALTH_FILTERS: tuple[str, ...] = (*health.HEALTH_CATEGORIES, "succeeded_recently")
"""Every health category the list can filter by."""


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    """A validated job-list filter; empty strings mean "any"."""

    state: str = ""
    health: str = ""
    queue: str = ""
    name: str = ""
    q: str = ""
    workflow: str = ""
    """A workflow's id: its steps only."""

    def queryset(self) -> QuerySet[Job]:
        """The jobs this filter matches (unordered)."""
        qs = Job.objects.all()
        if self.workflow:
            qs = qs.filter(step__workflow_id=int(self.workflow))
        if self.state:
            qs = qs.filter(state=self.state)
        if self.health:
            qs = qs.filter(health.health_q(self.health))
        if self.queue:
            qs = qs.filter(queue=self.queue)
        if self.name:
            qs = qs.filter(name=self.name)
        if self.q and payload_search.looks_like_payload_query(self.q):
            # A payload search: validated by the form; the driver says it in its database's
            # terms (an index on PostgreSQL).
            qs = qs.filter(driver().payload_contains(payload_search.parse(self.q)))
        elif self.q:
            text = Q(unique_key__icontains=self.q)
            # An id fits a signed 64-bit column only up to 18 digits; longer text is a key.
            if self.q.isdigit() and len(self.q) <= 18:
                text |= Q(pk=int(self.q))
            qs = qs.filter(text)
        return qs

    def search_words(self) -> str:
        """What the search text ``q`` matched, in words (empty: no search)."""
        if not self.q:
            return ""
        if payload_search.looks_like_payload_query(self.q):
            return f"Payloads containing {payload_search.parse(self.q).describe()}."
        if self.q.isdigit() and len(self.q) <= 18:
            return (
                f"A bare number is a job id: job {self.q}, and any job whose unique key contains "
                f"“{self.q}”. To search payloads for it, name its key: some_key={self.q}."
            )
        return f"Jobs whose unique key contains “{self.q}”."

    def params(self) -> dict[str, str]:
        """The non-empty fields, for links that keep the filter."""
        return {k: v for k, v in vars(self).items() if v}

    @property
    def active(self) -> bool:
        """Whether any field narrows the list."""
        return bool(self.params())


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of jobs, newest id first, and the cursor of the next page."""

    jobs: list[Job]
    next_before: int | None
    limit: int


def page(jobs: QuerySet[Job], *, before: int | None, limit: int) -> Page:
    """Keyset pagination by id, descending: stable under inserts, no OFFSET scans."""
    limit = max(1, min(limit, PAGE_SIZE_MAX))
    if before is not None:
        jobs = jobs.filter(pk__lt=before)
    rows = list(jobs.select_related("spec").order_by("-id")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(jobs=rows, next_before=rows[-1].pk if more else None, limit=limit)


def bulk_targets(f: JobFilter, action: str) -> QuerySet[Job]:
    """The jobs a bulk ``action`` over filter ``f`` would change.

    Bulk retry covers failed jobs whose ledger holds no effect of unknown outcome: an
    indeterminate job, or a failed one with such an effect, needs the fact its operator
    verified, one job at a time. Bulk cancel covers every state cancel may leave.
    """
    if action == "retry":
        unsettled = driver().unsettled_of_job(OuterRef("pk"))
        return f.queryset().filter(state=State.FAILED).exclude(Exists(unsettled))
    if action == "cancel":
        return f.queryset().filter(in_states([State.WAITING, State.FAILED, State.INDETERMINATE]))
    raise ValueError(f"no bulk action {action!r}")


def queues_of(jobs: QuerySet[Job], *, limit: int = 20) -> list[str]:
    """The distinct queues of ``jobs`` (at most ``limit``), by name."""
    names = jobs.order_by().values_list("queue", flat=True).distinct()[:limit]
    return sorted(set(names))


def known_queues() -> list[str]:
    """Queues the filters offer: :func:`scheduler_core.read.queues.known_queues`."""
    return queues.known_queues()


def known_job_types() -> list[str]:
    """Job types the filters offer: the registry's, and those schedules name."""
    names = set(registry.all_types())
    names.update(Schedule.objects.values_list("job_name", flat=True))
    return sorted(names)


def unknown_filter_values(f: JobFilter) -> list[dict[str, Any]]:
    """The queue and job type of ``f`` that name nothing known: not offered by the filters
    and held by no job. Asked only when a filter matched nothing, so a typo is said as one."""
    out: list[dict[str, Any]] = []
    if f.queue:
        known = known_queues()
        if f.queue not in known and not Job.objects.filter(queue=f.queue).exists():
            out.append({"what": "queue", "value": f.queue, "known": known})
    if f.name:
        known = known_job_types()
        if f.name not in known and not Job.objects.filter(name=f.name).exists():
            out.append({"what": "job type", "value": f.name, "known": known})
    return out


def _rows(table: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    order = [st.value for st in State]
    return [{"key": k, "counts": [v[st] for st in order]} for k, v in table.items()]


def overview() -> dict[str, Any]:
    """Everything the overview shows, read in one place."""
    execs = health.executors()
    leases = health.leases_by_owner([e["id"] for e in execs])
    for e in execs:
        e["leases"] = leases.get(e["id"], [])
    # One scan of the job table serves the state, queue and type tables (on a big table the
    # succeeded rows come from the scheduler's snapshot: health.overview_counts).
    grouped, succeeded_as_of, categories = health.overview_counts()
    by_type = _rows(health.fold_counts(grouped, "name"))
    for row in by_type:
        jt = registry.get(row["key"])
        row["effect"] = jt.effect.value if jt else ""
    database = health.database_pressure()
    queue_counts = health.queue_counts(grouped)
    queue_rows = queues.queue_overview(queue_counts)
    return {
        "liveness": liveness.assess(
            categories=categories, executors=execs, pressure=database, queue_rows=queue_rows
        ),
        "executor_stale_seconds": executor_stale_seconds(),
        "states": health.fold_counts(grouped, None),
        "health": {**categories, "succeeded_recently": health.succeeded_recently()},
        "by_queue": _rows(health.fold_counts(grouped, "queue")),
        "queue_counts": queue_counts,
        "queue_rows": queue_rows,
        "by_type": by_type,
        "executors": execs,
        "stale_writes": health.stale_writes(),
        "state_names": [st.value for st in State],
        "succeeded_as_of": succeeded_as_of,
        "database": database,
    }


def guarantee_of(job: Job) -> Guarantee | None:
    """The guarantee the job's effect mode gives (None for a mode this build does not know)."""
    try:
        return GUARANTEES[EffectMode(job.effect)]
    except ValueError:
        return None


EVENT_LABELS: dict[str, str] = {
    EffectEvent.INTENDED: "intent recorded before the call",
    EffectEvent.APPLIED: "applied: the destination acknowledged it",
    EffectEvent.NOT_SENT: "the attempt sent nothing",
    EffectEvent.UNKNOWN: "outcome unknown",
    EffectEvent.LEFT_UNSETTLED: "the attempt ended without recording the outcome",
    EffectEvent.RECONCILED: "a reconciliation answered",
    EffectEvent.OPERATOR: "an operator stated a verified fact",
}
"""What each ledger history event means, as the job page says it."""


@dataclass(frozen=True, kw_only=True)
class LedgerRow:
    """One effect of a job and its history, oldest event first."""

    effect: Effect
    events: list[dict[str, Any]]


def ledger(job: Job) -> tuple[list[LedgerRow], int]:
    """The job's effects, each with its history (the newest ``EVENTS_SHOWN`` events of the
    job), and how many history events the job has in all."""
    effects = list(Effect.objects.filter(job=job).order_by("name"))
    events = EffectEvent.objects.filter(effect__job=job)
    rows = list(
        events.order_by("-id").values(
            "effect_id",
            "created_at",
            "attempt__number",
            "fence",
            "event",
            "state_after",
            "in_doubt_after",
            "actor",
            "note",
        )[:EVENTS_SHOWN]
    )
    by_effect: dict[int, list[dict[str, Any]]] = {e.pk: [] for e in effects}
    for row in reversed(rows):
        event = {**row, "label": EVENT_LABELS.get(row["event"], row["event"])}
        by_effect.setdefault(row["effect_id"], []).append(event)
    total = len(rows) if len(rows) < EVENTS_SHOWN else events.count()
    return [LedgerRow(effect=e, events=by_effect[e.pk]) for e in effects], total


@dataclass(frozen=True, kw_only=True)
class OwnerStatus:
    """The executor of a job's last attempt and what is known about whether it stopped."""

    attempt: int
    fence: int
    executor: str
    outcome: str
    heartbeat_at: datetime | None
    """The attempt's last lease renewal."""
    ended_at: datetime | None
    """When the attempt was ended (by the reaper when ``outcome`` is ``lease_expired``)."""
    executor_seen_at: datetime | None
    """The executor's own last liveness beat (None: no row for it)."""
    executor_stopped_at: datetime | None
    in_flight: bool
    """Reaped and not known to have stopped: :func:`scheduler_core.storage.base.Driver.in_flight_owners`."""

    @property
    def holds_lease(self) -> bool:
        """Whether the attempt is still open (the job is leased to it)."""
        return self.ended_at is None

    @property
    def known_gone(self) -> bool:
        """Whether the executor recorded its own stop: only that makes it known gone."""
        return self.executor_stopped_at is not None


def owner_status(job: Job, in_flight: list[InFlightOwner]) -> OwnerStatus | None:
    """The job's last owner (None when never claimed); ``in_flight`` is the job's
    :func:`scheduler_core.storage.base.Driver.in_flight_owners`."""
    last = Attempt.objects.filter(job=job).order_by("-fence").first()
    if last is None:
        return None
    ex = Executor.objects.filter(pk=last.executor).first()
    return OwnerStatus(
        attempt=last.number,
        fence=last.fence,
        executor=last.executor,
        outcome=last.outcome,
        heartbeat_at=last.heartbeat_at,
        ended_at=last.finished_at,
        executor_seen_at=ex.heartbeat_at if ex else None,
        executor_stopped_at=ex.stopped_at if ex else None,
        in_flight=any(o.fence == last.fence for o in in_flight),
    )


def job_changes(job: Job, *, seen_version: int, seen_state: str) -> dict[str, Any]:
    """What changed on a job since an operator read it at ``seen_version`` (in
    ``seen_state``): its state and version then and now, and who moved it last, an operator
    (the newest audit row) or an attempt (claimed, ended, or reaped once its lease ran out),
    whichever came later."""
    audit = AuditEntry.objects.filter(job=job).order_by("-created_at", "-id").first()
    attempt = Attempt.objects.filter(job=job).order_by("-fence").first()
    by, at, why = "", None, ""
    attempt_at = (attempt.finished_at or attempt.claimed_at) if attempt else None
    if audit is not None and (attempt_at is None or audit.created_at >= attempt_at):
        by, at, why = f"By {audit.actor} ({audit.action})", audit.created_at, audit.reason
    elif attempt is not None:
        if attempt.finished_at is None:
            by = f"Claimed by executor {attempt.executor} (attempt {attempt.number})"
        elif attempt.outcome == "lease_expired":
            by = (
                f"The reaper ended attempt {attempt.number} of executor {attempt.executor}: "
                "its lease ran out"
            )
        else:
            by = (
                f"Attempt {attempt.number} on executor {attempt.executor} ended "
                f"({attempt.outcome or 'no outcome'})"
            )
        at = attempt_at
    return {
        "version_before": seen_version,
        "version_now": job.version,
        "state_before": seen_state,
        "state_now": job.state,
        "by": by,
        "at": at,
        "why": why,
    }


def job_record(job: Job) -> dict[str, Any]:
    """A job's full record: payload, result (once succeeded), guarantee, attempts, effect
    ledger with its history, the last owner and any earlier one that may still be in flight,
    and the audit trail."""
    attempts = list(Attempt.objects.filter(job=job).order_by("-fence")[:ATTEMPTS_SHOWN])
    attempts_total = Attempt.objects.filter(job=job).count()
    # Numbered by claim, oldest first: the attempt count restarts on an operator retry, the
    # claim order (the fence's) does not.
    for i, a in enumerate(attempts):
        a.ordinal = attempts_total - i  # type: ignore[attr-defined]
    rows, events_total = ledger(job)
    effects = [r.effect for r in rows]
    audit = list(AuditEntry.objects.filter(job=job).order_by("-created_at", "-id")[:AUDIT_SHOWN])
    in_flight = driver().in_flight_owners(job.pk)
    results = results_of([job.pk]) if job.state == State.SUCCEEDED else {}
    kept = results.get(job.pk)
    return {
        "job": job,
        "payload_json": json.dumps(job.payload, indent=2, sort_keys=True, ensure_ascii=False),
        "succeeded": job.pk in results,
        "result_json": None
        if kept is None
        else json.dumps(kept, indent=2, sort_keys=True, ensure_ascii=False),
        "guarantee": guarantee_of(job),
        "attempts": attempts,
        "attempts_total": attempts_total,
        "effects": effects,
        "ledger": rows,
        "events_total": events_total,
        "events_shown": min(events_total, EVENTS_SHOWN),
        "unsettled": [e for e in effects if e.unsettled],
        "owner": owner_status(job, in_flight),
        "in_flight": in_flight,
        "audit": audit,
    }


def get_job(job_id: int) -> Job | None:
    """One job by id, with its spec (None: no such job)."""
    return Job.objects.select_related("spec").filter(pk=job_id).first()


def effects_of(job: Job) -> list[Effect]:
    """The job's ledger rows, by effect name."""
    return list(Effect.objects.filter(job=job).order_by("name"))


def unsettled_effects(job_id: int) -> list[Effect]:
    """The job's ledger rows of unknown outcome, by name."""
    return driver().unsettled_effects(job_id)


def in_flight_owners(job_id: int) -> list[InFlightOwner]:
    """The job's earlier owners that may still be in flight, newest first."""
    return driver().in_flight_owners(job_id)


def has_applied_effect(job_id: int) -> bool:
    """Whether the job's ledger records an effect applied."""
    return bool(driver().applied_of_job(job_id).exists())


def cancel_request_audit(job: Job) -> AuditEntry | None:
    """The newest audit row of a cancel requested of the job while it ran (None: none)."""
    return (
        AuditEntry.objects.filter(job=job, action="cancel_running").order_by("-created_at").first()
    )


def now() -> datetime:
    """The database's clock, the one every time the console shows is measured by."""
    return driver().now()
