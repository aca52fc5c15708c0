"""Reads of workflows for the console and ``manage.py workflows``: the newest workflows with
their steps, one workflow's steps, and its audit trail. The states a step is shown in are
decided here once."""

from __future__ import annotations

from typing import Any

from ..models import AuditEntry, Workflow
from ..storage.drivers import driver
from ..storage.workflows import StepRow

__all__ = ["StepRow", "audit", "recent", "steps"]

AUDIT_SHOWN = 50
"""How many of a workflow's audit entries its page shows, newest first."""


def steps(workflow_id: int) -> list[StepRow]:
    """Every step of workflow ``workflow_id`` with its state and parents, in insert order."""
    return driver().workflow_steps(workflow_id)


def recent(limit: int) -> list[tuple[Workflow, list[StepRow]]]:
    """The ``limit`` newest workflows, each with its steps."""
    d = driver()
    return [
        (wf, d.workflow_steps(wf.pk))
        for wf in Workflow.objects.order_by("-created_at", "-id")[:limit]
    ]


def audit(workflow_id: int) -> list[Any]:
    """The newest audit entries of actions on workflow ``workflow_id`` (and its steps)."""
    return list(
        AuditEntry.objects.filter(detail__workflow=workflow_id).order_by("-created_at", "-id")[
            :AUDIT_SHOWN
        ]
    )
