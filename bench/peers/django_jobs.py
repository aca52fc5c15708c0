"""Handlers for the two Django-based peers."""

from __future__ import annotations

from django_tasks import task

from bench import ping


@task()
def noop_task(seq: int = -1) -> None:
    """The database task backend's handler: nothing, or a latency report."""
    if seq >= 0:
        ping.started(seq)


def noop_q(seq: int = -1) -> None:
    """The cluster's handler: nothing, or a latency report."""
    if seq >= 0:
        ping.started(seq)
