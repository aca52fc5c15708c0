"""The read side of queues: each queue's operator settings (paused, by whom, when and why; its
limits) next to what it holds now (due waiting jobs, leased jobs, and the due jobs its pause or
limits hold back), and in words what holds each queue, for the console's queues page, the
verdict and ``manage.py queues list``. No writes here."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from ..api import registry
from ..domain.states import State
from ..models import Job, Queue, Schedule
from .health import HELD_CATEGORIES, health_q

HELD_LABELS: dict[str, str] = {
    "paused": "paused",
    "concurrency_limited": "at its concurrency limit",
    "rate_limited": "rate-limited",
}
"""What holds a queue's due jobs, by health category, as the console says it."""


def queue_overview(counts: dict[str, dict[str, int]] | None = None) -> list[dict[str, Any]]:
    """One row per known queue (:func:`known_queues`) and per queue with unfinished jobs, by
    name: ``name``, ``paused``, ``paused_by``, ``paused_reason``, ``paused_at``,
    ``max_leased``, ``max_per_second``, ``version`` (0: never configured), ``due`` (waiting and
    due now, held back or not), ``waiting``, ``leased``, ``held_by`` (per category of
    :data:`~scheduler_core.read.health.HELD_CATEGORIES`, the due jobs it holds back), ``held``
    (how many in all) and ``holds`` (what holds the queue, in words; empty: nothing).

    ``counts`` (per queue, as :func:`scheduler_core.read.health.queue_counts` gives them) are
    figures the caller already read, such as the overview's one scan; without them the
    unfinished jobs are counted here."""
    rows: dict[str, dict[str, Any]] = {}
    if counts is None:
        read: list[dict[str, Any]] = [
            dict(c)
            for c in Job.objects.in_states([State.WAITING, State.LEASED])
            .values("queue")
            .annotate(
                waiting=Count("id", filter=Q(state=State.WAITING)),
                due=Count("id", filter=Q(state=State.WAITING) & health_q("due_now")),
                leased=Count("id", filter=Q(state=State.LEASED)),
                **{h: Count("id", filter=health_q(h)) for h in HELD_CATEGORIES},
            )
        ]
        counts = {c["queue"]: {k: int(c[k]) for k in (*_COUNTED, *HELD_CATEGORIES)} for c in read}
    for name in known_queues():
        rows[name] = _row(name, None)
    for name, c in counts.items():
        rows[name] = _row(name, None) | {k: c.get(k, 0) for k in _COUNTED}
        rows[name]["held_by"] = {h: c.get(h, 0) for h in HELD_CATEGORIES}
    for q in Queue.objects.all():
        rows[q.name] = rows.get(q.name, _row(q.name, None)) | _row(q.name, q, counts=False)
    out = [rows[name] for name in sorted(rows)]
    for row in out:
        row["held"] = sum(row["held_by"].values())
        row["holds"] = holds(row)
    return out


_COUNTED = ("waiting", "due", "leased")


def known_queues() -> list[str]:
    """Every queue Tenure knows of: a registered job type routes to it, an operator configured
    it (a ``Queue`` row), a schedule's job type routes to it, or it holds jobs."""
    names = {jt.queue for jt in registry.all_types().values()}
    names.update(Queue.objects.values_list("name", flat=True))
    for job_name in Schedule.objects.values_list("job_name", flat=True).distinct():
        jt = registry.get(job_name)
        if jt is not None:
            names.add(jt.queue)
    return sorted(names)


def is_known_queue(name: str) -> bool:
    """Whether ``name`` is a known queue (:func:`known_queues`) or holds any job."""
    return name in known_queues() or Job.objects.filter(queue=name).exists()


def holds(row: dict[str, Any]) -> str:
    """What holds a :func:`queue_overview` row's jobs back, in words (empty: nothing):
    its pause (by whom and why) or its limits, with how many due jobs wait for it."""
    parts: list[str] = []
    if row["paused"]:
        parts.append(f"paused by {row['paused_by'] or 'an operator'}: {row['paused_reason']}")
    else:
        if row["max_leased"] is not None:
            parts.append(f"at most {row['max_leased']} leased at once ({row['leased']} now)")
        if row["max_per_second"] is not None:
            parts.append(f"at most {row['max_per_second']:g} claims per second")
    if not parts:
        return ""
    text = "; ".join(parts)
    held = sum(row["held_by"].values())
    if held:
        text += f" · {held} due job{'s' if held != 1 else ''} held back"
    return text


def hold_note(name: str) -> str:
    """What an action that makes a job of queue ``name`` due must say about the queue: its
    pause (by whom, when, why) or its limits; empty when nothing holds the queue."""
    q = Queue.objects.filter(pk=name).first()
    if q is None:
        return ""
    if q.paused:
        when = f" at {q.paused_at:%Y-%m-%d %H:%M:%S} UTC" if q.paused_at else ""
        return (
            f"Queue {name} is paused (by {q.paused_by or 'an operator'}{when}: "
            f"{q.paused_reason}): the job waits, claimed by no executor, until the queue is "
            "resumed."
        )
    limits = []
    if q.max_leased is not None:
        limits.append(f"at most {q.max_leased} leased at once")
    if q.max_per_second is not None:
        limits.append(f"at most {q.max_per_second:g} claims per second")
    if not limits:
        return ""
    return (
        f"Queue {name} is limited ({'; '.join(limits)}): the job is claimed within those "
        "limits, after the due jobs ahead of it."
    )


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
        row.update({k: 0 for k in _COUNTED})
        row["held_by"] = {h: 0 for h in HELD_CATEGORIES}
    return row
