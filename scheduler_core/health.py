"""The read side: counts by state and health, executors, stale writes. No writes here."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from . import conf
from .dbclock import DbNow
from .models import Executor, Job, StaleWrite
from .states import State


def state_counts() -> dict[str, int]:
    """Jobs per lifecycle state (every state present, zero when empty)."""
    counts = {s.value: 0 for s in State}
    for row in Job.objects.values("state").annotate(n=Count("id")):
        counts[row["state"]] = row["n"]
    return counts


def health_counts() -> dict[str, int]:
    """Derived categories that tell normal waiting from abandoned or failing work."""
    s = conf.get()
    leased = Q(state=State.LEASED)
    waiting = Q(state=State.WAITING)
    agg = Job.objects.aggregate(
        waiting_due=Count("id", filter=waiting & Q(run_at__lte=DbNow()) & Q(attempts=0)),
        waiting_scheduled=Count("id", filter=waiting & Q(run_at__gt=DbNow()) & Q(attempts=0)),
        waiting_backing_off=Count("id", filter=waiting & Q(attempts__gt=0)),
        stuck=Count("id", filter=waiting & Q(run_at__lt=DbNow(-s.STUCK_AFTER_SECONDS))),
        running=Count("id", filter=leased & Q(lease_expires_at__gt=DbNow())),
        abandoned=Count("id", filter=leased & Q(lease_expires_at__lte=DbNow())),
        failing_repeatedly=Count(
            "id",
            filter=Q(state__in=[State.WAITING, State.LEASED])
            & Q(attempts__gte=s.FAILING_REPEATEDLY_ATTEMPTS),
        ),
        indeterminate=Count("id", filter=Q(state=State.INDETERMINATE)),
        failed=Count("id", filter=Q(state=State.FAILED)),
    )
    return {k: int(v) for k, v in agg.items()}


def executors() -> list[dict[str, Any]]:
    """Executors seen recently (alive) with their active attempt counts."""
    stale = conf.get().EXECUTOR_STALE_SECONDS
    rows = Executor.objects.filter(stopped_at__isnull=True, heartbeat_at__gt=DbNow(-stale))
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
    }
