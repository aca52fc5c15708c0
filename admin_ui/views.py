"""Dashboard views: one per page, plus POST-only endpoints for actions.

Reads go through :mod:`scheduler_core.read.jobs`; every change goes through
:func:`scheduler_core.services.operator.operator_action` (or its bulk form), which checks state and version
and writes the audit row in the same transaction. An htmx request renders a named partial of
the same template.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from scheduler_core.conf import tenure_settings
from scheduler_core.domain import payload_search
from scheduler_core.domain.states import what_happened
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import Job
from scheduler_core.read import jobs as queries
from scheduler_core.read import queues as queue_reads
from scheduler_core.services import operator

from . import actions, history
from .forms import ActionForm, BulkActionForm, JobFilterForm
from .htmx import is_history_restore, is_htmx
from .permissions import OPERATE_PERM
from .security import dashboard_view


def _can_operate(request: HttpRequest) -> bool:
    return bool(request.user.has_perm(OPERATE_PERM))


def _template(request: HttpRequest, name: str, partial: str) -> str:
    """The whole page, or only its named partial for an htmx request.

    A history-restore request wants the whole page back, so it gets it.
    """
    if is_htmx(request) and not is_history_restore(request):
        return f"{name}#{partial}"
    return name


def _see_other(url: str) -> HttpResponse:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


def _problem(
    request: HttpRequest, *, status: int, title: str, message: str, back: str
) -> HttpResponse:
    """An action that changed nothing: why, and where to look again."""
    return render(
        request,
        "admin_ui/problem.html",
        {"title": title, "message": message, "back": back},
        status=status,
    )


CATEGORIES: list[tuple[str, str, str, str]] = [
    (
        "waiting_due",
        "neutral",
        "Waiting, due",
        "Due now, held back by nothing: waiting for an executor.",
    ),
    ("waiting_scheduled", "neutral", "Scheduled", "Waiting for a future run time."),
    ("waiting_backing_off", "warn", "Backing off", "Failed before; next attempt is later."),
    ("running", "info", "Running", "Leased, lease valid, heartbeats fresh."),
    (
        "overrunning",
        "alert",
        "Overrunning",
        "Past its maximum runtime: may not complete or start an effect; the reaper ends it.",
    ),
    ("abandoned", "warn", "Abandoned", "Leased, but lease expired or heartbeats stopped."),
    (
        "failing_repeatedly",
        "warn",
        "Failing repeatedly",
        "Unfinished after several failed attempts.",
    ),
    ("stuck", "warn", "Stuck", "Due, but unclaimed for too long."),
    ("paused", "neutral", "Paused", "Due, in a queue an operator paused: claimed after resume."),
    (
        "concurrency_limited",
        "neutral",
        "At concurrency limit",
        "Due, in a queue with as many jobs leased as its limit allows: claimed as they finish.",
    ),
    (
        "rate_limited",
        "neutral",
        "Rate-limited",
        "Due, in a queue whose claims per second are limited: claimed in turn.",
    ),
    ("indeterminate", "alert", "Indeterminate", "Effect may or may not have happened: needs you."),
    ("failed", "bad", "Failed", "Permanent error or attempts exhausted."),
    ("succeeded_recently", "good", "Succeeded recently", "Finished successfully in the last hour."),
]
"""Health categories in display order: key, tone, label, what it means."""


@dashboard_view()
def overview(request: HttpRequest) -> HttpResponse:
    """Counts per health category, state, queue and job type; live executors and leases."""
    o = queries.overview()
    cards = [
        {"key": k, "tone": tone, "label": label, "help": help_, "count": o["health"][k]}
        for k, tone, label, help_ in CATEGORIES
    ]
    context = {
        "o": o,
        "cards": cards,
        "states": list(o["states"].items()),
        "nav": "overview",
        "counts_refresh": int(tenure_settings().COUNTS_REFRESH_SECONDS),
    }
    template = _template(request, "admin_ui/overview.html", "live")
    if "#" not in template:
        # The charts poll on their own (admin_ui:history); the 4 s poll leaves them out.
        context.update(history.charts(request.GET))
    return render(request, template, context)


@dashboard_view()
def job_list(request: HttpRequest) -> HttpResponse:
    """Jobs filtered by state, health, queue, type or text; newest first, keyset pages."""
    form = JobFilterForm(request.GET)
    if not form.is_valid():
        context = {
            "form": form,
            "invalid": True,
            "nav": "jobs",
            "known_queues": queries.known_queues(),
            "known_types": queries.known_job_types(),
        }
        # htmx swaps only a 2xx answer in place: the search box's own request gets the
        # message as a 200, so the operator sees why nothing is listed.
        status = 200 if is_htmx(request) and not is_history_restore(request) else 400
        return render(
            request, _template(request, "admin_ui/job_list.html", "results"), context, status=status
        )
    f = form.job_filter()
    limit = form.cleaned_data["limit"]
    pg = queries.page(f.queryset(), before=form.cleaned_data["before"], limit=limit)
    base = reverse("admin_ui:job_list")
    next_url = (
        f"{base}?{urlencode({**f.params(), 'before': pg.next_before, 'limit': pg.limit})}"
        if pg.next_before
        else ""
    )
    first_url = f"{base}?{urlencode({**f.params(), 'limit': pg.limit})}"
    before = form.cleaned_data["before"]
    # The list refreshes in place (the page's own query); a dialog open pauses it
    # (dashboard.js), so what the operator confirms does not move under them.
    polled: dict[str, Any] = {**f.params(), "limit": pg.limit}
    if before:
        polled["before"] = before
    poll_url = f"{base}?{urlencode(polled)}"
    bulk: list[dict[str, Any]] = []
    if _can_operate(request) and f.active:
        for action in ("retry", "cancel"):
            n = queries.bulk_targets(f, action).count()
            if n:
                url = reverse("admin_ui:bulk_confirm", args=[action])
                bulk.append(
                    {
                        "label": actions.BULK_LABELS[action],
                        "count": n,
                        "url": f"{url}?{urlencode(f.params())}",
                    }
                )
    payload_query = ""
    if f.q and payload_search.looks_like_payload_query(f.q):
        payload_query = payload_search.parse(f.q).describe()
    context = {
        "form": form,
        "filter": f,
        "page": pg,
        "payload_query": payload_query,
        "unknown": [] if pg.jobs else queries.unknown_filter_values(f),
        "known_queues": queries.known_queues(),
        "known_types": queries.known_job_types(),
        "next_url": next_url,
        "poll_url": poll_url,
        "first_url": first_url if form.cleaned_data["before"] else "",
        "bulk": bulk,
        "nav": "jobs",
    }
    return render(request, _template(request, "admin_ui/job_list.html", "results"), context)


@dashboard_view()
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job: payload, guarantee, attempts, effect ledger, audit trail, offered actions."""
    job = get_object_or_404(Job.objects.select_related("spec"), pk=job_id)
    context = queries.job_record(job)
    context["actions"] = actions.offered(job) if _can_operate(request) else []
    context["cancel_request"] = actions.cancel_request(job)
    # A waiting job's page says what holds its queue (a pause, limits), if anything.
    context["queue_note"] = queue_reads.hold_note(job.queue) if job.state == "waiting" else ""
    context["nav"] = "jobs"
    return render(request, "admin_ui/job_detail.html", context)


