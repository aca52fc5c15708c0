"""The read side of a failover: whether the store's server moved to a new timeline (a standby
promoted), when Tenure first wrote on it, how many attempts were in flight at the switch and
which jobs may have run again because of it, with the fences of both executions.

What the surviving store can name (docs/howto/high-availability.md): an attempt of the old
timeline still open at the switch, and the job's attempts on the new one; and an execution
the new primary never heard of (its claim was lost in the asynchronous gap) once it tried to
write: its refused write (``StaleWrite``) carries its fence. An attempt lost whole in the gap,
its completion included, left nothing here; only the destination's record of fences shows it
(a fence of the old epoch, then a higher one for the same key).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Min, Q

from ..models import Attempt, StaleWrite, StoreTimeline
from ..storage.drivers import driver
from ..storage.records import EPOCH_BITS

NOTICE_SECONDS = 24 * 3600
"""How long after a failover the console's verdict mentions it."""

LIST_LIMIT = 50
"""The most jobs the report names."""


def _fence_floor(timeline: int) -> int:
    return (timeline - 1) << EPOCH_BITS


def failover(*, limit: int = LIST_LIMIT) -> dict[str, Any]:
    """The last failover the store's records show (``timeline_changed`` False: none, or no
    timelines, as on SQLite)."""
    current = driver().timeline()
    if current is None:
        return {"timeline": None, "timeline_changed": False}
    seen = {int(t.timeline): t.first_seen_at for t in StoreTimeline.objects.order_by("timeline")}
    first = min(seen, default=current)
    if current == first:
        return {"timeline": current, "timeline_changed": False}
    earlier = [t for t in seen if t < current]
    previous = max(earlier) if earlier else None
    floor = _fence_floor(current)
    switched_at: dt.datetime | None = seen.get(current)
    dated_by = "recorded"
    if switched_at is None:
        # No scheduler round has run on the new timeline yet: its first claim dates it.
        switched_at = Attempt.objects.filter(fence__gte=floor).aggregate(at=Min("claimed_at"))["at"]
        dated_by = "first_claim"
    report: dict[str, Any] = {
        "timeline": current,
        "previous_timeline": previous,
        "timeline_changed": True,
        "switched_at": switched_at.isoformat() if switched_at else None,
        "dated_by": dated_by if switched_at else None,
        "fence_floor": floor,
        "in_flight_at_switch": 0,
        "possibly_rerun": 0,
        "jobs": [],
    }
    if switched_at is None:
        return report
    in_flight = Attempt.objects.filter(fence__lt=floor, claimed_at__lt=switched_at).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gte=switched_at)
    )
    report["in_flight_at_switch"] = in_flight.count()
    old_fences: dict[int, set[int]] = {}
    for job_id, fence in in_flight.values_list("job_id", "fence"):
        old_fences.setdefault(int(job_id), set()).add(int(fence))
    lost = StaleWrite.objects.filter(fence__lt=floor, created_at__gte=switched_at)
    lost_fences: dict[int, set[int]] = {}
    for job_id, fence in lost.values_list("job_id", "fence").distinct():
        lost_fences.setdefault(int(job_id), set()).add(int(fence))
    candidates = set(old_fences) | set(lost_fences)
    new_fences: dict[int, set[int]] = {}
    for job_id, fence in Attempt.objects.filter(
        job_id__in=candidates, fence__gte=floor
    ).values_list("job_id", "fence"):
        new_fences.setdefault(int(job_id), set()).add(int(fence))
    rerun = sorted(j for j in candidates if j in new_fences)
    report["possibly_rerun"] = len(rerun)
    report["jobs"] = [
        {
            "job": j,
            "old_fences": sorted(old_fences.get(j, set()) | lost_fences.get(j, set())),
            "new_fences": sorted(new_fences[j]),
            "lost_execution": j in lost_fences,
        }
        for j in rerun[:limit]
    ]
    return report


def recent(report: dict[str, Any], *, now: dt.datetime) -> bool:
    """Whether ``report``'s failover is recent enough for the verdict to mention it."""
    at = report.get("switched_at")
    if not report.get("timeline_changed") or at is None:
        return bool(report.get("timeline_changed"))
    return (now - dt.datetime.fromisoformat(at)).total_seconds() < NOTICE_SECONDS


def sentence(report: dict[str, Any]) -> str:
    """The failover in one sentence for a person."""
    at = report.get("switched_at")
    when = f"at {dt.datetime.fromisoformat(at):%Y-%m-%d %H:%M:%S} UTC" if at else "(not yet dated)"
    prev = report.get("previous_timeline")
    moved = f"timeline {prev} to {report['timeline']}" if prev else f"timeline {report['timeline']}"
    return (
        f"The store failed over {when} ({moved}): {report['in_flight_at_switch']} attempts "
        f"were in flight at the switch, {report['possibly_rerun']} jobs may have run again "
        "(jobs_status --json names them with both executions' fences)."
    )
