"""RQ adapter (through django-rq): a message carries only a job id; the claim decides.

``python manage.py rqworker default`` runs Tenure jobs with :class:`Worker` (django-rq's
``WORKER_CLASS``), which forks a work horse per message as RQ does. The horse claims the one
job the message names through :meth:`~scheduler_core.storage.base.Driver.claim`, renews the lease from its
own heartbeat thread and records the end through the write seam, as the broker-less executor
does. The worker process itself registers one executor row and keeps it alive.

Only JSON crosses the broker. RQ's default serializer is pickle, and ``rqworker`` hands pickle
to the worker unless told otherwise; :class:`Worker` and :class:`Job` use the JSON serializer
whatever they are given, so no payload is ever unpickled. A message that cannot be read as
JSON, or that asks for anything but :func:`run_job` with one argument (another function,
callbacks, webhooks, dependencies), is refused: logged, deleted from Redis, nothing run.

A duplicated message finds the job leased or finished and is dropped with a log line; a lost
one is re-sent by the dispatcher; a future ``run_at`` stays in the database (no RQ scheduling).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import redis
import rq
import rq.job
from django.db import DatabaseError
from rq.serializers import JSONSerializer

from ..api.hints import register_publisher
from ..read import metrics
from ..runtime.attempt import run_lease
from ..runtime.connections import limit_idle_transactions, register_executor
from ..runtime.heartbeat import Heartbeater
from ..storage.drivers import driver
from ..storage.records import new_executor_id

log = logging.getLogger("tenure.transports.rq")

TASK_PATH = "scheduler_core.transports.rq.run_job"
FAILURE_TTL = 24 * 3600
"""How long RQ keeps the record of a message whose horse died (the job's truth is the DB's)."""

# The worker process's executor identity. Forked horses inherit it, so every attempt a worker
# runs names the worker as its executor.
_worker: dict[str, Any] = {}
_own: dict[str, Any] = {}
_lock = threading.Lock()
_connections: dict[str, redis.Redis] = {}


# ---------------------------------------------------------------------------------------------
# Executing a message
# ---------------------------------------------------------------------------------------------


def _executor_id() -> str:
    """The worker's executor id, or (outside :class:`Worker`) one registered per process."""
    if "id" in _worker:
        return str(_worker["id"])
    with _lock:
        if _own.get("pid") != os.getpid():
            limit_idle_transactions()
            driver().connection.close()  # reopened with the limit
            executor_id = new_executor_id("rq")
            register_executor(executor_id, transport="rq", queues=["*"], concurrency=1)
            _own.update(pid=os.getpid(), id=executor_id)
        return str(_own["id"])


def run_job(job_id: Any) -> str:
    """Claim the job named by the message, if it is still waiting and due, and run it."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        log.warning("dropped message with a job id that is not an integer: %r", job_id)
        return "dropped"
    try:
        executor_id = _executor_id()
        leases = driver().claim(executor=executor_id, job_id=job_id, limit=1)
        metrics.claimed(leases)
        if not leases:
            log.info("dropped hint for job %s: unknown, not waiting, or not yet due", job_id)
            return "dropped"
        hb = Heartbeater(executor_id, beat_executor=False)
        hb.start()
        try:
            return run_lease(leases[0], heartbeater=hb)
        finally:
            hb.stop()
    finally:
        driver().connection.close()


# ---------------------------------------------------------------------------------------------
# Worker and job classes: JSON only, one function only
# ---------------------------------------------------------------------------------------------


class Job(rq.job.Job):
    """RQ's job, read and written with the JSON serializer whatever serializer it is given."""

    def __init__(self, id: str | None = None, connection: Any = None, serializer: Any = None):
        super().__init__(id, connection=connection, serializer=JSONSerializer)


def refusal(job: rq.job.Job) -> str | None:
    """Why a message must not run, or None when it is a plain hint for :func:`run_job`."""
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as e:
        return f"its payload is not JSON ({type(e).__name__})"
    if func_name != TASK_PATH:
        return f"it names {func_name!r}, not {TASK_PATH}"
    if instance is not None or kwargs or not isinstance(args, list | tuple) or len(args) != 1:
        return "its arguments are not exactly one job id"
    extras = ("_success_callback_name", "_failure_callback_name", "_stopped_callback_name")
    if any(getattr(job, name, None) for name in extras) or getattr(job, "webhooks", None):
        return "it asks for callbacks or webhooks"
    if getattr(job, "_dependency_ids", None):
        return "it depends on other messages"
    return None


