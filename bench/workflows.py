"""Workflows against independent jobs: the same number of no-op jobs drained by the same
broker-less executors, once as workflow steps and once as independent jobs.

Each workflow is a chain of 3 steps whose last fans out to 10 steps joined by one fan-in
(14 steps, :func:`enqueue_workflows`); the independent load is as many no-op jobs, enqueued
in bulk (``enqueue_many``, 1,000 a call). Each measurement enqueues into an empty store, then
starts the executors (2 processes x 8 threads, as the drain at their best) the moment the
enqueue has returned and counts finished jobs until all are done:

* ``enqueue_seconds``: the enqueue (a transaction per workflow; a call per 1,000 jobs);
* ``drain_seconds``: from the executors' start to the last job done (their start-up included);
* ``per_second`` (10-90 %): the rate between 10 % and 90 % done.

``make bench BENCH_ARGS="--only workflows"`` runs it (:func:`bench.run.workflows_round`)
beside Celery's canvas (:mod:`bench.peers.celery_canvas`); alone, against a database of
yours that it empties of jobs and workflows (never point it at one you keep)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tenure_bench_wf PYTHONPATH=. \\
        python -m bench.workflows --load workflows --workflows 1000

prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

QUEUE = "bench-wf"
ROOT = Path(__file__).resolve().parents[1]
STEPS = 14
"""Jobs of one workflow: a chain of 3, a fan-out of 10, one fan-in."""
POLL_SECONDS = 0.1

TABLES = (
    "tenure_workflow_edge, tenure_workflow_step, tenure_workflow, tenure_effect_event, "
    "tenure_effect, tenure_open_attempt, tenure_attempt, tenure_job_spec, tenure_audit, "
    "tenure_stale_write, tenure_executor, tenure_job"
)


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("TENURE_JOB_MODULES", "bench.workflow_jobs")
    import django

    django.setup()


def empty() -> None:
    """Remove every job and workflow, then refresh the tables' statistics (as every other
    drain of the bench starts)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
        cur.execute("ANALYZE tenure_job, tenure_workflow_step, tenure_workflow_edge")


def enqueue_workflows(n: int) -> int:
    """``n`` workflows, one transaction each: a -> b -> c -> part[0..9] -> join."""
    from django.db import transaction

    from bench.workflow_jobs import noop
    from scheduler_core import workflow

    total = 0
    for i in range(n):
        with transaction.atomic():
            wf = workflow("bench.fan")
            a = wf.step(noop, name="a", i=i)
            b = wf.step(noop, name="b", after=[a], i=i)
            c = wf.step(noop, name="c", after=[b], i=i)
            parts = wf.map(noop, [{"i": i}] * 10, after=[c], name="part")
            wf.step(noop, name="join", after=parts, i=i)
            total += len(wf.enqueue().jobs)
    return total


def enqueue_independent(n: int) -> int:
    """``n`` independent no-op jobs, 1,000 an ``enqueue_many`` call."""
    from bench.workflow_jobs import noop

    done = 0
    while done < n:
        k = min(1000, n - done)
        noop.enqueue_many([{"i": done + j} for j in range(k)])
        done += k
    return n


def executor_cmd(concurrency: int) -> list[str]:
    """One broker-less executor of the workflow queue."""
    import sys

    return [
        sys.executable,
        "manage.py",
        "run_executor",
        "--queues",
        QUEUE,
        "--concurrency",
        str(concurrency),
    ]


def measure(
    load: str, workflows: int, *, executors: int, concurrency: int, timeout: float
) -> dict[str, Any]:
    """Empty the store, enqueue ``load`` (``workflows`` or ``independent``: as many jobs as
    ``workflows`` workflows have steps), drain it; the figures of the module's docstring."""
    from django.db import connection

    from bench.common import cpu_seconds, processes, steady_rate

    empty()
    jobs = workflows * STEPS
    t0 = time.monotonic()
    if load == "workflows":
        enqueue_workflows(workflows)
    else:
        enqueue_independent(jobs)
    enqueued = time.monotonic() - t0
    env = {"PYTHONPATH": str(ROOT), **os.environ}
    progress: list[tuple[float, int]] = []
    done = 0
    with processes(f"workflows-{load}", grace=0.0) as procs:
        t0 = time.monotonic()
        for _ in range(executors):
            procs.start(executor_cmd(concurrency), env)
        pids = [p.pid for p in procs.procs]
        with connection.cursor() as cur:
            while done < jobs and time.monotonic() - t0 < timeout:
                time.sleep(POLL_SECONDS)
                cur.execute("SELECT count(*) FROM tenure_job WHERE state = 'succeeded'")
                done = int(cur.fetchone()[0])
                progress.append((time.monotonic() - t0, done))
                if procs.alive() == 0:
                    break
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pids)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM tenure_attempt")
        attempts = int(cur.fetchone()[0])
    nan = float("nan")
    return {
        "load": load,
        "jobs": jobs,
        "done": done,
        "complete": done >= jobs,
        "enqueue_seconds": enqueued,
        "drain_seconds": elapsed if done >= jobs else nan,
        "per_second": steady_rate(progress, jobs),
        "attempts": attempts,
        "worker_cpu_ms_per_job": cpu * 1000 / done if done else nan,
        "executors": executors,
        "concurrency": concurrency,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--load", choices=("workflows", "independent"), required=True)
    ap.add_argument("--workflows", type=int, default=1000)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    _setup()
    out = measure(
        args.load,
        args.workflows,
        executors=args.executors,
        concurrency=args.concurrency,
        timeout=args.timeout,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
