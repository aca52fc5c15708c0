"""The operator dashboard through Django's test client: access, CSRF, versions, audit,
escaping, validation. Every job state is made through the real write seam (factories)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from admin_ui import actions
from admin_ui.permissions import OPERATE_PERM
from scheduler_core.domain import states
from scheduler_core.domain.modes import GUARANTEES, EffectMode
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Attempt, AuditEntry, Effect, EffectEvent, Job
from scheduler_core.services import maintenance, operator, queues
from scheduler_core.storage.drivers import driver
from tests.hand_rows import hand_job

from . import factories as f

IDEMPOTENT_PROMISE = GUARANTEES[EffectMode.IDEMPOTENT].promise

pytestmark = pytest.mark.django_db


def action_url(job: Job, key: str) -> str:
    return reverse("admin_ui:job_action", args=[job.pk, key])


def confirm_url(job: Job, key: str) -> str:
    return reverse("admin_ui:action_confirm", args=[job.pk, key])


def detail_url(job: Job) -> str:
    return reverse("admin_ui:job_detail", args=[job.pk])


def act(client: Client, job: Job, key: str, *, version: int | None = None, **extra: Any) -> Any:
    data = {
        "version": job.version if version is None else version,
        "reason": "checked",
        "confirm": "on",
    }
    # What the confirmation showed: the earlier owners that may be in flight as of now (a
    # test that submits another set says so).
    owners = driver().in_flight_owners(job.pk)
    data["seen_owners"] = ",".join(str(o.fence) for o in owners)
    data.update(extra)
    return client.post(action_url(job, key), data)


def snapshot() -> tuple[list[tuple[Any, ...]], int, list[tuple[Any, ...]]]:
    """Everything an action could change: job rows, audit rows, effect states."""
    jobs = list(Job.objects.order_by("pk").values_list("pk", "state", "version", "fence", "run_at"))
    effects = list(Effect.objects.order_by("pk").values_list("pk", "state"))
    return jobs, AuditEntry.objects.count(), effects


# --- access ----------------------------------------------------------------------------------


def test_anonymous_is_redirected_to_login_and_changes_nothing(client: Client) -> None:
    job = f.failed()
    before = snapshot()
    for url in (reverse("admin_ui:overview"), reverse("admin_ui:job_list"), detail_url(job)):
        r = client.get(url)
        assert r.status_code == 302 and r["Location"].startswith("/accounts/login/?next=")
    r = act(client, job, "retry")
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")
    assert snapshot() == before


def test_anonymous_htmx_poll_is_told_to_navigate_to_login(client: Client) -> None:
    r = client.get(reverse("admin_ui:overview"), headers={"HX-Request": "true"})
    assert r["HX-Redirect"] == "/accounts/login/"


def test_logged_in_user_without_view_permission_gets_403(db: Any) -> None:
    c = Client()
    c.force_login(f.user("nobody", view=False))
    assert c.get(reverse("admin_ui:overview")).status_code == 403


def test_viewer_sees_no_action_buttons(view_client: Client) -> None:
    job = f.indeterminate()
    page = view_client.get(detail_url(job)).content.decode()
    assert "data-action=" not in page and "Resolve as succeeded" not in page
    listing = view_client.get(reverse("admin_ui:job_list"), {"state": "indeterminate"})
    assert "Cancel jobs" not in listing.content.decode()


def test_viewer_gets_403_on_every_action_and_nothing_changes(view_client: Client) -> None:
    job = f.indeterminate()
    before = snapshot()
    for key in ("retry-not-applied", "resolve-applied", "give-up", "cancel"):
        assert view_client.get(confirm_url(job, key)).status_code == 403
        assert act(view_client, job, key).status_code == 403
    bulk = {"state": "indeterminate", "confirmed_count": 1, "reason": "x", "confirm": "on"}
    assert (
        view_client.post(reverse("admin_ui:bulk_action", args=["cancel"]), bulk).status_code == 403
    )
    assert snapshot() == before


def test_operator_sees_the_actions_the_state_and_mode_allow(op_client: Client) -> None:
    idem = op_client.get(detail_url(f.indeterminate("ui.charge"))).content.decode()
    amo = op_client.get(detail_url(f.indeterminate("ui.notify"))).content.decode()
    for key in (
        "retry-not-applied",
        "retry-same-key",
        "resolve-applied",
        "give-up-not-applied",
        "cancel-not-applied",
        "cancel-applied",
    ):
        assert f'data-action="{key}"' in idem
    # An effect of unknown outcome never hides behind failed or cancelled without a fact.
    assert 'data-action="give-up"' not in idem and 'data-action="cancel"' not in idem
    # Same key is safe only where the destination deduplicates.
    assert 'data-action="retry-same-key"' not in amo
    leased, _ = f.running()
    page = op_client.get(detail_url(leased)).content.decode()
    # A running job offers only the cancel request, and once it is recorded, nothing.
    assert 'data-action="cancel-running"' in page and page.count("data-action=") == 1
    operator.operator_action(
        leased.pk, action="cancel_running", expected_version=leased.version, actor="a", reason="r"
    )
    page = op_client.get(detail_url(leased)).content.decode()
    assert "data-action=" not in page and "is leased by" in page


def test_get_on_action_urls_is_405_and_changes_nothing(op_client: Client) -> None:
    job = f.failed()
    before = snapshot()
    assert op_client.get(action_url(job, "retry")).status_code == 405
    assert op_client.get(reverse("admin_ui:bulk_action", args=["retry"])).status_code == 405
    assert snapshot() == before


def test_post_without_csrf_token_is_refused(operator: Any) -> None:
    c = Client(enforce_csrf_checks=True)
    c.force_login(operator)
    job = f.failed()
    before = snapshot()
    assert act(c, job, "retry").status_code == 403
    assert snapshot() == before
    # The same client succeeds once it sends the token the confirmation form carries.
    c.get(confirm_url(job, "retry"))
    token = c.cookies["csrftoken"].value
    assert act(c, job, "retry", csrfmiddlewaretoken=token).status_code == 303


def test_dashboard_responses_carry_csp_and_vary(op_client: Client) -> None:
    job = f.failed()
    for url in (reverse("admin_ui:overview"), reverse("admin_ui:job_list"), detail_url(job)):
        r = op_client.get(url)
        csp = r["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "HX-Request" in r["Vary"]
    assert "HX-Request" in op_client.get(action_url(job, "retry"))["Vary"]


def test_pages_have_no_inline_script(op_client: Client) -> None:
    job = f.indeterminate()
    for url in (reverse("admin_ui:overview"), detail_url(job), confirm_url(job, "give-up")):
        html = op_client.get(url).content.decode()
        assert "<script>" not in html and " on" + "click=" not in html
        assert '<script src="/static/django_htmx/htmx-2' in html


# --- actions ---------------------------------------------------------------------------------


def test_retry_of_a_failed_job_waits_again_with_one_audit_row(op_client: Client) -> None:
    job = f.failed()
    r = act(op_client, job, "retry", reason="card updated by customer")
    assert r.status_code == 303 and r["Location"] == detail_url(job)
    state, version = f.state_of(job)
    assert (state, version) == ("waiting", job.version + 1)
    audit = AuditEntry.objects.get(job=job)
    assert (audit.actor, audit.action, audit.reason) == (
        "olivia",
        "retry",
        "card updated by customer",
    )
    assert (audit.state_before, audit.state_after, audit.version_before) == (
        "failed",
        "waiting",
        job.version,
    )
    assert "card updated by customer" in op_client.get(detail_url(job)).content.decode()


def test_stale_version_gets_409_and_changes_nothing(op_client: Client) -> None:
    job = f.failed()
    before = snapshot()
    r = act(op_client, job, "retry", version=job.version - 1)
    assert r.status_code == 409
    assert snapshot() == before


def test_second_action_from_the_same_stale_page_gets_409(op_client: Client) -> None:
    job = f.failed()
    assert act(op_client, job, "retry").status_code == 303
    after_first = snapshot()
    assert act(op_client, job, "cancel").status_code == 409  # still carries the old version
    assert snapshot() == after_first
    assert AuditEntry.objects.filter(job=job).count() == 1


def test_page_stale_because_an_executor_claimed_the_job_gets_409(op_client: Client) -> None:
    job = f.enqueue()
    f.claim(job)  # the page still shows the waiting job and its version
    before = snapshot()
    assert act(op_client, job, "cancel").status_code == 409
    assert snapshot() == before


def test_an_attempt_shows_its_lease_and_its_maximum_runtime(op_client: Client) -> None:
    job, lease = f.running("ui.sync")
    html = op_client.get(detail_url(job)).content.decode()
    assert "lease until" in html and 'class="attempt-deadline"' in html
    # An attempt made before migration 0015 has no deadline on its row: none is shown.
    Attempt.objects.filter(pk=lease.attempt_id).update(deadline_at=None)
    html = op_client.get(detail_url(job)).content.decode()
    assert "lease until" in html and 'class="attempt-deadline"' not in html


def test_leased_job_cannot_be_retried_resolved_or_cancelled(op_client: Client) -> None:
    job, _ = f.running("ui.charge")
    before = snapshot()
    for key in ("retry", "retry-not-applied", "retry-same-key", "resolve-applied", "cancel"):
        r = act(op_client, job, key)  # with the current version: refused, not a conflict
        assert r.status_code == 400, key
        assert op_client.get(confirm_url(job, key)).status_code == 400
    assert snapshot() == before


def test_action_needs_a_reason_and_a_confirmation(op_client: Client) -> None:
    job = f.failed()
    before = snapshot()
    assert act(op_client, job, "retry", reason="   ").status_code == 400
    r = op_client.post(action_url(job, "retry"), {"version": job.version, "reason": "why"})
    assert r.status_code == 400 and "Tick the box" in r.content.decode()
    assert (
        op_client.post(action_url(job, "retry"), {"reason": "x", "confirm": "on"}).status_code
        == 400
    )
    assert act(op_client, job, "retry", version="abc").status_code == 400
    assert snapshot() == before


def test_confirmation_restates_the_guarantee_at_stake(op_client: Client) -> None:
    job = f.indeterminate("ui.charge")
    key = Effect.objects.get(job=job).key
    page = op_client.get(confirm_url(job, "retry-same-key")).content.decode()
    assert IDEMPOTENT_PROMISE in page
    assert key in page and "only while it still keeps that key" in page
    page = op_client.get(confirm_url(job, "resolve-applied")).content.decode()
    assert "I verified at the destination that each effect I ticked happened" in page
    assert "every effect of unknown outcome must be ticked" in page
    assert f'name="version" value="{job.version}"' in page
    # A fact is about the effects ticked; the one left unticked stays unknown, and what a
    # later attempt reports cannot settle an outcome that was once unknown.
    page = op_client.get(confirm_url(job, "retry-not-applied")).content.decode()
    assert "each effect I ticked did NOT happen" in page
    assert "An effect I did not tick stays unknown" in page
    assert "a later attempt that sent nothing does not settle it" in page


def test_indeterminate_job_resolved_as_applied_succeeds_and_settles_the_ledger(
    op_client: Client,
) -> None:
    job = f.indeterminate("ui.notify")
    # The one effect in question: its box comes ticked, and the form sends it.
    assert act(op_client, job, "resolve-applied", effects="charge").status_code == 303
    assert f.state_of(job)[0] == "succeeded"
    assert list(Effect.objects.filter(job=job).values_list("state", flat=True)) == ["applied"]
    assert AuditEntry.objects.get(job=job).verified == "applied"


def test_indeterminate_job_retried_as_not_applied_waits_with_ledger_updated(
    op_client: Client,
) -> None:
    job = f.indeterminate("ui.notify")
    assert act(op_client, job, "retry-not-applied", effects="charge").status_code == 303
    assert f.state_of(job)[0] == "waiting"
    assert Effect.objects.get(job=job).state == "not_applied"


def test_same_key_retry_is_refused_for_a_mode_without_deduplication(op_client: Client) -> None:
    job = f.indeterminate("ui.notify")
    before = snapshot()
    assert act(op_client, job, "retry-same-key").status_code == 400
    # The plain retry of a failed job does not apply either: the operator must state a fact.
    assert act(op_client, job, "retry").status_code == 400
    assert snapshot() == before
    idem = f.indeterminate("ui.charge")
    assert act(op_client, idem, "retry-same-key").status_code == 303
    assert f.state_of(idem)[0] == "waiting"
    assert Effect.objects.get(job=idem).state == "unknown"  # nothing was verified


def test_give_up_marks_an_indeterminate_job_failed_once_its_effect_is_verified(
    op_client: Client,
) -> None:
    """Fails on the code before: "give up" ended the job failed with its effect unknown."""
    job = f.indeterminate()
    before = snapshot()
    r = act(op_client, job, "give-up")
    assert r.status_code == 400 and "holds an effect of unknown outcome" in r.content.decode()
    assert snapshot() == before
    r = act(op_client, job, "give-up-not-applied")
    assert r.status_code == 400 and "Tick each effect you verified" in r.content.decode()
    assert act(op_client, job, "give-up-not-applied", effects=["charge"]).status_code == 303
    assert f.state_of(job)[0] == "failed"
    assert Effect.objects.get(job=job).state == "not_applied"


def test_cancel_applies_to_waiting_failed_and_indeterminate_only(op_client: Client) -> None:
    for job in (f.enqueue(), f.failed()):
        assert act(op_client, job, "cancel").status_code == 303
        assert f.state_of(job)[0] == "cancelled"
    unknown = f.indeterminate()
    assert act(op_client, unknown, "cancel").status_code == 400  # it would hide the effect
    assert act(op_client, unknown, "cancel-applied", effects=["charge"]).status_code == 303
    assert f.state_of(unknown)[0] == "cancelled"
    assert Effect.objects.get(job=unknown).state == "applied"
    done = f.succeeded()
    before = snapshot()
    assert act(op_client, done, "cancel").status_code == 400
    assert snapshot() == before


def test_a_job_row_without_its_spec_is_shown_and_can_be_cancelled(op_client: Client) -> None:
    """A job row written by hand without its spec row (no claim takes it): the list and its
    page name what is missing instead of failing (both answered 500 before), and its cancel
    goes through the guarded action like any other."""
    now = driver().now()
    bare = hand_job(name="ui.charge", queue="default", run_at=now, created_at=now, updated_at=now)
    listed = op_client.get(reverse("admin_ui:job_list"))
    assert listed.status_code == 200 and "no spec row" in listed.content.decode()
    page = op_client.get(detail_url(bare))
    assert page.status_code == 200 and 'id="no-spec"' in page.content.decode()
    assert offered_keys(op_client, bare) == {"cancel"}
    assert op_client.get(confirm_url(bare, "cancel")).status_code == 200
    assert act(op_client, bare, "cancel").status_code == 303
    assert f.state_of(bare)[0] == "cancelled"
    assert AuditEntry.objects.filter(job_id=bare.pk, action="cancel").count() == 1


# --- the action table is the lifecycle's ------------------------------------------------------


def offered_keys(client: Client, job: Job) -> set[str]:
    """The action buttons the job's page shows."""
    html = client.get(detail_url(job)).content.decode()
    return {a.key for a in actions.ACTIONS if f'data-action="{a.key}"' in html}


