"""The console's queues page through Django's test client: who may act, the confirmation
step, the version check (409), bad input (400), the audit row, and the overview's section."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler_core import job
from scheduler_core.models import AuditEntry, Queue
from scheduler_core.services import queues

pytestmark = pytest.mark.django_db

Q = "qviews"


@job(name="tests.queueviews.ok", queue=Q)
def ok(ctx: Any) -> None:
    """Nothing."""


def _post(client: Client, key: str, **data: Any) -> Any:
    body = {"version": 0, "reason": "provider outage", "confirm": "on", **data}
    return client.post(reverse("admin_ui:queue_action", args=[Q, key]), body)


def test_an_operator_pauses_through_the_confirmation_and_the_page_says_who_and_why(
    op_client: Client,
) -> None:
    ok.enqueue()
    page = op_client.get(reverse("admin_ui:queues"))
    assert page.status_code == 200
    assert reverse("admin_ui:queue_confirm", args=[Q, "pause"]) in page.content.decode()
    confirm = op_client.get(reverse("admin_ui:queue_confirm", args=[Q, "pause"]))
    assert confirm.status_code == 200
    assert "no executor or transport" in confirm.content.decode()
    assert not Queue.objects.exists()  # the confirmation never writes
    r = _post(op_client, "pause")
    assert r.status_code == 303 and r["Location"] == reverse("admin_ui:queues")
    row = Queue.objects.get(pk=Q)
    assert row.paused and row.paused_by == "olivia" and row.paused_reason == "provider outage"
    html = op_client.get(reverse("admin_ui:queues")).content.decode()
    assert "Paused" in html and "olivia" in html and "provider outage" in html
    overview = op_client.get(reverse("admin_ui:overview")).content.decode()
    assert 'id="queues-summary"' in overview and "provider outage" in overview
    assert "1 due job waits because the queue is paused" in overview
    assert AuditEntry.objects.get(action="pause_queue").actor == "olivia"


def test_a_stale_page_gets_409_and_changes_nothing(op_client: Client) -> None:
    queues.pause(Q, actor="someone", reason="first")
    r = _post(op_client, "resume", version=0)
    assert r.status_code == 409
    # What changed, and who changed it.
    assert "changed since version 0" in r.content.decode()
    assert "pause by someone, &#x27;first&#x27;" in r.content.decode()
    assert Queue.objects.get(pk=Q).paused
    assert AuditEntry.objects.count() == 1
    # Looking again keeps the reason the operator typed.
    again = r.context["back"]
    assert again.startswith(reverse("admin_ui:queue_confirm", args=[Q, "resume"]))
    page = op_client.get(again).content.decode()
    assert "provider outage</textarea>" in page


def test_bad_limits_get_400_and_change_nothing(op_client: Client) -> None:
    r = _post(op_client, "limit", max_leased="-2", max_per_second="")
    assert r.status_code == 400
    assert "max_leased must be between" in r.content.decode()
    r = _post(op_client, "limit", max_leased="x")
    assert r.status_code == 400
    assert not Queue.objects.exists() and not AuditEntry.objects.exists()


def test_limits_set_from_the_console_are_shown(op_client: Client) -> None:
    r = _post(op_client, "limit", max_leased="3", max_per_second="2.5")
    assert r.status_code == 303
    row = Queue.objects.get(pk=Q)
    assert (row.max_leased, row.max_per_second) == (3, 2.5)
    html = op_client.get(reverse("admin_ui:queues")).content.decode()
    assert ">3<" in html and ">2.5<" in html


def test_a_missing_reason_or_confirmation_is_refused(op_client: Client) -> None:
    assert _post(op_client, "pause", reason="").status_code == 400
    assert _post(op_client, "pause", confirm="").status_code == 400
    assert not Queue.objects.exists()


def test_a_viewer_sees_no_buttons_and_may_not_act(view_client: Client) -> None:
    ok.enqueue()
    html = view_client.get(reverse("admin_ui:queues")).content.decode()
    assert Q in html and "/confirm/" not in html
    assert view_client.get(reverse("admin_ui:queue_confirm", args=[Q, "pause"])).status_code == 403
    assert _post(view_client, "pause").status_code == 403
    assert view_client.get(reverse("admin_ui:queue_action", args=[Q, "pause"])).status_code == 405
    assert not Queue.objects.exists()


def test_an_unknown_action_is_404(op_client: Client) -> None:
    assert op_client.get(reverse("admin_ui:queue_confirm", args=[Q, "drop"])).status_code == 404


def test_the_job_list_filters_the_jobs_a_pause_holds(op_client: Client) -> None:
    j = ok.enqueue()
    queues.pause(Q, actor="someone", reason="maintenance")
    r = op_client.get(reverse("admin_ui:job_list"), {"health": "paused", "queue": Q})
    assert r.status_code == 200
    assert f"/ops/jobs/{j.pk}/" in r.content.decode()
