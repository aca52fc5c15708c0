"""Celery adapter: a message carries only a job id; the claim decides who runs it.

``celery -A config worker -Q default`` runs Tenure jobs: each pool process claims the one job a
message names through :meth:`~scheduler_core.storage.base.Driver.claim`, renews the lease from one heartbeat
thread per process, and records the end through the write seam, as the broker-less executor
does.

Messages are JSON only (``accept_content=["json"]``), so a pickle-typed message is refused by
the worker before anything is deserialised. A duplicated message finds the job already leased
or finished and is dropped with a log line; a lost one is re-sent by the dispatcher. A future
``run_at`` is held in the database, never as a broker ETA.

A message is a wake-up, not an assignment: after its job succeeds, the task claims the next due
jobs of the same queue and runs them too, for up to ``TENURE_CELERY_CHAIN_SECONDS`` per
message, their successful completions committed together (:mod:`scheduler_core.runtime.chain`). A job
taken this way is claimed like any other; its own message, arriving later, is dropped: without
a query when this process saw the job's completion commit, else at a claim that finds it
leased or finished.

A warm shutdown (SIGTERM to the worker) lets each pool process finish its task, and the task's
chain stops claiming: the worker's main process sets a flag in memory it shares with the pool
processes (created at import, before the pool forks), which a chain reads before every claim;
a pool process whose parent is gone stops claiming too. The jobs a chain had claimed and not
started are given back, and a hint that reaches a pool process after that is dropped unclaimed
(the dispatcher sends it again).

The task is registered when this module is imported, which the core app does at start-up when
``TENURE_TRANSPORT = "celery"``: a host project does not list Tenure's modules in
``autodiscover_tasks``. The options recovery relies on are the task's own (late
acknowledgement, no redelivery when a pool child is lost, JSON), and a worker whose app would
override them, accept anything but JSON or cancel running attempts when the broker connection
drops refuses to start (``transports.checks.celery_problems``).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import threading
import time
from collections import deque
from typing import Any

from celery import shared_task
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)
from django.db import DatabaseError

import scheduler_core.hooks as hooks

from ..api import hints
from ..api.hints import EVERY_QUEUE, register_publisher
from ..conf import tenure_settings
from ..read import metrics
from ..runtime.chain import Chain
from ..runtime.connections import (
    drop_connection_if_broken,
    limit_idle_transactions,
    register_executor,
)
from ..runtime.heartbeat import Heartbeater
from ..services.maintenance import dispatch_once
from ..storage.drivers import driver
from ..storage.records import Lease, new_executor_id
from .checks import celery_problems

log = logging.getLogger("tenure.transports.celery")

TASK_NAME = "tenure.run"

_state: dict[str, Any] = {}
_lock = threading.Lock()

_shutting_down = multiprocessing.RawValue(ctypes.c_bool, False)
"""Set in the worker's main process when it begins to shut down; the pool processes forked
from it share this memory, so their chains see it before their next claim."""


_announced = multiprocessing.RawValue(ctypes.c_bool, False)
"""Set by the first pool process of this worker that hints the backlog (shared, like
:data:`_shutting_down`, by the pool processes forked after import)."""
_announce_lock = multiprocessing.Lock()


class _Recent:
    """Job ids whose success this process committed in the last ``ttl`` seconds (at most
    ``size``). Succeeded is a final state (no operator action leaves it), so a hint for one of
    them needs no claim of that job (only of its queue's next, :func:`_next_of_queue`); the time bound keeps a reset database's reused ids from being
    dropped for longer than that (the dispatcher re-sends a due job's hint)."""

    def __init__(self, size: int, ttl: float) -> None:
        self._order: deque[tuple[float, int]] = deque()
        self._ids: dict[int, float] = {}
        self._size = size
        self._ttl = ttl

    def __contains__(self, job_id: object) -> bool:
        at = self._ids.get(job_id) if isinstance(job_id, int) else None
        return at is not None and time.monotonic() - at < self._ttl

    def extend(self, job_ids: list[int]) -> None:
        now = time.monotonic()
        for job_id in job_ids:
            self._ids[job_id] = now
            self._order.append((now, job_id))
        while self._order and (
            len(self._order) > self._size or now - self._order[0][0] >= self._ttl
        ):
            at, job_id = self._order.popleft()
            if self._ids.get(job_id) == at:
                del self._ids[job_id]


_finished_here = _Recent(100_000, ttl=60.0)


def _process_executor() -> tuple[str, Heartbeater]:
    """This worker process's identity and heartbeat thread, created after fork.

    Raises :class:`DatabaseError` while the process cannot register; the next call tries
    again (a pool process forked while the database restarts registers once it is back)."""
    with _lock:
        if _state.get("pid") != os.getpid():
            limit_idle_transactions()
            driver().connection.close()  # reopened with the limit
            executor_id = new_executor_id("celery")
            hb = Heartbeater(executor_id)
            _state.clear()
            _state.update(pid=os.getpid(), ppid=os.getppid(), id=executor_id, hb=hb)
        if not _state.get("registered"):
            register_executor(
                _state["id"], transport="celery", queues=_consumed_queues(), concurrency=1
            )
            _state["hb"].start()
            _state["registered"] = True
        return _state["id"], _state["hb"]


def _announce_backlog() -> None:
    """Once this pool process is registered, hint the due jobs of the queues it consumes that
    no message announced (enqueued while no worker consumed them), as the dispatcher would on
    its next round: the first worker to start does not wait for ``run_scheduler``'s round and
    its registry read.

    Only the first pool process of a worker to register does it (:data:`_announced`, shared
    by the pool): when every one of 16 pool processes published its own 500 hints, the
    publishing took the two cores the pool's other processes needed to start, and the worker
    began consuming about 5.5 s after its start instead of 2.5 s (``bench.startup``). The
    chains its hints start take the rest of the queue. Best effort: one that fails lets the
    next process try, and the dispatcher still covers what this misses."""
    with _announce_lock:
        if _announced.value:
            return
        _announced.value = True
    try:
        hints.CONSUMERS.forget()
        sent = dispatch_once()
        if sent:
            log.info("pool process %s hinted %d jobs waiting for a consumer", os.getpid(), sent)
    except DatabaseError as exc:
        log.info("pool process %s could not hint the backlog (%s)", os.getpid(), exc)
        _announced.value = False
    finally:
        driver().connection.close()


def _register_until_done() -> None:
    """Register this pool process, then hint what waited for a consumer; while the database
    cannot be reached, try again once a second until it succeeds or the process should stop:
    until it is registered no process sends its queues hints, so a pool process that could not
    reach the database at fork would otherwise wait for a message that never comes. Runs in a
    thread of its own, whose database connection it closes when done."""
    try:
        while not stopping():
            try:
                _process_executor()
                log.info("pool process %s registered as %s", os.getpid(), _state["id"])
                _announce_backlog()
                return
            except DatabaseError as exc:
                log.warning("pool process %s not registered yet: %s", os.getpid(), exc)
                drop_connection_if_broken()
            time.sleep(1.0)
    finally:
        driver().connection.close()


def _consumed_queues() -> list[str]:
    """The broker queues this worker consumes (``-Q``), or every queue when it cannot say.

    The executor registry hands them to every process that enqueues: a queue no live worker
    consumes gets no hints."""
    try:
        names = sorted(str(q) for q in run_job.app.amqp.queues.consume_from)
    except Exception:  # an app without queue configuration: claim them all
        return [EVERY_QUEUE]
    return names or [EVERY_QUEUE]


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _process_started(**_: Any) -> None:
    """Register the pool process (prefork, solo) from a thread of its own, before its first
    message can need it: until a live consumer of its queues is registered, no process sends
    them hints. Not in this receiver: a pool process takes messages only once it has returned.
    Registered here, the 16 pool processes of two workers on 2 cores were registered between
    1.7 and 5.7-6.1 s after the workers' start and the first job was claimed at 4.7-6.1 s; from
    a thread, the last registration and the first claim came at 4.2-4.3 s (``bench.startup``;
    2.1-2.5 s with :func:`_freeze_startup_objects` too). A message that comes first waits for
    the registration (:func:`_process_executor` holds its lock) or registers the process itself.

    The thread's connection is its own: Celery's Django fixup, a receiver of the same signal,
    closes by number the file descriptors of the connections this thread (the process's main
    thread) holds, and a connection opened here would later be closed a second time by number,
    which by then may name another thread's socket (a pool process's claim once failed so)."""
    threading.Thread(target=_register_until_done, name="tenure-register", daemon=True).start()


@worker_init.connect  # type: ignore[untyped-decorator]
def _freeze_startup_objects(**_: Any) -> None:
    """Put the objects of the worker's start-up (Django, the project and Tenure loaded: about
    100,000) out of the garbage collector's reach before the pool forks (``gc.freeze()``).

    Celery collects garbage in the worker's main process before each fork of a pool process,
    and a full collection walked them all: 55 ms a fork, eight forks a worker, one after
    another, so a worker's last pool process started about 0.8 s after its first. Frozen,
    they are skipped; they live as long as the process anyway, and the pool processes then
    share their pages instead of copying them when they collect."""
    gc.freeze()


@worker_init.connect  # type: ignore[untyped-decorator]
def _refuse_unsafe_configuration(sender: Any = None, **_: Any) -> None:
    """A worker whose Celery app would weaken what recovery relies on does not start.

    Celery logs and ignores an error raised by a ``worker_init`` receiver, so this exits."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    found = celery_problems(app.conf.get)
    task = app.tasks.get(TASK_NAME)
    if task is None:
        found.append(("tenure.E015", f"the worker's app has no task {TASK_NAME!r}", ""))
    else:
        changed = {
            name: getattr(task, name)
            for name, value in TASK_OPTIONS.items()
            if name != "ignore_result" and getattr(task, name, None) != value
        }
        if changed:
            found.append(
                (
                    "tenure.E015",
                    f"the worker's app overrides the options of Tenure's task {TASK_NAME}: "
                    f"{changed} (Tenure needs {TASK_OPTIONS})",
                    "Remove the override (task_annotations, or a task class of your own).",
                )
            )
    if found:
        lines = [f"{check_id}: {message} {hint}".strip() for check_id, message, hint in found]
        log.critical("refusing to start: %s", "; ".join(lines))
        raise SystemExit("Tenure refuses to start this Celery worker:\n" + "\n".join(lines))


@worker_shutting_down.connect  # type: ignore[untyped-decorator]
def _worker_shutting_down(**_: Any) -> None:
    """The worker's main process received a shutdown signal: the pool's chains stop claiming."""
    _shutting_down.value = True


def stopping() -> bool:
    """Whether this pool process should claim nothing more: its worker is shutting down, or
    the process that forked it is gone (it would be reparented)."""
    ppid = _state.get("ppid")
    return bool(_shutting_down.value) or (ppid is not None and os.getppid() != ppid)


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _process_stopped(**_: Any) -> None:
    """Mark this pool process's executor row stopped when the pool retires it."""
    if _state.get("pid") != os.getpid():
        return
    _state["hb"].stop()
    try:
        driver().executor_stopped(_state["id"])
    except DatabaseError:
        log.warning("could not mark executor %s stopped", _state["id"])


TASK_OPTIONS: dict[str, Any] = {
    # Acknowledged after the job ran: a worker killed before taking it hands the hint back.
    "acks_late": True,
    # A pool child lost mid-job does not make the broker redeliver forever: the database's
    # reaper owns recovery, and a redelivered hint would be absorbed by the claim anyway.
    "reject_on_worker_lost": False,
    "serializer": "json",
    "ignore_result": True,
}
"""The options of Tenure's task, set on the task itself so no app setting is needed."""


@shared_task(name=TASK_NAME, **TASK_OPTIONS)  # type: ignore[untyped-decorator]
def run_job(job_id: Any) -> str:
    """Claim the job named by the message, if it is still waiting and due, or else the next
    due job of its queue (:func:`_next_of_queue`), and run it and the queue's next jobs
    (:class:`~scheduler_core.runtime.chain.Chain`)."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        log.warning("dropped message with a job id that is not an integer: %r", job_id)
        return "dropped"
    drop_connection_if_broken()
    executor_id, hb = _process_executor()
    if stopping():
        log.info("dropped hint for job %s: this worker is shutting down", job_id)
        hooks.event("hint_dropped", job=job_id)
        return "dropped"
    if job_id in _finished_here:
        log.info("dropped hint for job %s: it succeeded in this process", job_id)
        hooks.event("hint_dropped", job=job_id)
        leases = []
    else:
        leases = driver().claim(executor=executor_id, job_id=job_id, limit=1)
        metrics.claimed(leases)
        if not leases:
            log.info("dropped hint for job %s: unknown, not waiting, or not yet due", job_id)
            hooks.event("hint_dropped", job=job_id)
    if not leases:
        leases = _next_of_queue(job_id, executor_id)
        if not leases:
            return "dropped"
    run = Chain(
        executor_id=executor_id,
        queue=leases[0].queue,
        heartbeater=hb,
        seconds=tenure_settings().CELERY_CHAIN_SECONDS,
        window=tenure_settings().CELERY_COMMIT_WINDOW,
        stopping=stopping,
    )
    try:
        return run.run(leases[0])
    finally:
        _finished_here.extend(run.succeeded)


def _next_of_queue(job_id: int, executor_id: str) -> list[Lease]:
    """A message is a wake-up, not an assignment: when its job was taken already, claim the
    next due job of the job's queue instead, and chain from it.

    On a backlog the chains of the pool's processes claim the queue's oldest jobs ahead of
    their own hints, so almost every hint arrives for a job already taken; dropping them
    left most processes idle between messages while one or two chains drained the queue
    (a drain of 4,000 jobs by 2 x 8 pool processes: 2,729 of 2,740 tasks dropped their hint,
    13.0 s; 8.2 s with this, docs/transports.md)."""
    queue = driver().queue_of(job_id)
    if queue is None:
        return []
    leases = driver().claim(executor=executor_id, queues=[queue], limit=1)
    metrics.claimed(leases)
    if leases:
        log.info(
            "hint for job %s: claimed job %s of queue %s instead", job_id, leases[0].job_id, queue
        )
    return leases


def publish(job_id: int, queue: str) -> None:
    """Publish a hint for ``job_id`` on broker queue ``queue`` (JSON, no ETA)."""
    run_job.apply_async(args=[job_id], queue=queue, serializer="json")


register_publisher("celery", publish)
