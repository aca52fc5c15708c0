"""Celery on Redis with nothing behind it: the transport's own ceiling.

Configured as Tenure's Celery app is (JSON, late acknowledgement, prefetch 1, no results), so
the two differ only by what Tenure does per message.
"""

from __future__ import annotations

import os

from celery import Celery

from bench import ping

app = Celery("bench", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    task_reject_on_worker_lost=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.nothing", ignore_result=True)
def nothing(seq: int = -1) -> None:
    """Nothing, except reporting its start for the latency workload."""
    if seq >= 0:
        ping.started(seq)