class Worker(rq.Worker):
    """``rqworker``'s worker for Tenure: JSON only, refuses foreign messages, one executor row.

    Each message still runs in a forked work horse; the horse's heartbeat thread renews the
    lease, and this process's own heartbeat thread keeps the executor row alive between jobs.
    SIGTERM is RQ's warm shutdown: no new message is taken and the running one finishes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = Job
        super().__init__(*args, **kwargs)
        for q in self.queues:
            q.serializer = JSONSerializer
            q.job_class = Job

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """Register this worker as an executor before taking messages."""
        super().bootstrap(*args, **kwargs)
        limit_idle_transactions()  # inherited by the forked horses
        executor_id = new_executor_id("rq")
        register_executor(executor_id, transport="rq", queues=self.queue_names(), concurrency=1)
        # Horses are forked from this thread: it must hold no database connection to share.
        driver().connection.close()
        hb = Heartbeater(executor_id)
        hb.start()
        _worker.update(id=executor_id, hb=hb)

    def subscribe(self) -> None:
        """Listen on this worker's control channel, reading it in waits of one second.

        RQ reads the channel in waits of 60 s, and at shutdown waits for the read under way
        to end. If the reader takes the reply to the shutdown's UNSUBSCRIBE before it is told
        to stop, it starts another read, and a warm shutdown lasts a minute after its last
        job (tests/transports/test_rq_messages.py::
        test_a_warm_shutdown_does_not_wait_out_a_read_of_the_control_channel).
        """
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=1, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def teardown(self) -> None:
        """Mark this worker's executor row stopped."""
        hb = _worker.get("hb")
        if hb is not None and not self.is_horse:
            hb.stop()
            try:
                driver().executor_stopped(_worker["id"])
            except DatabaseError:
                log.warning("could not mark executor %s stopped", _worker["id"])
            driver().connection.close()
        super().teardown()  # type: ignore[no-untyped-call]

    def execute_job(self, job: rq.job.Job, queue: rq.Queue) -> None:
        """Fork a horse for a plain hint; refuse anything else before it can run."""
        reason = refusal(job)
        if reason is not None:
            log.warning("refused message %s on %s: %s; nothing was run", job.id, queue.name, reason)
            self._discard(job.id, queue)
            return
        super().execute_job(job, queue)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
        """RQ's dequeue, except that a message that cannot even be loaded is refused and
        skipped instead of stopping the worker."""
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except redis.exceptions.RedisError:
                raise
            except Exception as e:
                job_id, queue = getattr(e, "job_id", None), getattr(e, "queue", None)
                if job_id is None or queue is None:
                    raise
                log.warning(
                    "refused message %s: it cannot be loaded (%r); nothing was run", job_id, e
                )
                self._discard(job_id, queue)

    def _discard(self, job_id: str, queue: rq.Queue) -> None:
        """Delete a refused message and its hash; it was never started, so no registry holds it."""
        with self.connection.pipeline() as p:
            p.lrem(queue.intermediate_queue_key, 0, job_id)
            p.delete(rq.job.Job.key_for(job_id))
            p.execute()


# ---------------------------------------------------------------------------------------------
# Publishing
# ---------------------------------------------------------------------------------------------


def _queue(name: str) -> rq.Queue:
    """An RQ queue for broker queue ``name``, on the connection ``RQ_QUEUES`` gives it."""
    from django.conf import settings
    from django_rq.connection_utils import filter_connection_params, get_redis_connection

    config = settings.RQ_QUEUES.get(name)
    if config is None:
        raise LookupError(f"RQ_QUEUES has no entry for queue {name!r}")
    params = filter_connection_params(config)
    key = repr(sorted(params.items()))
    conn = _connections.get(key)
    if conn is None:
        conn = _connections.setdefault(key, get_redis_connection(params))
    return rq.Queue(name, connection=conn, serializer=JSONSerializer, job_class=Job)


def publish(job_id: int, queue: str) -> None:
    """Publish a hint for ``job_id`` on broker queue ``queue`` (JSON, no RQ scheduling).

    The hint has no RQ timeout: a running job's limit is its lease and its type's
    ``timeout``, kept by the database, not by RQ killing the horse.
    """
    _queue(queue).enqueue_call(
        TASK_PATH,
        args=(job_id,),
        timeout=-1,
        result_ttl=0,
        failure_ttl=FAILURE_TTL,
        description=f"tenure job {job_id}",
    )


register_publisher("rq", publish)