def _spec(key: str) -> actions.ActionSpec:
    spec = actions.BY_KEY.get(key)
    if spec is None:
        raise Http404("no such action")
    return spec


def _confirm_context(job: Job, spec: actions.ActionSpec, form: ActionForm) -> dict[str, Any]:
    """What the confirmation shows: the statement, the effects a fact would be about (each
    with its box), and the earlier owners that may still be in flight."""
    effects = queries.effects_of(job)
    unsettled = queries.unsettled_effects(job.pk)
    if isinstance(form.data, QueryDict):
        checked = set(form.data.getlist("effects"))
    else:
        checked = set(form.initial.get("effects", []))
    owners = queries.in_flight_owners(job.pk)
    fences = [o.fence for o in owners]
    seen = form.seen_fences() if form.is_bound else fences
    owners_changed = form.is_bound and sorted(seen) != sorted(fences)
    if owners_changed and isinstance(form.data, QueryDict):
        # The operator accepted other owners than those shown now: they accept these anew.
        data = form.data.copy()
        data.pop("accept_in_flight", None)
        data["seen_owners"] = ",".join(str(f) for f in fences)
        form.data = data
    elif not form.is_bound:
        form.initial["seen_owners"] = ",".join(str(f) for f in fences)
    return {
        "job": job,
        "spec": spec,
        "form": form,
        "statement": actions.statement(spec, job, effects),
        "guarantee": queries.guarantee_of(job),
        "effects": effects,
        "unsettled": unsettled,
        "checked": checked,
        "fact_outcome": actions.FACT_OUTCOMES.get(spec.verified, ""),
        "owners": owners,
        "owners_changed": owners_changed,
        # Only a not-applied fact is refused while an owner may be in flight (the store's
        # rule); every other action still shows who that owner is and what it may do.
        "needs_acceptance": bool(owners) and spec.verified == "not_applied",
        # An action that makes the job due again says what holds its queue, if anything.
        "queue_note": queue_reads.hold_note(job.queue) if spec.action == "retry" else "",
    }


