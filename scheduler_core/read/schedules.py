"""The read side of schedules: every schedule, each one's newest occurrence jobs and the audit
rows about it, for the console's schedules pages. No writes here."""

from __future__ import annotations

from ..models import AuditEntry, Job, Schedule


def schedules() -> list[Schedule]:
    """Every schedule, code-declared and database, by name."""
    return list(Schedule.objects.order_by("name"))


def last_jobs(ids: list[int]) -> dict[int, Job]:
    """Each schedule's newest occurrence job (one indexed lookup per schedule)."""
    out: dict[int, Job] = {}
    for pk in ids:
        j = Job.objects.filter(schedule_id=pk).order_by("-id").first()
        if j is not None:
            out[pk] = j
    return out


def occurrence_jobs(schedule_id: int, *, limit: int) -> list[Job]:
    """The schedule's newest ``limit`` occurrence jobs, newest first."""
    return list(
        Job.objects.filter(schedule_id=schedule_id).select_related("spec").order_by("-id")[:limit]
    )


def audit(schedule_id: int, *, limit: int) -> list[AuditEntry]:
    """The newest ``limit`` audit rows about the schedule, newest first."""
    return list(
        AuditEntry.objects.filter(detail__schedule_id=schedule_id).order_by("-created_at", "-id")[
            :limit
        ]
    )
