"""The console never looks healthy when it is not, in a real browser: with every process
stopped the overview says "down" with its reasons; when the server stops answering the polls,
a banner says since when the page was not updated and the live numbers are greyed out, until a
poll succeeds again; the history charts are SVG drawn from the rolled-up minutes.

Needs Chromium at /usr/bin/chromium (see tests/ui/test_browser.py, whose fixtures it uses).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from scheduler_core.models import MinuteStats
from scheduler_core.services import history
from scheduler_core.services.maintenance import Maintenance
from scheduler_core.storage.drivers import driver

from . import factories as f
from .test_browser import browser, log_in, page  # noqa: F401  (fixtures)

pytestmark = pytest.mark.ui

POLL = re.compile(r".*/ops/(\?.*)?$")
"""The overview's own URL, which its live block polls."""


def test_a_stopped_system_is_shown_as_down_with_its_reasons(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    f.enqueue("ui.sync")
    f.stuck("ui.notify")
    log_in(page, "olivia")
    verdict = page.locator("#verdict")
    assert verdict.get_attribute("data-verdict") == "down"
    reasons = page.locator("#verdict-reasons li")
    keys = {reasons.nth(i).get_attribute("data-reason") for i in range(reasons.count())}
    assert {"no_executor", "no_scheduler", "stuck"} <= keys
    text = verdict.inner_text()
    assert "No live executor while 2 jobs are due" in text
    assert "run_scheduler is not running" in text
    assert "not running" in page.inner_text("#scheduler-liveness")

    # A scheduler and an executor start: the next poll says so without a reload.
    Maintenance(interval=0).beat()
    driver().executor_started(f.EXECUTOR, transport="polling", queues=["default"], concurrency=1)
    page.locator("#scheduler-liveness[data-alive=true]").wait_for()
    assert "alive, last beat" in page.inner_text("#scheduler-liveness")
    assert page.locator("#verdict").get_attribute("data-verdict") == "degraded"  # still stuck
    assert page.csp_errors == []  # type: ignore[attr-defined]


def test_a_failed_poll_shows_since_when_the_page_is_stale(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    log_in(page, "olivia")
    banner = page.locator("#stale-banner")
    assert banner.is_hidden()
    # Every poll now fails at the network: the server cannot be reached.
    page.route(POLL, lambda route: route.abort())
    banner.wait_for(state="visible", timeout=15_000)
    text = banner.inner_text()
    assert re.search(
        r"Not updated since \d\d:\d\d:\d\d UTC \(\d+ s ago\): the dashboard cannot reach the server",
        text,
    ), text
    assert "stale" in (page.locator("#live").get_attribute("class") or "")
    # The age keeps counting while it stays stale.
    first = int(re.search(r"\((\d+) s ago\)", text).group(1))  # type: ignore[union-attr]
    # Read from here, not by a predicate compiled in the page (``wait_for_function``), which
    # the dashboard's Content-Security-Policy (no ``unsafe-eval``) refuses.
    deadline = time.monotonic() + 15
    while int(re.search(r"\((\d+) s ago\)", banner.inner_text()).group(1)) <= first:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the banner's age stopped counting"
        page.wait_for_timeout(200)
    page.unroute(POLL)
    banner.wait_for(state="hidden", timeout=15_000)
    assert "stale" not in (page.locator("#live").get_attribute("class") or "")

    # An answer that is not 2xx is as stale as no answer.
    page.route(
        POLL,
        lambda route: route.fulfill(status=502, body="bad gateway"),
    )
    banner.wait_for(state="visible", timeout=15_000)
    page.unroute(POLL)
    banner.wait_for(state="hidden", timeout=15_000)
    assert page.csp_errors == []  # type: ignore[attr-defined]


def test_history_charts_render_as_svg_from_the_rolled_up_minutes(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    minute = history.minute_floor(driver().now())
    seeded = [
        (3, "billing", "ui.charge", {"succeeded": 5, "failed": 2, "claims": 7}),
        (3, "mail", "ui.notify", {"indeterminate": 1, "retried": 3, "claims": 4}),
        (10, "billing", "ui.charge", {"succeeded": 4, "claims": 4}),
    ]
    for ago, queue, name, counts in seeded:
        MinuteStats.objects.create(
            minute=minute - ago * history.dt.timedelta(minutes=1),
            queue=queue,
            name=name,
            wait_p50_ms=120.0,
            wait_p95_ms=900.0,
            **counts,
        )
    log_in(page, "olivia")
    hour = page.locator("#history-hour")
    assert hour.get_attribute("data-total") == "15"
    assert hour.locator("svg").count() == 2  # outcomes, and the wait lines
    # Found by its minute, not its position: the page may be drawn after the minute turned.
    start = (minute - 3 * history.dt.timedelta(minutes=1)).isoformat()
    three_ago = hour.locator(f'g.bar[data-start="{start}"]')
    assert three_ago.locator("rect[data-outcome=succeeded]").get_attribute("data-n") == "5"
    assert three_ago.locator("rect[data-outcome=retried]").get_attribute("data-n") == "3"
    assert "5 succeeded, 3 retried, 2 failed, 1 indeterminate; 11 claims" in (
        three_ago.locator("title").text_content() or ""
    )
    # Two minutes with a wait, seven minutes apart: two dots on each line, no line between.
    assert hour.locator("[data-line=wait_p95_ms] circle").count() == 2
    assert hour.locator("[data-line=wait_p95_ms] polyline").count() == 0
    assert page.locator("#history-day").get_attribute("data-total") == "15"

    # Filtered by queue: only that queue's minutes.
    page.select_option("select[name=hq]", "billing")
    page.click("#history button[type=submit]")
    page.wait_for_url("**/ops/?hq=billing*")
    assert page.locator("#history-hour").get_attribute("data-total") == "11"
    page.select_option("select[name=ht]", "ui.notify")
    page.select_option("select[name=hq]", "")
    page.click("#history button[type=submit]")
    page.wait_for_url("**ht=ui.notify*")
    assert page.locator("#history-hour").get_attribute("data-total") == "4"
    assert page.csp_errors == []  # type: ignore[attr-defined]
