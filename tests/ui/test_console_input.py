"""Bad input gets a clear error and changes nothing (issue 48.4): a reason over the limit is
refused with a message and kept, never cut; the queues page lists every known queue, a paused
one with no jobs too; a queue nobody knows is not paused by a typo; the search box says what a
bare number means."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler_core import job
from scheduler_core.domain.reasons import REASON_MAX_CHARS
from scheduler_core.models import AuditEntry, Job, Queue

from . import factories as f
from .test_views import act, detail_url

pytestmark = pytest.mark.django_db


def _tick(ctx: Any, **payload: Any) -> None:
    """Never run."""


job(name="ui.input.quiet", queue="input-quiet")(_tick)

LONG = "x" * (REASON_MAX_CHARS + 1)


def test_a_job_action_with_a_reason_over_the_limit_is_refused_with_a_message(
    op_client: Client,
) -> None:
    j = f.failed()
    r = act(op_client, j, "retry", reason=LONG)
    assert r.status_code == 400
    html = r.content.decode()
    assert f"at most {REASON_MAX_CHARS} characters; this one has {REASON_MAX_CHARS + 1}" in html
    assert LONG in html  # kept for the operator to shorten, not cut
    assert f.state_of(j) == (j.state, j.version) and not AuditEntry.objects.exists()


def test_a_queue_action_with_a_reason_over_the_limit_is_refused_with_a_message(
    op_client: Client,
) -> None:
    r = op_client.post(
        reverse("admin_ui:queue_action", args=["input-quiet", "pause"]),
        {"version": 0, "reason": LONG, "confirm": "on"},
    )
    assert r.status_code == 400
    assert f"at most {REASON_MAX_CHARS} characters" in r.content.decode()
    assert not Queue.objects.exists() and not AuditEntry.objects.exists()


def test_the_reason_box_carries_no_maxlength_that_would_cut_a_paste(op_client: Client) -> None:
    j = f.failed()
    html = op_client.get(reverse("admin_ui:action_confirm", args=[j.pk, "retry"])).content
    assert b'name="reason"' in html and b"maxlength" not in html


def test_the_queues_page_lists_a_known_queue_with_no_jobs_and_a_paused_one(
    op_client: Client,
) -> None:
    html = op_client.get(reverse("admin_ui:queues")).content.decode()
    assert 'data-queue="input-quiet"' in html  # a job type routes to it; it has no job
    r = op_client.post(
        reverse("admin_ui:queue_action", args=["input-quiet", "pause"]),
        {"version": 0, "reason": "quiet hours", "confirm": "on"},
    )
    assert r.status_code == 303
    html = op_client.get(reverse("admin_ui:queues")).content.decode()
    assert 'data-queue="input-quiet" class="queue-paused"' in html


def test_pausing_a_queue_nobody_knows_is_refused_from_the_dashboard(op_client: Client) -> None:
    r = op_client.post(
        reverse("admin_ui:queue_action", args=["input-typo", "pause"]),
        {"version": 0, "reason": "x", "confirm": "on"},
    )
    assert r.status_code == 400
    assert "no queue named &#x27;input-typo&#x27; is known" in r.content.decode()
    assert not Queue.objects.exists()


def test_the_search_box_says_a_bare_number_is_a_job_id(op_client: Client) -> None:
    j = f.enqueue()
    html = op_client.get(reverse("admin_ui:job_list") + f"?q={j.pk}").content.decode()
    assert 'id="search-help"' in html
    assert f"A bare number is a job id: job {j.pk}" in html
    assert f"some_key={j.pk}" in html
    assert detail_url(j) in html
    assert Job.objects.count() == 1