def _not_available(request: HttpRequest, spec: actions.ActionSpec, job: Job) -> HttpResponse:
    return _problem(
        request,
        status=400,
        title="Not available",
        message=actions.not_available(spec, job),
        back=reverse("admin_ui:job_detail", args=[job.pk]),
    )


@dashboard_view(operate=True)
def action_confirm(request: HttpRequest, job_id: int, key: str) -> HttpResponse:
    """The confirmation step: restates the guarantee at stake, lists the effects a fact is
    about and any earlier owner still in flight, asks for a reason. Never writes."""
    spec = _spec(key)
    job = get_object_or_404(Job.objects.select_related("spec"), pk=job_id)
    if not spec.offered_for(job):
        return _not_available(request, spec, job)
    initial: dict[str, Any] = {"version": job.version, "seen_state": job.state}
    # No effect is ever ticked for the operator: the verified fact is theirs to assert, even
    # when only one effect is in question.
    form = ActionForm(initial=initial)
    context = _confirm_context(job, spec, form)
    return render(request, _template(request, "admin_ui/confirm.html", "dialog"), context)


@dashboard_view(methods=("POST",), operate=True)
def job_action(request: HttpRequest, job_id: int, key: str) -> HttpResponse:
    """Apply one action to one job through the store; 409 when the page was stale, the
    problem page with the store's reason when it refuses."""
    spec = _spec(key)
    job = get_object_or_404(Job.objects.select_related("spec"), pk=job_id)
    back = reverse("admin_ui:job_detail", args=[job.pk])
    form = ActionForm(request.POST)
    if not form.is_valid():
        return render(
            request, "admin_ui/confirm.html", _confirm_context(job, spec, form), status=400
        )
    version = form.cleaned_data["version"]
    effects: list[str] = form.cleaned_data["effects"]
    # Judged against the state the operator saw; a different version is the store's 409.
    if job.version == version:
        if not spec.offered_for(job):
            return _not_available(request, spec, job)
        # The store would take "none named" as the only effect in question; from this form
        # it means the operator ticked none, so nothing was verified.
        if spec.settles_effects and not effects and queries.unsettled_effects(job.pk):
            form.add_error("effects", "Tick each effect you verified.")
            return render(
                request, "admin_ui/confirm.html", _confirm_context(job, spec, form), status=400
            )
    try:
        result = operator.operator_action(
            job.pk,
            action=spec.action,
            expected_version=version,
            actor=request.user.get_username(),
            reason=form.cleaned_data["reason"],
            verified=spec.verified,
            effects=effects,
            accept_in_flight=form.cleaned_data["accept_in_flight"],
            seen_owners=form.seen_fences(),
        )
    except ActionConflict as e:
        return _job_conflict(request, job, spec, form, str(e), back)
    except ActionRefused as e:
        # The confirmation comes back as the operator filled it, their reason kept, with why.
        form.add_error(None, f"Refused: {e}.")
        return render(
            request, "admin_ui/confirm.html", _confirm_context(job, spec, form), status=400
        )
    audit = result.audit
    messages.success(
        request,
        f"Job {job.pk}: {what_happened(spec.action, audit.state_before, audit.state_after)}.",
    )
    return _see_other(back)


def _job_conflict(
    request: HttpRequest,
    job: Job,
    spec: actions.ActionSpec,
    form: ActionForm,
    message: str,
    back: str,
) -> HttpResponse:
    """The 409 of a stale page: what changed, by whom and when, and the same action offered
    again against the job as it is now with the operator's reason kept (or, when the job's
    new state no longer allows it, the reason shown so it is not lost)."""
    job.refresh_from_db()
    changed = queries.job_changes(
        job,
        seen_version=form.cleaned_data["version"],
        seen_state=form.cleaned_data.get("seen_state") or "",
    )
    reason = form.cleaned_data["reason"]
    if spec.offered_for(job):
        initial: dict[str, Any] = {
            "version": job.version,
            "seen_state": job.state,
            "reason": reason,
        }
        fresh = ActionForm(initial=initial)
        context = _confirm_context(job, spec, fresh)
        context["changed"] = changed
        context["conflict"] = message
        return render(request, "admin_ui/confirm.html", context, status=409)
    return render(
        request,
        "admin_ui/problem.html",
        {
            "title": "The job changed",
            "message": message,
            "changed": changed,
            "kept_reason": reason,
            "back": back,
        },
        status=409,
    )