def test_every_action_takes_its_lifecycle_transition_and_is_offered_for_its_sources(
    op_client: Client,
) -> None:
    """One source of truth: an action is offered for exactly the states its lifecycle
    transition leaves, and the store, asked for it, takes that very transition."""
    for spec in actions.ACTIONS:
        assert spec.transition in states.TRANSITIONS and spec.transition.operator, spec.key
        assert spec.states == frozenset(s.value for s in spec.transition.sources), spec.key
    # Resolve leaves failed as well as indeterminate: a failed job whose effect outcome is
    # unknown may be resolved by a verified fact.
    assert "failed" in actions.BY_KEY["resolve-applied"].states
    makers = {
        "retry": lambda: f.failed("ui.charge"),
        "retry-not-applied": lambda: f.with_unknown_effect(states.FAIL),
        "retry-same-key": lambda: f.indeterminate("ui.charge"),
        "resolve-applied": lambda: f.with_unknown_effect(states.FAIL),
        "give-up": lambda: f.indeterminate("ui.charge", effects=()),
        "give-up-not-applied": lambda: f.indeterminate("ui.charge"),
        "cancel": lambda: f.enqueue("ui.charge"),
        "cancel-not-applied": lambda: f.indeterminate("ui.charge"),
        "cancel-applied": lambda: f.with_unknown_effect(states.FAIL),
        "cancel-running": lambda: f.running("ui.charge")[0],
    }
    assert set(makers) == set(actions.BY_KEY)
    for spec in actions.ACTIONS:
        job = makers[spec.key]()
        effects = ["charge"] if spec.settles_effects else []
        assert act(op_client, job, spec.key, effects=effects).status_code == 303, spec.key
        audit = AuditEntry.objects.get(job=job)
        assert audit.detail["transition"] == spec.transition.name, spec.key
        assert (audit.state_before, audit.state_after) == (job.state, spec.transition.target)


