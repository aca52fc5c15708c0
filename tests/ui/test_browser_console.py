"""The console's search, schedules, dialogs, filters and breakdowns in a real browser against a
live server: the search box finds invoice 1005 by payload; a schedule is paused and run now
through its dialogs; a dialog takes focus and Escape closes it; the filters offer the known
queues and job types; at 1280 px the job-type table is fully visible (or scrolls).

Uses the browser fixtures of tests/ui/test_browser.py (Chromium at /usr/bin/chromium:
required when ``CI=true``, skipped with the reason elsewhere). ``TENURE_SCREENSHOTS=<dir>``
also saves ``payload-search.png``, ``schedule.png`` and ``overview-1280.png`` there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler_core import job
from scheduler_core.models import AuditEntry, Job, Schedule
from scheduler_core.services import scheduling

from . import factories as f
from .test_browser import SHOTS, browser, log_in, page  # noqa: F401  (fixtures)

pytestmark = pytest.mark.ui


def shot(page: Any, name: str) -> None:  # noqa: F811
    """Save a screenshot when ``TENURE_SCREENSHOTS`` names a directory."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def _tick(ctx: Any, **payload: Any) -> None:
    """Never run: the browser reads the store."""


job(name="ui.console.report", queue="reports", effect="at_least_once")(_tick)
job(
    name="ui.console.a_job_type_with_a_rather_long_name_for_billing_reconciliation",
    queue="billing",
    effect="at_most_once",
)(_tick)


