"""The console's words (issue 48.3): a flash says what happened, attempts are numbered once
each with their fence, a runtime limit shows only on a running attempt, an action that makes a
job due in a paused or limited queue says so, a refused action keeps what the operator typed
and says why, and a stale page's 409 names who changed the queue and when."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler_core import job
from scheduler_core.models import Job
from scheduler_core.services import queues, scheduling
from scheduler_core.storage.drivers import driver

from . import factories as f
from .test_views import act, confirm_url, detail_url

pytestmark = pytest.mark.django_db


def _tick(ctx: Any, **payload: Any) -> None:
    """Never run: these tests read the store."""


job(name="ui.words.report", queue="words-q", effect="at_least_once")(_tick)


def test_the_flash_after_a_retry_says_what_happened(op_client: Client) -> None:
    j = f.failed()
    r = act(op_client, j, "retry")
    assert r.status_code == 303
    html = op_client.get(detail_url(j)).content.decode()
    assert "retry requested: waiting again (was failed)" in html
    assert "failed → waiting." not in html


def test_attempts_are_numbered_once_each_when_one_was_not_spent(op_client: Client) -> None:
    j, lease = f.running()
    driver().release_unstarted(lease, why="chain not started")  # gives the attempt back
    f.claim(j)  # counted as try 1 again
    html = op_client.get(detail_url(j)).content.decode()
    assert html.count('class="attempt-title">Attempt 1<') == 1
    assert html.count('class="attempt-title">Attempt 2<') == 1
    assert "ran as attempt 1" in html


def test_a_finished_attempt_shows_no_runtime_limit(op_client: Client) -> None:
    running, _ = f.running()
    assert 'class="attempt-deadline"' in op_client.get(detail_url(running)).content.decode()
    done = f.failed()
    assert 'class="attempt-deadline"' not in op_client.get(detail_url(done)).content.decode()


def test_a_retry_into_a_paused_queue_says_the_queue_is_paused(op_client: Client) -> None:
    j = f.failed()
    queues.pause(j.queue, actor="ops", reason="database migration")
    html = op_client.get(confirm_url(j, "retry")).content.decode()
    assert 'id="queue-hold"' in html and "database migration" in html
    assert f"Queue {j.queue} is paused (by ops" in html


@pytest.mark.parametrize(
    ("limits", "words"),
    [
        ({"max_leased": 2}, "at most 2 leased at once"),
        ({"max_per_second": 0.5}, "at most 0.5 claims per second"),
    ],
    ids=["concurrency", "rate"],
)
def test_a_retry_into_a_limited_queue_says_which_limit_holds_it(
    op_client: Client, limits: dict[str, Any], words: str
) -> None:
    j = f.failed()
    both = {"max_leased": None, "max_per_second": None, **limits}
    queues.set_limits(j.queue, actor="ops", reason="vendor quota", expected_version=None, **both)
    html = op_client.get(confirm_url(j, "retry")).content.decode()
    assert 'id="queue-hold"' in html
    assert f"Queue {j.queue} is limited ({words})" in html


def test_run_now_into_a_paused_queue_says_so(op_client: Client) -> None:
    s = scheduling.create_schedule(
        name="words", job_name="ui.words.report", cron="0 3 * * *", timezone="UTC"
    )
    queues.pause("words-q", actor="ops", reason="vendor outage")
    url = reverse("admin_ui:schedule_confirm", args=[s.pk, "run-now"])
    html = op_client.get(url).content.decode()
    assert "Queue words-q is paused (by ops" in html and "vendor outage" in html


def test_a_refused_limit_change_keeps_the_reason_and_says_why(op_client: Client) -> None:
    queues.set_limits(
        "words-q", max_leased=2, max_per_second=None, actor="o", reason="r", expected_version=None
    )
    version = queues.queue_settings("words-q").version
    r = op_client.post(
        reverse("admin_ui:queue_action", args=["words-q", "limit"]),
        {
            "version": version,
            "reason": "my carefully typed reason",
            "confirm": "on",
            "max_leased": "2",
            "max_per_second": "",
        },
    )
    assert r.status_code == 400
    html = r.content.decode()
    assert "my carefully typed reason" in html and "has these limits already" in html


def test_a_refused_job_action_keeps_the_reason_and_says_why(op_client: Client) -> None:
    j = f.indeterminate()
    before = Job.objects.get(pk=j.pk).state
    # A same-key retry is refused for a mode that does not deduplicate: the store says why.
    r = act(op_client, j, "resolve-applied", reason="reason typed with care", effects=["nope"])
    assert r.status_code == 400
    html = r.content.decode()
    assert "reason typed with care" in html and "Refused" in html
    assert Job.objects.get(pk=j.pk).state == before


def test_a_stale_queue_page_names_who_changed_it_and_when(op_client: Client) -> None:
    queues.pause("words-q", actor="alice", reason="first")
    stale = queues.queue_settings("words-q").version
    queues.resume("words-q", actor="bob", reason="done", expected_version=stale)
    r = op_client.post(
        reverse("admin_ui:queue_action", args=["words-q", "resume"]),
        {"version": stale, "reason": "mine", "confirm": "on"},
    )
    assert r.status_code == 409
    html = r.content.decode()
    assert "resume by bob, &#x27;done&#x27;, at " in html and " UTC" in html


def test_a_waiting_jobs_page_names_what_holds_its_queue(op_client: Client) -> None:
    j = f.enqueue()
    queues.pause(j.queue, actor="ops", reason="provider outage")
    html = op_client.get(detail_url(j)).content.decode()
    assert 'id="queue-hold"' in html and "provider outage" in html
    assert f"/ops/queues/#queue-{j.queue}" in html


def test_the_verdict_names_a_held_queue_and_links_to_it(op_client: Client) -> None:
    j = f.enqueue()
    queues.pause(j.queue, actor="ops", reason="provider outage")
    html = op_client.get(reverse("admin_ui:overview")).content.decode()
    assert f'data-reason="held_back" data-queue="{j.queue}"' in html
    assert f"/ops/queues/#queue-{j.queue}" in html and "1 due job held back" in html


def test_a_bulk_retry_into_a_paused_queue_says_so(op_client: Client) -> None:
    j = f.failed()
    queues.pause(j.queue, actor="ops", reason="provider outage")
    url = reverse("admin_ui:bulk_confirm", args=["retry"]) + "?state=failed"
    html = op_client.get(url).content.decode()
    assert f"Queue {j.queue} is paused (by ops" in html and "provider outage" in html
