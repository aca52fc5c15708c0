"""The history block's own URL and the overview's liveness blocks, without a browser: guarded
like every dashboard page, the block alone for htmx, filters that match nothing draw empty
charts, escaped values, and the overview's verdict and processes panel."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler_core.models import MinuteStats
from scheduler_core.services import history
from scheduler_core.services.maintenance import Maintenance
from scheduler_core.storage.drivers import driver

from . import factories as f

pytestmark = pytest.mark.django_db


def _seed(queue: str = "billing", name: str = "ui.charge", **counts: Any) -> None:
    MinuteStats.objects.create(
        minute=history.minute_floor(driver().now()) - dt.timedelta(minutes=2),
        queue=queue,
        name=name,
        wait_p50_ms=10.0,
        wait_p95_ms=20.0,
        **(counts or {"succeeded": 3, "claims": 3}),
    )


def test_history_is_guarded_like_every_dashboard_page(client: Client, view_client: Client) -> None:
    url = reverse("admin_ui:history")
    r = client.get(url)
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    _seed()
    r = view_client.get(url)
    assert r.status_code == 200
    assert "script-src 'self'" in r["Content-Security-Policy"]
    html = r.content.decode()
    assert html.count("<svg") == 4 and "<script>" not in html and " style=" not in html


def test_htmx_gets_only_the_history_block_with_its_filters(view_client: Client) -> None:
    _seed()
    _seed(queue="mail", name="ui.notify", failed=2, claims=2)
    r = view_client.get(reverse("admin_ui:history"), {"hq": "mail"}, headers={"HX-Request": "true"})
    html = r.content.decode()
    assert html.lstrip().startswith('<section class="panel" id="history"') and "<html" not in html
    assert 'hx-trigger="every 30s"' in html and "hq=mail" in html
    assert 'id="history-hour" data-total="2"' in html
    assert '<option value="mail" selected>' in html


def test_a_filter_that_matches_nothing_draws_empty_charts_and_is_escaped(
    view_client: Client,
) -> None:
    _seed()
    r = view_client.get(reverse("admin_ui:overview"), {"hq": f.XSS, "ht": "nope"})
    assert r.status_code == 200
    html = r.content.decode()
    assert 'id="history-hour" data-total="0"' in html
    assert f.XSS not in html


def test_the_overview_heads_with_the_verdict_and_shows_the_processes(view_client: Client) -> None:
    f.enqueue("ui.sync")
    html = view_client.get(reverse("admin_ui:overview")).content.decode()
    assert html.index('id="verdict"') < html.index('class="cards"')
    assert 'data-verdict="down"' in html
    assert 'data-reason="no_executor"' in html and 'data-reason="no_scheduler"' in html
    assert 'id="scheduler-liveness" data-alive="false"' in html
    assert 'id="stale-banner"' in html and "admin_ui/liveness.js" in html
    Maintenance(interval=0).beat()
    driver().executor_started(f.EXECUTOR, transport="polling", queues=["default"], concurrency=1)
    html = view_client.get(reverse("admin_ui:overview")).content.decode()
    assert 'data-verdict="healthy"' in html
    assert "alive</span>, last beat" in html
    # The 4 s poll carries the verdict too, and leaves the charts to their own poll.
    part = view_client.get(
        reverse("admin_ui:overview"), headers={"HX-Request": "true"}
    ).content.decode()
    assert 'id="verdict"' in part and 'id="history"' not in part


def test_wait_lines_join_neighbouring_minutes_and_leave_gaps(view_client: Client) -> None:
    now = history.minute_floor(driver().now())
    for ago in (2, 3, 4, 9):
        MinuteStats.objects.create(
            minute=now - dt.timedelta(minutes=ago),
            queue="billing",
            name="ui.charge",
            succeeded=1,
            claims=1,
            wait_p50_ms=5.0 * ago,
            wait_p95_ms=9.0 * ago,
        )
    html = view_client.get(
        reverse("admin_ui:history"), headers={"HX-Request": "true"}
    ).content.decode()
    hour = html[html.index('id="history-hour"') : html.index('id="history-day"')]
    p95 = hour[hour.index('data-line="wait_p95_ms"') :]
    p95 = p95[: p95.index("</g>")]
    assert p95.count("<polyline") == 1  # minutes 4, 3, 2 ago; minute 9 ago stands alone
    assert p95.count("<circle") == 4
    assert "36 ms" in p95  # 9 x 4 minutes ago, in its dot's title
