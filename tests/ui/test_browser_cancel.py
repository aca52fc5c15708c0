"""Cancelling a running job in a real browser: the operator opens a running job, asks it to
stop through the confirmation dialog (which says the handler must cooperate and that effects
already applied stay applied), and the page then shows who asked when, while it runs and once
its attempt has ended the job.

Needs Chromium at /usr/bin/chromium (see ``tests/ui/test_browser.py``, whose fixtures this
module reuses)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.domain import outcomes
from scheduler_core.domain.modes import EffectMode
from scheduler_core.models import AuditEntry, Job
from scheduler_core.storage.drivers import driver

from . import factories as f
from .test_browser import browser, log_in, page  # noqa: F401  (fixtures reused)

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


def test_operator_cancels_a_running_job_and_the_page_shows_the_request(
    page: Any,  # noqa: F811
) -> None:
    f.user("olivia", operate=True)
    job, lease = f.running("ui.charge", invoice_id=1005, cents=1250)
    log_in(page, "olivia")
    page.goto(f"/ops/jobs/{job.pk}/")
    assert page.locator(".badge.big").inner_text() == "leased"
    assert page.locator("#cancel-request").count() == 0

    page.click('[data-action="cancel-running"]')
    dialog = page.locator("#dialog")
    dialog.wait_for()
    text = dialog.inner_text()
    assert "The handler must cooperate" in text
    assert "Effects already applied stay applied" in text
    assert "no new effect starts" in text
    page.fill("#id_reason", "Vendor API hung; the customer cancelled")
    page.check("#id_confirm")
    dialog.locator("button[type=submit]").click()

    page.wait_for_url(f"**/ops/jobs/{job.pk}/")
    assert page.locator(".badge.big").inner_text() == "leased"  # it runs until it stops
    request = page.locator("#cancel-request")
    shown = request.inner_text()
    assert "Cancel requested at" in shown and "by olivia" in shown
    assert "Vendor API hung; the customer cancelled" in shown
    assert "Waiting for the running attempt to stop" in shown
    assert page.locator('[data-action="cancel-running"]').count() == 0  # asked once
    row = Job.objects.get(pk=job.pk)
    assert row.cancel_requested_at is not None
    audit = AuditEntry.objects.get(job=job)
    assert (audit.actor, audit.action) == ("olivia", "cancel_running")

    # The attempt learns it at its next renewal and stops: the page shows the outcome.
    assert driver().heartbeat(lease) is True
    decision = outcomes.after_cancel_request(
        outcomes.Situation(mode=EffectMode.AT_LEAST_ONCE, attempt=1, max_attempts=3, age_seconds=1),
        handler_stopped=True,
    )
    driver().finish(lease, decision, outcome="cancelled")
    page.reload()
    assert page.locator(".badge.big").inner_text() == "cancelled"
    assert (
        "The attempt stopped: the job was cancelled."
        in page.locator("#cancel-request").inner_text()
    )
    assert page.csp_errors == []  # type: ignore[attr-defined]
