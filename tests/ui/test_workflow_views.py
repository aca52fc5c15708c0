"""The workflow pages through the test client: the graph and the steps' table, viewers see no
actions and may not post one, a stale page gets 409 and changes nothing, and the jobs list
filters a workflow's steps. Fails on the code before (no workflow pages)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduler_core import workflow
from scheduler_core.models import AuditEntry, Job
from scheduler_core.services import workflows

from . import factories as f

pytestmark = pytest.mark.django_db


def _two() -> Any:
    wf = workflow("pair")
    a = wf.step(f.AT_LEAST_ONCE, name="first")
    wf.step(f.AT_LEAST_ONCE, name="second", after=[a])
    return wf.enqueue()


def test_viewer_sees_the_graph_and_no_actions(view_client: Client) -> None:
    run = _two()
    r = view_client.get(f"/ops/workflows/{run.id}/")
    body = r.content.decode()
    assert r.status_code == 200
    assert body.count('class="step"') == 2 and 'data-state="blocked"' in body
    assert "workflow-action" not in body
    r = view_client.post(
        f"/ops/workflows/{run.id}/cancel/", {"reason": "x", "confirm": "on", "seen": ""}
    )
    assert r.status_code == 403
    assert Job.objects.filter(state="waiting").count() == 2


def test_a_stale_page_gets_409_and_changes_nothing(op_client: Client) -> None:
    run = _two()
    seen = workflows.seen_versions(run.id)
    workflows.workflow_action(run.id, action="cancel", actor="someone", reason="first")
    before = AuditEntry.objects.count()
    r = op_client.post(
        f"/ops/workflows/{run.id}/retry/", {"reason": "again", "confirm": "on", "seen": seen}
    )
    assert r.status_code == 409
    assert AuditEntry.objects.count() == before


def test_the_jobs_list_filters_a_workflows_steps(view_client: Client) -> None:
    run = _two()
    f.enqueue("ui.sync")
    r = view_client.get(f"/ops/jobs/?workflow={run.id}")
    body = r.content.decode()
    for job_id in run.jobs.values():
        assert f"/ops/jobs/{job_id}/" in body
    assert body.count('href="/ops/jobs/') - body.count("/confirm/") >= 2
    other = Job.objects.exclude(pk__in=run.jobs.values()).get()
    assert f'href="/ops/jobs/{other.pk}/"' not in body


def test_a_steps_job_page_links_its_workflow(view_client: Client) -> None:
    run = _two()
    body = view_client.get(f"/ops/jobs/{run.jobs['second']}/").content.decode()
    assert f'href="/ops/workflows/{run.id}/"' in body
    assert "when its parent steps have succeeded" in body
    assert "9999" not in body


def test_a_reason_over_the_limit_is_refused_with_the_limit_and_kept_in_the_form(
    op_client: Client,
) -> None:
    """As a job's or a queue's action: the workflow's form says the limit and keeps the text
    (fails on the code before: a bare 400 page, the text lost)."""
    from scheduler_core.domain.reasons import REASON_MAX_CHARS

    run = _two()
    seen = workflows.seen_versions(run.id)
    long = "r" * (REASON_MAX_CHARS + 1)
    before = (AuditEntry.objects.count(), list(Job.objects.values_list("state", flat=True)))
    r = op_client.post(
        f"/ops/workflows/{run.id}/cancel/", {"reason": long, "confirm": "on", "seen": seen}
    )
    body = r.content.decode()
    assert r.status_code == 400
    assert f"A reason is at most {REASON_MAX_CHARS} characters" in body
    assert 'id="refused-cancel"' in body and f">{long}</textarea>" in body
    assert (AuditEntry.objects.count(), list(Job.objects.values_list("state", flat=True))) == (
        before
    )


def test_a_reason_at_the_limit_is_kept_whole_in_the_workflow_s_audit(op_client: Client) -> None:
    """A step's audit names the workflow action; when the prefix and the reason no longer fit
    the limit together, it points to the workflow's entry, which keeps the reason whole (before,
    the step refused a length the operator did not type)."""
    from scheduler_core.domain.reasons import REASON_MAX_CHARS

    run = _two()
    reason = "x" * REASON_MAX_CHARS
    workflows.workflow_action(run.id, action="cancel", actor="ops", reason=reason)
    entry = AuditEntry.objects.get(action="workflow_cancel")
    assert entry.reason == reason
    steps = AuditEntry.objects.filter(job__isnull=False)  # the first; it calls off the second
    assert steps.exists()
    assert all("the reason is in the workflow's audit entry" in a.reason for a in steps)
