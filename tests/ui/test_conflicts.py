"""Refused actions that help: a 409 on a stale job page says what changed (state and version
before → now), by whom and when (the newest audit row, or the attempt or reaper that moved
it), and offers the form again with the operator's reason kept; a mistyped bulk count says
"you typed N, the filter now matches M"."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import AuditEntry, Job
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver

from . import factories as f

pytestmark = pytest.mark.django_db


def act(client: Client, job: Job, key: str, *, version: int, state: str, reason: str) -> Any:
    return client.post(
        reverse("admin_ui:job_action", args=[job.pk, key]),
        {"version": version, "seen_state": state, "reason": reason, "confirm": "on"},
    )


def test_a_job_changed_by_another_operator_says_who_when_and_keeps_the_reason(
    op_client: Client,
) -> None:
    job = f.failed()
    seen_version = job.version
    operator.operator_action(
        job.pk, action="retry", expected_version=seen_version, actor="mallory", reason="retry 1"
    )
    r = act(op_client, job, "cancel", version=seen_version, state="failed", reason="dup order")
    assert r.status_code == 409
    html = r.content.decode()
    assert 'id="changed"' in html
    assert "failed</span> → <span" in html and "waiting" in html
    assert f"version {seen_version} → {seen_version + 1}" in html
    assert "By mallory (retry)" in html and "retry 1" in html
    assert "dup order" in html  # the reason kept in the re-offered form
    assert f'name="version" value="{seen_version + 1}"' in html
    assert not AuditEntry.objects.filter(action="cancel").exists()


def test_a_job_claimed_by_an_executor_names_the_executor(op_client: Client) -> None:
    job = f.enqueue()
    seen = job.version
    f.claim(job)
    r = act(op_client, job, "cancel", version=seen, state="waiting", reason="not needed")
    assert r.status_code == 409
    html = r.content.decode()
    assert f"Claimed by executor {f.EXECUTOR} (attempt 1)" in html
    assert "waiting</span> → <span" in html and "leased" in html
    # Leased: cancel is not offered now, so the reason is shown rather than a form.
    assert "Your reason, kept" in html and "not needed" in html


def test_a_job_moved_by_the_reaper_says_so(op_client: Client) -> None:
    job = f.reaped()
    seen = job.version
    # Another operator's earlier page is older still: the reaper's move is the newest.
    r = act(op_client, job, "give-up", version=seen - 1, state="leased", reason="owner is gone")
    assert r.status_code == 409
    html = r.content.decode()
    assert "The reaper ended attempt 1" in html and "lease ran out" in html
    assert "owner is gone" in html


def test_a_mistyped_bulk_count_says_what_was_typed_and_what_matches(op_client: Client) -> None:
    for _ in range(3):
        f.failed("ui.charge")
    data = {
        "queue": "billing",
        "confirmed_count": 30,
        "shown_count": 3,
        "reason": "provider outage over",
        "confirm": "on",
    }
    r = op_client.post(reverse("admin_ui:bulk_action", args=["retry"]), data)
    assert r.status_code == 409
    html = r.content.decode()
    assert "You typed 30, the filter now matches 3." in html
    assert "The jobs changed" not in html
    assert "provider outage over" in html
    assert Job.objects.filter(state="failed").count() == 3


def test_a_bulk_count_changed_since_the_confirmation_says_so(op_client: Client) -> None:
    jobs = [f.enqueue("ui.notify") for _ in range(2)]
    f.claim(jobs[0])
    data = {
        "queue": "mail",
        "confirmed_count": 2,
        "shown_count": 2,
        "reason": "stop mail",
        "confirm": "on",
    }
    r = op_client.post(reverse("admin_ui:bulk_action", args=["cancel"]), data)
    assert r.status_code == 409
    html = r.content.decode()
    assert "The jobs changed: the confirmation showed 2, you confirmed 2" in html
    assert "the filter now matches 1" in html
    assert "stop mail" in html


def test_a_job_that_came_back_to_the_same_state_offers_the_action_again(
    op_client: Client,
) -> None:
    job = f.indeterminate("ui.charge")
    seen = job.version
    operator.operator_action(
        job.pk,
        action="retry",
        expected_version=seen,
        actor="mallory",
        reason="replay",
        verified="same_key",
    )
    lease = f.claim(job)
    driver().effect_intend(lease, "charge")
    driver().finish(
        lease,
        Decision(transition=states.PARK, reason="indeterminate: timed out again"),
        outcome="indeterminate",
        failure=f._failure(f.FailureClass.INDETERMINATE, "timed out again"),
    )
    job.refresh_from_db()
    assert job.state == "indeterminate" and job.version > seen
    r = op_client.post(
        reverse("admin_ui:job_action", args=[job.pk, "resolve-applied"]),
        {
            "version": seen,
            "seen_state": "indeterminate",
            "reason": "provider shows it captured",
            "confirm": "on",
            "effects": "charge",
        },
    )
    assert r.status_code == 409
    html = r.content.decode()
    assert "State now <span" in html and f"version {seen} → {job.version}" in html
    assert f"Attempt 2 on executor {f.EXECUTOR} ended (indeterminate)" in html
    assert "provider shows it captured" in html
    # The reason is kept; the fact is not: the job changed, so the operator ticks it anew.
    assert 'value="charge" id="id_effect_1" required>' in html
    assert Job.objects.get(pk=job.pk).state == "indeterminate"
