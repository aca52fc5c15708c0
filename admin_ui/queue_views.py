"""The console's queues page and its actions: pause, resume and set limits.

Reads come from :mod:`scheduler_core.read.queues`; every change goes through
:mod:`scheduler_core.services.queues` (a reason, the version the operator saw, an audit row in
the same transaction), after a confirmation page that restates what is at stake. The
``operate`` permission is checked in each acting view, not only by hiding its button; a stale
page gets 409 and changes nothing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from scheduler_core.domain.reasons import REASON_MAX_CHARS
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.read.queues import queue_overview
from scheduler_core.services import queues

from .forms import ReasonField
from .htmx import is_history_restore, is_htmx
from .permissions import OPERATE_PERM
from .security import dashboard_view

ACTIONS: dict[str, str] = {"pause": "Pause queue", "resume": "Resume queue", "limit": "Set limits"}
"""The queue actions by URL key, with their button's label."""


class QueueActionForm(forms.Form):
    """What every queue action carries: the version the operator saw, a reason, a confirmation."""

    version = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    reason = ReasonField(widget=forms.Textarea(attrs={"rows": 3, "required": True}))
    confirm = forms.BooleanField(required=True)


class QueueLimitForm(QueueActionForm):
    """Setting limits: each one blank to clear it."""

    max_leased = forms.IntegerField(
        required=False, label="At most this many leased at once (blank: no limit)"
    )
    max_per_second = forms.FloatField(
        required=False, label="At most this many claims per second (blank: no limit)"
    )


def _row(name: str) -> dict[str, Any]:
    """The queues page's row of ``name`` (a queue nobody configured and with no jobs: its
    defaults)."""
    for row in queue_overview():
        if row["name"] == name:
            return row
    s = queues.queue_settings(name)
    return {
        "name": name,
        "paused": s.paused,
        "paused_by": s.paused_by,
        "paused_reason": s.paused_reason,
        "paused_at": s.paused_at,
        "max_leased": s.max_leased,
        "max_per_second": s.max_per_second,
        "version": s.version,
        "updated_at": s.updated_at,
        "waiting": 0,
        "due": 0,
        "leased": 0,
    }


def _action(key: str) -> str:
    if key not in ACTIONS:
        raise Http404("no such queue action")
    return key


def _queue_name(name: str) -> str:
    if not queues.QUEUE_NAME.match(name):
        raise Http404("no such queue")
    return name


def statement(action: str, row: dict[str, Any]) -> str:
    """What the operator confirms: what the action changes and what it leaves running."""
    name, due, leased = row["name"], row["due"], row["leased"]
    if action == "pause":
        return (
            f"I want no executor or transport to claim jobs of queue {name} until it is "
            f"resumed: its {due} due job(s) will wait; the {leased} leased now finish normally."
        )
    if action == "resume":
        limits = " within its limits" if _limited(row) else ""
        return f"I want executors to claim the {due} due job(s) of queue {name} again{limits}."
    return (
        f"I want every executor together to respect these limits for queue {name} from the "
        f"next claim on ({leased} of its jobs are leased now; none is stopped by a new limit)."
    )


def _limited(row: dict[str, Any]) -> bool:
    return row["max_leased"] is not None or row["max_per_second"] is not None


def _form_class(action: str) -> type[QueueActionForm]:
    return QueueLimitForm if action == "limit" else QueueActionForm


def _confirm(
    request: HttpRequest, action: str, row: dict[str, Any], form: Any, status: int
) -> HttpResponse:
    context = {
        "nav": "queues",
        "action": action,
        "label": ACTIONS[action],
        "row": row,
        "form": form,
        "statement": statement(action, row),
    }
    template = "admin_ui/queues_confirm.html"
    if is_htmx(request) and not is_history_restore(request):
        template += "#dialog"
    return render(request, template, context, status=status)


def _problem(
    request: HttpRequest, *, status: int, title: str, message: str, back: str = ""
) -> HttpResponse:
    return render(
        request,
        "admin_ui/problem.html",
        {"title": title, "message": message, "back": back or reverse("admin_ui:queues")},
        status=status,
    )


@dashboard_view()
def queue_list(request: HttpRequest) -> HttpResponse:
    """Every queue: paused (by whom, when, why) or not, its limits, its jobs now; the
    operator's buttons."""
    context = {
        "nav": "queues",
        "rows": queue_overview(),
        "can_operate": request.user.has_perm(OPERATE_PERM),
    }
    template = "admin_ui/queues.html"
    if is_htmx(request) and not is_history_restore(request):
        template += "#table"
    return render(request, template, context)


@dashboard_view(operate=True)
def queue_confirm(request: HttpRequest, queue: str, key: str) -> HttpResponse:
    """The confirmation step of a queue action: what it changes, a reason. Never writes."""
    action, name = _action(key), _queue_name(queue)
    row = _row(name)
    # A refused stale action sends the operator back here with the reason they typed.
    reason = request.GET.get("reason", "")[:REASON_MAX_CHARS]
    initial: dict[str, Any] = {"version": row["version"], "reason": reason}
    if action == "limit":
        initial.update(max_leased=row["max_leased"], max_per_second=row["max_per_second"])
    return _confirm(request, action, row, _form_class(action)(initial=initial), 200)


@dashboard_view(methods=("POST",), operate=True)
def queue_action(request: HttpRequest, queue: str, key: str) -> HttpResponse:
    """Apply a queue action through the service; 409 when the page was stale, the problem
    page with the service's reason when it refuses."""
    action, name = _action(key), _queue_name(queue)
    form = _form_class(action)(request.POST)
    if not form.is_valid():
        return _confirm(request, action, _row(name), form, 400)
    d = form.cleaned_data
    who = request.user.get_username()
    try:
        if action == "pause":
            result = queues.pause(
                name, actor=who, reason=d["reason"], expected_version=d["version"]
            )
        elif action == "resume":
            result = queues.resume(
                name, actor=who, reason=d["reason"], expected_version=d["version"]
            )
        else:
            result = queues.set_limits(
                name,
                max_leased=d["max_leased"],
                max_per_second=d["max_per_second"],
                actor=who,
                reason=d["reason"],
                expected_version=d["version"],
            )
    except ActionConflict as e:
        again = reverse("admin_ui:queue_confirm", args=[name, action])
        return _problem(
            request,
            status=409,
            title="The queue changed",
            message=f"{e}. Your reason is kept on the next page.",
            back=f"{again}?{urlencode({'reason': d['reason']})}",
        )
    except ActionRefused as e:
        # The form comes back as the operator filled it, their reason kept, with why.
        form.add_error(None, f"Refused: {e}.")
        return _confirm(request, action, _row(name), form, 400)
    q = result.queue
    messages.success(
        request,
        f"{ACTIONS[action]}: queue {q.name} is {'paused' if q.paused else 'running'} "
        f"(version {q.version}).",
    )
    response = HttpResponseRedirect(reverse("admin_ui:queues"))
    response.status_code = 303
    return response
