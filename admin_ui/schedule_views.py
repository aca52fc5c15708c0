"""The schedules pages: every schedule (code-declared and database) with its timing, policies,
last and next occurrence and their jobs; and the operator's actions on one (pause, resume,
"run now"), each through a confirmation page with a reason, like the job actions.

Every change goes through :mod:`scheduler_core.services.scheduling` (:func:`set_paused`,
:func:`run_now`), which checks the row's version and writes the audit row in the same
transaction. Nothing here writes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from scheduler_core.api import registry
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import AuditEntry, Job, Schedule
from scheduler_core.read import queues as queue_reads
from scheduler_core.read import schedules as schedule_reads
from scheduler_core.read.jobs import now as db_now
from scheduler_core.services import scheduling

from .forms import ReasonField
from .htmx import is_htmx
from .permissions import OPERATE_PERM
from .security import dashboard_view

JOBS_SHOWN = 50
"""The newest occurrence jobs a schedule's page lists."""
UPCOMING_SHOWN = 5
"""How many next fire times a schedule's page lists."""
AUDIT_SHOWN = 50

SCHEDULE_ACTIONS = ("pause", "resume", "run-now")


@dataclass(frozen=True, kw_only=True)
class ScheduleAction:
    """One button on a schedule: when it is offered and what it puts at stake."""

    key: str
    label: str
    danger: bool = False

    def offered_for(self, row: Schedule) -> bool:
        """Pause an active schedule, resume a paused one; run any schedule now."""
        if self.key == "pause":
            return not row.paused
        if self.key == "resume":
            return row.paused
        return True

    def statement(self, row: Schedule, busy: list[Job]) -> str:
        """The confirmation the operator ticks."""
        if self.key == "pause":
            return (
                f"Schedule {row.name} fires nothing until it is resumed. Occurrences already "
                "enqueued still run. On resume, the occurrences missed meanwhile follow its "
                f"misfire policy ({misfire_text(row)})."
            )
        if self.key == "resume":
            return (
                f"Schedule {row.name} fires again. Occurrences missed while it was paused follow "
                f"its misfire policy ({misfire_text(row)}): they may fire at once."
            )
        text = (
            f"One extra occurrence of {row.name} is enqueued now, due at once, with its own "
            "unique key: it takes the place of no timed occurrence and changes no timing. Its "
            "job's effect mode decides what a repeated effect means."
        )
        if row.paused:
            text += " The schedule stays paused."
        jt = registry.get(row.job_name)
        note = queue_reads.hold_note(jt.queue) if jt is not None else ""
        if note:
            text += f" {note}"
        if busy and row.overlap != "skip":
            text += (
                f" {len(busy)} earlier occurrence(s) have not finished; with overlap=allow both "
                "may run at the same time."
            )
        return text


BY_KEY: dict[str, ScheduleAction] = {
    "pause": ScheduleAction(key="pause", label="Pause schedule", danger=True),
    "resume": ScheduleAction(key="resume", label="Resume schedule"),
    "run-now": ScheduleAction(key="run-now", label="Run now"),
}


class ScheduleActionForm(forms.Form):
    """What every schedule action carries: the version and paused state seen, a reason, a
    confirmation."""

    version = forms.IntegerField(min_value=0, max_value=2**31 - 1, widget=forms.HiddenInput)
    seen_paused = forms.CharField(required=False, max_length=5, widget=forms.HiddenInput)
    reason = ReasonField()
    confirm = forms.BooleanField(
        required=True,
        error_messages={"required": "Tick the box to confirm what this action does."},
    )

    def clean_reason(self) -> str:
        reason = str(self.cleaned_data["reason"]).strip()
        if not reason:
            raise forms.ValidationError("Say why.")
        return reason


def misfire_text(row: Schedule) -> str:
    """The misfire policy in words."""
    if row.misfire == "catch_up":
        return f"catch_up: the latest {row.catch_up_max} late occurrence(s) fire"
    if row.misfire == "skip":
        return "skip: late occurrences do not fire"
    return "run_once: one job stands for all late occurrences"


def spec_text(row: Schedule) -> tuple[str, str]:
    """The schedule's timing in words, and the error when the row does not validate."""
    try:
        spec = scheduling.spec_of(row)
    except ValueError as e:
        return (row.cron or f"every {row.interval_seconds}s", str(e))
    if spec.cron:
        return (f"cron {spec.cron}", "")
    return (f"every {spec.interval_seconds} s", "")


def upcoming(row: Schedule, n: int = UPCOMING_SHOWN) -> list[dt.datetime]:
    """The next ``n`` fire times from the row's ``next_fire_at`` (none while it is unset or
    the row does not validate)."""
    if row.next_fire_at is None:
        return []
    try:
        spec = scheduling.spec_of(row)
    except ValueError:
        return []
    out = [row.next_fire_at]
    while len(out) < n:
        out.append(spec.next_after(out[-1]))
    return out


def _row_context(row: Schedule, last_jobs: dict[int, Job]) -> dict[str, Any]:
    spec, problem = spec_text(row)
    return {
        "row": row,
        "spec": spec,
        "problem": problem,
        "misfire": misfire_text(row),
        "last_job": last_jobs.get(row.pk),
    }


def _see_other(url: str) -> HttpResponse:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