def test_offered_actions_follow_the_lifecycle_the_need_of_a_fact_and_the_mode(
    op_client: Client,
) -> None:
    """Plain retry only when no fact is needed; the verified variants only when one is;
    same key only for idempotent jobs; nothing for a state no operator transition leaves."""
    fact = {"retry-not-applied", "retry-same-key", "resolve-applied"}
    end = {"cancel-not-applied", "cancel-applied"}
    table = {
        "waiting": (f.enqueue("ui.charge"), {"cancel"}),
        # Its cancel holds it indeterminate, or states the fact.
        "waiting, effect unknown": (f.with_unknown_effect(states.RETRY), {"cancel"} | end),
        "leased": (f.running("ui.charge")[0], {"cancel-running"}),
        "succeeded": (f.succeeded("ui.charge"), set()),
        "failed": (f.failed("ui.charge"), {"retry", "cancel"}),
        "failed, effect unknown": (f.with_unknown_effect(states.FAIL), fact | end),
        "indeterminate, no effect": (
            f.indeterminate("ui.charge", effects=()),
            fact | {"give-up", "cancel"},
        ),
        "indeterminate, idempotent": (
            f.indeterminate("ui.charge"),
            fact | end | {"give-up-not-applied"},
        ),
        "indeterminate, at most once": (
            f.indeterminate("ui.notify"),
            fact - {"retry-same-key"} | end | {"give-up-not-applied"},
        ),
    }
    cancelled = f.indeterminate("ui.charge")
    operator.operator_action(
        cancelled.pk,
        action="cancel",
        expected_version=cancelled.version,
        actor="a",
        reason="r",
        verified="applied",
    )
    table["cancelled, effect unknown"] = (cancelled, set())
    for what, (job, expected) in table.items():
        assert offered_keys(op_client, job) == expected, what
        for spec in actions.ACTIONS:
            if spec.key not in expected:
                assert op_client.get(confirm_url(job, spec.key)).status_code == 400, (what, spec)


