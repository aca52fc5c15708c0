"""The console is readable (issue 48.5) and the verified fact is the operator's to tick (48.2),
in a real browser against a live server:

* the jobs list fits 1280 px: fixed columns, one line per row whatever the payload, key or
  error, a payload's whole text behind a disclosure;
* the list refreshes live (htmx polling) and holds still while a dialog is open;
* at 390 px (a phone) every navigation link is on screen and works, and no page is wider than
  the screen;
* the resolve dialog arrives with every box unticked, and a submission without a ticked
  effect is refused with a message, changing nothing;
* the words: a finished attempt shows no runtime limit, a retry's dialog names the pause that
  will hold the job, the flash says what happened, a refusal keeps the reason typed;
* screenshots of the overview, jobs, job, queues and schedules pages at 1280 and 390 px are
  stored under ``var/screenshots/`` (``<page>-<width>.png``) by every run.

Uses the browser fixtures of tests/ui/test_browser.py (Chromium at /usr/bin/chromium).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler_core import job
from scheduler_core.models import AuditEntry, Job
from scheduler_core.services import queues, scheduling

from . import factories as f
from .test_browser import browser, log_in, page  # noqa: F401  (fixtures)

pytestmark = pytest.mark.ui

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
"""Where every run stores the console's screenshots (an artefact of the test run)."""


def _tick(ctx: Any, **payload: Any) -> None:
    """Never run: the browser reads the store."""


job(name="ui.readable.report", queue="reports", effect="at_least_once")(_tick)

LONG_PAYLOAD = {
    "customer": {"email": "someone.with.a.long.address@example.com", "name": "A. Customer"},
    "lines": [
        {"sku": f"SKU-{i:05d}", "qty": i, "note": "gift wrap, deliver after 6 pm"}
        for i in range(12)
    ],
    "invoice_id": 1005,
}


def test_the_jobs_list_fits_1280_px_with_one_line_rows(page: Any) -> None:  # noqa: F811
    f.user("victor")
    long = f.enqueue("ui.sync", unique_key="order:" + "7" * 180, **LONG_PAYLOAD)
    f.failed("ui.notify", message="550 mailbox unavailable: " + "the server said no; " * 20)
    f.enqueue("ui.sync")
    log_in(page, "victor")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto("/ops/jobs/")
    table = page.locator("table.jobs")
    table.wait_for()
    box = table.evaluate(
        """t => ({ right: t.getBoundingClientRect().right,
                   main: t.closest('main').getBoundingClientRect().right,
                   page: document.documentElement.scrollWidth,
                   rows: [...t.querySelectorAll('tbody tr')].map(r => r.getBoundingClientRect().height) })"""
    )
    assert box["right"] <= box["main"] + 1 and box["page"] <= 1280, box
    assert len(set(round(h) for h in box["rows"])) == 1 and box["rows"][0] <= 48, box
    # The payload's whole text is one click away, and opening it does not grow the row.
    row = page.locator("table.jobs tbody tr").filter(
        has=page.locator(f'a[href="/ops/jobs/{long.pk}/"]')
    )
    summary = row.locator("details.payload summary")
    summary.click()
    full = page.locator("details.payload[open] .payload-full")
    assert "someone.with.a.long.address@example.com" in full.inner_text()
    assert full.is_visible()
    heights = table.evaluate(
        "t => [...t.querySelectorAll('tbody tr')].map(r => r.getBoundingClientRect().height)"
    )
    assert heights == box["rows"]


def test_the_list_refreshes_live_and_holds_still_while_a_dialog_is_open(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    f.failed("ui.notify")
    log_in(page, "olivia")
    page.goto("/ops/jobs/?state=failed")
    page.locator("table.jobs").wait_for()
    later = f.failed("ui.notify")
    page.locator(f'table.jobs a[href="/ops/jobs/{later.pk}/"]').first.wait_for(timeout=12_000)
    # A dialog open: the list does not refresh under it.
    page.click("text=Retry failed jobs (2)…")
    page.locator("#dialog").wait_for()
    third = f.failed("ui.notify")
    page.wait_for_timeout(7_000)
    assert page.locator("#dialog").is_visible()
    assert page.locator(f'a[href="/ops/jobs/{third.pk}/"]').count() == 0
    # Closed: it refreshes again.
    page.keyboard.press("Escape")
    page.locator(f'table.jobs a[href="/ops/jobs/{third.pk}/"]').first.wait_for(timeout=12_000)


def test_at_390_px_every_navigation_link_is_on_screen_and_works(page: Any) -> None:  # noqa: F811
    f.user("victor")
    log_in(page, "victor")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/ops/")
    links = page.locator("header.top nav a")
    # Overview, jobs, queues, schedules, workflows.
    assert links.count() == 5
    nav = page.locator("header.top nav").bounding_box()
    assert nav is not None
    for i in range(links.count()):
        b = links.nth(i).bounding_box()
        assert b is not None and b["x"] >= 0 and b["x"] + b["width"] <= 390, (i, b)
        # Whole inside the navigation's own box too: a bar that scrolled sideways showed its
        # last link cut at the edge.
        assert nav["x"] <= b["x"] and b["x"] + b["width"] <= nav["x"] + nav["width"], (i, b, nav)
    header = page.locator("header.top").evaluate("h => [h.scrollWidth, h.clientWidth]")
    assert header[0] <= header[1], header
    page.locator("header.top nav a", has_text="Queues").click()
    page.wait_for_url("**/ops/queues/")


def test_at_390_px_no_page_is_wider_than_the_screen(page: Any) -> None:  # noqa: F811
    """A phone reads every page without scrolling it sideways: the panels, the history charts
    and a job's times fit the screen (tables scroll inside their own box)."""
    f.user("olivia", operate=True)
    failed = f.failed("ui.notify", message="550 mailbox unavailable")
    running, _ = f.running("ui.sync", invoice_id=1005)
    f.indeterminate("ui.charge", invoice_id=42, cents=1999)
    f.succeeded("ui.sync")
    f.stuck("ui.notify")
    scheduling.create_schedule(
        name="nightly-report", job_name="ui.readable.report", cron="0 3 * * *", timezone="UTC"
    )
    queues.pause("reports", actor="olivia", reason="vendor maintenance until 14:00")
    log_in(page, "olivia")
    page.set_viewport_size({"width": 390, "height": 844})
    for url in (
        "/ops/",
        "/ops/jobs/",
        f"/ops/jobs/{failed.pk}/",
        f"/ops/jobs/{running.pk}/",
        "/ops/queues/",
        "/ops/schedules/",
        "/ops/workflows/",
    ):
        page.goto(url)
        page.locator("main").wait_for()
        widths = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], (url, widths)


