"""The workloads. Each function measures one thing for one system and returns plain numbers.

* :func:`enqueue` — jobs accepted per second, one transaction each or in bulk.
* :func:`drain` — jobs finished per second by N workers started on a pre-filled queue: the whole
  run (start-up included) and the 10-90 % window.
* :func:`cost` — what each job cost the database (commits, row writes, statements,
  connections).
* :func:`latency` — enqueue-to-handler-start delay at a fixed arrival rate on an idle system.
* :func:`recovery` — time until the jobs of a SIGKILLed executor are claimed again.
* :func:`pgbench` — the server's own write rate, the physical reference.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import common
from .common import (
    HARNESS_XACTS_PER_READ,
    connect,
    counting_env,
    cpu_seconds,
    db_counters,
    free_udp_port,
    processes,
    recreate_database,
    steady_rate,
    steady_window,
)
from .systems import System, Tenure


def _agent(system: System, action: str, *args: Any, timeout: float = 900) -> dict[str, Any]:
    out = subprocess.run(
        system.agent(action, *[str(a) for a in args]),
        env=system.env(),
        cwd=system.root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{system.key} {action} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def enqueue(system: System, single: int, bulk: int) -> dict[str, Any]:
    """Into an empty system, enqueue ``single`` no-op jobs one transaction each, then ``bulk``
    in one call; jobs per second for each (``bulk`` is absent without a bulk enqueue)."""
    system.reset()
    return _agent(system, "enqueue", single, bulk)


POLL_SECONDS = 0.05
"""How often a drain counts finished jobs: whole-run times are late by at most this."""


def drain(
    system: System,
    jobs: int,
    workers: int,
    *,
    timeout: float,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Time ``workers`` worker processes of ``system`` (in its shape) draining ``jobs`` no-op
    jobs; the same procedure for every system and both shapes.

    The jobs are enqueued first (one bulk call where the system has one, else one message at
    a time), and the workers are started the moment the enqueue has returned (committed or
    published). Two figures come from the finished count, polled every
    :data:`POLL_SECONDS`:

    * the **whole run**: from the enqueue's return to the last job done, the workers'
      start-up included (``whole_seconds``, ``whole_per_second`` = jobs / whole_seconds);
    * the **10-90 % window**: the rate between 10 % and 90 % done
      (:func:`bench.common.steady_rate`), which leaves out most of the start-up and the tail.

    A drain is time-boxed at ``timeout`` seconds after the enqueue returned; a drain cut by it
    has no whole-run time and its ``whole_per_second`` is what was done over the box.
    ``on_start`` is called just before the workers are started (:mod:`bench.startup` reads the
    database's clock there).
    """
    system.reset()
    env = system.env(**system.worker_env(workers))
    progress: list[tuple[float, int]] = []
    cpu: list[tuple[int, float]] = []
    conn = connect(system.db) if system.db else None
    try:
        with processes(f"{system.key}-{system.shape}-drain-{workers}", grace=0.0) as procs:
            enqueue = _agent(system, "preload", jobs)
            if on_start is not None:
                on_start()
            t0 = time.monotonic()
            for cmd in system.worker_cmds(workers):
                procs.start(cmd, env, system.root)
            pids = [p.pid for p in procs.procs]
            done = 0
            while done < jobs and time.monotonic() - t0 < timeout:
                time.sleep(POLL_SECONDS)
                done = system.done(conn, jobs)
                progress.append((time.monotonic() - t0, done))
                cpu.append((done, cpu_seconds(pids)))
                if procs.alive() == 0:
                    break
            elapsed = time.monotonic() - t0
    finally:
        if conn is not None:
            conn.close()
    complete = done >= jobs
    window = steady_window(progress, jobs)
    # The worker processes' CPU per job between the samples nearest 10 % and 90 % done
    # (start-up and the tail left out, as from the rate).
    inside = [(d, c) for d, c in cpu if 0.1 * jobs <= d <= 0.9 * jobs]
    cpu_per_job = (
        (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]
        else float("nan")
    )
    first = next((t for t, d in progress if d > 0), float("nan"))
    nan = float("nan")
    return {
        "jobs": jobs,
        "done": done,
        "complete": complete,
        "processes": workers,
        "concurrency": system.concurrency,
        "per_second": steady_rate(progress, jobs),
        "window_seconds": window[1] - window[0] if window else nan,
        "whole_seconds": elapsed if complete else nan,
        "whole_per_second": done / elapsed if elapsed else nan,
        "first_done_seconds": first,
        "seconds": elapsed,
        "timeout": timeout,
        "enqueue_seconds": float(enqueue.get("seconds", nan)),
        "worker_cpu_ms_per_job": cpu_per_job * 1000,
    }


