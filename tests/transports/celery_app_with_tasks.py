"""A host project's Celery app with a task of its own beside Tenure's, as during a move from
Celery (docs/celery.md): ``celery -A tests.transports.celery_app_with_tasks worker -Q
<its queue>,<Tenure's queue>``."""

from __future__ import annotations

from pathlib import Path

from config.celery import app

__all__ = ["app", "write_sum"]


@app.task(name="tests.legacy.write_sum")
def write_sum(a: int, b: int, path: str) -> None:
    """A plain Celery task: its effect is a file."""
    Path(path).write_text(str(a + b))
