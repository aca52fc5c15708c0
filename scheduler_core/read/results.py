"""Jobs' results, read: what a succeeded job's handler returned, kept by its fenced
completion (:mod:`scheduler_core.api.results`). ``job.result`` reads one; these read by id,
for code that holds ids (a step reading its parents' results, the dashboard)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..models import Job


def results_of(job_ids: Iterable[int]) -> dict[int, Any]:
    """The result of each succeeded job among ``job_ids``, by id, in one query; a job that has
    not succeeded (or does not exist) is left out, so a missing id and a ``None`` result are
    told apart."""
    return Job.objects.filter(pk__in=list(job_ids)).results()


def result_of(job_id: int) -> Any:
    """The result of job ``job_id``: the JSON value its handler returned in the attempt whose
    completion was accepted; ``None`` while it has not succeeded or when it returned none
    (:func:`results_of` tells those apart)."""
    return results_of([job_id]).get(job_id)
