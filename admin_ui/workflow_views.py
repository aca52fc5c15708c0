"""The workflow pages: the newest workflows, and one workflow drawn as a graph of its steps
(server-rendered SVG, coloured by state, each step linking to its job's page) with its steps'
table and the operator's actions on the whole (cancel, retry its failed steps), posted with a
reason, a confirmation and the step versions the page showed. Every change goes through
:mod:`scheduler_core.services.workflows`; nothing here writes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import Workflow
from scheduler_core.read import workflows as workflow_reads
from scheduler_core.services import workflows

from .forms import ReasonField
from .permissions import OPERATE_PERM
from .security import dashboard_view
from .workflow_graph import layout, shown_state

LIST_SHOWN = 50
STATEMENTS = {
    "cancel": "Every waiting step of this workflow ends cancelled, and every running step is "
    "asked to stop (it learns it at its next heartbeat; an effect it already applied stays "
    "applied). A step whose effect outcome is unknown is left for you to settle with the "
    "fact you verified.",
    "retry": "Every failed step waits again, and the steps its failure called off wait with "
    "it; each then runs as a retried job does. An indeterminate step is not retried here: it "
    "needs the fact you verified, on its own job page.",
}


class WorkflowActionForm(forms.Form):
    """What a workflow action carries: the step versions the page showed, a reason, a tick."""

    seen = forms.CharField(max_length=200_000, widget=forms.HiddenInput)
    reason = ReasonField(strip=True)
    confirm = forms.BooleanField(required=True)


@dashboard_view()
def workflow_list(request: HttpRequest) -> HttpResponse:
    """The newest workflows with their steps' states."""
    rows = []
    for wf, steps in workflow_reads.recent(LIST_SHOWN):
        rows.append(
            {
                "wf": wf,
                "counts": sorted(Counter(shown_state(s) for s in steps).items()),
                "n": len(steps),
            }
        )
    return render(request, "admin_ui/workflow_list.html", {"rows": rows, "nav": "workflows"})


def _detail_context(request: HttpRequest, wf: Workflow) -> dict[str, Any]:
    steps = workflow_reads.steps(wf.pk)
    can_operate = bool(request.user.has_perm(OPERATE_PERM))
    return {
        "wf": wf,
        "steps": [(s, shown_state(s)) for s in steps],
        "graph": layout(steps),
        "held": sum(1 for s in steps if s.held),
        "actions": list(STATEMENTS.items()) if can_operate else [],
        "seen": workflows.seen_versions(wf.pk),
        "audit": workflow_reads.audit(wf.pk),
        "nav": "workflows",
    }


@dashboard_view()
def workflow_detail(request: HttpRequest, workflow_id: int) -> HttpResponse:
    """One workflow: its graph, its steps, its audit, the actions on it."""
    wf = get_object_or_404(Workflow, pk=workflow_id)
    return render(request, "admin_ui/workflow_detail.html", _detail_context(request, wf))


@dashboard_view(methods=("POST",), operate=True)
def workflow_action(request: HttpRequest, workflow_id: int, action: str) -> HttpResponse:
    """Cancel or retry a workflow through the service: 409 when a step changed since the page
    was read, 400 with the service's reason when it refuses."""
    if action not in STATEMENTS:
        raise Http404("no such action")
    wf = get_object_or_404(Workflow, pk=workflow_id)
    form = WorkflowActionForm(request.POST)
    if not form.is_valid():
        why = " ".join(str(e) for errors in form.errors.values() for e in errors)
        return _refused(request, wf, action, why)
    d = form.cleaned_data
    try:
        result = workflows.workflow_action(
            wf.pk,
            action=action,
            actor=request.user.get_username(),
            reason=d["reason"],
            seen=d["seen"],
        )
    except ActionConflict as e:
        return _problem(request, wf, 409, "The workflow changed", str(e))
    except ActionRefused as e:
        return _refused(request, wf, action, str(e))
    messages.success(request, f"Workflow {wf.pk}: {action} moved {len(result.moved)} step(s).")
    response = HttpResponseRedirect(reverse("admin_ui:workflow_detail", args=[wf.pk]))
    response.status_code = 303
    return response


def _refused(request: HttpRequest, wf: Workflow, action: str, why: str) -> HttpResponse:
    """The workflow's page again, 400, with why the action was refused beside its form and
    what the operator typed kept in it (nothing changed)."""
    context = _detail_context(request, wf)
    context.update(
        refused_action=action, refused_why=why, typed_reason=request.POST.get("reason", "")
    )
    return render(request, "admin_ui/workflow_detail.html", context, status=400)


def _problem(
    request: HttpRequest, wf: Workflow, status: int, title: str, message: str
) -> HttpResponse:
    return render(
        request,
        "admin_ui/problem.html",
        {
            "title": title,
            "message": message,
            "back": reverse("admin_ui:workflow_detail", args=[wf.pk]),
        },
        status=status,
    )
