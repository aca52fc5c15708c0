"""Celery adapter: a message carries only a job id; the claim decides who runs it.

``celery -A config worker -Q default`` runs Tenure jobs: each pool process claims the one job a
message names through :func:`scheduler_core.store.claim`, renews the lease from one heartbeat
thread per process, and records the end through the write seam, as the broker-less executor
does.

Messages are JSON only (``accept_content=["json"]``), so a pickle-typed message is refused by
the worker before anything is deserialised. A duplicated message finds the job already leased
or finished and is dropped with a log line; a lost one is re-sent by the dispatcher. A future
``run_at`` is held in the database, never as a broker ETA.

A message is a wake-up, not an assignment: after its job succeeds, the task claims the next due
job of the same queue inside that completion's transaction (as the broker-less executor does)
and runs it too, for up to ``TENURE_CELERY_CHAIN_SECONDS`` per message. A job taken this way is
claimed like any other; its own message, arriving later, finds it leased or finished and is
dropped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.db import DatabaseError
from django.db import connection as db_connection

from .. import conf, executor, store

log = logging.getLogger("tenure.transports.celery")

TASK_NAME = "tenure.run"

_state: dict[str, Any] = {}
_lock = threading.Lock()


def _process_executor() -> tuple[str, executor.Heartbeater]:
    """This worker process's identity and heartbeat thread, created after fork."""
    with _lock:
        if _state.get("pid") != os.getpid():
            executor.limit_idle_transactions()
            db_connection.close()  # reopened with the limit
            executor_id = store.new_executor_id("celery")
            store.executor_started(executor_id, transport="celery", queues=["*"], concurrency=1)
            hb = executor.Heartbeater(executor_id)
            hb.start()
            _state.update(pid=os.getpid(), id=executor_id, hb=hb)
        return _state["id"], _state["hb"]


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _process_stopped(**_: Any) -> None:
    """Mark this pool process's executor row stopped when the pool retires it."""
    if _state.get("pid") != os.getpid():
        return
    _state["hb"].stop()
    try:
        store.executor_stopped(_state["id"])
    except DatabaseError:
        log.warning("could not mark executor %s stopped", _state["id"])


@shared_task(name=TASK_NAME, ignore_result=True)  # type: ignore[untyped-decorator]
def run_job(job_id: Any) -> str:
    """Claim the job named by the message, if it is still waiting and due, and run it."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        log.warning("dropped message with a job id that is not an integer: %r", job_id)
        return "dropped"
    executor.drop_connection_if_broken()
    executor_id, hb = _process_executor()
    leases = store.claim(executor=executor_id, job_id=job_id, limit=1)
    if not leases:
        log.info("dropped hint for job %s: unknown, not waiting, or not yet due", job_id)
        store.log_event("hint_dropped", job=job_id)
        return "dropped"
    chain_until = time.monotonic() + conf.get().CELERY_CHAIN_SECONDS

    def wanted() -> int:
        return 1 if time.monotonic() < chain_until else 0

    lease: store.Lease | None = leases[0]
    outcome = ""
    while lease is not None:
        store.log_event("claim", job=lease.job_id, fence=lease.fence, attempt_kind=lease.kind)
        nxt = executor.NextClaim(executor=executor_id, queues=[lease.queue], wanted=wanted)
        outcome = executor.run_lease(lease, heartbeater=hb, next_claim=nxt)
        store.log_event("end", job=lease.job_id, fence=lease.fence, outcome=outcome)
        lease = nxt.got[0] if nxt.got else None
    return outcome


def publish(job_id: int, queue: str) -> None:
    """Publish a hint for ``job_id`` on broker queue ``queue`` (JSON, no ETA)."""
    run_job.apply_async(args=[job_id], queue=queue, serializer="json")
