"""``manage.py queues``: the same guarded queue actions as the dashboard, from the command line,
audited with the OS user as actor; a refusal exits non-zero with the reason and changes
nothing."""

from __future__ import annotations

import getpass
import json
import subprocess
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from scheduler_core import job
from scheduler_core.models import AuditEntry, Queue
from scheduler_core.storage.drivers import driver
from tests.conftest import PYTHON, ROOT

pytestmark = pytest.mark.django_db(transaction=True)

Q = "qcli"


@job(name="tests.queuescli.ok", queue=Q)
def ok(ctx: Any) -> None:
    """Nothing."""


def _run(*args: str) -> str:
    out = StringIO()
    call_command("queues", *args, stdout=out)
    return out.getvalue()


def test_pause_from_the_command_line_stops_claims_and_audits_the_os_user() -> None:
    ok.enqueue()
    out = _run("pause", Q, "--reason", "provider outage")
    assert "paused" in out
    assert driver().claim(executor="t:1:cli", queues=[Q], limit=5) == []
    a = AuditEntry.objects.get(action="pause_queue")
    assert a.actor == f"cli:{getpass.getuser()}" and a.reason == "provider outage"
    assert Queue.objects.get(pk=Q).paused_by == f"cli:{getpass.getuser()}"
    _run("resume", Q, "--reason", "provider back")
    assert len(driver().claim(executor="t:1:cli", queues=[Q], limit=5)) == 1


def test_limit_sets_and_clears_limits() -> None:
    _run("limit", Q, "--max-leased", "2", "--max-per-second", "1.5", "--reason", "protect db")
    row = Queue.objects.get(pk=Q)
    assert (row.max_leased, row.max_per_second) == (2, 1.5)
    _run("limit", Q, "--max-leased", "none", "--reason", "lifted")
    row.refresh_from_db()
    assert (row.max_leased, row.max_per_second) == (None, 1.5)
    assert AuditEntry.objects.filter(action="limit_queue").count() == 2


def test_list_shows_paused_state_who_and_why() -> None:
    ok.enqueue()
    _run("pause", Q, "--reason", "maintenance window")
    out = _run("list")
    assert f"{Q}: PAUSED by cli:{getpass.getuser()}" in out and "maintenance window" in out
    [row] = [r for r in json.loads(_run("list", "--json")) if r["name"] == Q]
    assert row["paused"] is True and row["due"] == 1


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("resume", Q, "--reason", "x"), "not paused", 1),
        (("pause", Q, "--reason", "  "), "reason is required", 1),
        (("limit", Q, "--max-leased", "-4", "--reason", "x"), "max_leased must be between", 1),
        (("limit", Q, "--reason", "x"), "give --max-leased", 1),
        (("pause", Q, "--reason", "x", "--expected-version", "3"), "changed since version 3", 3),
        (("pause", "qcli-typo", "--reason", "x"), "no queue named 'qcli-typo' is known", 1),
        (("limit", "qcli-typo", "--max-leased", "2", "--reason", "x"), "is known", 1),
        (("pause", Q, "--reason", "x" * 4001), "4001 characters, more than the 4000", 1),
    ],
)
def test_a_refusal_raises_with_the_reason_and_changes_nothing(
    args: tuple[str, ...], message: str, code: int
) -> None:
    with pytest.raises(CommandError, match=message) as e:
        _run(*args)
    assert e.value.returncode == code
    assert not Queue.objects.exists() and not AuditEntry.objects.exists()


def test_a_refusal_exits_non_zero_from_the_shell(child_env: dict[str, str]) -> None:
    p = subprocess.run(
        [PYTHON, "manage.py", "queues", "resume", Q, "--reason", "nothing to resume"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "refused: queue qcli is not paused" in p.stderr


def test_an_unknown_queue_is_paused_only_with_create() -> None:
    out = _run("pause", "qcli-new", "--reason", "before its first deploy", "--create")
    assert "qcli-new: paused" in out
    assert Queue.objects.get(pk="qcli-new").paused


def test_a_known_queue_with_no_jobs_is_listed_and_can_be_paused() -> None:
    # Known because a job type routes to it: no job, no settings row yet.
    assert any(r["name"] == Q for r in json.loads(_run("list", "--json")))
    _run("pause", Q, "--reason", "quiet hours")
    assert Queue.objects.get(pk=Q).paused


def test_list_says_what_holds_each_queue() -> None:
    ok.enqueue()
    _run("pause", Q, "--reason", "maintenance window")
    out = _run("list")
    assert "held back: 1 (1 paused)" in out