def test_an_action_that_does_not_apply_says_why_in_plain_words(op_client: Client) -> None:
    job = f.indeterminate("ui.charge")
    before = f.state_of(job)
    r = op_client.get(confirm_url(job, "retry"))
    text = r.content.decode()
    assert r.status_code == 400
    assert "this indeterminate idempotent job may have applied an effect" in text
    assert "state the fact you verified" in text and "a indeterminate" not in text
    assert act(op_client, job, "retry").status_code == 400
    plain = f.failed("ui.notify")
    text = op_client.get(confirm_url(plain, "resolve-applied")).content.decode()
    assert "states a fact about an unknown outcome; this failed at_most_once job has none" in text
    text = op_client.get(confirm_url(f.succeeded(), "cancel")).content.decode()
    assert "does not apply to a succeeded at_least_once job" in text
    assert f.state_of(job) == before


# --- facts name their effects -----------------------------------------------------------------


def test_the_dialog_lists_each_unsettled_effect_with_its_own_box(op_client: Client) -> None:
    two = f.indeterminate("ui.charge", effects=("charge", "receipt"))
    Effect.objects.filter(job=two, name="receipt").update(note="smtp timeout after DATA")
    page = op_client.get(confirm_url(two, "retry-not-applied")).content.decode()
    for e in Effect.objects.filter(job=two):
        assert f'name="effects" value="{e.name}" id=' in page
        assert e.key in page
    assert "I verified this effect did not happen" in page
    assert "smtp timeout after DATA" in page and "in doubt" in page
    assert " checked" not in page.split('id="effects"')[1].split("</fieldset>")[0]
    page = op_client.get(confirm_url(two, "resolve-applied")).content.decode()
    assert "I verified this effect happened" in page and "(every one must be)" in page
    # With one effect in question its box is still the operator's to tick: the verified fact
    # is theirs to assert (fails on the code before, which ticked it). Same key states none.
    one = f.indeterminate("ui.charge")
    page = op_client.get(confirm_url(one, "retry-not-applied")).content.decode()
    assert 'name="effects" value="charge" id="id_effect_1">' in page
    assert " checked" not in page.split('id="effects"')[1].split("</fieldset>")[0]
    page = op_client.get(confirm_url(one, "retry-same-key")).content.decode()
    assert 'name="effects"' not in page and Effect.objects.get(job=one).key in page


def test_a_fact_names_one_effect_and_leaves_another_unknown(op_client: Client) -> None:
    job = f.indeterminate("ui.charge", effects=("charge", "receipt"))
    before = snapshot()
    # Nothing ticked: nothing was verified, so nothing changes.
    r = act(op_client, job, "retry-not-applied")
    assert r.status_code == 400 and "Tick each effect you verified." in r.content.decode()
    # A stale page is the store's 409 before any question about the boxes.
    assert act(op_client, job, "retry-not-applied", version=job.version - 1).status_code == 409
    assert snapshot() == before
    r = act(op_client, job, "retry-not-applied", effects=["charge"], reason="no charge at psp")
    assert r.status_code == 303
    assert f.state_of(job)[0] == "waiting"
    ledger = {e.name: (e.state, e.in_doubt) for e in Effect.objects.filter(job=job)}
    assert ledger == {"charge": ("not_applied", False), "receipt": ("unknown", True)}
    audit = AuditEntry.objects.get(job=job)
    assert audit.verified == "not_applied" and audit.detail["effects"] == ["charge"]
    fact = EffectEvent.objects.get(effect__job=job, event=EffectEvent.OPERATOR)
    assert (fact.effect.name, fact.actor, fact.note) == ("charge", "olivia", "no charge at psp")


