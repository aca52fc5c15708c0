"""In-process actions for one system: ``python -m bench.agent SYSTEM ACTION [ARGS]``.

Each run loads only its own system (its settings, its client) and prints one JSON line. The
timed part excludes interpreter start-up and imports.

Actions: ``enqueue SINGLE BULK`` (SINGLE jobs one transaction each, then BULK in one call),
``preload N`` (the fastest way the system offers: one bulk call, or one message at a time for
Celery alone), ``ping PORT RATE SECONDS`` (open-loop latency), and for Tenure ``hold K
SECONDS`` (the recovery workload), ``cycle N`` (N jobs through their whole lifecycle one
after another: enqueue, claim, complete; :mod:`bench.versions`) and ``dashboard JOBS
ATTEMPTS REQUESTS [GENERATE]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from .common import percentile


class Ops:
    """Enqueue operations of one system."""

    def setup(self) -> None:
        """Load the system's client (not timed)."""

    def single(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs, one transaction (or message) each."""
        for _ in range(n):
            self.one(-1)

    def bulk(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs at once."""
        raise NotImplementedError

    def one(self, seq: int) -> None:
        """Enqueue one no-op job carrying ``seq`` (the latency workload's sequence number)."""
        raise NotImplementedError


def _django(settings: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


class TenureOps(Ops):
    def setup(self) -> None:
        _django("config.settings")
        from scheduler_core.api import registry

        self.jt = registry.get("bench.noop")
        assert self.jt is not None

    def bulk(self, n: int) -> None:
        self.jt.enqueue_many([{}] * n)

    def one(self, seq: int) -> None:
        if seq < 0:
            self.jt.enqueue()
        else:
            self.jt.enqueue(seq=seq)


class TenureAsyncOps(TenureOps):
    """Tenure's no-op as an ``async def`` handler (``bench.noop_async``)."""

    def setup(self) -> None:
        _django("config.settings")
        from scheduler_core.api import registry

        self.jt = registry.get("bench.noop_async")
        assert self.jt is not None


class CeleryOps(Ops):
    def setup(self) -> None:
        from .peers import celery_alone
        from .systems import CeleryAlone

        self.task = celery_alone.nothing
        self.queue = CeleryAlone.QUEUE

    def one(self, seq: int) -> None:
        self.task.apply_async(args=[seq], queue=self.queue)


class ProcrastinateOps(Ops):
    def setup(self) -> None:
        # At its best (``BENCH_SHAPE=best``) its workers run the async task of another app.
        if os.environ.get("BENCH_SHAPE") == "best":
            from .peers import procrastinate_best

            procrastinate_best.app.open()
            self.task = procrastinate_best.noop_async
            return
        from .peers import procrastinate_app

        procrastinate_app.app.open()
        self.task = procrastinate_app.noop

    def bulk(self, n: int) -> None:
        self.task.batch_defer(*([{}] * n))

    def one(self, seq: int) -> None:
        if seq < 0:
            self.task.defer()
        else:
            self.task.defer(seq=seq)


class DjangoTasksOps(Ops):
    def setup(self) -> None:
        _django("bench.peers.django_settings")
        from .peers import django_jobs

        self.task = django_jobs.noop_task

    def bulk(self, n: int) -> None:
        # No bulk call: the closest is every enqueue in one transaction.
        from django.db import transaction

        with transaction.atomic():
            for _ in range(n):
                self.task.enqueue()

    def one(self, seq: int) -> None:
        if seq < 0:
            self.task.enqueue()
        else:
            self.task.enqueue(seq=seq)


class DjangoQOps(Ops):
    def setup(self) -> None:
        _django("bench.peers.django_settings")
        from django_q.tasks import async_task

        self.async_task = async_task

    def bulk(self, n: int) -> None:
        # No bulk call: the closest is every enqueue in one transaction.
        from django.db import transaction

        with transaction.atomic():
            for _ in range(n):
                self.one(-1)

    def one(self, seq: int) -> None:
        self.async_task("bench.peers.django_jobs.noop_q", seq)


class PgQueuerOps(Ops):
    def setup(self) -> None:
        import psycopg
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        from .peers.pgqueuer_app import DSN

        self.loop = asyncio.new_event_loop()

        async def make() -> Any:
            conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
            return Queries(PsycopgDriver(conn))

        self.q = self.loop.run_until_complete(make())

    def bulk(self, n: int) -> None:
        self.loop.run_until_complete(self.q.enqueue(["noop"] * n, [None] * n, [0] * n))

    def one(self, seq: int) -> None:
        payload = None if seq < 0 else str(seq).encode()
        self.loop.run_until_complete(self.q.enqueue("noop", payload))


OPS: dict[str, type[Ops]] = {
    "tenure": TenureOps,
    "tenure-celery": TenureOps,
    "tenure-beside-limited": TenureOps,
    "tenure-async": TenureAsyncOps,
    "celery": CeleryOps,
    "procrastinate": ProcrastinateOps,
    "django-tasks-db": DjangoTasksOps,
    "django-q2": DjangoQOps,
    "pgqueuer": PgQueuerOps,
}


# ---------------------------------------------------------------------------------------------
# Latency: open loop at a fixed rate, handler starts reported over UDP
# ---------------------------------------------------------------------------------------------

WARMUP_SEQ = 10_000_000


def ping(ops: Ops, port: int, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue ``rate`` jobs a second for ``seconds`` on a fixed schedule (open loop, so a slow
    system is not given time to catch up) and pair each job's handler start with the moment
    its enqueue returned (committed)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", port))
    sock.settimeout(0.2)
    starts: dict[int, float] = {}
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(64)
            except TimeoutError:
                continue
            seq, t = data.decode().split()
            starts.setdefault(int(seq), float(t))

    threading.Thread(target=receive, daemon=True).start()
    # Warm-up: the workers are ready once one job reaches a handler.
    deadline = time.monotonic() + 90
    k = 0
    while not any(s >= WARMUP_SEQ for s in starts):
        if time.monotonic() > deadline:
            raise SystemExit("no worker picked up a warm-up job within 90 s")
        ops.one(WARMUP_SEQ + k)
        k += 1
        time.sleep(0.25)
    time.sleep(1.0)
    n = int(rate * seconds)
    sent: dict[int, float] = {}
    call: list[float] = []
    t0 = time.time() + 0.1
    for i in range(n):
        target = t0 + i / rate
        delay = target - time.time()
        if delay > 0:
            time.sleep(delay)
        before = time.time()
        ops.one(i)
        sent[i] = time.time()
        call.append(sent[i] - before)
    lag = time.time() - (t0 + (n - 1) / rate)
    wait_until = time.monotonic() + 15
    while time.monotonic() < wait_until and any(i not in starts for i in sent):
        time.sleep(0.05)
    stop.set()
    lat = [max(0.0, starts[i] - sent[i]) * 1000 for i in sent if i in starts]
    return {
        "n": n,
        "received": len(lat),
        "missing": n - len(lat),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
        "enqueue_call_p50_ms": percentile([c * 1000 for c in call], 50),
        "schedule_lag_s": lag,
    }


def _cycle(n: int) -> None:
    """``n`` no-op jobs through Tenure's lifecycle, one at a time, with the writes an executor
    makes: the enqueue, the claim (job row and a new attempt row) and the completion (job row
    and attempt row)."""
    from scheduler_core.api import registry
    from scheduler_core.storage.drivers import driver

    jt = registry.get("bench.noop")
    assert jt is not None
    d = driver()
    for i in range(n):
        jt.enqueue(seq=i)
        for lease in d.claim(executor="bench:cycle", queues=[jt.queue], limit=1):
            with d.atomic():
                d.complete(lease)


def _timed(fn: Any, n: int) -> dict[str, float]:
    t = time.perf_counter()
    fn(n)
    seconds = time.perf_counter() - t
    return {"n": n, "seconds": seconds, "per_second": n / seconds}


def main(argv: list[str]) -> None:
    """Run one action and print its JSON result."""
    system, action, *args = argv
    if action == "dashboard":
        from .dashboard import measure

        print(json.dumps(measure(*[int(a) for a in args])))
        return
    ops = OPS[system]()
    ops.setup()
    if action == "hold":
        from scheduler_core.api import registry

        k, seconds = int(args[0]), float(args[1])
        jt = registry.get("bench.hold")
        assert jt is not None
        ids = [jt.enqueue(seconds=seconds).pk for _ in range(k)]
        print(json.dumps({"ids": ids}))
        return
    if action == "cycle":
        print(json.dumps(_timed(_cycle, int(args[0]))))
        return
    if action == "ping":
        result = ping(ops, int(args[0]), float(args[1]), float(args[2]))
        print(json.dumps(result))
        return
    if action == "enqueue":
        # One transaction each, then in bulk, in one process (one interpreter start-up).
        single, many = int(args[0]), int(args[1])
        out: dict[str, Any] = {"single": _timed(ops.single, single)}
        if system != "celery":
            out["bulk"] = _timed(ops.bulk, many)
        print(json.dumps(out))
        return
    if action != "preload":
        raise SystemExit(f"unknown action {action!r}")
    n = int(args[0])
    fn = ops.single if system == "celery" else ops.bulk
    # In slices, so no single statement or transaction grows without bound.
    t = time.perf_counter()
    for start in range(0, n, 20_000):
        fn(min(20_000, n - start))
    seconds = time.perf_counter() - t
    print(json.dumps({"n": n, "seconds": seconds, "per_second": n / seconds}))


if __name__ == "__main__":
    main(sys.argv[1:])
