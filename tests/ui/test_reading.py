"""The reading fixes of the operator console, each as a view test: the job-type table fits or
scrolls with a cue; timestamps keep together and show their age beside absolute UTC; a
succeeded job's earlier error is muted and labelled; failed jobs say when they finished; the
queue and job-type filters offer the known values and say when a value names nothing known;
the dialog script is served; the at-most-once guarantee says an operator is needed; refusals
use the right article."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.urls import reverse

from admin_ui.templatetags.tenure_ui import age
from scheduler_core.domain import states
from scheduler_core.domain.modes import GUARANTEES, EffectMode
from scheduler_core.domain.outcomes import Decision
from scheduler_core.exceptions import ActionRefused
from scheduler_core.models import Job
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver

from . import factories as f

pytestmark = pytest.mark.django_db


def static(name: str) -> str:
    """A static file of the app, as the server would serve it."""
    path = finders.find(name)
    assert isinstance(path, str), name
    return Path(path).read_text()


def detail(client: Client, job: Job) -> str:
    return client.get(reverse("admin_ui:job_detail", args=[job.pk])).content.decode()


def listing(client: Client, **params: str) -> str:
    return client.get(reverse("admin_ui:job_list"), params).content.decode()


def succeeded_after_a_failure() -> Job:
    """A job whose first attempt failed transiently and whose second succeeded."""
    j = f.enqueue("ui.sync")
    lease = f.claim(j)
    driver().finish(
        lease,
        Decision(transition=states.RETRY, delay=0.0, reason="transient"),
        outcome="retry",
        failure=f._failure(f.FailureClass.TRANSIENT, "connection reset by peer"),
    )
    driver().complete(f.claim(j))
    j.refresh_from_db()
    assert j.state == "succeeded" and j.last_error
    return j


def test_the_job_type_table_fits_at_1280_or_scrolls_with_a_cue(op_client: Client) -> None:
    f.succeeded("ui.charge")
    html = op_client.get(reverse("admin_ui:overview")).content.decode()
    assert 'class="two-col breakdowns"' in html
    assert 'class="scroll breakdown" tabindex="0" role="region"' in html
    text = static("admin_ui/dashboard.css")
    assert "@media (max-width: 1600px) { .two-col.breakdowns { grid-template-columns: 1fr; } }" in (
        text
    )


def test_timestamps_never_wrap_and_show_their_age_beside_utc(op_client: Client) -> None:
    j = f.failed()
    html = listing(op_client)
    stamp = re.search(r'<time class="when" datetime="([^"]+)" title="\1">', html)
    assert stamp is not None and stamp.group(1).endswith("+00:00")
    assert '<span class="age">just now</span>' in html
    assert "time.when, .when { white-space: nowrap; }" in static("admin_ui/dashboard.css")
    now = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    assert age(now - dt.timedelta(minutes=3), now) == "3 min ago"
    assert age(now + dt.timedelta(hours=2), now) == "in 2 h"
    assert age(now - dt.timedelta(days=3), now) == "3 d ago"
    assert "just now" in detail(op_client, j)


def test_a_succeeded_job_shows_an_earlier_error_muted_and_labelled(op_client: Client) -> None:
    j = succeeded_after_a_failure()
    html = listing(op_client)
    assert "earlier attempt:" in html
    assert '<div class="error-text">' not in html
    page = detail(op_client, j)
    assert "Earlier error" in page and "Last error" not in page
    assert 'class="earlier-error"' in page and "connection reset by peer" in page
    assert 'class="error-text"' not in page
    # A failed job's error stays an alarm.
    failed = f.failed(message="card declined")
    assert re.search(r'<dd class="error-text">[^<]*card declined', detail(op_client, failed))


def test_failed_jobs_say_when_they_finished_not_run_at(op_client: Client) -> None:
    j = f.failed()
    assert j.finished_at is not None
    row = re.search(
        rf'<td class="num"><a href="/ops/jobs/{j.pk}/">.*?</tr>', listing(op_client), re.S
    )
    assert row is not None
    assert "Finished" in row.group(0) and "Run at" not in row.group(0)
    page = detail(op_client, j)
    assert "<dt>Finished</dt>" in page and "<dt>Run at</dt>" not in page
    waiting = f.scheduled()
    assert "<dt>Run at</dt>" in detail(op_client, waiting)


def test_filters_offer_the_known_queues_and_job_types(op_client: Client) -> None:
    html = listing(op_client)
    assert 'list="known-queues"' in html and 'list="known-types"' in html
    for value in ("billing", "mail", "ui.charge", "ui.notify"):
        assert f'<option value="{value}">' in html


def test_a_filter_value_that_names_nothing_known_says_so(op_client: Client) -> None:
    f.failed("ui.charge")
    html = listing(op_client, queue="biling")
    assert "No job matches." in html
    assert "No queue named <strong>biling</strong> is known; known:" in html and "billing" in html
    html = listing(op_client, name="ui.chrage")
    assert "No job type named <strong>ui.chrage</strong> is known" in html
    # A known value that matches nothing is not called unknown.
    assert "is known" not in listing(op_client, queue="mail", state="failed")


def test_the_dialog_script_is_served_from_the_app_without_inline_code(op_client: Client) -> None:
    j = f.failed()
    html = detail(op_client, j)
    assert '<script src="/static/admin_ui/dashboard.js" defer></script>' in html
    js = static("admin_ui/dashboard.js")
    assert '"Escape"' in js and ".focus()" in js


def test_an_at_most_once_job_says_an_operator_is_needed(op_client: Client) -> None:
    needs = GUARANTEES[EffectMode.AT_MOST_ONCE].needs
    assert needs != "Nothing." and "operator" in needs
    page = detail(op_client, f.indeterminate("ui.notify"))
    assert "Needs</dt><dd>Nothing.</dd>" not in page
    assert "an operator for each ambiguous attempt" in page


def test_refusals_use_the_right_article() -> None:
    jobs = [f.failed(), f.indeterminate(), f.succeeded(), f.enqueue()]
    for j in jobs:
        for action in ("retry", "cancel", "resolve", "give_up"):
            try:
                operator.operator_action(
                    j.pk, action=action, expected_version=j.version, actor="t", reason="r"
                )
            except ActionRefused as e:
                assert not re.search(r"\ba [aeiou]", str(e)), str(e)
            j.refresh_from_db()
