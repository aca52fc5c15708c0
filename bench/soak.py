"""The soak: Tenure and its peers, one after another, under steady arrivals and a long-held
snapshot, on a PostgreSQL cluster of the soak's own with production defaults.

``python -m bench.soak [--minutes T] [--rate R | --fraction F] [--systems ...] [--short]``
(``make soak``, ``make soak-short``; what it measures and why: bench/README.md, "Soak");
``python -m bench.soak --combine OUT.md RUN.json[@REV] ...`` merges runs made separately.

This module owns the whole soak: the cluster (:class:`SoakCluster`, PostgreSQL's defaults plus
the few settings it states), each system's soak configuration (:class:`SoakTenure`,
:class:`SoakPgQueuer`, :class:`SoakProcrastinate`), the drain-capacity measurement that fixes
the arrival rate, the open-loop generator processes (``python -m bench.soak --generate ...``),
the receiver that pairs each enqueue's commit with its handler's start, the per-interval
sampler (statement times, sizes, dead tuples, autovacuum runs, oldest snapshot, worker memory),
the long reader, the verdicts and the report (``.md``, ``.json``, ``.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from array import array
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from verifier.cluster import PgCluster, free_port

from . import common
from .common import BENCH, BIN, PYTHON, VAR, percentile, processes, steady_rate
from .peers.soak_mix import KINDS, WARMUP_SEQ, kind_of
from .systems import PgQueuer, Procrastinate, System, Tenure
from .workloads import _agent

SOAK = VAR / "soak"
WORKER_PROCESSES = 2
EXECUTOR_CONCURRENCY = 8
PROCRASTINATE_CONCURRENCY = 8

CLUSTER_SETTINGS: dict[str, str] = {
    # Statement times are read from pg_stat_statements, which must be preloaded.
    "shared_preload_libraries": "pg_stat_statements",
    # Logging only, so the report can put the server's own work beside the queue waits: each
    # line stamped with its epoch time, every checkpoint (on by default) and every autovacuum
    # and autoanalyze with its duration (by default only those over 10 minutes).
    "log_line_prefix": "%n:",
    "log_checkpoints": "on",
    "log_autovacuum_min_duration": "0",
}
"""Every setting the soak's cluster changes from PostgreSQL's defaults, besides its port and
its socket folder (``var/soak/cluster``, so nothing is written where the machine's own cluster
keeps its socket). The report lists them, and every setting the server reports as not at its
built-in default."""

SHOWN = (
    "server_version",
    "autovacuum",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_connections",
    "work_mem",
    "maintenance_work_mem",
    "autovacuum_max_workers",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
    "checkpoint_timeout",
    "max_wal_size",
    "idle_in_transaction_session_timeout",
    "old_snapshot_threshold",
    "shared_preload_libraries",
)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class HarnessError(RuntimeError):
    """The harness itself broke (a system did not start, nothing was processed)."""


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


class SoakCluster(PgCluster):
    """The fault verifier's throw-away cluster, started with PostgreSQL's own defaults (autovacuum
    on, durable commits, default memory) plus :data:`CLUSTER_SETTINGS` only."""

    def _options(self) -> str:
        opts = [f"-p {self.port}", f"-k {self.root}"]
        opts += [f"-c {k}={v}" for k, v in CLUSTER_SETTINGS.items()]
        return " ".join(opts)

    def wait_up(self, timeout: float = 30.0) -> float:
        """Wait until the server answers (in ``postgres``: the soak makes its own databases)."""
        start = time.monotonic()
        while True:
            try:
                with self.connect("postgres", timeout=1) as conn:
                    conn.execute("SELECT 1")
                return time.monotonic() - start
            except psycopg.Error:
                if time.monotonic() - start > timeout:
                    raise
                time.sleep(0.1)

    def facts(self) -> dict[str, Any]:
        """``SHOW`` of the settings the report states, and every setting not at its default."""
        shown: dict[str, str] = {}
        with common.connect("postgres") as conn:
            for n in SHOWN:
                # A setting this server version does not have is left out.
                with contextlib.suppress(psycopg.Error):
                    shown[n] = str(conn.execute(f"SHOW {n}").fetchone()[0])  # type: ignore[index]
            changed = {
                r[0]: f"{r[1]} ({r[2]})"
                for r in conn.execute(
                    "SELECT name, current_setting(name), source FROM pg_settings "
                    "WHERE source NOT IN ('default', 'override', 'client', 'session') "
                    "ORDER BY name"
                )
            }
        return {"show": shown, "not_default": changed, "port": self.port}


# ---------------------------------------------------------------------------------------------
# The systems' soak configurations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """Where a system keeps its jobs, for the sampler, the reader and the size verdict."""

    table_like: str
    """LIKE pattern of every table the system owns (sizes are summed over them)."""
    main_tables: tuple[str, ...]
    """The tables whose dead tuples and autovacuum runs are followed; the first is the one the
    long reader reads."""
    claim_like: tuple[str, ...]
    """pg_stat_statements texts that are the claim: every pattern matches (ILIKE)."""
    claim_not_like: tuple[str, ...]
    left_sql: str
    """Jobs still waiting or running."""
    kept_sql: str
    """Jobs whose record the tables still hold (finished ones and those left)."""
    config: str
    """The configuration, for the report."""


class SoakTenure(Tenure):
    """Tenure: 2 x ``run_executor --concurrency 8`` and one ``run_scheduler``."""

    soak_shape = Shape(
        table_like="tenure\\_%",
        main_tables=("tenure_job", "tenure_attempt"),
        claim_like=("%FOR UPDATE%SKIP LOCKED%", "%tenure_job%"),
        claim_not_like=(),
        left_sql="SELECT count(*) FROM tenure_job WHERE state IN ('waiting', 'leased')",
        kept_sql="SELECT count(*) FROM tenure_job",
        config=(
            f"{WORKER_PROCESSES} x `manage.py run_executor --queues default --concurrency "
            f"{EXECUTOR_CONCURRENCY}` (handlers on threads, `time.sleep`) + 1 x `manage.py "
            "run_scheduler`; `TENURE_TRANSPORT=polling` (LISTEN/NOTIFY, poll fallback); "
            "psycopg 3; every other setting at its default (finished jobs kept 7 days). "
            "Enqueue: `JobType.enqueue(seq=...)`, one autocommit transaction each."
        ),
    )

    def __init__(self) -> None:
        super().__init__(
            key="tenure",
            db="soak_tenure",
            TENURE_JOB_MODULES="bench.tenure_jobs,bench.peers.tenure_soak",
        )

    def worker_cmds(self, n: int) -> list[list[str]]:
        # The soak's configuration whatever ``n``: the capacity measurement uses it too.
        return [self.executor_cmd(EXECUTOR_CONCURRENCY)] * WORKER_PROCESSES + [self.scheduler_cmd()]


class SoakTenureDefaults(SoakTenure):
    """The same executors under the example project's default transport: Celery on the
    filesystem broker, with no Celery worker running. Hints must cost nothing when nobody
    consumes them: the queue wait should match the broker-less run's."""

    soak_shape = dataclasses.replace(
        SoakTenure.soak_shape,
        config=SoakTenure.soak_shape.config.replace(
            "`TENURE_TRANSPORT=polling` (LISTEN/NOTIFY, poll fallback)",
            "`TENURE_TRANSPORT=celery` (the example project's default) on the filesystem "
            "broker, **no Celery worker running**: only the broker-less executors take jobs",
        ),
    )

    def __init__(self) -> None:
        Tenure.__init__(
            self,
            key="tenure-celery-defaults",
            db="soak_tenure",
            TENURE_JOB_MODULES="bench.tenure_jobs,bench.peers.tenure_soak",
            TENURE_TRANSPORT="celery",
            CELERY_BROKER_URL="filesystem://",
        )
        self.label = "Tenure (example defaults: Celery transport, no Celery worker)"


class SoakPgQueuer(PgQueuer):
    """pgqueuer on asyncpg, batch 4, at most 8 tasks per process, its autovacuum settings."""

    soak_shape = Shape(
        table_like="pgqueuer%",
        main_tables=("pgqueuer", "pgqueuer_log"),
        claim_like=("%SKIP LOCKED%", "%pgqueuer%"),
        claim_not_like=("%pgqueuer_schedules%",),
        left_sql="SELECT count(*) FROM pgqueuer",
        kept_sql=(
            "SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful') "
            "+ (SELECT count(*) FROM pgqueuer)"
        ),
        config=(
            f"{WORKER_PROCESSES} x `pgqueuer.run(main, batch_size=4, max_concurrent_tasks=8, "
            "dequeue_timeout=30 s)` (`bench/peers/pgqueuer_soak.py`: what `pgq run ... "
            "--batch-size 4 --max-concurrent-tasks 8` does), the asyncpg driver on one dedicated "
            "connection per worker, async handlers (`asyncio.sleep`); `pgq install` then `pgq "
            "autovac` (its recommended per-table autovacuum settings and fillfactor 70 on its "
            "queue table). Enqueue: `Queries.enqueue(kind, payload)` on asyncpg, one statement "
            "each (autocommit)."
        ),
    )

    def __init__(self) -> None:
        super().__init__()
        db = "soak_pgqueuer"
        self.db = db
        self.label = "pgqueuer (asyncpg)"
        self.extra_env = {"BENCH_DSN": common.dsn(db), "PGDSN": common.dsn(db)}

    def install(self) -> None:
        super().install()
        # Its performance guide's checklist: "Run `pgq autovac` after installation".
        self._run([str(BIN / "pgq"), "autovac"])

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [[PYTHON, "-m", "bench.peers.pgqueuer_soak"]] * WORKER_PROCESSES


class SoakProcrastinate(Procrastinate):
    """procrastinate: 2 x ``procrastinate worker --concurrency 8`` on async tasks."""

    soak_shape = Shape(
        table_like="procrastinate\\_%",
        main_tables=("procrastinate_jobs", "procrastinate_events"),
        claim_like=("%procrastinate_fetch_job%",),
        claim_not_like=("%CREATE FUNCTION%",),
        left_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        kept_sql="SELECT count(*) FROM procrastinate_jobs",
        config=(
            f"{WORKER_PROCESSES} x `procrastinate --app bench.peers.procrastinate_soak.app worker "
            f"--concurrency {PROCRASTINATE_CONCURRENCY}` (async tasks, `asyncio.sleep`), "
            "psycopg 3 pool connector; every other worker option at its default (LISTEN/NOTIFY "
            "with 5 s polling fallback, finished jobs kept: `delete_jobs=never`). Enqueue: "
            "`task.defer(seq=...)`, one transaction each."
        ),
    )

    def __init__(self) -> None:
        super().__init__()
        db = "soak_procrastinate"
        self.db = db
        self.extra_env = {"BENCH_DSN": common.dsn(db)}

    def worker_cmds(self, n: int) -> list[list[str]]:
        cmd = [
            str(BIN / "procrastinate"),
            "--app",
            "bench.peers.procrastinate_soak.app",
            "--log-level",
            "warning",
            "worker",
            "--concurrency",
            str(PROCRASTINATE_CONCURRENCY),
        ]
        return [cmd] * WORKER_PROCESSES