def cost(system: System, jobs: int, *, timeout: float) -> dict[str, Any]:
    """What each job costs the database when one worker drains ``jobs`` pre-loaded jobs.

    Commits and row writes are the database's statistics deltas over the drain (the harness's
    own reads subtracted); statements and connections are counted in the worker processes at
    the driver. Start-up and idle polling of the worker are included, as they are real costs.
    """
    system.reset()
    _agent(system, "preload", jobs)
    stmt_dir = Path(tempfile.mkdtemp(prefix="bench-stmt-"))
    before = db_counters(system.db) if system.db else None
    env = counting_env(system.env(**system.worker_env(1)), stmt_dir)
    polls = 0
    conn = connect(system.db) if system.db else None
    try:
        with processes(f"{system.key}-cost", grace=0.0) as procs:
            t0 = time.monotonic()
            for cmd in system.worker_cmds(1):
                procs.start(cmd, env, system.root)
            done = 0
            while done < jobs and time.monotonic() - t0 < timeout:
                time.sleep(0.25)
                done = system.done(conn, jobs)
                polls += 1
    finally:
        if conn is not None:
            conn.close()
    result: dict[str, Any] = {"jobs": jobs, "done": done}
    if before is not None and system.db:
        time.sleep(1.2)  # backends publish their statistics at least once a second
        after = db_counters(system.db)
        own = polls + HARNESS_XACTS_PER_READ
        result.update(
            commits_per_job=(after.xact_commit - before.xact_commit - own) / jobs,
            rows_inserted_per_job=(after.tup_ins - before.tup_ins) / jobs,
            rows_updated_per_job=(after.tup_upd - before.tup_upd) / jobs,
            rows_deleted_per_job=(after.tup_del - before.tup_del) / jobs,
        )
    from .hooks.sitecustomize import read_counts

    stmts, conns = read_counts(str(stmt_dir))
    result.update(statements_per_job=stmts / jobs, connections_per_job=conns / jobs)
    shutil.rmtree(stmt_dir, ignore_errors=True)
    return result


def latency(system: System, rate: float, seconds: float) -> dict[str, Any]:
    """Start one worker on an empty system, then enqueue ``rate`` jobs a second for
    ``seconds``; percentiles of enqueue-returned to handler-started, in milliseconds."""
    system.reset()
    port = free_udp_port()
    env = system.env(BENCH_PING_PORT=str(port), **system.worker_env(1))
    with processes(f"{system.key}-latency", grace=0.0) as procs:
        for cmd in system.worker_cmds(1):
            procs.start(cmd, env, system.root)
        return _agent(system, "ping", port, rate, seconds, timeout=seconds + 180)


def recovery(system: Tenure, *, holders: int = 4, hold_seconds: float = 300) -> dict[str, Any]:
    """SIGKILL an executor that holds ``holders`` leased jobs; seconds until every one of them
    is claimed again by a second executor, against 1.5 x the jobs' lease."""
    system.reset()
    lease = 10.0  # bench.hold's lease_seconds
    env = system.env()
    with processes(f"{system.key}-recovery", grace=0.0) as procs, connect(system.db or "") as conn:
        victim = procs.start(system.executor_cmd(holders), env)
        ids = _agent(system, "hold", holders, hold_seconds)["ids"]

        def owners() -> list[tuple[str, int, str]]:
            return [
                (r[0], r[1], r[2])
                for r in conn.execute(
                    "SELECT state, fence, lease_owner FROM tenure_job WHERE id = ANY(%s)", [ids]
                ).fetchall()
            ]

        deadline = time.monotonic() + 60
        while not all(s == "leased" for s, _, _ in owners()):
            if time.monotonic() > deadline:
                raise RuntimeError("the first executor did not lease the hold jobs")
            time.sleep(0.05)
        first_owner = owners()[0][2]
        procs.start(system.executor_cmd(holders), env)
        procs.start(system.scheduler_cmd(), env)
        time.sleep(1.5)  # the second executor and the reaper start; leases renewed meanwhile
        os.kill(victim.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        while True:
            rows = owners()
            if all(s == "leased" and f >= 2 and o != first_owner for s, f, o in rows):
                break
            if time.monotonic() - t_kill > 10 * lease:
                return {"seconds": float("nan"), "lease": lease, "limit": 1.5 * lease}
            time.sleep(0.05)
        seconds = time.monotonic() - t_kill
    return {"seconds": seconds, "lease": lease, "limit": 1.5 * lease, "jobs": holders}


def pgbench_tps(seconds: int, clients: int = 2) -> dict[str, Any]:
    """``pgbench -N`` (simple-update, the write transactions of TPC-B without the branch
    table hot spot) against a scratch database: the server's write transactions per second."""
    exe = shutil.which("pgbench") or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None
    )
    if exe is None:
        return {"tps": float("nan"), "note": "pgbench not found"}
    db = "bench_pgbench"
    # Read at call time: the run may have pointed the harness at a cluster of its own.
    args = ["-h", common.PG_HOST, "-p", common.PG_PORT, "-U", common.PG_USER]
    recreate_database(db)
    subprocess.run([exe, *args, "-i", "-q", db], check=True, capture_output=True)
    out = subprocess.run(
        [exe, *args, "-c", str(clients), "-j", str(clients), "-T", str(seconds), "-N", "-n", db],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tps = next(
        float(line.split("=")[1].split()[0]) for line in out.splitlines() if line.startswith("tps")
    )
    return {
        "tps": tps,
        "clients": clients,
        "seconds": seconds,
        "server": f"{common.PG_HOST}:{common.PG_PORT}",
    }