def test_a_resolve_that_leaves_an_effect_unknown_is_refused(op_client: Client) -> None:
    job = f.indeterminate("ui.charge", effects=("charge", "receipt"))
    before = snapshot()
    r = act(op_client, job, "resolve-applied", effects=["charge"])
    text = r.content.decode()
    assert r.status_code == 400 and "Refused" in text
    assert "receipt would stay unknown in a succeeded job" in text
    assert snapshot() == before
    assert act(op_client, job, "resolve-applied", effects=["charge", "receipt"]).status_code == 303
    assert f.state_of(job)[0] == "succeeded"
    assert set(Effect.objects.filter(job=job).values_list("state", flat=True)) == {"applied"}
    assert AuditEntry.objects.get(job=job).detail["effects"] == ["charge", "receipt"]


def test_a_fact_about_an_effect_not_in_question_is_refused(op_client: Client) -> None:
    job = f.indeterminate("ui.charge")
    before = snapshot()
    r = act(op_client, job, "retry-not-applied", effects=["refund"])
    assert r.status_code == 400 and "is not awaiting a fact" in r.content.decode()
    r = act(op_client, job, "retry-same-key", effects=["charge"])
    assert r.status_code == 400 and "records no fact about effects" in r.content.decode()
    assert snapshot() == before


# --- an earlier owner that may still be in flight ---------------------------------------------


def test_not_applied_retry_with_an_owner_in_flight_needs_the_acknowledgment(
    op_client: Client,
) -> None:
    job = f.reaped("ui.short_notify")
    page = op_client.get(confirm_url(job, "retry-not-applied")).content.decode()
    assert f'data-owner="{f.OWNER}"' in page and "not known to have stopped" in page
    assert "If it is paused between its check and its send, it will send when it resumes" in page
    assert "only a destination that checks the fencing token closes this window" in page
    assert 'name="accept_in_flight"' in page
    before = snapshot()
    r = act(op_client, job, "retry-not-applied", effects=["charge"])
    text = r.content.decode()
    assert r.status_code == 400 and "may still be in flight" in text and f.OWNER in text
    assert snapshot() == before
    # Accepted against other owners than the confirmation showed: a conflict, nothing changes
    # (fails on the code before, which judged the acceptance against the owners at submit).
    r = act(
        op_client,
        job,
        "retry-not-applied",
        effects=["charge"],
        accept_in_flight="on",
        seen_owners="",
    )
    assert r.status_code == 409 and "changed since the confirmation" in r.content.decode()
    assert snapshot() == before
    page = op_client.get(confirm_url(job, "retry-not-applied")).content.decode()
    fence = Job.objects.get(pk=job.pk).fence
    assert f'name="seen_owners" value="{fence}"' in page
    r = act(op_client, job, "retry-not-applied", effects=["charge"], accept_in_flight="on")
    assert r.status_code == 303
    assert f.state_of(job)[0] == "waiting"
    assert Effect.objects.get(job=job).state == "not_applied"
    detail = AuditEntry.objects.get(job=job).detail
    assert detail["in_flight_owners"] == [f.OWNER] and detail["accepted_in_flight"] is True
    assert detail["effects"] == ["charge"]


def test_same_key_retry_and_resolve_warn_of_an_owner_in_flight_without_a_second_box(
    op_client: Client,
) -> None:
    job = f.reaped("ui.short_charge")
    for key in ("retry-same-key", "resolve-applied", "cancel-applied"):
        page = op_client.get(confirm_url(job, key)).content.decode()
        assert f'data-owner="{f.OWNER}"' in page, key
        assert "it will send when it resumes" in page, key
        assert 'name="accept_in_flight"' not in page, key
    assert act(op_client, job, "retry-same-key").status_code == 303
    assert f.state_of(job)[0] == "waiting"
    detail = AuditEntry.objects.get(job=job).detail
    assert detail["in_flight_owners"] == [f.OWNER] and detail["accepted_in_flight"] is False


def test_an_owner_known_to_have_stopped_needs_no_acknowledgment(op_client: Client) -> None:
    job = f.reaped("ui.short_notify", stopped=True)
    page = op_client.get(confirm_url(job, "retry-not-applied")).content.decode()
    assert 'id="in-flight"' not in page and 'name="accept_in_flight"' not in page
    html = op_client.get(detail_url(job)).content.decode()
    assert "yes: its executor recorded its stop" in html and 'id="in-flight"' not in html
    assert act(op_client, job, "retry-not-applied", effects=["charge"]).status_code == 303
    assert AuditEntry.objects.get(job=job).detail["in_flight_owners"] == []


def test_job_page_shows_the_last_owner_and_whether_it_is_known_gone(op_client: Client) -> None:
    job = f.reaped("ui.short_notify")
    html = op_client.get(detail_url(job)).content.decode()
    owner = html.split('id="owner"')[1].split("</section>")[0]
    assert f.OWNER in owner and "Reaped" in owner and "Executor's own last beat" in owner
    assert "no: not known to have stopped" in owner
    assert f'data-owner="{f.OWNER}"' in owner and "it will send when it resumes" in owner
    running, _ = f.running()
    owner = op_client.get(detail_url(running)).content.decode().split('id="owner"')[1]
    assert f.EXECUTOR in owner and "no: it holds the lease" in owner
    assert 'id="in-flight"' not in owner.split("</section>")[0]
    assert 'id="owner"' not in op_client.get(detail_url(f.enqueue())).content.decode()


# --- the ledger's history ---------------------------------------------------------------------