SOAK_SYSTEMS: dict[str, type[System]] = {
    "tenure": SoakTenure,
    "tenure-celery-defaults": SoakTenureDefaults,
    "pgqueuer": SoakPgQueuer,
    "procrastinate": SoakProcrastinate,
}


def _shape(system: System) -> Shape:
    return system.soak_shape  # type: ignore[attr-defined, no-any-return]


# ---------------------------------------------------------------------------------------------
# The generator: one process of G, each enqueuing every G-th job of one fixed schedule
# ---------------------------------------------------------------------------------------------


class Enqueuer:
    """One system's normal enqueue call, one transaction per job."""

    def setup(self) -> None:
        """Load the client and connect (before the schedule starts)."""

    def enqueue(self, seq: int, kind: str) -> None:
        """Enqueue job ``seq`` of ``kind``; returns once it is committed."""
        raise NotImplementedError


class TenureEnqueuer(Enqueuer):
    def setup(self) -> None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        from scheduler_core.api import registry

        self.types = {k: registry.get(f"soak.{k}") for k in KINDS}

    def enqueue(self, seq: int, kind: str) -> None:
        self.types[kind].enqueue(seq=seq)  # type: ignore[union-attr]


class PgQueuerEnqueuer(Enqueuer):
    def setup(self) -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        from .peers.pgqueuer_soak import DSN

        self.loop = asyncio.new_event_loop()

        async def make() -> Any:
            return Queries(AsyncpgDriver(await asyncpg.connect(DSN)))

        self.q = self.loop.run_until_complete(make())

    def enqueue(self, seq: int, kind: str) -> None:
        self.loop.run_until_complete(self.q.enqueue(kind, str(seq).encode()))


class ProcrastinateEnqueuer(Enqueuer):
    def setup(self) -> None:
        from .peers import procrastinate_soak

        procrastinate_soak.app.open()
        self.tasks = procrastinate_soak.TASKS

    def enqueue(self, seq: int, kind: str) -> None:
        self.tasks[kind].defer(seq=seq)


ENQUEUERS: dict[str, type[Enqueuer]] = {
    "tenure": TenureEnqueuer,
    "tenure-celery-defaults": TenureEnqueuer,
    "pgqueuer": PgQueuerEnqueuer,
    "procrastinate": ProcrastinateEnqueuer,
}


def generate(argv: list[str]) -> None:
    """``--generate KEY PORT RATE K G SECONDS GO OUT``: generator ``K`` of ``G``.

    Job ``seq`` is due at ``t0 + seq / RATE`` (open loop: a late enqueue does not move the
    next one); this process enqueues ``seq = K, K+G, ...``. After each commit it sends
    ``E seq time`` to the receiver. ``t0`` is read from the file ``GO`` once the harness has
    seen the workers start; until then generator 0 enqueues a warm-up job every 0.25 s.
    """
    key, port, rate, k, g, seconds, go, out = argv
    rate_f, k_i, g_i, secs = float(rate), int(k), int(g), float(seconds)
    go_path, out_path = Path(go), Path(out)
    ops = ENQUEUERS[key]()
    ops.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    addr = ("127.0.0.1", int(port))
    sock.sendto(f"R {k_i}".encode(), addr)
    warm, next_warm = 0, 0.0
    while not go_path.exists():
        if k_i == 0 and time.monotonic() >= next_warm:
            ops.enqueue(WARMUP_SEQ + warm, "noop")
            warm += 1
            next_warm = time.monotonic() + 0.25
        time.sleep(0.02)
    t0 = float(go_path.read_text())
    end = t0 + secs
    seq, sent, late, max_lag = k_i, 0, 0, 0.0
    calls: list[float] = []
    while True:
        target = t0 + seq / rate_f
        now = time.time()
        if target >= end or now >= end:
            break
        if target > now:
            time.sleep(target - now)
        before = time.time()
        ops.enqueue(seq, kind_of(seq))
        after = time.time()
        sock.sendto(f"E {seq} {after:.6f}".encode(), addr)
        lag = before - target
        max_lag = max(max_lag, lag)
        late += lag > 0.1
        calls.append(after - before)
        sent += 1
        seq += g_i
    due = sum(1 for s in range(k_i, int(secs * rate_f) + 1, g_i) if s / rate_f < secs)
    out_path.write_text(
        json.dumps(
            {
                "k": k_i,
                "sent": sent,
                "due": due,
                "late_over_100ms": late,
                "max_lag_s": max_lag,
                "enqueue_call_p50_ms": percentile(calls, 50) * 1000,
                "enqueue_call_p99_ms": percentile(calls, 99) * 1000,
                "warmup_jobs": warm,
            }
        )
    )


# ---------------------------------------------------------------------------------------------
# The receiver: pairs each commit ("E seq t") with its handler's start ("seq t")
# ---------------------------------------------------------------------------------------------


SLOW_MS = 10.0
"""A queue wait above this counts as slow in the per-second record (the first ten minutes'
p99 is about 2 ms)."""


class Receiver:
    """UDP receiver on the loopback; per interval, the queue waits of the jobs whose handler
    started in it, and how many jobs were enqueued in it."""

    def __init__(self, n_intervals: int, interval: float, max_seq: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # A large buffer, so a receiving thread held up for a moment loses no datagram.
        for opt in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
            if opt is None:
                continue
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, opt, 32 * 1024 * 1024)
                break
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.n = n_intervals
        self.interval = interval
        self.t0 = math.inf
        self.ready: set[int] = set()
        self.warm = False
        self.enq: dict[int, float] = {}
        self.early: dict[int, float] = {}
        self.started = bytearray(max_seq + 1)
        self.waits = [array("d") for _ in range(n_intervals)]
        # Per second of the run: handler starts, their longest wait and how many waited over
        # SLOW_MS, so a bad minute can be put to the second beside the server's log.
        self.n_seconds = math.ceil(n_intervals * interval)
        self.sec_starts = array("l", bytes(8 * self.n_seconds))
        self.sec_slow = array("l", bytes(8 * self.n_seconds))
        self.sec_max = array("d", bytes(8 * self.n_seconds))
        self.enqueued = [0] * n_intervals
        self.starts = [0] * n_intervals
        self.after_end = 0
        self.duplicates = 0
        self.total_enqueued = 0
        self.total_started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _idx(self, t: float) -> int:
        if self.t0 == math.inf:
            return -1
        return int((t - self.t0) // self.interval)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(128)
            except TimeoutError:
                continue
            except OSError:
                return
            parts = data.split()
            if parts[0] == b"E":
                seq, t = int(parts[1]), float(parts[2])
                self.total_enqueued += 1
                i = self._idx(t)
                if 0 <= i < self.n:
                    self.enqueued[i] += 1
                st = self.early.pop(seq, None)
                if st is None:
                    self.enq[seq] = t
                else:
                    self._pair(t, st)
            elif parts[0] == b"R":
                self.ready.add(int(parts[1]))
            else:
                seq, t = int(parts[0]), float(parts[1])
                if seq >= WARMUP_SEQ:
                    self.warm = True
                    continue
                if seq >= len(self.started):
                    continue
                if self.started[seq]:
                    self.duplicates += 1
                    continue
                self.started[seq] = 1
                self.total_started += 1
                et = self.enq.pop(seq, None)
                if et is None:
                    self.early[seq] = t
                else:
                    self._pair(et, t)

    def _pair(self, enq_t: float, start_t: float) -> None:
        i = self._idx(start_t)
        if 0 <= i < self.n:
            self.starts[i] += 1
            # The handler may report before the enqueuing call has returned.
            wait = max(0.0, start_t - enq_t)
            self.waits[i].append(wait)
            sec = int(start_t - self.t0)
            if 0 <= sec < self.n_seconds:
                self.sec_starts[sec] += 1
                self.sec_max[sec] = max(self.sec_max[sec], wait)
                if wait * 1000 > SLOW_MS:
                    self.sec_slow[sec] += 1
        elif i >= self.n:
            self.after_end += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------


def _proc_stats() -> dict[int, list[str]]:
    """Every process's ``/proc/<pid>/stat`` fields after its name (``state`` first, so
    ``ppid`` is [1], ``utime`` and ``stime`` [11] and [12]); a process gone meanwhile is left
    out."""
    out: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{name}/stat") as f:
            # The name may hold spaces and parentheses: the fields follow its last ')'.
            out[int(name)] = f.read().rsplit(")", 1)[1].split()
    return out


def _tree_rss(pids: list[int]) -> int:
    """Resident memory (bytes) of ``pids`` and all their descendants, from /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, fields in _proc_stats().items():
        with contextlib.suppress(ValueError, IndexError):
            children[int(fields[1])].append(pid)
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(children.get(p, []))
    total = 0
    for p in seen:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


TOP_PROCESSES = 8
"""How many of the busiest processes each second of the machine record keeps at most."""

TOP_SHARE = 5.0
"""The least share of one CPU (%) a process used in a second for the record to keep it: a
burst of a tenth of a second (a statement scanning a table) is kept beside the steady users."""


class MachineSampler:
    """Once a second of the run: how busy the machine's CPUs were (and how much of that was
    waiting on the disk, or taken by the host), and which processes used them most (every one
    above ``TOP_SHARE``, at most ``TOP_PROCESSES``). A database backend is named by its type or
    by the statement it last ran, read from ``pg_stat_activity`` in the same second, so a slow
    second can be put to the process that had the CPUs then, not only to what the server's log
    records."""

    def __init__(self, t0: float, n_seconds: int) -> None:
        self.t0 = t0
        self.n = n_seconds
        self.busy = array("d", bytes(8 * n_seconds))
        self.iowait = array("d", bytes(8 * n_seconds))
        self.steal = array("d", bytes(8 * n_seconds))
        self.top: list[list[list[Any]]] = [[] for _ in range(n_seconds)]
        self.hz = os.sysconf("SC_CLK_TCK")
        self.conn = common.connect("postgres")
        self.conn.execute("SET application_name = 'soak-machine'")
        self._names: dict[int, str] = {}
        self.names: list[str] = []
        self._index_of: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _cpu() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]

    @staticmethod
    def _ticks() -> dict[int, int]:
        """Each process's CPU time so far (user and system, clock ticks)."""
        out: dict[int, int] = {}
        for pid, fields in _proc_stats().items():
            with contextlib.suppress(ValueError, IndexError):
                out[pid] = int(fields[11]) + int(fields[12])
        return out

    def _backends(self) -> dict[int, str]:
        """Each server process's name for this second: its type, or its last statement."""
        rows = self.conn.execute(
            "SELECT pid, backend_type, coalesce(application_name, ''), "
            "left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 70) "
            "FROM pg_stat_activity"
        ).fetchall()
        names: dict[int, str] = {}
        for pid, kind, app, query in rows:
            if kind != "client backend":
                names[int(pid)] = f"pg {kind}"
            elif app.startswith("soak-"):
                names[int(pid)] = f"pg {app}"
            else:
                names[int(pid)] = f"pg: {query}" if query else "pg client (idle)"
        return names

    def _name(self, pid: int, backends: dict[int, str]) -> str:
        if pid in backends:
            return backends[pid]
        if pid not in self._names:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                argv = []
            if not argv:
                # A kernel thread has no command line: its name, as ps shows it.
                with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
                    argv = [f"[{f.read().strip()}]"]
            line = " ".join(argv)
            label = next(
                (
                    name
                    for key, name in (
                        ("run_scheduler", "scheduler"),
                        ("run_executor", "executor"),
                        ("--generate", "generator"),
                        ("bench.soak", "harness"),
                    )
                    if key in line
                ),
                " ".join(a if a.startswith("[") else os.path.basename(a) for a in argv[:3])[:60]
                or f"pid {pid}",
            )
            self._names[pid] = label
        return self._names[pid]

    def _index(self, name: str) -> int:
        """The number of a process name in ``names`` (the JSON keeps each name once)."""
        if name not in self._index_of:
            self._index_of[name] = len(self.names)
            self.names.append(name)
        return self._index_of[name]

    def _loop(self) -> None:
        cpu, ticks, at = self._cpu(), self._ticks(), time.monotonic()
        while not self._stop.is_set():
            now = time.time()
            sec = int(now - self.t0)
            # Sample at each whole second of the run: the sample taken at t0 + i + 1 covers
            # second i.
            self._stop.wait(max(0.0, self.t0 + sec + 1 - now))
            try:
                cpu2, ticks2, backends = self._cpu(), self._ticks(), self._backends()
            except (OSError, psycopg.Error):
                continue
            at2 = time.monotonic()
            # A share is of the time since the last sample, which a late wake-up stretches.
            per_cpu = 100.0 / self.hz / max(at2 - at, 0.001)
            i = sec
            d = [b - a for a, b in zip(cpu, cpu2, strict=True)]
            total = sum(d) or 1
            if 0 <= i < self.n:
                # user nice system idle iowait irq softirq steal
                self.busy[i] = round(100.0 * (d[0] + d[1] + d[2] + d[5] + d[6]) / total, 1)
                self.iowait[i] = round(100.0 * d[4] / total, 1)
                self.steal[i] = round(100.0 * d[7] / total, 1)
                used = sorted(
                    ((t - ticks.get(pid, t), pid) for pid, t in ticks2.items()), reverse=True
                )
                self.top[i] = [
                    [self._index(self._name(pid, backends)), round(dt_ * per_cpu, 0)]
                    for dt_, pid in used[:TOP_PROCESSES]
                    if dt_ * per_cpu >= TOP_SHARE
                ]
            cpu, ticks, at = cpu2, ticks2, at2

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the record for the JSON: per second the CPUs' busy, iowait and steal
        percentages and the busiest processes as ``[number in names, share]`` (a share is of
        one CPU, so a process using both reads 200)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(psycopg.Error):
            self.conn.close()
        return {
            "busy_pct": list(self.busy),
            "iowait_pct": list(self.iowait),
            "steal_pct": list(self.steal),
            "cpus": os.cpu_count(),
            "names": self.names,
            "top": self.top,
        }


