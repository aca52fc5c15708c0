"""The dashboard in a real browser against a live server: log in, read every category, resolve
an indeterminate job through its confirmation dialog, see the audit row; retry one whose
earlier owner may still be in flight; a viewer sees no buttons.

Needs Chromium at /usr/bin/chromium: required when ``CI=true``, skipped (with the reason)
elsewhere. ``TENURE_SCREENSHOTS=<dir>`` also saves ``overview.png``, ``resolve-dialog.png``,
``in-flight-job.png`` and ``in-flight-retry-dialog.png`` there (the docs' images come from
``TENURE_SCREENSHOTS=docs/img``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.domain.modes import GUARANTEES, EffectMode
from scheduler_core.models import AuditEntry, Job
from scheduler_core.read import health
from scheduler_core.storage.drivers import driver
from tests.conftest import wait_until

from . import factories as f

IDEMPOTENT_PROMISE = GUARANTEES[EffectMode.IDEMPOTENT].promise

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOTS = os.environ.get("TENURE_SCREENSHOTS", "")

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # The test thread reads the database while Playwright's sync API holds an event loop;
    # Django would refuse that as "async" even though every call here is synchronous.
    old = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            yield b
            b.close()
    finally:
        if old is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = old


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=live_server.url)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    pg.csp_errors = []  # type: ignore[attr-defined]
    pg.on(
        "console",
        lambda m: (
            pg.csp_errors.append(m.text)  # type: ignore[attr-defined]
            if m.type == "error" and "Content Security Policy" in m.text
            else None
        ),
    )
    yield pg
    context.close()


def log_in(page: Any, username: str) -> None:
    page.goto("/ops/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", f.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/ops/")


def every_category() -> dict[str, Job]:
    """One job in each health category (an abandoned one needs its 1 s lease to run out)."""
    driver().executor_started(
        f.EXECUTOR, transport="polling", queues=["default", "billing"], concurrency=4
    )
    made = {
        "waiting_due": f.enqueue("ui.sync"),
        "waiting_scheduled": f.scheduled("ui.notify"),
        "waiting_backing_off": f.backing_off("ui.sync"),
        "running": f.running("ui.charge", invoice_id=7, cents=1250)[0],
        "overrunning": f.overrunning(),
        "failing_repeatedly": f.backing_off("ui.charge", attempts=3),
        "stuck": f.stuck("ui.notify"),
        "indeterminate": f.indeterminate(
            "ui.charge", message="read timeout after request sent", invoice_id=42, cents=1999
        ),
        "failed": f.failed("ui.notify", message="550 mailbox unavailable"),
        "succeeded_recently": f.succeeded("ui.sync"),
        "abandoned": f.abandoned(),
    }
    wait_until(lambda: health.health_counts()["abandoned"] == 1, timeout=10)
    return made


def test_operator_sees_every_category_and_resolves_an_indeterminate_job(page: Any) -> None:
    f.user("olivia", operate=True)
    made = every_category()
    log_in(page, "olivia")

    counts = health.health_counts()
    for key in made:
        card = page.locator(f'[data-category="{key}"] .card-count')
        expected = 1 if key == "succeeded_recently" else counts[key]
        assert card.inner_text() == str(expected), key
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / "overview.png"), full_page=True)

    # The overview refreshes in place (htmx poll): a new failure shows up without a reload.
    f.failed("ui.sync")
    page.locator('[data-category="failed"] .card-count').filter(has_text="2").wait_for()

    page.click('[data-category="indeterminate"]')
    page.wait_for_url("**/ops/jobs/?health=indeterminate")
    job = made["indeterminate"]
    page.click(f'a[href="/ops/jobs/{job.pk}/"] >> nth=0')
    page.wait_for_url(f"**/ops/jobs/{job.pk}/")
    assert "read timeout after request sent" in page.inner_text("body")

    page.click('[data-action="resolve-applied"]')
    dialog = page.locator("#dialog")
    dialog.wait_for()
    assert "I verified at the destination that each effect I ticked happened" in dialog.inner_text()
    # The verified fact is the operator's to assert: no box comes ticked, and the browser
    # does not send the form until the one effect in question is.
    boxes = dialog.locator('input[type="checkbox"]')
    assert [boxes.nth(i).is_checked() for i in range(boxes.count())] == [False] * boxes.count()
    assert IDEMPOTENT_PROMISE in dialog.inner_text()
    page.fill("#id_reason", "Provider dashboard shows charge ch_123 captured")
    page.check("#id_confirm")
    assert dialog.locator("form").evaluate("f => f.checkValidity()") is False
    dialog.locator('input[name="effects"][value="charge"]').check()
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / "resolve-dialog.png"))
    dialog.locator("button[type=submit]").click()

    page.wait_for_url(f"**/ops/jobs/{job.pk}/")
    assert page.locator(".badge.big").inner_text() == "succeeded"
    audit = page.locator("table.audit tbody tr")
    assert audit.count() == 1
    row = audit.first.inner_text()
    assert "olivia" in row and "Provider dashboard shows charge ch_123 captured" in row
    assert "indeterminate → succeeded" in row
    assert Job.objects.get(pk=job.pk).state == "succeeded"
    assert AuditEntry.objects.filter(job=job, verified="applied").count() == 1
    assert page.csp_errors == []  # type: ignore[attr-defined]


def test_operator_retries_an_indeterminate_job_whose_owner_may_be_in_flight(page: Any) -> None:
    f.user("olivia", operate=True)
    job = f.reaped("ui.short_notify")
    log_in(page, "olivia")
    page.goto(f"/ops/jobs/{job.pk}/")
    owner = page.locator("#owner")
    assert f.OWNER in owner.inner_text()
    assert "no: not known to have stopped" in owner.inner_text()
    assert "it will send when it resumes" in owner.inner_text()
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / "in-flight-job.png"), full_page=True)

    page.click('[data-action="retry-not-applied"]')
    dialog = page.locator("#dialog")
    dialog.wait_for()
    text = dialog.inner_text()
    assert f.OWNER in text and "not known to have stopped" in text
    assert "If it is paused between its check and its send, it will send when it resumes" in text
    assert "only a destination that checks the fencing token closes this window" in text
    effect = dialog.locator('input[name="effects"][value="charge"]')
    assert not effect.is_checked()  # the operator ticks what they verified, never the page
    effect.check()
    page.fill("#id_reason", "Mail server log: no message for this key")
    page.check("#id_confirm")
    # Without the acknowledgment the form is not complete, so the browser does not send it.
    accept = dialog.locator("#id_accept_in_flight")
    assert accept.evaluate("e => e.validity.valueMissing") is True
    assert dialog.locator("form").evaluate("f => f.checkValidity()") is False
    accept.check()
    assert dialog.locator("form").evaluate("f => f.checkValidity()") is True
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / "in-flight-retry-dialog.png"))
    dialog.locator("button[type=submit]").click()

    page.wait_for_url(f"**/ops/jobs/{job.pk}/")
    assert page.locator(".badge.big").inner_text() == "waiting"
    assert "indeterminate → waiting" in page.locator("table.audit tbody tr").first.inner_text()
    # Settled now, so its history is folded; opening it shows the operator's fact.
    page.locator('[data-effect="charge"] summary').click()
    fact = page.locator('[data-effect="charge"] [data-event="operator"]')
    assert "Mail server log: no message for this key" in fact.inner_text()
    assert Job.objects.get(pk=job.pk).state == "waiting"
    audit = AuditEntry.objects.get(job=job)
    assert audit.detail["accepted_in_flight"] is True
    assert audit.detail["in_flight_owners"] == [f.OWNER]
    assert audit.detail["effects"] == ["charge"]
    assert page.csp_errors == []  # type: ignore[attr-defined]


def test_viewer_sees_no_action_buttons(page: Any) -> None:
    f.user("victor", operate=False)
    job = f.indeterminate("ui.charge")
    log_in(page, "victor")
    assert page.locator('[data-category="indeterminate"] .card-count').inner_text() == "1"
    page.goto(f"/ops/jobs/{job.pk}/")
    assert page.locator(".badge.big").inner_text() == "indeterminate"
    assert page.locator("[data-action]").count() == 0
    page.goto("/ops/jobs/?state=indeterminate")
    assert page.locator(".bulk").count() == 0
    response = page.goto(f"/ops/jobs/{job.pk}/resolve-applied/confirm/")
    assert response is not None and response.status == 403
    assert Job.objects.get(pk=job.pk).state == "indeterminate"
