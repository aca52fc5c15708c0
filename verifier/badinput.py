"""The hostile-input sweep: bad payloads through the API, forged messages straight into the
broker, forged and stale posts to the operator dashboard. Each must be refused or quarantined,
nothing may execute, nothing may be lost, and the pickle payload's file must never appear.

Runs as the ``sweep`` role (Django set up on the run's database, executors still running)
and writes ``sweep.json`` for the checker. The broker part needs Redis (``CHAOS_REDIS_URL``)
and starts one Celery worker on a queue of its own.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import pickle
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import transaction

from scheduler_core import conf
from scheduler_core.api import registry
from scheduler_core.exceptions import EnqueueError
from scheduler_core.services import maintenance

from .fleet import ROOT

JOB = "chaos.transactional"
"""The job type hostile payloads are aimed at (its destination is the job database itself)."""
BROKER_JOB = "chaos.noop"
BROKER_JOB_QUEUE = "sweep"


def _case(case: str, ok: bool, observed: str) -> dict[str, Any]:
    return {"case": case, "ok": bool(ok), "observed": observed[:300]}


def _job_count() -> int:
    from scheduler_core.models import Job

    return Job.objects.count()


# ---------------------------------------------------------------------------------------------
# Through the API
# ---------------------------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def api_cases() -> list[tuple[str, Callable[[], Any]]]:
    """Hostile enqueues: each must raise ``EnqueueError`` and write nothing."""
    future = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)

    def enq(payload: Any, **kw: Any) -> Callable[[], Any]:
        return lambda: registry.enqueue(JOB, payload, **kw)

    return [
        ("NaN number", enq({"n": 1, "work": math.nan})),
        ("infinite number", enq({"n": 1, "work": math.inf})),
        ("NUL in a string", enq({"n": 1, "slow": "a\x00b"})),
        ("lone surrogate (invalid UTF-8)", enq({"n": 1, "slow": "\udcff"})),
        ("NUL in a key", enq({"n\x00": 1})),
        ("nesting 200 deep", enq({"n": _nested(200)})),
        ("integer beyond 64 bits", enq({"n": 2**70})),
        ("payload of 1 MB", enq({"n": 1, "slow": "x" * 1_000_000})),
        ("payload not an object", enq([1, 2, 3])),
        ("non-string key", enq({1: 1})),
        ("unknown keyword", enq({"n": 1, "rm_rf": True})),
        ("missing keyword", enq({})),
        ("bytes value", enq({"n": b"\xff\xfe"})),
        ("unknown job name", lambda: registry.enqueue("os.system", {"command": "true"})),
        ("run_at in year 9999", enq({"n": 1}, run_at=future)),
        ("naive run_at", enq({"n": 1}, run_at=dt.datetime(2030, 1, 1))),
        ("run_at as a string", enq({"n": 1}, run_at="tomorrow")),
        ("priority 10**9", enq({"n": 1}, priority=10**9)),
        ("queue no job type routes to", enq({"n": 1}, queue="no-such-queue")),
        ("run_at and delay together", enq({"n": 1}, run_at=dt.datetime.now(dt.UTC), delay=5)),
        ("negative delay", enq({"n": 1}, delay=-60)),
        ("delay as a string", enq({"n": 1}, delay="soon")),
        ("unique_key of 10 000 characters", enq({"n": 1}, unique_key="k" * 10_000)),
        ("unique_key with NUL", enq({"n": 1}, unique_key="a\x00b")),
    ]


def sweep_api() -> list[dict[str, Any]]:
    """Run every hostile enqueue; ok when it raised ``EnqueueError`` and no row appeared."""
    out = []
    for name, call in api_cases():
        before = _job_count()
        try:
            with transaction.atomic():
                call()
            observed, refused = "accepted", False
        except EnqueueError as e:
            observed, refused = f"refused: {e}", True
        except Exception as e:  # refused, but not with the documented error type
            observed, refused = f"raised {type(e).__name__}: {e}", False
        written = _job_count() - before
        out.append(_case(f"api: {name}", refused and written == 0, f"{observed}; rows +{written}"))
    return out


# ---------------------------------------------------------------------------------------------
# Straight into the broker
# ---------------------------------------------------------------------------------------------


class _CreatesFile:
    """Unpickling this opens (creates) a file: proof that a worker deserialised pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _celery_headers(task: str, args_repr: str) -> dict[str, Any]:
    task_id = str(uuid.uuid4())
    return {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "eta": None,
        "expires": None,
        "argsrepr": args_repr,
        "kwargsrepr": "{}",
        "origin": "chaos-sweep",
    }


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _publish(url: str, queue: str, messages: list[tuple[str, bytes, str, str, str]]) -> None:
    """Publish raw messages ``(case, body, content_type, encoding, task)`` to ``queue``."""
    import kombu

    k: Any = kombu  # kombu ships no type hints
    with k.Connection(url) as conn:
        conn.ensure_connection(max_retries=3)
        k.Queue(queue, routing_key=queue)(conn.default_channel).declare()
        producer = conn.Producer(serializer=None)
        for case, body, ctype, encoding, task in messages:
            producer.publish(
                body,
                exchange="",
                routing_key=queue,
                content_type=ctype,
                content_encoding=encoding,
                headers=_celery_headers(task, case),
            )