def test_the_resolve_dialog_ticks_nothing_and_refuses_a_submission_without_a_fact(
    page: Any,  # noqa: F811
) -> None:
    f.user("olivia", operate=True)
    j = f.indeterminate("ui.charge", invoice_id=42, cents=1999)
    log_in(page, "olivia")
    page.goto(f"/ops/jobs/{j.pk}/")
    page.click('[data-action="resolve-applied"]')
    dialog = page.locator("#dialog")
    dialog.wait_for()
    boxes = dialog.locator('input[type="checkbox"]')
    assert boxes.count() >= 2
    assert [boxes.nth(i).is_checked() for i in range(boxes.count())] == [False] * boxes.count()
    page.fill("#id_reason", "checked the provider")
    page.check("#id_confirm")
    # Past the browser's own check (a script or an old browser): the server refuses too.
    dialog.locator("form").evaluate("f => { f.noValidate = true; }")
    dialog.locator("button[type=submit]").click()
    page.get_by_text("Tick each effect you verified.").wait_for()
    assert Job.objects.get(pk=j.pk).state == "indeterminate"
    assert not AuditEntry.objects.filter(job=j).exists()


def test_the_operator_reads_in_words_what_holds_a_job_and_what_an_action_did(
    page: Any,  # noqa: F811
) -> None:
    """Issue 48.3 in the browser: a finished attempt shows no runtime limit, the retry's
    dialog names the pause that will hold the job, the flash says what happened in words, and a
    refused action brings the dialog back with the reason typed and the store's reason."""
    f.user("olivia", operate=True)
    j = f.failed()
    queues.pause(j.queue, actor="ops", reason="database migration")
    log_in(page, "olivia")
    page.goto(f"/ops/jobs/{j.pk}/")
    assert page.locator(".attempt-title").all_inner_texts() == ["Attempt 1"]
    assert page.locator(".attempt-deadline").count() == 0
    page.click('[data-action="retry"]')
    dialog = page.locator("#dialog")
    dialog.wait_for()
    assert f"Queue {j.queue} is paused (by ops" in dialog.locator("#queue-hold").inner_text()
    page.fill("#id_reason", "card replaced")
    page.check("#id_confirm")
    dialog.locator("button[type=submit]").click()
    page.get_by_text("retry requested: waiting again (was failed)").wait_for()
    assert "failed → waiting" not in page.locator("ul.messages").inner_text()
    assert Job.objects.get(pk=j.pk).state == "waiting"
    # A fact about an effect the ledger does not hold: the store refuses, the text stays.
    k = f.indeterminate("ui.charge", invoice_id=43, cents=100)
    page.goto(f"/ops/jobs/{k.pk}/")
    page.click('[data-action="resolve-applied"]')
    dialog.wait_for()
    page.fill("#id_reason", "reason typed with care")
    page.check("#id_confirm")
    dialog.locator('input[type="checkbox"][name="effects"]').first.check()
    dialog.locator("form").evaluate(
        """f => { const i = document.createElement('input'); i.type = 'hidden';
                  i.name = 'effects'; i.value = 'nope'; f.appendChild(i); }"""
    )
    dialog.locator("button[type=submit]").click()
    page.get_by_text("Refused").first.wait_for()
    assert page.locator("#id_reason").input_value() == "reason typed with care"
    assert Job.objects.get(pk=k.pk).state == "indeterminate"


def test_screenshots_of_every_page_at_1280_and_390_px(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    driver_jobs = [f.enqueue("ui.sync", invoice_id=1005), f.stuck("ui.notify")]
    failed = f.failed("ui.notify", message="550 mailbox unavailable")
    f.indeterminate("ui.charge", invoice_id=42, cents=1999)
    f.succeeded("ui.sync")
    s = scheduling.create_schedule(
        name="nightly-report", job_name="ui.readable.report", cron="0 3 * * *", timezone="UTC"
    )
    queues.pause("reports", actor="olivia", reason="vendor maintenance until 14:00")
    assert driver_jobs and s
    log_in(page, "olivia")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pages = {
        "overview": "/ops/",
        "jobs": "/ops/jobs/",
        "job": f"/ops/jobs/{failed.pk}/",
        "queues": "/ops/queues/",
        "schedules": "/ops/schedules/",
    }
    for width, height in ((1280, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        for name, url in pages.items():
            page.goto(url)
            page.locator("main").wait_for()
            path = SCREENSHOTS / f"{name}-{width}.png"
            page.screenshot(path=str(path), full_page=True)
            assert path.stat().st_size > 1000, path
