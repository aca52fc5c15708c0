"""The job type of ``bench/workflows.py`` (its executors import it: TENURE_JOB_MODULES)."""

from __future__ import annotations

from typing import Any

from scheduler_core import job


@job(name="bench.wf.noop", queue="bench-wf", max_attempts=3)
def noop(ctx: Any, *, i: int = 0) -> None:
    """Nothing: the cost measured is Tenure's own."""