def _bulk_action_name(action: str) -> str:
    if action not in actions.BULK_LABELS:
        raise Http404("no such bulk action")
    return action


def _narrow_filter(request: HttpRequest, back: str) -> HttpResponse:
    """The answer to a bulk action whose filter is invalid or empty."""
    return _problem(
        request,
        status=400,
        title="Narrow the filter",
        message="A bulk action needs a valid, non-empty filter.",
        back=back,
    )


@dashboard_view(operate=True)
def bulk_confirm(request: HttpRequest, action: str) -> HttpResponse:
    """The bulk confirmation step: how many jobs match now; the operator types that number."""
    action = _bulk_action_name(action)
    filter_form = JobFilterForm(request.GET)
    back = reverse("admin_ui:job_list")
    if not filter_form.is_valid() or not filter_form.job_filter().active:
        return _narrow_filter(request, back)
    f = filter_form.job_filter()
    targets = queries.bulk_targets(f, action)
    count = targets.count()
    # A bulk retry makes jobs due again: it names every queue of theirs that a pause or a
    # limit holds.
    notes = []
    if action == "retry" and count:
        notes = [n for q in queries.queues_of(targets) if (n := queue_reads.hold_note(q))]
    context = {
        "queue_notes": notes,
        "action": action,
        "label": actions.BULK_LABELS[action],
        "filter": f,
        "count": count,
        "statement": actions.bulk_statement(action, count),
        "form": BulkActionForm(),
        "back": f"{back}?{urlencode(f.params())}",
        "max": operator.BULK_MAX,
    }
    return render(request, _template(request, "admin_ui/bulk_confirm.html", "dialog"), context)


def _bulk_count_conflict(
    request: HttpRequest,
    action: str,
    f: queries.JobFilter,
    form: BulkActionForm,
    *,
    typed: int,
    matched: int,
    back: str,
) -> HttpResponse:
    """The 409 of a bulk count that is not the filter's: a typo ("you typed N, the filter
    now matches M") told apart from jobs that changed since the confirmation showed its
    count; the confirmation offered again with the reason kept."""
    shown = form.cleaned_data.get("shown_count")
    if shown is not None and shown == typed:
        mismatch = (
            f"The jobs changed: the confirmation showed {shown}, you confirmed {typed}, and "
            f"the filter now matches {matched}."
        )
    else:
        mismatch = f"You typed {typed}, the filter now matches {matched}."
    context = {
        "action": action,
        "label": actions.BULK_LABELS[action],
        "filter": f,
        "count": matched,
        "statement": actions.bulk_statement(action, matched),
        "form": BulkActionForm(initial={"reason": form.cleaned_data["reason"]}),
        "back": back,
        "max": operator.BULK_MAX,
        "mismatch": mismatch,
    }
    return render(request, "admin_ui/bulk_confirm.html", context, status=409)


@dashboard_view(methods=("POST",), operate=True)
def bulk_action(request: HttpRequest, action: str) -> HttpResponse:
    """Apply retry or cancel to every job the filter matches, if the count is still the one
    the operator confirmed; all or nothing."""
    action = _bulk_action_name(action)
    filter_form = JobFilterForm(request.POST)
    form = BulkActionForm(request.POST)
    back = reverse("admin_ui:job_list")
    if not filter_form.is_valid() or not filter_form.job_filter().active:
        return _narrow_filter(request, back)
    f = filter_form.job_filter()
    back = f"{back}?{urlencode(f.params())}"
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(str(m) for m in v)}" for k, v in form.errors.items())
        return _problem(request, status=400, title="Incomplete", message=errors, back=back)
    typed = form.cleaned_data["confirmed_count"]
    matched = queries.bulk_targets(f, action).count()
    if typed != matched:
        return _bulk_count_conflict(
            request, action, f, form, typed=typed, matched=matched, back=back
        )
    try:
        result = operator.bulk_operator_action(
            queries.bulk_targets(f, action),
            action=action,
            confirmed_count=form.cleaned_data["confirmed_count"],
            actor=request.user.get_username(),
            reason=form.cleaned_data["reason"],
        )
    except ActionConflict:
        # Changed between the count above and the write.
        matched = queries.bulk_targets(f, action).count()
        return _bulk_count_conflict(
            request, action, f, form, typed=typed, matched=matched, back=back
        )
    except ActionRefused as e:
        return _problem(request, status=400, title="Refused", message=str(e), back=back)
    messages.success(request, f"{actions.BULK_LABELS[action]}: {len(result.results)} jobs.")
    return _see_other(back)
