"""The read side of queues: each queue's operator settings (paused, by whom, when and why; its
limits) next to what it holds now (due waiting jobs, leased jobs), for the console's queues
page and ``manage.py queues list``. No writes here."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from ..domain.states import State
from ..models import Job, Queue
from .health import health_q


def queue_overview(counts: dict[str, dict[str, int]] | None = None) -> list[dict[str, Any]]:
    """One row per queue that has a settings row or unfinished jobs, by name: ``name``,
    ``paused``, ``paused_by``, ``paused_reason``, ``paused_at``, ``max_leased``,
    ``max_per_second``, ``version`` (0: never configured), ``due`` (waiting and due now),
    ``waiting`` and ``leased``.

    ``counts`` (per queue: ``waiting``, ``due``, ``leased``) are figures the caller already
    read, such as the overview's one scan (:func:`scheduler_core.read.health.queue_counts`);
    without them the unfinished jobs are counted here."""
    rows: dict[str, dict[str, Any]] = {}
    if counts is None:
        counts = {
            c["queue"]: {"waiting": c["waiting"], "due": c["due"], "leased": c["leased"]}
            for c in Job.objects.in_states([State.WAITING, State.LEASED])
            .values("queue")
            .annotate(
                waiting=Count("id", filter=Q(state=State.WAITING)),
                due=Count("id", filter=health_q("waiting_due")),
                leased=Count("id", filter=Q(state=State.LEASED)),
            )
        }
    for name, c in counts.items():
        rows[name] = _row(name, None) | {
            "waiting": c["waiting"],
            "due": c["due"],
            "leased": c["leased"],
        }
    for q in Queue.objects.all():
        rows[q.name] = rows.get(q.name, _row(q.name, None)) | _row(q.name, q, counts=False)
    return [rows[name] for name in sorted(rows)]


def _row(name: str, q: Queue | None, *, counts: bool = True) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name,
        "paused": bool(q and q.paused),
        "paused_by": q.paused_by if q else "",
        "paused_reason": q.paused_reason if q else "",
        "paused_at": q.paused_at if q else None,
        "max_leased": q.max_leased if q else None,
        "max_per_second": q.max_per_second if q else None,
        "version": q.version if q else 0,
        "updated_at": q.updated_at if q else None,
    }
    if counts:
        row.update(waiting=0, due=0, leased=0)
    return row