def _queue_length(url: str, queue: str) -> int:
    import redis

    return int(redis.Redis.from_url(url).llen(queue))


def sweep_broker(workdir: Path, url: str) -> tuple[list[dict[str, Any]], bool, dict[str, Any]]:
    """Forged messages into a Celery queue, then a real worker on it.

    Returns the cases, whether the pickle file appeared, and figures. A real job's hint is
    published three times among them: it must run exactly once (nothing lost, no double run).
    """
    from scheduler_core.models import Attempt, Job

    prefix = f"chaos-{os.getpid()}-"
    queue = f"{prefix}{BROKER_JOB_QUEUE}"
    marker = Path(f"/tmp/tenure-chaos-pickle-{uuid.uuid4().hex}")
    jobs_before = Job.objects.count()
    # On a queue no broker-less executor serves: only the sweep's Celery worker can run it.
    real = registry.enqueue(BROKER_JOB, {"n": -1}, unique_key=f"sweep:{uuid.uuid4().hex}")
    ghost_id = None
    try:
        with transaction.atomic():
            ghost_id = registry.enqueue(BROKER_JOB, {"n": -2}).pk
            raise RuntimeError("roll back the enqueue its hint names")
    except RuntimeError:
        pass
    # A broker that loses its messages: the lost job's hint is published on commit, then
    # the broker's database is flushed; only the dispatcher's re-send can wake it now.
    lost, flushed_at = _enqueue_then_flush(url, prefix)
    good = json.dumps([[real.pk], {}, EMBED]).encode()
    messages = [
        ("pickle payload that creates a file",
         pickle.dumps(([_CreatesFile(str(marker))], {}, EMBED)),
         "application/x-python-serialize", "binary", "tenure.run"),
        ("invalid UTF-8 bytes", b"\xff\xfe\xfa not utf-8", "application/json", "utf-8", "tenure.run"),
        ("body that is not JSON", b"{not json", "application/json", "utf-8", "tenure.run"),
        ("job id that is a string", json.dumps([["1; DROP TABLE tenure_job"], {}, EMBED]).encode(),
         "application/json", "utf-8", "tenure.run"),
        ("job id that does not exist", json.dumps([[10**15], {}, EMBED]).encode(),
         "application/json", "utf-8", "tenure.run"),
        ("hint for a rolled-back enqueue", json.dumps([[ghost_id], {}, EMBED]).encode(),
         "application/json", "utf-8", "tenure.run"),
        ("unregistered task name", json.dumps([["touch /tmp/x"], {}, EMBED]).encode(),
         "application/json", "utf-8", "os.system"),
        ("real hint, copy 1", good, "application/json", "utf-8", "tenure.run"),
        ("real hint, copy 2", good, "application/json", "utf-8", "tenure.run"),
        ("real hint, copy 3", good, "application/json", "utf-8", "tenure.run"),
    ]  # fmt: skip
    _publish(url, queue, messages)
    env = dict(os.environ)
    env.update(
        CELERY_BROKER_URL=url,
        TENURE_TRANSPORT="celery",
        TENURE_BROKER_QUEUE_PREFIX=prefix,
        PGAPPNAME="chaos-sweep-celery",
    )
    log_path = workdir / "logs" / "sweep-celery.log"
    celery = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queue]
    celery += ["--pool", "solo", "--without-mingle", "--without-gossip", "-l", "INFO"]
    with open(log_path, "ab") as log:
        worker = subprocess.Popen(celery, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            recovered = None
            while time.monotonic() < deadline:
                maintenance.dispatch_once()
                states = set(
                    Job.objects.filter(pk__in=[real.pk, lost.pk]).values_list("state", flat=True)
                )
                if recovered is None and Job.objects.get(pk=lost.pk).state == "succeeded":
                    recovered = time.time() - flushed_at
                if _queue_length(url, queue) == 0 and states <= {"succeeded", "failed"}:
                    break
                time.sleep(0.5)
            time.sleep(2.0)
            alive = worker.poll() is None
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    _forget_queue(url, prefix)
    worker_log = log_path.read_text(errors="replace")
    real.refresh_from_db()
    lost.refresh_from_db()
    real_attempts = Attempt.objects.filter(job_id=real.pk).count()
    left = _queue_length(url, queue)
    new_jobs = Job.objects.count() - jobs_before - 2  # the real job and the lost one
    file_exists = marker.exists()
    refused_pickle = "ContentDisallowed" in worker_log or "untrusted content" in worker_log
    cases = [
        _case("broker: pickle payload that creates a file",
              not file_exists and refused_pickle and alive,
              f"file {'EXISTS' if file_exists else 'absent'}; worker "
              f"{'refused the content type' if refused_pickle else 'said nothing'}; "
              f"worker {'alive' if alive else 'DIED'}"),
        _case("broker: invalid UTF-8, non-JSON, string id, unknown id, unregistered task",
              alive and left == 0 and new_jobs == 0,
              f"queue left {left}; jobs created {new_jobs}; worker {'alive' if alive else 'DIED'}"),
        _case("broker: hint for a rolled-back enqueue",
              ghost_id is not None and not Job.objects.filter(pk=ghost_id).exists()
              and not Attempt.objects.filter(job_id=ghost_id).exists(),
              f"job {ghost_id} absent, no attempt"),
        _case("broker: one real hint published 3 times",
              real.state == "succeeded" and real_attempts == 1,
              f"job {real.pk} {real.state} after {real_attempts} attempt(s)"),
        _case("broker: hint lost when the broker's data was flushed",
              lost.state == "succeeded",
              f"job {lost.pk} {lost.state}; the dispatcher's re-send ran it "
              f"{recovered if recovered is None else round(recovered, 2)}s after the flush"),
    ]  # fmt: skip
    figures = {"queue_left": left, "worker_alive": alive, "lost_hint_recovered_s": recovered}
    return cases, file_exists, figures


def _enqueue_then_flush(url: str, prefix: str) -> tuple[Any, float]:
    """Enqueue a job whose hint goes to the broker on commit, then delete the broker's copy
    of the queue (the broker lost its messages; other keys of a shared broker are left
    alone). Leaves the dispatcher configured to re-send hints after one second."""
    import redis
    from django.conf import settings

    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUE_PREFIX = prefix
    settings.TENURE_REDISPATCH_AFTER_SECONDS = 1.0
    conf.reload()
    job = registry.enqueue(BROKER_JOB, {"n": -4}, unique_key=f"sweep:{uuid.uuid4().hex}")
    client = redis.Redis.from_url(url)
    queued = client.llen(f"{prefix}{BROKER_JOB_QUEUE}")
    client.delete(f"{prefix}{BROKER_JOB_QUEUE}")
    if queued < 1:
        raise RuntimeError("the lost job's hint never reached the broker")
    return job, time.time()


def _forget_queue(url: str, prefix: str) -> None:
    """Remove the sweep's own keys from the broker (its queue and routing entries)."""
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"*{prefix}*"):
        client.delete(key)


