"""A workflow's page in a real browser against a live server: its steps drawn as an SVG graph
coloured by state (a step after unfinished parents shown blocked), each step a link to its
job's page, and the operator cancelling the whole workflow with a reason. Fails on the code
before (no workflow page).

Needs Chromium at /usr/bin/chromium (see ``tests/ui/test_browser.py``, whose browser fixtures
this reuses). ``TENURE_SCREENSHOTS=<dir>`` also saves ``workflow.png`` there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler_core import workflow
from scheduler_core.models import Job
from scheduler_core.storage.drivers import driver
from tests.ui.test_browser import SHOTS, browser, log_in, page  # noqa: F401 (fixtures)

from . import factories as f

pytestmark = pytest.mark.ui


def _order() -> Any:
    wf = workflow("order.fulfil")
    a = wf.step(f.AT_LEAST_ONCE, name="charge")
    b = wf.step(f.AT_LEAST_ONCE, name="ship", after=[a])
    c = wf.step(f.AT_LEAST_ONCE, name="email", after=[a])
    wf.step(f.AT_LEAST_ONCE, name="close", after=[b, c])
    run = wf.enqueue()
    [lease] = driver().claim(executor=f.EXECUTOR, queues=["default"], job_id=run.jobs["charge"])
    driver().complete(lease)
    return run


def test_the_workflow_page_draws_the_steps_by_state_and_cancels_the_whole(page: Any) -> None:  # noqa: F811
    f.user("olivia", operate=True)
    run = _order()
    log_in(page, "olivia")
    page.click("nav >> text=Workflows")
    page.wait_for_url("**/ops/workflows/")
    page.click(f'tr[data-workflow="{run.id}"] a')
    page.wait_for_url(f"**/ops/workflows/{run.id}/")
    graph = page.locator("#workflow-graph")
    assert graph.locator("a.step").count() == 4
    assert graph.locator("line.edge").count() == 4
    state = {
        n: graph.locator(f'a.step[data-job="{j}"]').get_attribute("data-state")
        for n, j in run.jobs.items()
    }
    assert state == {
        "charge": "succeeded",
        "ship": "waiting",
        "email": "waiting",
        "close": "blocked",
    }
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / "workflow.png"), full_page=True)

    # Each step links to its job's page.
    graph.locator(f'a.step[data-job="{run.jobs["close"]}"]').click()
    page.wait_for_url(f"**/ops/jobs/{run.jobs['close']}/")
    page.go_back()
    page.wait_for_url(f"**/ops/workflows/{run.id}/")

    form = page.locator('form.workflow-action[data-action="cancel"]')
    form.locator("textarea[name=reason]").fill("Order withdrawn by the customer")
    form.locator("input[name=confirm]").check()
    form.locator("button[type=submit]").click()
    page.wait_for_url(f"**/ops/workflows/{run.id}/")
    graph = page.locator("#workflow-graph")
    for name in ("ship", "email", "close"):
        assert (
            graph.locator(f'a.step[data-job="{run.jobs[name]}"]').get_attribute("data-state")
            == "cancelled"
        )
        assert Job.objects.get(pk=run.jobs[name]).state == "cancelled"
    assert "Order withdrawn by the customer" in page.inner_text("body")
    assert not page.csp_errors  # type: ignore[attr-defined]