def test_job_page_shows_each_effects_history_and_an_in_doubt_badge(op_client: Client) -> None:
    job = f.indeterminate("ui.charge")  # intent, then the attempt ended without an outcome
    r = act(op_client, job, "retry-same-key", reason="provider keeps keys 24 h")
    assert r.status_code == 303
    job.refresh_from_db()
    lease = f.claim(job)
    eff = driver().effect_intend(lease, "charge")  # in doubt: the earlier outcome is unknown
    driver().effect_settle(lease, eff.key, Effect.NOT_APPLIED, note="connection refused")
    html = op_client.get(detail_url(job)).content.decode()
    row = html.split('data-effect="charge"')[1].split("</tbody>")[0]
    assert '<span class="badge in-doubt"' in row
    events = [e.split('"')[0] for e in row.split('data-event="')[1:]]
    assert events == ["intended", "left_unsettled", "intended", "not_sent"]
    # Sticky: the later attempt sent nothing, yet the effect stays unknown and in doubt.
    last = row.split('data-event="not_sent"')[1]
    assert "effect-unknown" in last and '<strong class="warn-text">yes</strong>' in last
    assert "sent nothing, but an earlier outcome is still unknown" in last
    assert f'<td class="num small">{lease.fence}</td>' in last
    driver().finish(lease, Decision(transition=states.PARK, reason="x"), outcome="indeterminate")
    job.refresh_from_db()
    r = act(op_client, job, "retry-not-applied", effects=["charge"], reason="psp: no charge")
    assert r.status_code == 303
    row = op_client.get(detail_url(job)).content.decode().split('data-effect="charge"')[1]
    row = row.split("</tbody>")[0]
    assert '<span class="badge in-doubt"' not in row.split('<tr class="history">')[0]
    fact = row.split('data-event="operator"')[1].split("</tr>")[0]
    assert "olivia" in fact and "psp: no charge" in fact and "effect-not_applied" in fact


def test_unknown_action_or_job_is_404(op_client: Client) -> None:
    job = f.failed()
    assert act(op_client, job, "delete").status_code == 404
    assert (
        op_client.post(reverse("admin_ui:job_action", args=[10**12, "retry"]), {}).status_code
        == 404
    )
    assert op_client.get(reverse("admin_ui:job_detail", args=[10**30])).status_code == 404


def test_audit_rows_equal_state_changes(op_client: Client) -> None:
    jobs = [f.failed(), f.indeterminate("ui.charge"), f.indeterminate("ui.notify"), f.enqueue()]
    attempts = [
        (jobs[0], "retry", None),
        (jobs[0], "retry", None),  # stale now: refused
        (jobs[1], "retry-same-key", None),
        (jobs[2], "retry-same-key", None),  # refused for this mode
        (jobs[2], "resolve-applied", 0),  # wrong version: refused
        (jobs[2], "give-up", None),  # its effect is unknown: refused
        (jobs[2], "resolve-applied", None),  # nothing ticked: refused
        (jobs[3], "cancel", None),
        (jobs[3], "cancel", None),  # stale
    ]
    changes = 0
    for job, key, version in attempts:
        before = f.state_of(job)
        act(op_client, job, key, version=version)
        if f.state_of(job) != before:
            changes += 1
    assert changes == 3
    assert AuditEntry.objects.count() == changes
    for row in AuditEntry.objects.all():
        assert row.state_before != row.state_after
        assert Job.objects.get(pk=row.job_id).state == row.state_after


def test_state_change_and_audit_row_commit_together(op_client: Client, monkeypatch: Any) -> None:
    """A crash between the state change and its audit row leaves neither (fault 38)."""

    class Crash(RuntimeError):
        pass

    class NoAudit:
        class objects:  # stands in for the manager the store calls
            @staticmethod
            def using(_: str) -> Any:
                raise Crash("process died before the audit row was written")

    job = f.indeterminate("ui.notify")
    before = snapshot()
    from scheduler_core.storage import core

    monkeypatch.setattr(core, "AuditEntry", NoAudit)
    with pytest.raises(Crash):
        act(op_client, job, "resolve-applied", effects="charge")
    assert snapshot() == before  # the job and its ledger kept their state