# ---------------------------------------------------------------------------------------------
# The operator dashboard
# ---------------------------------------------------------------------------------------------


def _failed_job() -> Any:
    """A failed job to aim at: one from the run, else a fresh planned-permanent one."""
    from scheduler_core.models import Job

    job = Job.objects.filter(state="failed").order_by("id").first()
    if job is not None:
        return job
    made = registry.enqueue(JOB, {"n": -3, "permanent": True}, unique_key=f"sweep:{uuid.uuid4()}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        made.refresh_from_db()
        if made.state == "failed":
            return made
        time.sleep(0.5)
    return None


def sweep_dashboard() -> tuple[list[dict[str, Any]], str]:
    """Forged, unauthorised and stale action posts; each must change nothing."""
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import NoReverseMatch, reverse

    from scheduler_core.models import AuditEntry, Job

    try:
        from admin_ui.permissions import grant
    except ImportError:
        return [], "the dashboard's permissions module is missing"
    job = _failed_job()
    if job is None:
        return [], "no failed job to aim the dashboard checks at"
    try:
        url = reverse("admin_ui:job_action", args=[job.pk, "retry"])
        detail = reverse("admin_ui:job_detail", args=[job.pk])
        listing = reverse("admin_ui:job_list")
    except NoReverseMatch:
        return [], "the dashboard has no action URLs"
    suffix = uuid.uuid4().hex[:8]
    operator = User.objects.create_user(f"chaos-operator-{suffix}", password=None)
    viewer = User.objects.create_user(f"chaos-viewer-{suffix}", password=None)
    grant(operator, operate=True)
    grant(viewer, operate=False)

    def snapshot() -> tuple[str, int, int]:
        j = Job.objects.get(pk=job.pk)
        return j.state, j.version, AuditEntry.objects.filter(job_id=job.pk).count()

    def post(client: Any, data: dict[str, Any]) -> int:
        return int(client.post(url, data).status_code)

    form = {"version": job.version, "reason": "chaos sweep", "confirm": "on"}
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(operator)
    op_client = Client()
    op_client.force_login(operator)
    viewer_client = Client()
    viewer_client.force_login(viewer)
    anonymous = Client()
    checks: list[tuple[str, Callable[[], int], set[int]]] = [
        ("operator POST without a CSRF token", lambda: post(csrf_client, form), {403}),
        ("GET on the action URL", lambda: int(op_client.get(url).status_code), {405}),
        ("view-only user POSTs", lambda: post(viewer_client, form), {403}),
        ("anonymous POST", lambda: post(anonymous, form), {302}),
        ("stale version", lambda: post(op_client, {**form, "version": job.version - 1}), {409}),
        ("no reason", lambda: post(op_client, {**form, "reason": "  "}), {400}),
        ("not confirmed", lambda: post(op_client, {k: v for k, v in form.items() if k != "confirm"}), {400}),
        ("version beyond range", lambda: post(op_client, {**form, "version": 2**70}), {400}),
    ]  # fmt: skip
    out = []
    for name, call, expected in checks:
        before = snapshot()
        status = call()
        after = snapshot()
        out.append(
            _case(
                f"dashboard: {name}",
                status in expected and after == before,
                f"HTTP {status} (expected {sorted(expected)}); job and audit "
                f"{'unchanged' if after == before else f'CHANGED {before} -> {after}'}",
            )
        )
    # Two operators retry at once from the same page: exactly one wins, the other gets 409.
    script = "<script>alert('chaos')</script>"
    before = snapshot()
    first = post(op_client, {**form, "reason": f"retry {script}"})
    second = post(op_client, form)
    after = snapshot()
    out.append(
        _case(
            "dashboard: two retries from one page",
            first in (302, 303) and second == 409 and after[2] == before[2] + 1,
            f"first HTTP {first}, second HTTP {second}; audit rows +{after[2] - before[2]}",
        )
    )
    page = op_client.get(detail).content.decode("utf-8", "replace")
    out.append(
        _case(
            "dashboard: script in a reason is escaped",
            script not in page,
            "raw script absent from the job page" if script not in page else "RAW SCRIPT SERVED",
        )
    )
    huge = op_client.get(listing, {"limit": 10**12})
    out.append(
        _case(
            "dashboard: page size 10**12",
            huge.status_code == 200,
            f"HTTP {huge.status_code}, {len(huge.content)} bytes",
        )
    )
    return out, ""


# ---------------------------------------------------------------------------------------------


def sweep(workdir: Path) -> dict[str, Any]:
    """Run every part of the sweep and write ``sweep.json``."""
    result: dict[str, Any] = {"input": sweep_api(), "operator": [], "pickle_file_exists": False}
    url = os.environ.get("CHAOS_REDIS_URL", "")
    if url:
        try:
            cases, exists, figures = sweep_broker(workdir, url)
            result["input"] += cases
            result["pickle_file_exists"] = exists
            result["broker"] = figures
        except Exception as e:  # no broker here: the part is reported as not covered
            result["broker_note"] = f"broker part not run: {type(e).__name__}: {e}"[:300]
    try:
        result["operator"], note = sweep_dashboard()
        if note:
            result["operator_note"] = note
    except Exception as e:
        result["operator_note"] = f"dashboard part failed to run: {type(e).__name__}: {e}"[:300]
    (workdir / "sweep.json").write_text(json.dumps(result, indent=1))
    return result