class Sampler:
    """The database figures of one system, read with the harness's own connections."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.shape = _shape(system)
        assert system.db
        self.db = system.db
        self.admin = common.connect("postgres")
        self.conn = common.connect(self.db)
        for c in (self.admin, self.conn):
            c.execute("SET application_name = 'soak-sampler'")

    def close(self) -> None:
        self.admin.close()
        self.conn.close()

    def claim(self) -> tuple[int, float, list[dict[str, Any]]]:
        """Calls and total execution time (ms) of the claim statements so far, and which."""
        rows = self.admin.execute(
            "SELECT s.calls, s.total_exec_time, left(regexp_replace(s.query, '\\s+', ' ', 'g'),"
            " 160) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s AND s.query ILIKE ALL(%s) AND NOT (s.query ILIKE ANY(%s))",
            [self.db, list(self.shape.claim_like), list(self.shape.claim_not_like) or ["-"]],
        ).fetchall()
        return (
            sum(int(r[0]) for r in rows),
            sum(float(r[1]) for r in rows),
            [{"calls": int(r[0]), "total_ms": float(r[1]), "query": r[2]} for r in rows],
        )

    def sizes(self) -> dict[str, int]:
        """pg_total_relation_size (heap, indexes, TOAST) of each of the system's tables."""
        return {
            r[0]: int(r[1])
            for r in self.conn.execute(
                "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables "
                "WHERE relname LIKE %s",
                [self.shape.table_like],
            )
        }

    def table_options(self) -> dict[str, list[str]]:
        """Storage settings the system's own schema put on its tables (``reloptions``)."""
        return {
            r[0]: list(r[1])
            for r in self.conn.execute(
                "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_stat_user_tables t "
                "ON t.relid = c.oid WHERE t.relname LIKE %s AND c.reloptions IS NOT NULL "
                "ORDER BY 1",
                [self.shape.table_like],
            )
        }

    def relations(self) -> dict[str, int]:
        """Bytes of each table (heap and TOAST) and of each of its indexes, by name: where the
        space is, which the per-table total hides (an index on an ever-growing key keeps the
        pages a burst of versions split, while the heap gives its dead space back)."""
        return {
            r[0]: int(r[1])
            for r in self.conn.execute(
                "SELECT c.relname, pg_table_size(c.oid) FROM pg_class c "
                "JOIN pg_stat_user_tables t ON t.relid = c.oid WHERE t.relname LIKE %s "
                "UNION ALL "
                "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_stat_user_tables t ON t.relid = x.indrelid WHERE t.relname LIKE %s",
                [self.shape.table_like, self.shape.table_like],
            )
        }

    def server(self) -> dict[str, float]:
        """The cluster's cumulative WAL and buffer-write counters and the machine's dirty page
        cache: what a checkpoint, a vacuum or a backend writing its own buffers costs, per
        interval (their differences). Counters a server version lacks are left out."""
        out: dict[str, float] = {}
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        for sql in (
            "SELECT wal_records, wal_fpi, wal_bytes, wal_buffers_full FROM pg_stat_wal",
            "SELECT checkpoints_timed, checkpoints_req, checkpoint_write_time, "
            "checkpoint_sync_time, buffers_checkpoint, buffers_clean, buffers_backend, "
            "buffers_backend_fsync FROM pg_stat_bgwriter",
        ):
            with contextlib.suppress(psycopg.Error):
                cur = self.admin.execute(sql)
                row = cur.fetchone()
                names = [d.name for d in cur.description or []]
                if row is not None:
                    out.update({n: float(v) for n, v in zip(names, row, strict=True)})
        with contextlib.suppress(OSError):
            for line in Path("/proc/meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("Dirty", "Writeback"):
                    out[f"os_{key.lower()}_bytes"] = float(rest.split()[0]) * 1024
        return out

    def sample(self, t: float, receiver: Receiver | None, pids: list[int]) -> dict[str, Any]:
        """Everything the report follows per interval, at ``t`` seconds into the run."""
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        tables = {
            r[0]: {
                "n_dead_tup": int(r[1]),
                "n_live_tup": int(r[2]),
                "autovacuum_count": int(r[3]),
                "autoanalyze_count": int(r[4]),
                "vacuum_count": int(r[5]),
            }
            for r in self.conn.execute(
                "SELECT relname, n_dead_tup, n_live_tup, autovacuum_count, autoanalyze_count, "
                "vacuum_count FROM pg_stat_user_tables WHERE relname = ANY(%s)",
                [list(self.shape.main_tables)],
            )
        }
        xmin_age, xact_s = self.admin.execute(
            "SELECT max(age(backend_xmin)), max(extract(epoch FROM now() - xact_start)) "
            "FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()"
        ).fetchone()  # type: ignore[misc]
        calls, total_ms, _ = self.claim()
        sizes = self.sizes()
        # Each index's size and the entries its statistics count: what the upkeep's need
        # estimate reads.
        indexes = {
            r[0]: [int(r[1]), int(r[2])]
            for r in self.conn.execute(
                "SELECT i.relname, pg_relation_size(i.oid), i.reltuples::bigint FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_stat_user_tables t ON t.relid = x.indrelid WHERE t.relname = ANY(%s)",
                [list(self.shape.main_tables)],
            )
        }
        return {
            "t": t,
            "claim_calls": calls,
            "claim_total_ms": total_ms,
            "size_bytes": sum(sizes.values()),
            "sizes": sizes,
            "indexes": indexes,
            "tables": tables,
            "oldest_xmin_age": int(xmin_age or 0),
            # Clocks of the server and of this process differ by a hair: never below zero.
            "oldest_snapshot_seconds": max(0.0, float(xact_s or 0.0)),
            # Everything else this machine runs counts too (it is shared): its 1-minute load.
            "loadavg": os.getloadavg()[0],
            "rss_bytes": _tree_rss(pids),
            "enqueued_total": receiver.total_enqueued if receiver else 0,
            "started_total": receiver.total_started if receiver else 0,
            "server": self.server(),
        }


def _reader(db: str, table: str, t_open: float, t_close: float) -> Any:
    """The long reader: a REPEATABLE READ transaction that reads ``table`` once at ``t_open``
    (taking its snapshot) and stays idle in it until ``t_close``, then rolls back."""
    out: dict[str, Any] = {"table": table}

    def run() -> None:
        try:
            with common.connect(db) as conn:
                conn.execute("SET application_name = 'soak-reader'")
                time.sleep(max(0.0, t_open - time.time()))
                out["opened_at"] = time.time()
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                out["rows_read"] = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]
                out["read_seconds"] = time.time() - out["opened_at"]
                time.sleep(max(0.0, t_close - time.time()))
                conn.execute("ROLLBACK")
                out["closed_at"] = time.time()
        except Exception as e:  # reported; the soak goes on without it
            out["error"] = repr(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    out["thread"] = th
    return out


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What one soak does."""

    minutes: float
    interval: float
    fraction: float
    rate: float | None
    capacity_jobs: int
    systems: list[str]
    generators: int | None
    out_dir: Path
    stem: str
    short: bool
    keep_cluster: bool
    command: str
    startup_timeout: float = 120.0
    reader: bool = True
    """Whether a snapshot is held through the middle third (not in the capacity probe)."""
    capacity_seconds: float = 20.0
    """Seconds of each step of the end-to-end capacity search (:func:`measure_end_to_end`)."""

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @property
    def n_intervals(self) -> int:
        return max(1, round(self.seconds / self.interval))


def measure_capacity(system: SoakTenure, jobs: int) -> dict[str, Any]:
    """Tenure's drain capacity with the soak's worker set: the workers start on an empty
    queue, ``jobs`` no-op jobs are enqueued in bulk once both executors are up, and the rate
    is taken between 10 % and 90 % done."""
    system.reset()
    progress: list[tuple[float, int]] = []
    with processes("soak-capacity", grace=5.0) as procs, common.connect(system.db or "") as conn:
        for cmd in system.worker_cmds(0):
            procs.start(cmd, system.env())
        deadline = time.monotonic() + 90
        while (
            int(
                conn.execute(  # type: ignore[index]
                    "SELECT count(*) FROM tenure_executor WHERE stopped_at IS NULL"
                    " AND transport <> 'scheduler'"
                ).fetchone()[0]
            )
            < WORKER_PROCESSES
        ):
            if time.monotonic() > deadline or procs.alive() == 0:
                raise HarnessError("Tenure's executors did not start for the capacity drain")
            time.sleep(0.1)
        time.sleep(1.0)
        t0 = time.monotonic()
        _agent(system, "preload", jobs)
        done = 0
        while done < jobs and time.monotonic() - t0 < 120:
            time.sleep(0.1)
            done = system.done(conn, jobs)
            progress.append((time.monotonic() - t0, done))
        elapsed = time.monotonic() - t0
    system.reset()
    return {
        "jobs": jobs,
        "done": done,
        "per_second": steady_rate(progress, jobs),
        "wall_per_second": done / elapsed if elapsed else float("nan"),
        "seconds": elapsed,
    }


PROBE_STEPS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
"""The rates the capacity search offers, as fractions of the workers' bulk drain rate."""
PROBE_KEPT_UP = 0.95
"""A step is held when its second half started and enqueued this share of its schedule..."""
PROBE_P99_MS = 1000.0
"""... and no interval of it had a p99 queue wait above this."""


def measure_end_to_end(system: SoakTenure, plan: Plan, drain: float) -> dict[str, Any]:
    """Tenure's capacity in the soak's own shape: the highest steady rate of the soak's mixed
    jobs, enqueued one per transaction by the soak's generators (as many as the soak would
    start for that rate), that the soak's workers keep up with, with no reader.

    The rates of :data:`PROBE_STEPS` x ``drain`` (the workers' bulk drain rate) are offered
    in turn, ``plan.capacity_seconds`` each, until one is not held: over its second half,
    fewer than :data:`PROBE_KEPT_UP` of the scheduled jobs were enqueued or started, or an
    interval's p99 queue wait passed :data:`PROBE_P99_MS`. Offering more than the machine
    can enqueue would measure something else: a dozen generator processes running flat out
    take the two cores from the workers."""
    interval = max(1.0, plan.capacity_seconds / 6)
    probe = dataclasses.replace(
        plan, minutes=plan.capacity_seconds / 60, interval=interval, reader=False
    )
    steps: list[dict[str, Any]] = []
    held = float("nan")
    for frac in PROBE_STEPS:
        offered = max(1.0, round(frac * drain))
        generators = _generators(offered)
        system.reset()
        rec = soak_system(system, probe, offered, generators)
        system.reset()
        rows = rec["intervals"]
        half = rows[len(rows) // 2 :] or rows
        secs = sum(r["end_s"] - r["start_s"] for r in half)
        started = sum(r["started_per_s"] * (r["end_s"] - r["start_s"]) for r in half) / secs
        enqueued = sum(r["enqueued_per_s"] * (r["end_s"] - r["start_s"]) for r in half) / secs
        p99 = max(
            (r["wait_p99_ms"] for r in half if r["wait_p99_ms"] == r["wait_p99_ms"]),
            default=float("nan"),
        )
        ok = (
            enqueued >= PROBE_KEPT_UP * offered
            and started >= PROBE_KEPT_UP * offered
            and p99 <= PROBE_P99_MS
        )
        steps.append(
            {
                "offered_per_second": offered,
                "generators": generators,
                "enqueued_per_second": enqueued,
                "started_per_second": started,
                "p99_ms": p99,
                "held": ok,
            }
        )
        _log(
            f"capacity step {offered:.0f} jobs/s: enqueued {enqueued:.0f}/s, started "
            f"{started:.0f}/s, p99 {p99:.0f} ms -> {'held' if ok else 'not held'}"
        )
        if not ok:
            break
        held = offered
    if held != held:
        # Not even the first step was held: the rate it did start is all there is to go on.
        held = steps[0]["started_per_second"] if steps else float("nan")
    return {
        "seconds_per_step": probe.seconds,
        "drain_per_second": drain,
        "steps": steps,
        "per_second": held,
    }


def _generators(rate: float) -> int:
    """Generator processes for ``rate`` jobs a second: Tenure's enqueue costs about 3.5 ms of
    client CPU and 8 ms of wall time on an idle 2-core machine (the peers' 0.5-0.9 and 3),
    and about 20 ms of wall time under the soak's load: one process per 25 jobs/s keeps its
    share on schedule, and the same number serves every system."""
    return max(2, min(12, math.ceil(rate / 25)))


def soak_system(system: System, plan: Plan, rate: float, generators: int) -> dict[str, Any]:
    """Run one system for ``plan.minutes`` at ``rate`` jobs a second; every raw figure."""
    shape = _shape(system)
    n, interval, secs = plan.n_intervals, plan.interval, plan.seconds
    max_seq = int(rate * secs) + generators + 1
    receiver = Receiver(n, interval, max_seq)
    run_dir = SOAK / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    go = run_dir / f"go-{system.key}"
    sampler = Sampler(system)
    samples: list[dict[str, Any]] = []
    out: dict[str, Any] = {"label": system.label, "config": _shape(system).config}
    empty = sampler.sizes()
    out["size_empty_bytes"] = sum(empty.values())
    out["table_options"] = sampler.table_options()
    out["database"] = sampler.db
    reader: dict[str, Any] = {}
    machine: MachineSampler | None = None
    try:
        env = system.env(BENCH_PING_PORT=str(receiver.port))
        with (
            processes(f"soak-{system.key}", grace=10.0) as workers,
            processes(f"soak-gen-{system.key}", grace=2.0) as gens,
        ):
            for cmd in system.worker_cmds(WORKER_PROCESSES):
                # The scheduler says what each upkeep look saw and did (INFO), for the report.
                extra = {"TENURE_LOG_LEVEL": "INFO"} if "run_scheduler" in cmd else {}
                workers.start(cmd, {**env, **extra})
            for k in range(generators):
                gens.start(
                    [
                        PYTHON,
                        "-m",
                        "bench.soak",
                        "--generate",
                        system.key,
                        str(receiver.port),
                        repr(rate),
                        str(k),
                        str(generators),
                        repr(secs),
                        str(go),
                        str(run_dir / f"gen-{system.key}-{k}.json"),
                    ],
                    system.env(),
                )
            t_start = time.monotonic()
            while not (receiver.warm and len(receiver.ready) == generators):
                dead = len(workers.procs) - workers.alive()
                if dead or gens.alive() < generators:
                    raise HarnessError(
                        f"{system.key}: {dead} worker(s) and "
                        f"{generators - gens.alive()} generator(s) exited before the start "
                        "(logs: var/bench-logs/soak-*.log)"
                    )
                if time.monotonic() - t_start > plan.startup_timeout:
                    raise HarnessError(
                        f"{system.key}: no warm-up job started within {plan.startup_timeout:.0f} s"
                    )
                time.sleep(0.1)
            out["startup_seconds"] = time.monotonic() - t_start
            # The warm-up jobs still queued are done before the schedule starts.
            time.sleep(2.0)
            pids = [p.pid for p in workers.procs]
            t0 = time.time() + 0.5
            receiver.t0 = t0
            machine = MachineSampler(t0, receiver.n_seconds)
            samples.append(sampler.sample(0.0, receiver, pids))
            go.with_suffix(".tmp").write_text(repr(t0))
            go.with_suffix(".tmp").rename(go)
            if plan.reader:
                reader = _reader(sampler.db, shape.main_tables[0], t0 + secs / 3, t0 + 2 * secs / 3)
            _log(f"{system.key}: running {plan.minutes:g} min at {rate:.0f} jobs/s")
            for i in range(1, n + 1):
                time.sleep(max(0.0, t0 + i * interval - time.time()))
                samples.append(sampler.sample(i * interval, receiver, pids))
                if i % max(1, n // 10) == 0:
                    s = samples[-1]
                    _log(
                        f"{system.key}: {s['t']:.0f} s, enqueued {s['enqueued_total']:,}, "
                        f"started {s['started_total']:,}, workers alive {workers.alive()}"
                    )
            out["workers_alive_at_end"] = workers.alive()
            out["jobs_left"] = int(sampler.conn.execute(shape.left_sql).fetchone()[0])  # type: ignore[index]
            deadline = time.monotonic() + 15
            while gens.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        th = reader.pop("thread", None)
        if th is not None:
            th.join(timeout=30)
        for key in ("opened_at", "closed_at"):
            if key in reader:
                reader[key] = reader[key] - t0
        out["reader"] = reader
        out["generators"] = [
            json.loads(p.read_text()) for p in sorted(run_dir.glob(f"gen-{system.key}-*.json"))
        ]
        out["claim_statements"] = sampler.claim()[2]
        out["retained"] = _retained(sampler, shape)
        out["upkeep_log"] = _upkeep_log(workers.logs)
    finally:
        receiver.stop()
        sampler.close()
        if machine is not None:
            out["machine"] = machine.stop()
    out["samples"] = samples
    out["t0_epoch"] = receiver.t0
    out["seconds"] = _seconds(receiver)
    out["intervals"] = _intervals(receiver, samples, interval)
    out["receiver"] = {
        "enqueued": receiver.total_enqueued,
        "started": receiver.total_started,
        "started_after_end": receiver.after_end,
        "duplicate_starts": receiver.duplicates,
        "enqueued_never_started": len(receiver.enq),
        "started_without_enqueue_record": len(receiver.early),
    }
    out["phases"] = _phases(receiver, plan)
    out["verdicts"] = _verdicts(receiver, out, plan)
    if receiver.total_started == 0:
        raise HarnessError(f"{system.key}: no job was processed")
    return out


UPKEEP_LOGGERS = (" tenure.indexes ", " tenure.tables ")
"""The loggers of the scheduler's table compaction and index upkeep."""


def _upkeep_log(logs: list[Path]) -> list[str]:
    """The lines of the upkeep's loggers in the processes' logs (Tenure's scheduler), in the
    order written: what each look saw and rebuilt."""
    lines: list[str] = []
    for path in logs:
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace")
            lines += [ln for ln in text.splitlines() if any(k in ln for k in UPKEEP_LOGGERS)]
    return sorted(lines)


_LOG_LINE = re.compile(r"^(\d+\.\d+):([A-Z]+):\s+(.*)$")
_NUM = r"([\d.]+)"


def server_log(path: Path) -> dict[str, list[dict[str, Any]]]:
    """What the soak cluster's own log says it did (needs :data:`CLUSTER_SETTINGS`' prefix):
    each checkpoint, each autovacuum and autoanalyze with its duration and WAL, and every
    warning or error. Times are epoch seconds."""
    entries: list[tuple[float, str, str]] = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            m = _LOG_LINE.match(line)
            if m:
                entries.append((float(m[1]), m[2], m[3]))
            elif entries and line.startswith("\t"):
                t, level, text = entries[-1]
                entries[-1] = (t, level, f"{text}\n{line.strip()}")
    out: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "vacuums": [], "problems": []}
    started: float | None = None
    for t, level, text in entries:
        if text.startswith("checkpoint starting"):
            started = t
        elif text.startswith("checkpoint complete"):
            ck: dict[str, Any] = {"start": started, "end": t}
            for key, pattern in (
                ("buffers", r"wrote (\d+) buffers"),
                ("write_s", rf"write={_NUM} s"),
                ("sync_s", rf"sync={_NUM} s"),
                ("total_s", rf"total={_NUM} s"),
                ("sync_files", r"sync files=(\d+)"),
                ("longest_sync_s", rf"longest={_NUM} s"),
                ("distance_kb", r"distance=(\d+) kB"),
            ):
                m = re.search(pattern, text)
                ck[key] = float(m[1]) if m else None
            out["checkpoints"].append(ck)
            started = None
        elif text.startswith(("automatic vacuum", "automatic analyze")):
            table = re.search(r'of table "([^"]+)"', text)
            elapsed = re.search(rf"elapsed: {_NUM} s", text)
            wal = re.search(r"WAL usage: (\d+) records, (\d+) full page images, (\d+) bytes", text)
            secs = float(elapsed[1]) if elapsed else 0.0
            out["vacuums"].append(
                {
                    "kind": "vacuum" if text.startswith("automatic vacuum") else "analyze",
                    "table": table[1].rsplit(".", 1)[-1] if table else "?",
                    "database": table[1].split(".", 1)[0] if table else "?",
                    "start": t - secs,
                    "end": t,
                    "wal_fpi": int(wal[2]) if wal else None,
                    "wal_bytes": int(wal[3]) if wal else None,
                }
            )
        elif level in ("WARNING", "ERROR", "FATAL", "PANIC"):
            out["problems"].append({"t": t, "level": level, "text": text[:300]})
    return out


def _log_time(line: str) -> float | None:
    """Epoch seconds of a Tenure log line's clock time (``2026-12-05 20:53:41,807 ...``)."""
    try:
        stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return stamp.timestamp()


def _retained(sampler: Sampler, shape: Shape) -> dict[str, Any]:
    """Bytes the tables keep per job they still hold: every table rewritten compactly
    (``VACUUM FULL``, workers stopped) and its size divided by the jobs it holds."""
    before = sum(sampler.sizes().values())
    relations_before = sampler.relations()
    kept = int(sampler.conn.execute(shape.kept_sql).fetchone()[0])  # type: ignore[index]
    t = time.monotonic()
    for table in sampler.sizes():
        sampler.conn.execute(f'VACUUM FULL "{table}"')
    compact = sum(sampler.sizes().values())
    return {
        "size_before_bytes": before,
        "compact_bytes": compact,
        "relations_before": relations_before,
        "relations_compact": sampler.relations(),
        "jobs_held": kept,
        "vacuum_full_seconds": time.monotonic() - t,
    }


# ---------------------------------------------------------------------------------------------
# Figures and verdicts
# ---------------------------------------------------------------------------------------------


def _pool(receiver: Receiver, lo: float, hi: float) -> list[float]:
    """Every queue wait (ms) of the intervals within ``[lo, hi)`` seconds of the run."""
    out: list[float] = []
    for i, w in enumerate(receiver.waits):
        start = i * receiver.interval
        if lo - 1e-6 <= start and start + receiver.interval <= hi + 1e-6:
            out.extend(x * 1000 for x in w)
    return out


def _intervals(
    receiver: Receiver, samples: list[dict[str, Any]], interval: float
) -> list[dict[str, Any]]:
    rows = []
    for i in range(receiver.n):
        waits = [x * 1000 for x in receiver.waits[i]]
        prev, cur = samples[i], samples[i + 1] if i + 1 < len(samples) else None
        row: dict[str, Any] = {
            "i": i,
            "start_s": i * interval,
            "end_s": (i + 1) * interval,
            "enqueued_per_s": receiver.enqueued[i] / interval,
            "started_per_s": receiver.starts[i] / interval,
            "wait_p50_ms": percentile(waits, 50),
            "wait_p99_ms": percentile(waits, 99),
            "wait_max_ms": max(waits) if waits else float("nan"),
        }
        if cur is not None:
            calls = cur["claim_calls"] - prev["claim_calls"]
            row.update(
                claim_calls=calls,
                claim_mean_ms=(cur["claim_total_ms"] - prev["claim_total_ms"]) / calls
                if calls
                else float("nan"),
                size_bytes=cur["size_bytes"],
                dead_tuples=sum(t["n_dead_tup"] for t in cur["tables"].values()),
                dead_by_table={k: t["n_dead_tup"] for k, t in cur["tables"].items()},
                autovacuum_runs=sum(t["autovacuum_count"] for t in cur["tables"].values()),
                oldest_xmin_age=cur["oldest_xmin_age"],
                oldest_snapshot_seconds=cur["oldest_snapshot_seconds"],
                rss_bytes=cur["rss_bytes"],
                loadavg=cur.get("loadavg"),
                backlog=cur["enqueued_total"] - cur["started_total"],
                **_server_delta(prev.get("server") or {}, cur.get("server") or {}),
            )
        rows.append(row)
    return rows


def _server_delta(prev: dict[str, float], cur: dict[str, float]) -> dict[str, float]:
    """One interval's share of the server's counters (see :meth:`Sampler.server`)."""

    def d(key: str) -> float:
        return cur[key] - prev[key] if key in cur and key in prev else float("nan")

    return {
        "wal_bytes": d("wal_bytes"),
        "wal_fpi": d("wal_fpi"),
        "buffers_checkpoint": d("buffers_checkpoint"),
        "buffers_backend": d("buffers_backend"),
        "buffers_backend_fsync": d("buffers_backend_fsync"),
        "os_dirty_bytes": cur.get("os_dirty_bytes", float("nan")),
    }


def _seconds(receiver: Receiver) -> dict[str, list[float]]:
    """The receiver's per-second record, for the JSON (waits in ms)."""
    return {
        "starts": list(receiver.sec_starts),
        "slow": list(receiver.sec_slow),
        "max_ms": [round(x * 1000, 2) for x in receiver.sec_max],
    }


def _phases(receiver: Receiver, plan: Plan) -> dict[str, Any]:
    s = plan.seconds
    out = {}
    for name, lo, hi in (
        ("before the reader", 0.0, s / 3),
        ("reader held", s / 3, 2 * s / 3),
        ("after the reader", 2 * s / 3, s),
    ):
        w = _pool(receiver, lo, hi)
        out[name] = {
            "from_s": lo,
            "to_s": hi,
            "jobs": len(w),
            "per_s": len(w) / (hi - lo) if hi > lo else float("nan"),
            "wait_p50_ms": percentile(w, 50),
            "wait_p99_ms": percentile(w, 99),
            "wait_max_ms": max(w) if w else float("nan"),
        }
    return out


def _windows(plan: Plan) -> dict[str, tuple[float, float]]:
    """The verdicts' windows: those of a 60-minute run, scaled to this run's length."""
    s = plan.seconds
    return {
        "first": (0.0, s / 6),
        "last": (s - s / 6, s),
        "reader": (s / 3, 2 * s / 3),
        # Two minutes of a 60-minute run, and never less than one interval.
        "recovery": (2 * s / 3, 2 * s / 3 + max(s / 30, plan.interval)),
        "memory_base": (s / 12, s / 4),
    }


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def _verdicts(receiver: Receiver, out: dict[str, Any], plan: Plan) -> dict[str, Any]:
    win = _windows(plan)
    rows = out["intervals"]
    p99_first = percentile(_pool(receiver, *win["first"]), 99)
    p99_last = percentile(_pool(receiver, *win["last"]), 99)
    baseline = 1.5 * p99_first
    r_lo, r_hi = win["reader"]
    during = [r["wait_p99_ms"] for r in rows if r["end_s"] > r_lo + 1e-6 and r["start_s"] < r_hi]
    worst_during = max((x for x in during if x == x), default=float("nan"))
    back = next(
        (
            r["end_s"] - r_hi
            for r in rows
            if r["start_s"] >= r_hi - 1e-6
            and r["wait_p99_ms"] == r["wait_p99_ms"]
            and r["wait_p99_ms"] <= baseline
        ),
        float("nan"),
    )
    recovery_limit = win["recovery"][1] - win["recovery"][0]
    # Size: after the first window against after the run, allowing for what a system keeps
    # per finished job (measured compactly after the run) times the jobs finished since.
    at_first = min(out["samples"], key=lambda s: abs(s["t"] - win["first"][1]))
    size_first = at_first["size_bytes"]
    size_end = out["samples"][-1]["size_bytes"]
    ret = out.get("retained", {})
    held = ret.get("jobs_held", 0)
    per_job = (ret["compact_bytes"] - out["size_empty_bytes"]) / held if held else 0.0
    finished_since = sum(
        r["started_per_s"] * (r["end_s"] - r["start_s"])
        for r in rows
        if r["start_s"] >= at_first["t"] - 1e-6
    )
    allowance = per_job * finished_since
    mem_base = _mean(
        [
            s["rss_bytes"]
            for s in out["samples"]
            if win["memory_base"][0] <= s["t"] <= win["memory_base"][1]
        ]
    )
    mem_last = _mean([s["rss_bytes"] for s in out["samples"] if s["t"] >= win["last"][0] - 1e-6])
    return {
        "windows": win,
        "p99_first_ms": p99_first,
        "p99_last_ms": p99_last,
        "p99_stable": p99_last <= 1.5 * p99_first,
        "p99_reader_worst_ms": worst_during,
        "p99_reader_under_1s": worst_during < 1000.0,
        "baseline_ms": baseline,
        "back_to_baseline_after_s": back,
        "recovery_limit_s": recovery_limit,
        "recovered": back == back and back <= recovery_limit + 1e-6,
        "size_first_bytes": size_first,
        "size_first_at_s": at_first["t"],
        "size_end_bytes": size_end,
        "bytes_per_job_kept": per_job,
        "jobs_finished_since_first": finished_since,
        "retained_allowance_bytes": allowance,
        "size_bounded": size_end <= size_first + allowance,
        "rss_base_bytes": mem_base,
        "rss_last_bytes": mem_last,
        "memory_flat": abs(mem_last - mem_base) <= 0.10 * mem_base if mem_base else False,
    }


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _f(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def _mb(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x / 1e6:,.1f}"


def _yes(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _mmss(seconds: float) -> str:
    if seconds < 120 or (seconds % 60 and seconds < 600):
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if not seconds % 60 else f"{seconds / 60:.1f} min"


def write_report(data: dict[str, Any], out_dir: Path, stem: str) -> Path:
    """Write ``<stem>.md``, ``<stem>.json`` and ``<stem>.png``; return the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str))
    png = out_dir / f"{stem}.png"
    with contextlib.suppress(ImportError):
        _plot(data, png)
    lines: list[str] = []
    add = lines.append
    win = _windows_from(data)
    add(f"# Soak, {data['date']}: T = {data['plan']['minutes']:g} min per system")
    add("")
    add(
        "Tenure and its peers one after another on a PostgreSQL cluster of the soak's own, each "
        "under the same steady open-loop arrivals of mixed jobs, with a REPEATABLE READ "
        "transaction held open through the middle third. How it works: "
        "[bench/README.md](../README.md#soak)."
    )
    add("")
    runs = data.get("runs")
    if runs:
        add(
            f"This report combines {len(runs)} runs of the same soak, made one after another on "
            "this machine with the same harness and the same R; each run `initdb`'d a cluster "
            "of its own with the same settings (the cluster section is the first run's). "
            f"Combined with `{data['command']}`."
        )
        add("")
        add("| run | systems | command | run time |")
        add("|---|---|---|---|")
        for run in runs:
            add(
                f"| {run['source']} ({run['date']}{', ' + run['revision'] if run.get('revision') else ''}) "
                f"| {', '.join(run['systems'])} | `{run['command']}` "
                f"| {run['elapsed_seconds'] / 60:.1f} min |"
            )
    else:
        add(f"Command: `{data['command']}` (run time {data['elapsed_seconds'] / 60:.1f} min).")
    add("")
    for err in data.get("errors", []):
        add(f"**The harness broke:** `{err}`")
        add("")
    if png.exists():
        add(f"![per-interval figures]({stem}.png)")
        add("")
    # ---- rate --------------------------------------------------------------------------------
    add("## Arrival rate")
    add("")
    cap = data.get("capacity")
    e2e = data.get("capacity_end_to_end")
    if cap and e2e:
        add(
            f"R = **{data['rate']:,.0f} jobs/s** for every system = {data['plan']['fraction']:.0%} "
            f"of Tenure's capacity in the soak's shape, measured at the start on this cluster: "
            f"the highest steady rate of the soak's mixed jobs, enqueued one per transaction by "
            f"the soak's generators, that the soak's workers kept up with "
            f"({e2e['per_second']:,.0f} jobs/s; steps of {e2e['seconds_per_step']:g} s with no "
            f"reader, held when over its second half at least 95 % of the schedule was enqueued "
            f"and started and no interval's p99 wait passed 1 s). The workers alone drain more "
            f"— {cap['jobs']:,} no-op jobs enqueued in bulk into warm idle workers, rate between "
            f"10 % and 90 % done: {cap['per_second']:,.0f} jobs/s — but in the soak the same "
            "two cores and database also run every enqueue."
        )
        add("")
        add("| offered jobs/s | generators | enqueued/s | started/s | worst p99 ms | held |")
        add("|---|---|---|---|---|---|")
        for st in e2e["steps"]:
            add(
                f"| {_f(st['offered_per_second'])} | {st['generators']} | "
                f"{_f(st['enqueued_per_second'])} | {_f(st['started_per_second'])} | "
                f"{_f(st['p99_ms'], 1)} | {_yes(st['held'])} |"
            )
    elif cap:
        add(
            f"R = **{data['rate']:,.0f} jobs/s** for every system = {data['plan']['fraction']:.0%} "
            f"of Tenure's drain capacity measured at the start on this cluster with the soak's "
            f"worker set ({cap['jobs']:,} no-op jobs enqueued in bulk into warm idle workers, "
            f"rate between 10 % and 90 % done: {cap['per_second']:,.0f} jobs/s; wall "
            f"{cap['wall_per_second']:,.0f} jobs/s)."
        )
    else:
        add(f"R = **{_f(data.get('rate'))} jobs/s** for every system, given with `--rate`.")
    add("")
    mix = ", ".join(f"{k} ({v * 1000:g} ms)" for k, v in KINDS.items())
    add(
        f"Jobs: 85 % / 10 % / 5 % {mix}, by sequence number; {data.get('generators')} generator "
        "processes share one fixed schedule (job `seq` due at `t0 + seq / R`), one enqueue per "
        "transaction in each system's normal way. Queue wait = handler start - the moment the "
        "enqueue call returned (committed), both reported over UDP on the loopback. Figures are "
        f"per {_mmss(data['plan']['interval'])} interval, by handler start."
    )
    add("")
    # ---- cluster -----------------------------------------------------------------------------
    add("## The cluster")
    add("")
    show = data["cluster"]["show"]
    add(
        f"PostgreSQL {show['server_version']}, initdb'd by the soak into `var/soak/cluster`, port "
        f"{data['cluster']['port']}. Changed from PostgreSQL's defaults by the soak: "
        + ", ".join(f"`{k}={v}`" for k, v in data["cluster_settings"].items())
        + "; nothing else."
    )
    add("")
    add("| setting | value |")
    add("|---|---|")
    for k, v in show.items():
        add(f"| {k} | {v} |")
    add("")
    add("Every setting the server reports as not at its built-in default (source in brackets):")
    add("")
    add(", ".join(f"`{k}` = {v}" for k, v in data["cluster"]["not_default"].items()))
    add("")
    # ---- systems -----------------------------------------------------------------------------
    add("## Systems")
    add("")
    add("| system | configuration |")
    add("|---|---|")
    for rec in data["systems"].values():
        add(f"| {rec['label']} | {rec.get('config', '')} |")
    add("")
    for rec in data["systems"].values():
        opts = rec.get("table_options")
        if opts is None:
            continue
        add(
            f"Table settings installed by the schema of {rec['label']}: "
            + ("; ".join(f"`{t}` ({', '.join(o)})" for t, o in opts.items()) if opts else "none")
            + "."
        )
        add("")
    # ---- verdicts ----------------------------------------------------------------------------
    add("## Targets")
    add("")
    f_lo, f_hi = win["first"]
    l_lo, l_hi = win["last"]
    r_lo, r_hi = win["reader"]
    m_lo, m_hi = win["memory_base"]
    rec_lim = win["recovery"][1] - win["recovery"][0]
    add(
        f"Windows (those of a 60-minute run scaled to T = {data['plan']['minutes']:g} min): first "
        f"{_mmss(f_hi - f_lo)}, last {_mmss(l_hi - l_lo)}, reader {_mmss(r_lo)} to {_mmss(r_hi)}, "
        f"back to baseline within {_mmss(rec_lim)}, memory base {_mmss(m_lo)} to {_mmss(m_hi)}. "
        "p99 of a window pools every wait in it."
    )
    add("")
    add(
        "| system | p99 last ≤ 1.5 x first | p99 < 1 s while the reader holds | back to "
        "baseline after it | tables + indexes bounded | worker memory flat |"
    )
    add("|---|---|---|---|---|---|")
    for rec in data["systems"].values():
        v = rec.get("verdicts")
        if not v:
            add(f"| {rec['label']} | error: {rec.get('error', '?')} | | | | |")
            continue
        add(
            f"| {rec['label']} "
            f"| {_yes(v['p99_stable'])}: {_f(v['p99_first_ms'], 1)} → {_f(v['p99_last_ms'], 1)} ms "
            f"| {_yes(v['p99_reader_under_1s'])}: worst interval {_f(v['p99_reader_worst_ms'], 1)} ms "
            f"| {_yes(v['recovered'])}: ≤ {_f(v['baseline_ms'], 1)} ms after "
            f"{_f(v['back_to_baseline_after_s'])} s "
            f"| {_yes(v['size_bounded'])}: {_mb(v['size_first_bytes'])} → "
            f"{_mb(v['size_end_bytes'])} MB, allowance {_mb(v['retained_allowance_bytes'])} MB "
            f"| {_yes(v['memory_flat'])}: {_mb(v['rss_base_bytes'])} → {_mb(v['rss_last_bytes'])} MB |"
        )
    add("")
    for rec in data["systems"].values():
        gens = rec.get("generators") or []
        sent, due = sum(g["sent"] for g in gens), sum(g["due"] for g in gens)
        if due and sent < 0.99 * due:
            add(
                f"**{rec['label']}: the generators did not keep R.** They enqueued {sent:,} of the "
                f"{due:,} jobs due ({sent / due:.0%}; median enqueue call "
                f"{percentile([g['enqueue_call_p50_ms'] for g in gens], 50):.1f} ms, schedule up "
                f"to {max(g['max_lag_s'] for g in gens):.1f} s late): its figures are at a lower "
                "arrival rate than R, and its queue waits leave out the time jobs waited to be "
                "enqueued."
            )
            add("")
    add(
        "Retained history: each system keeps a record of every finished job (Tenure its job "
        "and attempt rows for 7 days by default, procrastinate its job and event rows until "
        "deleted, pgqueuer a log row per status change), so its tables grow by design. The "
        "allowance is the bytes a held job costs when the tables are compact — after the run, "
        "workers stopped, every table of the system rewritten with `VACUUM FULL`, (compact size - "
        "size when empty) / jobs the tables hold — times the jobs finished after the first "
        "window (handler starts). Anything above that is bloat: dead space autovacuum did "
        "not return to use."
    )
    add("")
    add(
        "| system | bytes per held job | jobs held | compact size | size before VACUUM FULL | VACUUM FULL took |"
    )
    add("|---|---|---|---|---|---|")
    for rec in data["systems"].values():
        r, v = rec.get("retained"), rec.get("verdicts")
        if not r or not v:
            continue
        add(
            f"| {rec['label']} | {_f(v['bytes_per_job_kept'])} | {_f(r['jobs_held'])} "
            f"| {_mb(r['compact_bytes'])} MB | {_mb(r['size_before_bytes'])} MB "
            f"| {r['vacuum_full_seconds']:.1f} s |"
        )
    add("")
    for rec in data["systems"].values():
        r = rec.get("retained") or {}
        before, compact = r.get("relations_before"), r.get("relations_compact")
        if not before or not compact:
            continue
        add(
            f"Where the space of {rec['label']} was at the end, per table (heap and TOAST) and "
            "per index, above 1 MB, largest excess first:"
        )
        add("")
        add("| relation | size before VACUUM FULL | compact | excess |")
        add("|---|---|---|---|")
        rows = sorted(before, key=lambda n: compact.get(n, 0) - before[n])
        for name in rows:
            if before[name] < 1_000_000:
                continue
            c = compact.get(name, 0)
            add(f"| `{name}` | {_mb(before[name])} MB | {_mb(c)} MB | {_mb(before[name] - c)} MB |")
        add("")
    for rec in data["systems"].values():
        upkeep = rec.get("upkeep_log")
        if not upkeep:
            continue
        add(
            f"What the scheduler's table compaction and index upkeep of {rec['label']} saw and "
            "did, each look (its log, clock time; an index as size/need MB):"
        )
        add("")
        add("```")
        for line in upkeep:
            add(line)
        add("```")
        add("")
    # ---- phases ------------------------------------------------------------------------------
    add("## Queue wait by phase")
    add("")
    add("| system | phase | handler starts/s | p50 ms | p99 ms | max ms |")
    add("|---|---|---|---|---|---|")
    for rec in data["systems"].values():
        for name, ph in rec.get("phases", {}).items():
            add(
                f"| {rec['label']} | {name} ({_mmss(ph['from_s'])} to {_mmss(ph['to_s'])}) "
                f"| {_f(ph['per_s'])} | {_f(ph['wait_p50_ms'], 1)} | {_f(ph['wait_p99_ms'], 1)} "
                f"| {_f(ph['wait_max_ms'], 1)} |"
            )
    add("")
    add(
        "| system | jobs enqueued | started by the end | left in the queue at the end | duplicate starts | generator max lag | enqueues > 100 ms late | reader |"
    )
    add("|---|---|---|---|---|---|---|---|")
    for rec in data["systems"].values():
        if "receiver" not in rec:
            continue
        rc, gens = rec["receiver"], rec.get("generators", [])
        rd = rec.get("reader", {})
        reader = (
            f"snapshot at {_f(rd.get('opened_at'))} s, read {_f(rd.get('rows_read'))} rows in "
            f"{_f(rd.get('read_seconds'), 2)} s, rolled back at {_f(rd.get('closed_at'))} s"
            if "error" not in rd
            else f"error: {rd['error']}"
        )
        add(
            f"| {rec['label']} | {rc['enqueued']:,} of {sum(g['due'] for g in gens):,} due "
            f"| {rc['started']:,} | {rec.get('jobs_left', 0):,} "
            f"| {rc['duplicate_starts']} | {max((g['max_lag_s'] for g in gens), default=0):.2f} s "
            f"| {sum(g['late_over_100ms'] for g in gens):,} | {reader} |"
        )
    add("")
    # ---- per interval ------------------------------------------------------------------------
    add("## Per interval")
    add("")
    add(
        "Claim = mean execution time of the system's claim statement(s) in the interval "
        "(pg_stat_statements deltas; the statements are listed below). Dead tuples and "
        "autovacuum runs (cumulative) are of the main tables; size is every table of the "
        "system with its indexes and TOAST; oldest snapshot = the oldest `backend_xmin` in the "
        "cluster at the interval's end; memory = RSS of the system's worker processes and "
        "their children; backlog = jobs enqueued but not started; load = the machine's 1-minute "
        "load average (2 CPUs: above 2, processes waited for a CPU)."
    )
    for rec in data["systems"].values():
        rows = rec.get("intervals")
        if not rows:
            continue
        add("")
        add(f"### {rec['label']}")
        add("")
        add(
            "| end | enq/s | starts/s | p50 ms | p99 ms | max ms | claim ms | size MB | dead tuples "
            "| autovacuums | oldest snapshot (xids / s) | memory MB | backlog | load "
            "| WAL MB | full-page images | buffers backends wrote |"
        )
        add("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            add(
                f"| {_mmss(r['end_s'])} | {_f(r['enqueued_per_s'])} | {_f(r['started_per_s'])} "
                f"| {_f(r['wait_p50_ms'], 1)} | {_f(r['wait_p99_ms'], 1)} | {_f(r['wait_max_ms'], 0)} "
                f"| {_f(r.get('claim_mean_ms'), 3)} | {_mb(r.get('size_bytes'))} "
                f"| {_f(r.get('dead_tuples'))} | {_f(r.get('autovacuum_runs'))} "
                f"| {_f(r.get('oldest_xmin_age'))} / {_f(r.get('oldest_snapshot_seconds'))} "
                f"| {_mb(r.get('rss_bytes'))} | {_f(r.get('backlog'))} | {_f(r.get('loadavg'), 1)} "
                f"| {_mb(r.get('wal_bytes'))} | {_f(r.get('wal_fpi'))} | {_f(r.get('buffers_backend'))} |"
            )
        add("")
        add("Claim statements (calls over the whole run):")
        add("")
        for st in rec.get("claim_statements", []):
            add(f"- {st['calls']:,} calls: `{st['query'].replace('`', '')}`")
    add("")
    _server_section(add, data)
    add("## Versions")
    add("")
    add(", ".join(f"{k} {v}" for k, v in data["versions"].items()))
    add(f"; {data['machine']['cpus']} CPUs, Python {data['machine']['python']}.")
    add("")
    md = out_dir / f"{stem}.md"
    md.write_text("\n".join(lines))
    return md


WORST_SECONDS = 12
"""How many of a run's slowest seconds the report puts beside the server's work."""


def _machine_second(machine: dict[str, Any], i: int) -> str:
    """One second of the machine record: CPUs busy, disk wait, host steal, busiest processes
    (a process's share is of one CPU)."""
    if i >= len(machine["busy_pct"]):
        return "-"
    names = machine["names"]
    top = ", ".join(f"{names[k]} {pct:.0f} %" for k, pct in machine["top"][i])
    return (
        f"{machine['busy_pct'][i]:.0f} % busy, {machine['iowait_pct'][i]:.0f} % iowait, "
        f"{machine['steal_pct'][i]:.0f} % steal: {top or '-'}"
    )


def _machine_summary(add: Any, machine: dict[str, Any], per_sec: dict[str, list[float]]) -> None:
    """Whether the slow seconds were the machine's busy ones: the CPUs' use in seconds with a
    wait over 10 ms against the rest, and which processes were busiest in the slow ones."""
    n = min(len(machine["busy_pct"]), len(per_sec["slow"]))
    slow = [i for i in range(n) if per_sec["slow"][i]]
    rest = [i for i in range(n) if not per_sec["slow"][i]]
    if not slow or not rest:
        return

    def avg(key: str, idx: list[int]) -> float:
        return sum(machine[key][i] for i in idx) / len(idx)

    add("")
    add(
        f"The machine ({machine.get('cpus', 2)} CPUs shared by the server, the system under test, the generators and "
        f"the harness) in the {len(slow):,} seconds with a wait over 10 ms against the other "
        f"{len(rest):,}: CPUs busy {avg('busy_pct', slow):.0f} % against "
        f"{avg('busy_pct', rest):.0f} %, iowait {avg('iowait_pct', slow):.1f} % against "
        f"{avg('iowait_pct', rest):.1f} %, steal {avg('steal_pct', slow):.1f} % against "
        f"{avg('steal_pct', rest):.1f} %."
    )
    share: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for idx, col in ((slow, 0), (rest, 1)):
        for i in idx:
            for k, pct in machine["top"][i]:
                # A statement's text names the work, not the backend that ran it.
                share[machine["names"][k]][col] += pct / len(idx)
    over = sorted(share.items(), key=lambda kv: -(kv[1][0] - kv[1][1]))[:8]
    add("")
    add(
        "The processes whose use was most above their usual in the slow seconds (mean share "
        f"of one CPU, counting a process in a second where it used at least {TOP_SHARE:g} %):"
    )
    add("")
    add("| process (a server backend by its last statement) | slow seconds % | other seconds % |")
    add("|---|---|---|")
    for name, (a, b) in over:
        add(f"| {name.replace('|', '/')} | {a:.1f} | {b:.1f} |")


def _server_section(add: Any, data: dict[str, Any]) -> None:
    """The server's checkpoints and the run's slowest seconds beside what the server and
    Tenure's upkeep were doing then (from the cluster's log and the scheduler's)."""
    log = data.get("server_log")
    if not log:
        return
    add("## The server's work beside the queue waits")
    add("")
    add(
        "From the soak cluster's log (every checkpoint, autovacuum and autoanalyze is logged: "
        "see the settings above) and the per-second record of handler starts; times are "
        "minutes:seconds into each system's run. A checkpoint spreads its writes over 90 % of "
        "`checkpoint_timeout`, then `fsync`s every file it wrote (sync)."
    )
    for rec in data["systems"].values():
        t0, per_sec = rec.get("t0_epoch"), rec.get("seconds")
        if t0 is None or not per_sec:
            continue
        end = t0 + len(per_sec["starts"])
        add("")
        add(f"### {rec['label']}")
        add("")
        cks = [c for c in log["checkpoints"] if c["end"] >= t0 and (c["start"] or c["end"]) <= end]
        add(
            "| checkpoint started | completed | buffers written | write s | sync s | longest file sync s | WAL since the last |"
        )
        add("|---|---|---|---|---|---|---|")
        for c in cks:
            add(
                f"| {_mmss((c['start'] or c['end']) - t0)} | {_mmss(c['end'] - t0)} "
                f"| {_f(c['buffers'])} | {_f(c['write_s'], 1)} | {_f(c['sync_s'], 3)} "
                f"| {_f(c['longest_sync_s'], 3)} | {_f((c['distance_kb'] or 0) / 1024, 1)} MB |"
            )
        vacs = [
            v
            for v in log["vacuums"]
            if v["database"] == rec.get("database") and v["end"] >= t0 and v["start"] <= end
        ]
        events: list[tuple[float, float, str]] = []
        for c in cks:
            if c["start"]:
                events.append((c["start"], c["start"], "checkpoint starts"))
            sync = c["sync_s"] or 0.0
            events.append(
                (
                    c["end"] - sync,
                    c["end"],
                    f"checkpoint syncs {_f(c['sync_files'])} files, {sync:.3f} s",
                )
            )
        for v in vacs:
            fpi = f", {v['wal_fpi']:,} full-page images" if v.get("wal_fpi") is not None else ""
            events.append(
                (
                    v["start"],
                    v["end"],
                    f"auto{v['kind']} {v['table']} {v['end'] - v['start']:.2f} s{fpi}",
                )
            )
        for line in rec.get("upkeep_log", []):
            at = _log_time(line)
            if at is not None:
                events.append((at, at, "upkeep: " + line[24:].split(":", 1)[-1].strip()[:80]))
        worst = sorted(range(len(per_sec["max_ms"])), key=lambda i: -per_sec["max_ms"][i])
        add("")
        add(
            f"The {WORST_SECONDS} seconds with the longest queue wait, and the server's work "
            "that overlapped the 5 seconds up to each:"
        )
        add("")
        machine = rec.get("machine")
        add(
            "| second | handler starts | waits over 10 ms | longest wait ms | the server's work then |"
            + (" the machine's CPUs, that second and the one before |" if machine else "")
        )
        add("|---|---|---|---|---|" + ("---|" if machine else ""))
        for i in sorted(worst[:WORST_SECONDS]):
            lo, hi = t0 + i - 5, t0 + i + 1
            seen = [
                f"{text} ({_mmss(a - t0)})" for a, b, text in sorted(events) if b >= lo and a <= hi
            ]
            cpus = (
                " " + "<br>".join(_machine_second(machine, j) for j in (i - 1, i) if j >= 0) + " |"
                if machine
                else ""
            )
            add(
                f"| {_mmss(i)} | {per_sec['starts'][i]} | {per_sec['slow'][i]} "
                f"| {per_sec['max_ms'][i]:.1f} | {'; '.join(seen) or '-'} |{cpus}"
            )
        if machine:
            _machine_summary(add, machine, per_sec)
    if log.get("problems"):
        add("")
        add("The server's warnings and errors:")
        add("")
        for pr in log["problems"][:20]:
            add(f"- {pr['level']}: {pr['text'].splitlines()[0]}")
    add("")


def _windows_from(data: dict[str, Any]) -> dict[str, tuple[float, float]]:
    p = data["plan"]
    return _windows(
        Plan(
            minutes=p["minutes"],
            interval=p["interval"],
            fraction=p["fraction"],
            rate=None,
            capacity_jobs=0,
            systems=[],
            generators=None,
            out_dir=Path("."),
            stem="",
            short=False,
            keep_cluster=False,
            command="",
        )
    )


def _plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("wait_p99_ms", "queue wait p99 (ms, log)", True, 1.0),
        ("started_per_s", "handler starts / s", False, 1.0),
        ("dead_tuples", "dead tuples, main tables", False, 1.0),
        ("size_bytes", "tables + indexes (MB)", False, 1e-6),
        ("rss_bytes", "worker memory RSS (MB)", False, 1e-6),
    )
    win = _windows_from(data)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels)), sharex=True)
    for ax, (key, title, log, scale) in zip(axes, panels, strict=True):
        for sys_key, rec in data["systems"].items():
            rows = [r for r in rec.get("intervals", []) if r.get(key) is not None]
            xs = [r["end_s"] / 60 for r in rows]
            ys = [r[key] * scale for r in rows]
            ax.plot(xs, ys, marker=".", label=rec.get("label", sys_key))
        ax.axvspan(win["reader"][0] / 60, win["reader"][1] / 60, color="0.85", zorder=0)
        if key == "started_per_s" and data.get("rate"):
            ax.axhline(data["rate"], color="0.4", linestyle="--", linewidth=1, label="R")
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title("shaded: the long REPEATABLE READ transaction is open", fontsize=9)
    axes[-1].set_xlabel("minutes into each system's run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The whole soak
# ---------------------------------------------------------------------------------------------

VERSIONS = ("django", "psycopg", "asyncpg", "pgqueuer", "procrastinate", "matplotlib")


def _versions() -> dict[str, str]:
    out = {}
    for p in VERSIONS:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def _why(e: Exception) -> str:
    """An exception as one report line, with a failed command's own error output."""
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, subprocess.CalledProcessError) and e.stderr:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        text += f"\n{err}"
    return text[-2000:]


def run(plan: Plan) -> tuple[dict[str, Any], bool]:
    """Run the soak; everything measured, and whether the harness worked."""
    started = time.monotonic()
    root = SOAK / "cluster"
    # A previous run's server may still hold the folder (an interrupted run).
    if (root / "pgdata" / "postmaster.pid").exists():
        SoakCluster(root, port=0).stop("immediate")
    shutil.rmtree(root, ignore_errors=True)
    cluster = SoakCluster(root, port=free_port())
    cluster.init()
    cluster.start()
    ok = True
    data: dict[str, Any] = {}
    try:
        cluster.wait_up()
        common.use_server("127.0.0.1", cluster.port)
        with common.connect("postgres") as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        facts = cluster.facts()
        _log(f"cluster on port {cluster.port}: {facts['show']}")
        systems = [SOAK_SYSTEMS[k]() for k in plan.systems]
        data = {
            "date": dt.date.today().isoformat(),
            "command": plan.command,
            "plan": {
                "minutes": plan.minutes,
                "interval": plan.interval,
                "fraction": plan.fraction,
                "rate_given": plan.rate,
                "capacity_jobs": plan.capacity_jobs,
                "capacity_seconds": plan.capacity_seconds,
                "systems": plan.systems,
                "short": plan.short,
            },
            "cluster": facts,
            "cluster_settings": CLUSTER_SETTINGS,
            "versions": _versions(),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "systems": {},
        }
        rate = plan.rate
        tenure = next((s for s in systems if isinstance(s, SoakTenure)), None)
        if rate is None:
            if tenure is None:
                raise HarnessError("without --rate the soak needs Tenure to measure capacity")
            _log("install tenure")
            tenure.install()
            _log(f"capacity: Tenure draining {plan.capacity_jobs:,} no-op jobs")
            cap = measure_capacity(tenure, plan.capacity_jobs)
            data["capacity"] = cap
            if not cap["per_second"] == cap["per_second"] or cap["done"] == 0:
                raise HarnessError(f"the capacity drain finished no job: {cap}")
            _log(
                f"capacity: workers alone {cap['per_second']:.0f} jobs/s; now the steady rate "
                f"the soak's arrivals are kept up with ({plan.capacity_seconds:g} s a step)"
            )
            e2e = measure_end_to_end(tenure, plan, float(cap["per_second"]))
            data["capacity_end_to_end"] = e2e
            if not e2e["per_second"] > 0:
                raise HarnessError(f"the end-to-end capacity search started no job: {e2e}")
            rate = max(1, round(plan.fraction * e2e["per_second"]))
            _log(f"capacity end to end {e2e['per_second']:.0f} jobs/s -> R = {rate} jobs/s")
        data["rate"] = rate
        generators = plan.generators or _generators(rate)
        data["generators"] = generators
        for s in systems:
            rec: dict[str, Any] = {"label": s.label, "config": _shape(s).config}
            try:
                if s is not tenure or "capacity" not in data:
                    _log(f"install {s.key}")
                    s.install()
                rec = soak_system(s, plan, float(rate), generators)
                v = rec["verdicts"]
                _log(
                    f"{s.key}: p99 first {v['p99_first_ms']:.1f} ms, last {v['p99_last_ms']:.1f} "
                    f"ms, reader worst {v['p99_reader_worst_ms']:.1f} ms"
                )
            except Exception as e:  # reported; the other systems still run
                ok = False
                rec["error"] = _why(e)
                _log(f"{s.key}: FAILED: {rec['error']}")
            data["systems"][s.key] = rec
            (SOAK / "partial.json").write_text(json.dumps(data, indent=1, default=str))
    except Exception as e:  # reported with whatever was measured before it
        ok = False
        data.setdefault("errors", []).append(_why(e))
        _log(f"FAILED: {_why(e)}")
    finally:
        cluster.stop()
        data["server_log"] = server_log(cluster.log)
        if not plan.keep_cluster:
            shutil.rmtree(root, ignore_errors=True)
    data["elapsed_seconds"] = time.monotonic() - started
    return data, ok


def combine(argv: list[str]) -> Path:
    """``--combine OUT.md RUN.json[@REVISION] ...``: one report of soaks run separately.

    A 60-minute soak of three systems takes a little over three hours; run as several
    invocations of the same harness at the same ``--rate``, their ``.json`` files are merged
    here into one report (``OUT.md``, ``.json``, ``.png``) whose header lists every run, its
    command, its revision when given, and its run time. Refuses runs at different rates or
    lengths, and a system that appears in two runs.
    """
    if len(argv) < 3:
        raise SystemExit("usage: python -m bench.soak --combine OUT.md RUN.json[@REV] RUN.json ...")
    out = Path(argv[0])
    merged: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    for arg in argv[1:]:
        name, _, revision = arg.partition("@")
        data = json.loads(Path(name).read_text())
        if not merged:
            merged = {k: v for k, v in data.items() if k != "systems"}
            merged["systems"] = {}
        if data.get("rate") != merged.get("rate"):
            raise SystemExit(f"{name}: rate {data.get('rate')} differs from {merged.get('rate')}")
        if data["plan"]["minutes"] != merged["plan"]["minutes"]:
            raise SystemExit(
                f"{name}: {data['plan']['minutes']} min, not {merged['plan']['minutes']}"
            )
        for key in ("capacity", "capacity_end_to_end"):
            if data.get(key) and not merged.get(key):
                merged[key] = data[key]
        twice = set(data["systems"]) & set(merged["systems"])
        if twice:
            raise SystemExit(f"{name}: {sorted(twice)} already in an earlier run")
        merged["systems"].update(data["systems"])
        runs.append(
            {
                "source": Path(name).name,
                "revision": revision,
                "date": data["date"],
                "command": data["command"],
                "systems": list(data["systems"]),
                "elapsed_seconds": data["elapsed_seconds"],
            }
        )
    merged["runs"] = runs
    merged["plan"] = {**merged["plan"], "systems": list(merged["systems"])}
    merged["elapsed_seconds"] = sum(r["elapsed_seconds"] for r in runs)
    merged["command"] = (
        "PYTHONPATH=. var/bench-venv/bin/python -m bench.soak --combine "
        + " ".join(shlex.quote(a) for a in argv)
    )
    return write_report(merged, out.parent, out.stem)


def main(argv: list[str] | None = None) -> int:
    """Command line; exits non-zero only when the harness broke, never for a missed target."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--generate":
        generate(argv[1:])
        return 0
    if argv and argv[0] == "--combine":
        _log(f"wrote {combine(argv[1:])}")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="T, per system (60)")
    parser.add_argument("--rate", type=float, default=None, help="R in jobs/s (default: measured)")
    parser.add_argument(
        "--fraction", type=float, default=0.6, help="R as a fraction of Tenure's capacity (0.6)"
    )
    parser.add_argument("--interval", type=float, default=None, help="seconds per figure")
    parser.add_argument("--capacity-jobs", type=int, default=20_000)
    parser.add_argument(
        "--capacity-seconds",
        type=float,
        default=20.0,
        help="seconds of each step of the end-to-end capacity search (20; --short: 6)",
    )
    parser.add_argument("--systems", default=",".join(SOAK_SYSTEMS))
    parser.add_argument("--generators", type=int, default=None)
    parser.add_argument("--out", default=None, help="report folder")
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument(
        "--short",
        action="store_true",
        help="the CI check: 1 minute per system, a 4,000-job capacity drain, report in var/soak",
    )
    args = parser.parse_args(argv)
    minutes, capacity_jobs, capacity_seconds = (
        args.minutes,
        args.capacity_jobs,
        args.capacity_seconds,
    )
    if args.short:
        minutes, capacity_jobs = 1.0, min(capacity_jobs, 4_000)
        capacity_seconds = min(capacity_seconds, 6.0)
    # A 60-minute run reports per minute; a shorter one keeps about 60 intervals (at least 5 s).
    interval = args.interval or max(5.0, minutes)
    date = dt.date.today().isoformat()
    if args.short:
        stem, default_out = f"{date}-soak-short", SOAK
    elif minutes == 60:
        stem, default_out = f"{date}-soak", BENCH / "results"
    else:
        stem, default_out = f"{date}-soak-{minutes:g}min", SOAK
    systems = [k.strip() for k in args.systems.split(",") if k.strip()]
    unknown = [k for k in systems if k not in SOAK_SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {list(SOAK_SYSTEMS)}")
    plan = Plan(
        minutes=minutes,
        interval=interval,
        fraction=args.fraction,
        rate=args.rate,
        capacity_jobs=capacity_jobs,
        capacity_seconds=capacity_seconds,
        systems=systems,
        generators=args.generators,
        out_dir=Path(args.out) if args.out else default_out,
        stem=stem,
        short=args.short,
        keep_cluster=args.keep_cluster,
        command="PYTHONPATH=. var/bench-venv/bin/python -m bench.soak "
        + " ".join(shlex.quote(a) for a in argv),
    )
    SOAK.mkdir(parents=True, exist_ok=True)
    data, ok = run(plan)
    if data.get("plan"):
        md = write_report(data, plan.out_dir, plan.stem)
        _log(f"wrote {md} in {data['elapsed_seconds'] / 60:.1f} min")
    (SOAK / "partial.json").unlink(missing_ok=True)
    if not ok:
        _log("the harness broke (see above); figures that were taken are in the report")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
