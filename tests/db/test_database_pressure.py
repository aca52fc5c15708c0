"""What the database holds back: the oldest snapshot and the job table's dead rows, in
``jobs_status``, ``/metrics`` and the dashboard (PostgreSQL; SQLite readers hold nothing)."""

from __future__ import annotations

import io
import time
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client

from scheduler_core import job
from scheduler_core.read import health
from scheduler_core.storage.drivers import driver
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.pressure.noop", queue="pressure")
def noop(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _churn(n: int) -> None:
    """Claim and complete ``n`` jobs: two dead versions of each row behind a held snapshot."""
    noop.enqueue_many([{"n": i} for i in range(n)])
    while got := driver().claim(executor="t:1:pressure", queues=["pressure"], limit=50):
        for lease in got:
            driver().complete(lease)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's snapshots")
def test_a_held_snapshot_and_the_dead_rows_it_keeps_are_reported(
    monkeypatch: pytest.MonkeyPatch, admin_client: Client
) -> None:
    monkeypatch.setattr(health, "HELD_BACK_AFTER_SECONDS", 0.5)
    monkeypatch.setattr(health, "HELD_BACK_DEAD_ROWS", 100)
    s = connection.settings_dict
    reader = psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], dbname=s["NAME"],
        application_name="forgotten-report",
    )  # fmt: skip
    try:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM tenure_job").fetchone()
        _churn(300)
        time.sleep(0.6)

        def reported() -> dict[str, Any] | None:
            p = health.database_pressure()
            return p if p and p["job_dead_rows"] > 100 else None

        p = wait_until(reported, timeout=30, interval=0.2)
        assert p["held_back"] is True
        assert p["oldest_snapshot"]["application"] == "forgotten-report"
        assert p["oldest_snapshot_seconds"] >= 0.5
        assert health.status()["database"]["held_back"] is True
        out = io.StringIO()
        call_command("jobs_status", stdout=out)
        assert "forgotten-report" in out.getvalue() and "HELD BACK" in out.getvalue()
        page = admin_client.get("/ops/").content.decode()
        assert 'id="held-back"' in page and "forgotten-report" in page
        from scheduler_core.read import metrics

        text = admin_client.get("/metrics").content.decode()
        assert "tenure_db_held_back 1.0" in text, metrics
        assert "tenure_db_oldest_snapshot_seconds" in text
    finally:
        reader.close()
    assert health.database_pressure()["held_back"] is False  # type: ignore[index]


def test_sqlite_reports_no_database_pressure() -> None:
    if connection.vendor == "postgresql":
        assert health.database_pressure() is not None
    else:
        assert health.database_pressure() is None