def race(clients: list[Client], job: Job, key: str) -> list[int]:
    """Post the same action from each client at the same moment, one thread each."""
    barrier = threading.Barrier(len(clients))
    codes: list[int] = []
    lock = threading.Lock()

    def post(c: Client) -> None:
        try:
            barrier.wait()
            code = act(c, job, key).status_code
            with lock:
                codes.append(code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sorted(codes)


def test_two_threads_retrying_one_job_exactly_one_wins(transactional_db: Any) -> None:
    """On PostgreSQL the two requests really race; on SQLite the write lock orders them."""
    op = f.user("olivia", operate=True)
    clients = []
    for _ in range(2):
        c = Client()
        c.force_login(op)
        clients.append(c)
    for round_ in range(5):
        job = f.failed(message=f"round {round_}")
        assert race(clients, job, "retry") == [303, 409]
        assert AuditEntry.objects.filter(job=job).count() == 1
        assert f.state_of(job) == ("waiting", job.version + 1)


def test_escape_scripts_in_payload_error_text_and_params(op_client: Client) -> None:
    job = f.failed(note=f.XSS, message=f.XSS)
    pages = [
        op_client.get(detail_url(job)),
        op_client.get(reverse("admin_ui:job_list")),
        op_client.get(reverse("admin_ui:job_list"), {"q": f.XSS}),
        op_client.get(reverse("admin_ui:job_list"), {"state": f.XSS}),
        op_client.get(reverse("admin_ui:overview")),
        op_client.get(confirm_url(job, "retry")),
    ]
    for r in pages:
        html = r.content.decode()
        assert "<script>alert" not in html
    assert "&lt;script&gt;alert(" in pages[0].content.decode()


def test_get_requests_never_mutate(op_client: Client) -> None:
    jobs = [f.failed(), f.indeterminate("ui.charge"), f.enqueue(), f.succeeded()]
    before = snapshot()
    urls = [reverse("admin_ui:overview"), reverse("admin_ui:job_list")]
    for job in jobs:
        urls.append(detail_url(job))
        for key in (
            "retry",
            "retry-not-applied",
            "retry-same-key",
            "resolve-applied",
            "give-up",
            "cancel",
        ):
            urls += [confirm_url(job, key), action_url(job, key)]
    urls += [
        reverse("admin_ui:bulk_confirm", args=["retry"]) + "?state=failed",
        reverse("admin_ui:bulk_action", args=["retry"])
        + "?state=failed&confirmed_count=1&reason=x&confirm=on",
    ]
    for url in urls:
        assert op_client.get(url).status_code in (200, 400, 405), url
        assert op_client.get(url, headers={"HX-Request": "true"}).status_code in (200, 400, 405)
    assert snapshot() == before


# --- reads -----------------------------------------------------------------------------------


def test_overview_counts_each_category(op_client: Client) -> None:
    made = {
        "waiting_due": f.enqueue(),
        "waiting_scheduled": f.scheduled(),
        "waiting_backing_off": f.backing_off(),
        "running": f.running()[0],
        "overrunning": f.overrunning(),
        "failing_repeatedly": f.backing_off(attempts=3),
        "stuck": f.stuck(),
        "indeterminate": f.indeterminate(),
        "failed": f.failed(),
        "succeeded_recently": f.succeeded(),
        "paused": f.enqueue(),
    }
    Job.objects.filter(pk=made["paused"].pk).update(queue="held")
    queues.pause("held", actor="op", reason="maintenance window")
    assert made
    r = op_client.get(reverse("admin_ui:overview"))
    cards = {c["key"]: c["count"] for c in r.context["cards"]}
    # stuck is also due; failing repeatedly is also backing off: categories overlap on purpose.
    assert cards == {
        # The paused queue's due job is counted as paused, not due: a held job is not "due".
        "waiting_due": 2,
        "waiting_scheduled": 1,
        "waiting_backing_off": 2,
        "running": 1,
        "overrunning": 1,
        "abandoned": 0,
        "failing_repeatedly": 1,
        "stuck": 1,
        "paused": 1,
        "concurrency_limited": 0,
        "rate_limited": 0,
        "indeterminate": 1,
        "failed": 1,
        "succeeded_recently": 1,
    }
    html = r.content.decode()
    for key in cards:
        assert f'data-category="{key}"' in html
    # Each card lists what it counts: the overrunning card's link finds the overrunning job.
    listed = op_client.get(reverse("admin_ui:job_list"), {"health": "overrunning"})
    assert [j.pk for j in listed.context["page"].jobs] == [made["overrunning"].pk]
    assert "billing" in html and "ui.charge" in html and "idempotent" in html


def test_overview_lists_live_executors_and_their_leases(op_client: Client) -> None:
    driver().executor_started(f.EXECUTOR, transport="polling", queues=["default"], concurrency=2)
    job, _ = f.running()
    html = op_client.get(reverse("admin_ui:overview")).content.decode()
    assert f.EXECUTOR in html and f'href="{detail_url(job)}"' in html


def test_htmx_request_gets_only_the_partial(op_client: Client) -> None:
    f.failed()
    r = op_client.get(reverse("admin_ui:overview"), headers={"HX-Request": "true"})
    html = r.content.decode()
    assert html.lstrip().startswith('<div id="live"') and "<html" not in html
    assert 'hx-trigger="every' in html
    r = op_client.get(
        reverse("admin_ui:job_list"), {"state": "failed"}, headers={"HX-Request": "true"}
    )
    assert r.content.decode().lstrip().startswith('<div id="results"')
    job = Job.objects.get()
    r = op_client.get(confirm_url(job, "retry"), headers={"HX-Request": "true"})
    assert r.content.decode().lstrip().startswith('<div class="backdrop" id="dialog"')


def test_list_filters_by_state_health_queue_type_and_text(op_client: Client) -> None:
    charge = f.indeterminate("ui.charge")
    note = f.failed("ui.notify")
    keyed = f.enqueue(unique_key="invoice:2024-0042")
    url = reverse("admin_ui:job_list")

    def ids(**params: Any) -> set[int]:
        r = op_client.get(url, params)
        assert r.status_code == 200
        return {j.pk for j in r.context["page"].jobs}

    assert ids(state="failed") == {note.pk}
    assert ids(health="indeterminate") == {charge.pk}
    assert ids(queue="billing") == {charge.pk}
    assert ids(name="ui.notify") == {note.pk}
    assert ids(q=str(charge.pk)) == {charge.pk}
    assert ids(q="2024-00") == {keyed.pk}
    assert ids(state="waiting", queue="billing") == set()


def test_keyset_pages_visit_every_job_once(op_client: Client) -> None:
    made = {f.enqueue().pk for _ in range(7)}
    seen: list[int] = []
    url = reverse("admin_ui:job_list") + "?limit=3"
    while url:
        r = op_client.get(url)
        seen += [j.pk for j in r.context["page"].jobs]
        url = r.context["next_url"]
    assert seen == sorted(made, reverse=True)


def test_page_size_is_capped(op_client: Client) -> None:
    with transaction.atomic():
        for _ in range(205):
            f.enqueue()
    r = op_client.get(reverse("admin_ui:job_list"), {"limit": "1000000"})
    assert r.status_code == 200 and len(r.context["page"].jobs) == 200
    assert r.context["next_url"]
    r = op_client.get(reverse("admin_ui:job_list"), {"limit": "0"})
    assert len(r.context["page"].jobs) == 1


@pytest.mark.parametrize(
    "query",
    [
        "state=exploded",
        "health=sideways",
        "limit=ten",
        "limit=" + "9" * 5000,
        "limit=-5",
        "before=-1",
        "before=" + "9" * 40,
        "before=1e9",
        "q=a%00b",
        "q=" + "x" * 5000,
        "queue=" + "q" * 500,
        "name=%ff%fe%80",
        "q=99999999999999999999999",
        "state=failed&state=waiting",
        "limit=",
    ],
)
def test_bad_list_params_are_refused_or_clamped_never_500(op_client: Client, query: str) -> None:
    f.failed()
    r = op_client.get(reverse("admin_ui:job_list") + "?" + query)
    assert r.status_code in (200, 400)


# --- bulk ------------------------------------------------------------------------------------


def bulk(client: Client, action: str, count: int, **filters: str) -> Any:
    data = {**filters, "confirmed_count": count, "reason": "provider outage over", "confirm": "on"}
    return client.post(reverse("admin_ui:bulk_action", args=[action]), data)


def test_bulk_retry_needs_the_matched_count_confirmed(op_client: Client) -> None:
    failed = [f.failed("ui.charge") for _ in range(3)]
    f.indeterminate("ui.charge")  # never retried in bulk
    page = op_client.get(reverse("admin_ui:bulk_confirm", args=["retry"]), {"queue": "billing"})
    assert page.context["count"] == 3
    before = snapshot()
    assert bulk(op_client, "retry", 2, queue="billing").status_code == 409
    assert snapshot() == before
    assert bulk(op_client, "retry", 3, queue="billing").status_code == 303
    assert {f.state_of(j)[0] for j in failed} == {"waiting"}
    assert AuditEntry.objects.filter(action="retry").count() == 3
    assert Job.objects.filter(state="indeterminate").count() == 1


def test_bulk_cancel_over_a_filter_audits_each_job(op_client: Client) -> None:
    jobs = [
        f.enqueue("ui.notify"),
        f.failed("ui.notify"),
        f.indeterminate("ui.notify", effects=()),
    ]
    done = f.succeeded("ui.notify")
    assert bulk(op_client, "cancel", 3, name="ui.notify").status_code == 303
    assert {f.state_of(j)[0] for j in jobs} == {"cancelled"}
    assert f.state_of(done)[0] == "succeeded"
    assert AuditEntry.objects.filter(action="cancel").count() == 3


def test_bulk_refuses_an_empty_filter(op_client: Client) -> None:
    f.failed()
    before = snapshot()
    assert bulk(op_client, "retry", 1).status_code == 400
    assert snapshot() == before


def test_bulk_count_changed_by_an_executor_gets_409(op_client: Client) -> None:
    jobs = [f.enqueue("ui.notify") for _ in range(2)]
    page = op_client.get(reverse("admin_ui:bulk_confirm", args=["cancel"]), {"queue": "mail"})
    assert page.context["count"] == 2
    f.claim(jobs[0])  # leased now: no longer cancellable, so the filter matches one job
    before = snapshot()
    assert bulk(op_client, "cancel", 2, queue="mail").status_code == 409
    assert snapshot() == before


def test_bulk_action_is_all_or_nothing(db: Any) -> None:
    from scheduler_core.exceptions import ActionRefused

    f.failed("ui.notify")
    f.failed("ui.notify")
    f.running("ui.notify")
    before = snapshot()
    with pytest.raises(ActionRefused):
        operator.bulk_operator_action(
            Job.objects.filter(queue="mail"),
            action="cancel",
            confirmed_count=3,
            actor="a",
            reason="r",
        )
    assert snapshot() == before


# --- admin and command -----------------------------------------------------------------------


def test_django_admin_is_read_only(db: Any) -> None:
    admin = get_user_model().objects.create_superuser("root", "root@example.invalid", "pw")
    c = Client()
    c.force_login(admin)
    job = f.failed()
    assert c.get("/admin/scheduler_core/job/").status_code == 200
    assert c.get(f"/admin/scheduler_core/job/{job.pk}/change/").status_code == 200
    assert c.get("/admin/scheduler_core/job/add/").status_code == 403
    assert c.get(f"/admin/scheduler_core/job/{job.pk}/delete/").status_code == 403
    before = snapshot()
    c.post(f"/admin/scheduler_core/job/{job.pk}/change/", {"state": "succeeded"})
    assert snapshot() == before
    for model in ("attempt", "effect", "auditentry", "executor", "schedule", "stalewrite"):
        assert c.get(f"/admin/scheduler_core/{model}/").status_code == 200
        assert c.get(f"/admin/scheduler_core/{model}/add/").status_code == 403


def test_create_demo_users_prints_credentials_and_grants_roles(db: Any, capsys: Any) -> None:
    call_command("create_demo_users", "--password", "s3cret-demo")
    out = capsys.readouterr().out
    assert "username=operator password=s3cret-demo" in out
    assert "username=viewer password=s3cret-demo" in out
    users = get_user_model().objects
    assert users.get(username="operator").has_perm(OPERATE_PERM)
    assert not users.get(username="viewer").has_perm(OPERATE_PERM)
    c = Client()
    assert c.login(username="viewer", password="s3cret-demo")
    assert c.get(reverse("admin_ui:overview")).status_code == 200


def test_on_a_big_table_the_overview_says_how_old_the_succeeded_count_is_and_how_often_it_is_taken(
    op_client: Client, settings: Any
) -> None:
    f.succeeded()
    settings.TENURE_EXACT_COUNTS_BELOW = -1  # every table counts as big
    maintenance._CountCost.seconds = 0.0  # no earlier test's count spaces this one out
    assert maintenance.refresh_counts() is True
    html = op_client.get(reverse("admin_ui:overview")).content.decode()
    assert 'id="succeeded-as-of"' in html
    assert "every 30 s, or less often when a recount takes longer than a twentieth" in html


def test_the_job_page_shows_a_succeeded_jobs_result_escaped(op_client: Client) -> None:
    j, lease = f.running()
    driver().complete(lease, result={"receipt": f.XSS, "n": 7})
    html = op_client.get(detail_url(j)).content.decode()
    assert 'id="result"' in html
    assert "&quot;receipt&quot;: &quot;&lt;script&gt;alert(" in html
    assert "<script>alert" not in html
    bare = f.succeeded()
    html = op_client.get(detail_url(bare)).content.decode()
    assert "None: the handler returned no value" in html
    waiting = f.enqueue()
    assert 'id="result"' not in op_client.get(detail_url(waiting)).content.decode()
