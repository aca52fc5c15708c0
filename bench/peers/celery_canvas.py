"""Celery's canvas on Redis: the workflow load of :mod:`bench.workflows` as
``chain(a, b, c, chord(group(part x 10), join))``, against as many independent tasks.

Configured as Celery alone in the drain (:mod:`bench.peers.celery_alone`: JSON, late
acknowledgement; 2 workers of 8 prefork processes, prefetch 64), except that results are
kept: a chord needs a result backend ("Tasks used within a chord must not ignore their
results", Celery's canvas guide), here Redis at ``BENCH_CANVAS_BACKEND`` (default
``redis://127.0.0.1:6379/14``; the broker is ``BENCH_REDIS_URL``'s database 13; every key
prefixed ``bench-canvas:``). The
independent tasks run on the same app, results kept too. Each task counts itself done with
one ``INCR`` on the backend's Redis, which the harness polls::

    PYTHONPATH=. python -m bench.peers.celery_canvas --load workflows --workflows 1000

prints one JSON line (the same figures as :func:`bench.workflows.measure`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery, chain, chord, group

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
BACKEND = os.environ.get("BENCH_CANVAS_BACKEND", "redis://127.0.0.1:6379/14")
QUEUE = "bench-canvas"
PREFIX = "bench-canvas:"
DONE_KEY = PREFIX + "done"
STEPS = 14
ROOT = Path(__file__).resolve().parents[2]

app = Celery("bench_canvas", broker=BROKER, backend=BACKEND)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_ignore_result=False,
    task_acks_late=True,
    task_reject_on_worker_lost=False,
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # Every key of this app carries the prefix, so a reset touches nothing else on the server.
    broker_transport_options={"global_keyprefix": PREFIX},
    result_backend_transport_options={"global_keyprefix": PREFIX},
)

_counter: Any = None


def _count() -> None:
    global _counter
    if _counter is None:
        import redis

        _counter = redis.Redis.from_url(BACKEND)
    _counter.incr(DONE_KEY)


@app.task(name="bench.canvas.noop")
def noop(*parents: Any, i: int = 0) -> None:
    """Nothing (a chain passes the previous result as the first argument)."""
    _count()


def canvas(i: int) -> Any:
    """One workflow: a -> b -> c -> 10 parts -> join (each receives its parents' results)."""
    return chain(
        noop.s(i=i),
        noop.s(i=i),
        noop.s(i=i),
        chord(group(noop.s(i=i) for _ in range(10)), noop.s(i=i)),
    )


def _reset() -> None:
    import redis

    for url in (BROKER, BACKEND):
        r = redis.Redis.from_url(url)
        keys = list(r.scan_iter(match=PREFIX + "*", count=1000))
        for k in range(0, len(keys), 1000):
            r.delete(*keys[k : k + 1000])


def worker_cmd(concurrency: int, name: str) -> list[str]:
    """One prefork worker as Celery alone at its best (bench/systems.py)."""
    return [
        str(Path(sys.executable).parent / "celery"),
        "-A",
        "bench.peers.celery_canvas",
        "worker",
        "-Q",
        QUEUE,
        "-c",
        str(concurrency),
        "--pool",
        "prefork",
        "--prefetch-multiplier",
        "64",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        "WARNING",
        "-n",
        f"{name}@%h",
    ]


def measure(
    load: str, workflows: int, *, workers: int, concurrency: int, timeout: float
) -> dict[str, Any]:
    """Empty the broker and the backend, publish ``load``, drain it with ``workers`` workers."""
    import redis

    from bench.common import cpu_seconds, processes, steady_rate

    _reset()
    jobs = workflows * STEPS
    t0 = time.monotonic()
    if load == "workflows":
        for i in range(workflows):
            canvas(i).apply_async()
    else:
        for i in range(jobs):
            noop.apply_async(kwargs={"i": i})
    enqueued = time.monotonic() - t0
    counter = redis.Redis.from_url(BACKEND)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    progress: list[tuple[float, int]] = []
    done = 0
    with processes(f"canvas-{load}", grace=0.0) as procs:
        t0 = time.monotonic()
        for w in range(workers):
            procs.start(worker_cmd(concurrency, f"canvas-{w + 1}"), env)
        while done < jobs and time.monotonic() - t0 < timeout:
            time.sleep(0.1)
            done = int(counter.get(DONE_KEY) or 0)
            progress.append((time.monotonic() - t0, done))
            if procs.alive() == 0:
                break
        elapsed = time.monotonic() - t0
        cpu = _tree_cpu([p.pid for p in procs.procs], cpu_seconds)
    _reset()
    nan = float("nan")
    return {
        "load": load,
        "jobs": jobs,
        "done": done,
        "complete": done >= jobs,
        "enqueue_seconds": enqueued,
        "drain_seconds": elapsed if done >= jobs else nan,
        "per_second": steady_rate(progress, jobs),
        "worker_cpu_ms_per_job": cpu * 1000 / done if done else nan,
        "executors": workers,
        "concurrency": concurrency,
    }


def _tree_cpu(pids: list[int], cpu_seconds: Any) -> float:
    """CPU of the workers and their pool processes (prefork children)."""
    found = list(pids)
    for pid in pids:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        found += [int(k) for k in kids]
    return float(cpu_seconds(found))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--load", choices=("workflows", "independent"), required=True)
    ap.add_argument("--workflows", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    out = measure(
        args.load,
        args.workflows,
        workers=args.workers,
        concurrency=args.concurrency,
        timeout=args.timeout,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
