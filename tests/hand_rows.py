"""Rows written by hand, as a database edited outside Tenure would hold them: tests that need a
job in a state no enqueue gives it write it here, past ``Job.save()``'s refusal."""

from __future__ import annotations

from typing import Any

from django.db import models

from scheduler_core.models import Job


def hand_job(**fields: Any) -> Job:
    """Insert one job row (no spec row) with ``fields``, as a hand-written ``INSERT`` would."""
    job = Job(**fields)
    models.Model.save(job, force_insert=True)
    return job