def test_search_finds_the_job_of_invoice_1005(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    wanted = f.enqueue("ui.charge", invoice_id=1005, customer={"email": "a@b.c"})
    other = f.enqueue("ui.charge", invoice_id=1006, customer={"email": "a@b.c"})
    text_twin = f.enqueue("ui.charge", invoice_id="1005")
    log_in(page, "olivia")
    page.goto("/ops/jobs/")
    page.fill("#id_q", "invoice_id=1005")
    page.press("#id_q", "Enter")
    page.wait_for_url("**/ops/jobs/?*q=invoice_id*")
    rows = page.locator("table.jobs tbody tr")
    rows.first.wait_for()
    assert rows.count() == 1
    assert f"/ops/jobs/{wanted.pk}/" in rows.first.inner_html()
    assert '"invoice_id":1005' in rows.first.inner_text()
    shot(page, "payload-search.png")
    page.fill("#id_q", '{"customer": {"email": "a@b.c"}}')
    page.press("#id_q", "Enter")
    page.locator(f'a[href="/ops/jobs/{other.pk}/"]').first.wait_for()
    assert page.locator("table.jobs tbody tr").count() == 2
    assert page.locator(f'a[href="/ops/jobs/{text_twin.pk}/"]').count() == 0
    page.fill("#id_q", '{"invoice_id": 1005')
    page.press("#id_q", "Enter")
    page.locator(".problem-box").filter(has_text="not valid JSON").wait_for()
    assert page.locator("table.jobs").count() == 0
    assert page.csp_errors == []  # type: ignore[attr-defined]


def test_operator_pauses_a_schedule_and_runs_it_now(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    s = scheduling.create_schedule(
        name="nightly-report", job_name="ui.console.report", cron="0 3 * * *"
    )
    log_in(page, "olivia")
    page.click('nav a[href="/ops/schedules/"]')
    page.wait_for_url("**/ops/schedules/")
    page.click('a:text("nightly-report")')
    page.wait_for_url(f"**/ops/schedules/{s.pk}/")

    page.click('[data-action="pause"]')
    dialog = page.locator("#dialog")
    dialog.wait_for()
    # The dialog takes focus once htmx has settled the swap, a moment after it appears.
    _wait_for_focus(page.locator("#id_reason"))
    page.fill("#id_reason", "Reporting database under maintenance")
    page.check("#id_confirm")
    dialog.locator("button[type=submit]").click()
    page.locator('.badge.big[data-paused="true"]').wait_for()
    assert Schedule.objects.get(pk=s.pk).paused

    page.click('[data-action="run-now"]')
    dialog.wait_for()
    assert "The schedule stays paused." in dialog.inner_text()
    page.fill("#id_reason", "The CFO needs today's report now")
    page.check("#id_confirm")
    dialog.locator("button[type=submit]").click()
    page.locator("tr[data-job]").first.wait_for()
    j = Job.objects.get(schedule_id=s.pk)
    assert j.unique_key.startswith(f"schedule:{s.pk}:manual@")
    assert j.unique_key in page.inner_text("body")
    shot(page, "schedule.png")
    assert set(AuditEntry.objects.values_list("action", flat=True)) == {
        "pause_schedule",
        "run_schedule_now",
    }
    assert page.csp_errors == []  # type: ignore[attr-defined]


def _wait_for_focus(element: Any) -> None:
    """Until ``element`` has the focus. Playwright's own retrying check, run by its injected
    script: a predicate given as a string (``wait_for_function``) is compiled in the page,
    which the dashboard's Content-Security-Policy (no ``unsafe-eval``) refuses whenever the
    first look does not already find it true."""
    from playwright.sync_api import expect

    expect(element).to_be_focused()


def test_the_dialog_takes_focus_and_escape_closes_it(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    failed = f.failed()
    log_in(page, "olivia")
    page.goto(f"/ops/jobs/{failed.pk}/")
    opener = page.locator('[data-action="retry"]')
    opener.click()
    page.locator("#dialog").wait_for()
    # The dialog takes focus once htmx has settled the swap, a moment after it appears.
    _wait_for_focus(page.locator("#id_reason"))
    page.keyboard.press("Escape")
    page.locator("#dialog").wait_for(state="detached")
    _wait_for_focus(opener)
    assert Job.objects.get(pk=failed.pk).state == "failed"
    # The dialog as a whole page (no htmx): Escape follows its Back link.
    page.goto(f"/ops/jobs/{failed.pk}/retry/confirm/")
    _wait_for_focus(page.locator("#id_reason"))
    page.keyboard.press("Escape")
    page.wait_for_url(f"**/ops/jobs/{failed.pk}/")


def test_filters_offer_the_known_queues_and_job_types(page: Any) -> None:  # noqa: F811
    f.user("victor", operate=False)
    log_in(page, "victor")
    page.goto("/ops/jobs/")
    queues = page.eval_on_selector_all("#known-queues option", "os => os.map(o => o.value)")
    types = page.eval_on_selector_all("#known-types option", "os => os.map(o => o.value)")
    assert {"billing", "mail", "reports"} <= set(queues)
    assert {"ui.charge", "ui.console.report"} <= set(types)
    assert page.get_attribute("#id_queue", "list") == "known-queues"
    page.fill("#id_queue", "biling")
    page.press("#id_queue", "Enter")
    page.locator(".unknown-filter").filter(has_text="No queue named biling is known").wait_for()


def test_at_1280_px_the_job_type_table_is_fully_visible(page: Any) -> None:  # noqa: F811
    f.user("victor", operate=False)
    f.enqueue("ui.console.a_job_type_with_a_rather_long_name_for_billing_reconciliation")
    f.failed("ui.charge")
    log_in(page, "victor")
    for width in (1280, 1366):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto("/ops/")
        table = page.locator('table[data-breakdown="name"]')
        table.wait_for()
        box = table.evaluate(
            """t => { const s = t.closest('.scroll'); return {
                 table: t.getBoundingClientRect().right, scroll: s.getBoundingClientRect().right,
                 sw: s.scrollWidth, cw: s.clientWidth,
                 overflow: getComputedStyle(s).overflowX,
                 page: document.documentElement.clientWidth }; }"""
        )
        assert box["scroll"] <= box["page"], box
        fits = box["sw"] <= box["cw"] and box["table"] <= box["scroll"] + 1
        scrolls = box["overflow"] == "auto" and box["sw"] > box["cw"]
        assert fits or scrolls, box
        assert fits, f"at {width} px the job-type table should fit: {box}"
        if width == 1280:
            shot(page, "overview-1280.png")
