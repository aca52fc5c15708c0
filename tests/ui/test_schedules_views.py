"""The schedules pages through Django's test client: every schedule listed with its timing,
policies, last and next occurrence and their jobs; pause, resume and "run now" each through a
confirmation with a reason, version-checked, audited, refused to a viewer and without CSRF;
"run now" refused while an occurrence runs under overlap=skip."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from scheduler_core import job
from scheduler_core.models import AuditEntry, Job, Schedule
from scheduler_core.services import scheduling

from . import factories as f

pytestmark = pytest.mark.django_db


def _tick(ctx: Any, **payload: Any) -> None:
    """Never run: these tests read the store."""


job(name="ui.sched.report", queue="reports", effect="at_least_once")(_tick)


def make(name: str = "nightly-report", **kw: Any) -> Schedule:
    args: dict[str, Any] = {"job_name": "ui.sched.report", "cron": "0 3 * * *"}
    args.update(kw)
    return scheduling.create_schedule(name=name, timezone="Europe/Berlin", **args)


def confirm_url(s: Schedule, key: str) -> str:
    return reverse("admin_ui:schedule_confirm", args=[s.pk, key])


def act(client: Client, s: Schedule, key: str, *, version: int | None = None, **extra: Any) -> Any:
    data = {
        "version": s.version if version is None else version,
        "seen_paused": "true" if s.paused else "false",
        "reason": "maintenance window",
        "confirm": "on",
    }
    data.update(extra)
    return client.post(reverse("admin_ui:schedule_action", args=[s.pk, key]), data)


def snapshot() -> tuple[list[tuple[Any, ...]], int, int]:
    rows = list(Schedule.objects.order_by("pk").values_list("pk", "paused", "version"))
    return rows, Job.objects.count(), AuditEntry.objects.count()


def test_list_shows_every_schedule_with_spec_zone_policies_and_occurrences(
    op_client: Client,
) -> None:
    nightly = make(misfire="catch_up", catch_up_max=3, overlap="skip")
    every = make("heartbeat", cron="", interval_seconds=90)
    _, job_ = scheduling.run_now(every.pk, expected_version=every.version, actor="t", reason="x")
    html = op_client.get(reverse("admin_ui:schedule_list")).content.decode()
    assert "nightly-report" in html and "heartbeat" in html
    assert "cron 0 3 * * *" in html and "every 90 s" in html
    assert "Europe/Berlin" in html
    assert "catch_up (3)" in html and "skip" in html
    assert f'href="/ops/jobs/{job_.pk}/"' in html
    assert nightly.next_fire_at is not None
    assert nightly.next_fire_at.astimezone(dt.UTC).isoformat() in html
    assert 'href="/ops/schedules/"' in html  # the nav link


def test_detail_shows_next_fire_times_occurrence_jobs_and_actions(op_client: Client) -> None:
    s = make()
    _, j = scheduling.run_now(s.pk, expected_version=s.version, actor="olivia", reason="test")
    r = op_client.get(reverse("admin_ui:schedule_detail", args=[s.pk]))
    html = r.content.decode()
    assert len(r.context["upcoming"]) == 5
    assert j.unique_key in html and f'data-job="{j.pk}"' in html
    assert 'data-action="pause"' in html and 'data-action="run-now"' in html
    assert 'data-action="resume"' not in html
    assert "run_schedule_now" in html


def test_viewer_sees_no_buttons_and_gets_403_on_every_action(view_client: Client) -> None:
    s = make()
    html = view_client.get(reverse("admin_ui:schedule_detail", args=[s.pk])).content.decode()
    assert "data-action=" not in html
    before = snapshot()
    for key in ("pause", "resume", "run-now"):
        assert view_client.get(confirm_url(s, key)).status_code == 403
        assert act(view_client, s, key).status_code == 403
    assert snapshot() == before


def test_actions_need_post_csrf_a_reason_and_the_confirmation(operator: Any) -> None:
    s = make()
    c = Client(enforce_csrf_checks=True)
    c.force_login(operator)
    before = snapshot()
    assert c.get(reverse("admin_ui:schedule_action", args=[s.pk, "pause"])).status_code == 405
    assert act(c, s, "pause").status_code == 403
    c.get(confirm_url(s, "pause"))
    token = c.cookies["csrftoken"].value
    assert act(c, s, "pause", reason="  ", csrfmiddlewaretoken=token).status_code == 400
    assert act(c, s, "pause", confirm="", csrfmiddlewaretoken=token).status_code == 400
    assert snapshot() == before
    assert act(c, s, "pause", csrfmiddlewaretoken=token).status_code == 303


def test_pause_and_resume_are_audited_and_version_checked(op_client: Client) -> None:
    s = make()
    page = op_client.get(confirm_url(s, "pause"))
    assert "misfire policy" in page.content.decode()
    assert act(op_client, s, "pause").status_code == 303
    s.refresh_from_db()
    assert s.paused
    a = AuditEntry.objects.get(action="pause_schedule")
    assert (a.actor, a.reason, a.detail["schedule_id"]) == ("olivia", "maintenance window", s.pk)
    # The same stale page again: 409, nothing changes.
    before = snapshot()
    r = act(op_client, s, "pause", version=s.version - 1)
    assert r.status_code == 409
    assert snapshot() == before
    assert act(op_client, s, "resume").status_code == 303
    s.refresh_from_db()
    assert not s.paused
    assert AuditEntry.objects.filter(action="resume_schedule").count() == 1


def test_run_now_enqueues_a_manual_occurrence_with_its_own_key_audited(
    op_client: Client,
) -> None:
    s = make(payload={"report": "daily"})
    timing = (s.next_fire_at, s.last_fire_at)
    assert act(op_client, s, "run-now").status_code == 303
    j = Job.objects.get(schedule=s)
    assert j.unique_key.startswith(f"schedule:{s.pk}:manual@")
    assert (j.state, j.name, j.payload, j.queue) == (
        "waiting",
        "ui.sched.report",
        {"report": "daily"},
        "reports",
    )
    a = AuditEntry.objects.get(action="run_schedule_now")
    assert (a.job_id, a.actor, a.detail["unique_key"]) == (j.pk, "olivia", j.unique_key)
    s.refresh_from_db()
    assert (s.next_fire_at, s.last_fire_at) == timing
    # A second submit of the same page is a 409, not a second job.
    assert act(op_client, s, "run-now", version=s.version - 1).status_code == 409
    assert Job.objects.filter(schedule=s).count() == 1
    # A fresh page runs another, under another key.
    assert act(op_client, s, "run-now").status_code == 303
    keys = set(Job.objects.filter(schedule=s).values_list("unique_key", flat=True))
    assert len(keys) == 2


def test_run_now_is_refused_while_an_occurrence_runs_under_overlap_skip(
    op_client: Client,
) -> None:
    s = make(overlap="skip")
    _, first = scheduling.run_now(s.pk, expected_version=s.version, actor="t", reason="x")
    f.claim(first)
    s.refresh_from_db()
    page = op_client.get(confirm_url(s, "run-now")).content.decode()
    assert "Run now is refused while it runs" in page
    before = snapshot()
    r = act(op_client, s, "run-now")
    assert r.status_code == 400
    text = r.content.decode()
    assert "overlap=skip" in text and f"job {first.pk} (leased)" in text
    assert "maintenance window" in text  # the reason is kept
    assert snapshot() == before


def test_run_now_with_overlap_allow_runs_beside_an_unfinished_occurrence(
    op_client: Client,
) -> None:
    s = make(overlap="allow")
    scheduling.run_now(s.pk, expected_version=s.version, actor="t", reason="x")
    s.refresh_from_db()
    page = op_client.get(confirm_url(s, "run-now")).content.decode()
    assert "both may run at the same time" in page
    assert act(op_client, s, "run-now").status_code == 303
    assert Job.objects.filter(schedule=s).count() == 2


def test_a_stale_schedule_page_says_who_changed_it_and_keeps_the_reason(
    op_client: Client,
) -> None:
    s = make()
    seen = Schedule.objects.get(pk=s.pk)
    scheduling.set_paused(
        s.pk, paused=True, expected_version=s.version, actor="mallory", reason="db upgrade"
    )
    r = act(op_client, seen, "pause", reason="my own reason")
    assert r.status_code == 409
    html = r.content.decode()
    assert "active</span> → <span" in html and "paused" in html
    assert f"version {seen.version} → {seen.version + 1}" in html
    assert "mallory" in html and "db upgrade" in html
    assert "my own reason" in html
    assert "does not apply now" in html  # it is paused already


def test_unknown_schedule_or_action_is_404(op_client: Client) -> None:
    s = make()
    assert op_client.get(reverse("admin_ui:schedule_detail", args=[999999])).status_code == 404
    assert op_client.get(confirm_url(s, "explode")).status_code == 404


def test_an_occurrence_job_links_back_to_its_schedule(op_client: Client) -> None:
    s = make()
    _, j = scheduling.run_now(s.pk, expected_version=s.version, actor="t", reason="x")
    html = op_client.get(reverse("admin_ui:job_detail", args=[j.pk])).content.decode()
    assert f'href="/ops/schedules/{s.pk}/" data-schedule-link' in html
    assert "(run now by an operator)" in html


def test_two_operators_running_one_schedule_now_from_one_page_make_one_job(
    transactional_db: Any,
) -> None:
    """On PostgreSQL the two requests really race; on SQLite the write lock orders them."""
    op = f.user("olivia", operate=True)
    s = make(overlap="allow")
    clients = []
    for _ in range(2):
        c = Client()
        c.force_login(op)
        clients.append(c)
    barrier = threading.Barrier(2)
    codes: list[int] = []
    lock = threading.Lock()

    def post(c: Client) -> None:
        try:
            barrier.wait()
            code = act(c, s, "run-now").status_code
            with lock:
                codes.append(code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(codes) == [303, 409]
    assert Job.objects.filter(schedule_id=s.pk).count() == 1
    assert AuditEntry.objects.filter(action="run_schedule_now").count() == 1