def _action(key: str) -> ScheduleAction:
    spec = BY_KEY.get(key)
    if spec is None:
        raise Http404("no such schedule action")
    return spec


@dashboard_view()
def schedule_list(request: HttpRequest) -> HttpResponse:
    """Every schedule, code-declared and database, by name."""
    rows = schedule_reads.schedules()
    last = schedule_reads.last_jobs([r.pk for r in rows])
    context = {
        "rows": [_row_context(r, last) for r in rows],
        "now": db_now(),
        "nav": "schedules",
    }
    return render(request, "admin_ui/schedule_list.html", context)


def changed_facts(row: Schedule, *, seen_version: int, seen_paused: str) -> dict[str, Any]:
    """What changed on a schedule since the operator read it: version and paused state then
    and now, and the newest audit row about it (who, what, when, why)."""
    newest = schedule_reads.audit(row.pk, limit=1)
    last: AuditEntry | None = newest[0] if newest else None
    return {
        "version_before": seen_version,
        "version_now": row.version,
        "state_before": {"true": "paused", "false": "active"}.get(seen_paused, ""),
        "state_now": "paused" if row.paused else "active",
        "audit": last,
        "by_scheduler": last is None or (row.last_fire_at or row.updated_at) > last.created_at,
    }


@dashboard_view()
def schedule_detail(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """One schedule: timing, policies, next fire times, its occurrence jobs, its audit."""
    row = get_object_or_404(Schedule, pk=schedule_id)
    jobs = schedule_reads.occurrence_jobs(row.pk, limit=JOBS_SHOWN)
    audit = schedule_reads.audit(row.pk, limit=AUDIT_SHOWN)
    can_operate = bool(request.user.has_perm(OPERATE_PERM))
    context = {
        **_row_context(row, {row.pk: jobs[0]} if jobs else {}),
        "upcoming": upcoming(row),
        "jobs": jobs,
        "busy": scheduling.busy_occurrences(row.pk),
        "audit": audit,
        "actions": [a for a in BY_KEY.values() if a.offered_for(row)] if can_operate else [],
        "nav": "schedules",
    }
    return render(request, "admin_ui/schedule_detail.html", context)


def _confirm(
    request: HttpRequest,
    row: Schedule,
    action: ScheduleAction,
    form: ScheduleActionForm,
    *,
    status: int = 200,
    changed: dict[str, Any] | None = None,
    refused: str = "",
) -> HttpResponse:
    busy = scheduling.busy_occurrences(row.pk)
    context = {
        "row": row,
        "action": action,
        "form": form,
        "statement": action.statement(row, busy),
        "busy": busy,
        "blocked": action.key == "run-now" and row.overlap == "skip" and bool(busy),
        "misfire": misfire_text(row),
        "changed": changed,
        "refused": refused,
        "nav": "schedules",
    }
    template = "admin_ui/schedule_confirm.html"
    if is_htmx(request) and status == 200:
        template += "#dialog"
    return render(request, template, context, status=status)


def _fresh_form(row: Schedule, reason: str = "") -> ScheduleActionForm:
    return ScheduleActionForm(
        initial={
            "version": row.version,
            "seen_paused": "true" if row.paused else "false",
            "reason": reason,
        }
    )


@dashboard_view(operate=True)
def schedule_confirm(request: HttpRequest, schedule_id: int, key: str) -> HttpResponse:
    """The confirmation step: what the action does, the occurrences not yet finished, a
    reason. Never writes."""
    action = _action(key)
    row = get_object_or_404(Schedule, pk=schedule_id)
    return _confirm(request, row, action, _fresh_form(row))


@dashboard_view(methods=("POST",), operate=True)
def schedule_action(request: HttpRequest, schedule_id: int, key: str) -> HttpResponse:
    """Apply one action through the scheduling service; a stale page is a 409 that says what
    changed and re-offers the form with the reason kept; a refusal says why."""
    action = _action(key)
    row = get_object_or_404(Schedule, pk=schedule_id)
    back = reverse("admin_ui:schedule_detail", args=[row.pk])
    form = ScheduleActionForm(request.POST)
    if not form.is_valid():
        return _confirm(request, row, action, form, status=400)
    version = form.cleaned_data["version"]
    reason = form.cleaned_data["reason"]
    actor = request.user.get_username()
    try:
        if row.version == version and not action.offered_for(row):
            raise ActionRefused(f"{action.label.lower()} does not apply now")
        if action.key == "run-now":
            row, job = scheduling.run_now(
                row.pk, expected_version=version, actor=actor, reason=reason
            )
            done = f"Run now: schedule {row.name} enqueued job {job.pk}."
        else:
            row = scheduling.set_paused(
                row.pk,
                paused=action.key == "pause",
                expected_version=version,
                actor=actor,
                reason=reason,
            )
            done = f"{action.label}: {row.name} is {'paused' if row.paused else 'active'}."
    except ActionConflict:
        row.refresh_from_db()
        changed = changed_facts(
            row, seen_version=version, seen_paused=form.cleaned_data["seen_paused"]
        )
        return _confirm(request, row, action, _fresh_form(row, reason), status=409, changed=changed)
    except ActionRefused as e:
        row.refresh_from_db()
        return _confirm(request, row, action, _fresh_form(row, reason), status=400, refused=str(e))
    messages.success(request, done)
    return _see_other(back)
