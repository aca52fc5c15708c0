"""Queues in a real browser against a live server: an operator pauses a queue from the
overview's queues section with a reason, sees who paused it and why (its due jobs shown as
waiting because of the pause, not stuck), and resumes it; a viewer sees no buttons.

Needs Chromium at /usr/bin/chromium (see ``tests/ui/test_browser.py``, whose browser fixtures
this reuses). ``TENURE_SCREENSHOTS=<dir>`` also saves ``queues.png`` and
``queue-pause-dialog.png`` there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler_core.models import AuditEntry, Queue
from scheduler_core.read import health
from scheduler_core.storage.drivers import driver
from tests.ui.test_browser import SHOTS, browser, log_in, page  # noqa: F401 (fixtures)

from . import factories as f

pytestmark = pytest.mark.ui

QUEUE = "default"


def test_operator_pauses_a_queue_with_a_reason_sees_who_and_why_and_resumes(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    waiting = f.enqueue("ui.sync")
    log_in(page, "olivia")
    assert "No queue is paused or limited." in page.inner_text("#queues-summary")

    page.click('#queues-summary a[href="/ops/queues/"] >> nth=0')
    page.wait_for_url("**/ops/queues/")
    row = page.locator(f'tr[data-queue="{QUEUE}"]')
    assert "Running" in row.inner_text()
    row.locator("a", has_text="Pause").click()
    page.wait_for_url(f"**/ops/queues/{QUEUE}/pause/confirm/")
    dialog = page.locator("#dialog")
    text = dialog.inner_text()
    assert "no executor or transport" in text and "1 due job(s) will wait" in text
    page.fill("#id_reason", "Billing provider outage, INC-4411")
    page.check("#id_confirm")
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / "queue-pause-dialog.png"))
    dialog.locator("button[type=submit]").click()

    page.wait_for_url("**/ops/queues/")
    row = page.locator(f'tr[data-queue="{QUEUE}"]')
    text = row.inner_text()
    assert "Paused" in text and "olivia" in text and "Billing provider outage, INC-4411" in text
    assert Queue.objects.get(pk=QUEUE).paused
    assert driver().claim(executor="t:1:ui", queues=[QUEUE], limit=5) == []
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / "queues.png"), full_page=True)

    # The overview says why the queue's jobs wait.
    page.goto("/ops/")
    summary = page.locator("#queues-summary").inner_text()
    assert "Paused by olivia" in summary and "INC-4411" in summary
    assert "1 due job waits because the queue is paused" in summary
    assert health.health_counts()["paused"] == 1

    page.goto("/ops/queues/")
    page.locator(f'tr[data-queue="{QUEUE}"] a', has_text="Resume").click()
    page.wait_for_url(f"**/ops/queues/{QUEUE}/resume/confirm/")
    page.fill("#id_reason", "Provider back")
    page.check("#id_confirm")
    page.locator("#dialog button[type=submit]").click()
    page.wait_for_url("**/ops/queues/")
    assert "Running" in page.locator(f'tr[data-queue="{QUEUE}"]').inner_text()
    [lease] = driver().claim(executor="t:1:ui", queues=[QUEUE], limit=5)
    assert lease.job_id == waiting.pk
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "actor", "reason"))
    assert actions == [
        ("pause_queue", "olivia", "Billing provider outage, INC-4411"),
        ("resume_queue", "olivia", "Provider back"),
    ]
    assert page.csp_errors == []  # type: ignore[attr-defined]


def test_viewer_sees_the_paused_queue_but_no_buttons(page: Any) -> None:  # noqa: F811
    from scheduler_core.services import queues

    f.user("victor", operate=False)
    f.enqueue("ui.sync")
    queues.pause(QUEUE, actor="olivia", reason="maintenance")
    log_in(page, "victor")
    assert "maintenance" in page.inner_text("#queues-summary")
    page.goto("/ops/queues/")
    row = page.locator(f'tr[data-queue="{QUEUE}"]')
    assert "Paused" in row.inner_text() and "maintenance" in row.inner_text()
    assert page.locator("a", has_text="Resume").count() == 0
    assert page.locator("a", has_text="Pause").count() == 0
    assert page.locator("a", has_text="Set limits").count() == 0
