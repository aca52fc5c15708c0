"""Operator actions on a whole workflow, from the service and ``manage.py workflows``: cancel
(waiting steps end cancelled, running ones are asked to stop), retry (failed steps wait again
with the steps their failure called off), each step through the single-job guarded action
with its audit row, plus one for the workflow. Fails on the code before (no such command)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from scheduler_core import Permanent, job, workflow
from scheduler_core.exceptions import ActionRefused
from scheduler_core.models import AuditEntry, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import workflows
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "workflow-actions"
EXEC = "t:1:workflow-actions"
broken: set[str] = set()


@job(name="tests.wfa.step", queue=Q, effect="at_least_once", max_attempts=1)
def step(ctx: Any, *, label: str) -> str:
    if label in broken:
        raise Permanent(f"{label} is broken")
    return label


@pytest.fixture(autouse=True)
def _fresh() -> None:
    broken.clear()


def _chain() -> Any:
    wf = workflow("three", on_failure="continue")
    a = wf.step(step, name="a", label="a")
    b = wf.step(step, name="b", after=[a], label="b")
    wf.step(step, name="c", after=[b], label="c")
    return wf.enqueue()


def _run_due() -> None:
    while leases := driver().claim(executor=EXEC, queues=[Q], limit=10):
        for lease in leases:
            run_lease(lease)


def _states(run: Any) -> dict[str, str]:
    return {n: Job.objects.get(pk=j).state for n, j in run.jobs.items()}


def test_cancel_ends_waiting_steps_and_asks_running_ones_to_stop() -> None:
    run = _chain()
    driver().claim(executor=EXEC, queues=[Q])
    result = workflows.workflow_action(run.id, action="cancel", actor="olivia", reason="order void")
    assert _states(run) == {"a": "leased", "b": "cancelled", "c": "cancelled"}
    assert Job.objects.get(pk=run.jobs["a"]).cancel_requested_at is not None
    # c ended with b's cancel ("upstream cancelled: b"), in the same transaction and audit row.
    assert result.moved == [run.jobs["a"], run.jobs["b"]]
    assert Job.objects.get(pk=run.jobs["c"]).reason == "upstream cancelled: b"
    assert AuditEntry.objects.filter(action="workflow_cancel").count() == 1
    assert AuditEntry.objects.filter(job_id__in=run.jobs.values()).count() == 2


def test_retry_sends_failed_steps_back_with_the_steps_they_called_off() -> None:
    broken.add("b")
    run = _chain()
    _run_due()
    assert _states(run) == {"a": "succeeded", "b": "failed", "c": "cancelled"}
    broken.clear()
    out = io.StringIO()
    call_command("workflows", "retry", str(run.id), "--reason", "fixed the label", stdout=out)
    assert f"workflow {run.id}: retry moved 1 step(s)" in out.getvalue()
    assert _states(run) == {"a": "succeeded", "b": "waiting", "c": "waiting"}
    _run_due()
    assert _states(run) == {"a": "succeeded", "b": "succeeded", "c": "succeeded"}


def test_nothing_to_do_is_refused_and_changes_nothing() -> None:
    run = _chain()
    _run_due()
    with pytest.raises(ActionRefused, match="no step to retry"):
        workflows.workflow_action(run.id, action="retry", actor="olivia", reason="why not")
    with pytest.raises(CommandError, match="needs --reason"):
        call_command("workflows", "cancel", str(run.id))
    assert not AuditEntry.objects.exists()


def test_list_and_show() -> None:
    run = _chain()
    out = io.StringIO()
    call_command("workflows", "list", "--json", stdout=out)
    [row] = json.loads(out.getvalue())
    assert row["id"] == run.id and row["steps"] == {"waiting": 3}
    out = io.StringIO()
    call_command("workflows", "show", str(run.id), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert [s["name"] for s in shown["steps"]] == ["a", "b", "c"]
    assert shown["steps"][2]["parents"] == [run.jobs["b"]]
