"""``manage.py jobs list|show`` and what the command line reads: the dashboard's filters and
one job's record (attempts, ledger, audit, the actions it is offered), read through the same
functions as the dashboard, so the two say the same. Each test fails on the code before the
reads existed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_core.read.jobs import JobFilter, job_record
from scheduler_core.services.offered import offered
from tests.db.test_jobs_cli import jobs_cli
from tests.ui import factories as f

pytestmark = pytest.mark.django_db(transaction=True)


def test_list_takes_the_dashboards_filters_and_prints_json(capsys: Any) -> None:
    failed = f.failed()
    waiting = f.enqueue()
    code, out, err = jobs_cli(capsys, "list", "--state", "failed", "--json")
    assert (code, err) == (0, "")
    rows = json.loads(out)["jobs"]
    assert [r["id"] for r in rows] == [failed.pk]
    assert [j.pk for j in JobFilter(state="failed").queryset()] == [failed.pk]
    code, out, _ = jobs_cli(capsys, "list")
    assert code == 0 and str(waiting.pk) in out and str(failed.pk) in out


def test_list_health_matches_the_dashboards_category(capsys: Any) -> None:
    f.stuck()
    f.enqueue()
    code, out, _ = jobs_cli(capsys, "list", "--health", "stuck", "--json")
    assert code == 0
    ids = [r["id"] for r in json.loads(out)["jobs"]]
    assert ids == [j.pk for j in JobFilter(health="stuck").queryset().order_by("-id")]
    assert len(ids) == 1


def test_list_says_what_a_bare_number_searched(capsys: Any) -> None:
    j = f.enqueue()
    code, out, _ = jobs_cli(capsys, "list", "--search", str(j.pk))
    assert code == 0 and f"A bare number is a job id: job {j.pk}" in out


def test_list_refuses_an_unknown_state(capsys: Any) -> None:
    code, _, err = jobs_cli(capsys, "list", "--state", "stuck")
    assert code == 2 and "invalid choice" in err


def test_show_prints_attempts_ledger_audit_and_the_offered_actions(capsys: Any) -> None:
    j = f.indeterminate()
    code, out, err = jobs_cli(capsys, "show", str(j.pk), "--json")
    assert (code, err) == (0, "")
    shown = json.loads(out)
    record = job_record(j)
    assert [a["fence"] for a in shown["attempts"]] == [a.fence for a in record["attempts"]]
    assert [e["effect"] for e in shown["ledger"]] == [r.effect.name for r in record["ledger"]]
    assert [o["action"] for o in shown["offered"]] == [s.label for s in offered(j)]
    assert any("--fact applied" in o["command"] for o in shown["offered"])
    code, out, _ = jobs_cli(capsys, "show", str(j.pk))
    assert "attempt 1 fence" in out and "ledger:" in out and "offered:" in out


def test_show_of_a_job_that_does_not_exist_exits_non_zero(capsys: Any) -> None:
    code, _, err = jobs_cli(capsys, "show", "999999")
    assert code == 1 and "does not exist" in err


def test_an_action_still_needs_a_reason(capsys: Any) -> None:
    j = f.failed()
    code, _, err = jobs_cli(capsys, "retry", str(j.pk))
    assert code == 1 and "reason is required" in err
