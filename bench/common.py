"""Shared plumbing for the benchmark harness: the server, databases, processes, statistics.

The harness itself talks to PostgreSQL with plain psycopg (never through a system under
test), starts every system's processes from the bench environment's interpreter, and keeps
their logs under ``var/bench-logs/``.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
VAR = ROOT / "var"
LOGS = VAR / "bench-logs"
PYTHON = sys.executable
BIN = Path(sys.executable).parent

PG_HOST = os.environ.get("BENCH_PG_HOST", "127.0.0.1")
PG_PORT = os.environ.get("BENCH_PG_PORT", "5432")
PG_USER = os.environ.get("BENCH_PG_USER", "postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")


def use_server(host: str, port: int | str, user: str = "postgres") -> None:
    """Point the harness, and every child it starts from now on, at another server (the
    soak's own cluster). Systems built after this call take its address."""
    global PG_HOST, PG_PORT, PG_USER
    PG_HOST, PG_PORT, PG_USER = host, str(port), user
    os.environ.update(BENCH_PG_HOST=host, BENCH_PG_PORT=str(port), BENCH_PG_USER=user)


def dsn(db: str) -> str:
    """A libpq URL for database ``db`` on the benchmark server."""
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}"


def connect(db: str = "postgres") -> psycopg.Connection[Any]:
    """An autocommit connection for the harness (each statement is its own transaction)."""
    return psycopg.connect(dsn(db), autocommit=True)


def scalar(db: str, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the first row of ``sql`` run in ``db``."""
    with connect(db) as conn:
        row = conn.execute(sql, params).fetchone()
        return row[0] if row else None


def recreate_database(db: str) -> None:
    """Drop (ending its sessions) and create database ``db``."""
    with connect() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [db],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        conn.execute(f'CREATE DATABASE "{db}"')


def server_facts() -> dict[str, str]:
    """The server settings the report records (durability first)."""
    names = [
        "server_version",
        "autovacuum",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_level",
        "shared_buffers",
        "max_connections",
        "work_mem",
    ]
    with connect() as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


def non_default_settings() -> dict[str, str]:
    """Every setting the server reports as set by its configuration or command line (not at
    its built-in default), as ``value (source)``."""
    with connect() as conn:
        return {
            r[0]: f"{r[1]} ({r[2]})"
            for r in conn.execute(
                "SELECT name, current_setting(name), source FROM pg_settings "
                "WHERE source NOT IN ('default', 'override', 'client', 'session') "
                "ORDER BY name"
            )
        }


@dataclass
class DbCounters:
    """Cumulative counters of one database, read from the statistics views."""

    xact_commit: int
    xact_rollback: int
    tup_ins: int
    tup_upd: int
    tup_del: int
    tup_hot_upd: int


def db_counters(db: str) -> DbCounters:
    """The database's commit and row-change counters now (after a fresh snapshot)."""
    with connect(db) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        xc, xr = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", [db]
        ).fetchone()  # type: ignore[misc]
        ins, upd, dele, hot = conn.execute(
            "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), "
            "coalesce(sum(n_tup_del), 0), coalesce(sum(n_tup_hot_upd), 0) "
            "FROM pg_stat_user_tables"
        ).fetchone()  # type: ignore[misc]
    return DbCounters(int(xc), int(xr), int(ins), int(upd), int(dele), int(hot))


HARNESS_XACTS_PER_READ = 3
"""Transactions :func:`db_counters` itself commits in the database it reads (one per query)."""


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def compile_bytecode(root: Path = ROOT) -> None:
    """Compile the Python modules under ``root`` to bytecode ahead, as installing a package does.

    Every system's processes start from source trees here (Tenure, the harness's job modules,
    the peers' small entry points), and a machine or image that sets
    ``PYTHONDONTWRITEBYTECODE`` makes every process compile each of those modules again at
    each start: about 75 ms of a Tenure executor's start-up, counted in a drain's whole run,
    where a package installed from a wheel (each peer, and Tenure in a host project) has
    its bytecode written at install. Compiled ahead, every system starts as it would
    installed; the bytecode of modules unchanged since is reused."""
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or path.name in {"var", "node_modules"}:
            continue  # environments, caches and runs' output: not the systems' sources
        if path.is_dir():
            compileall.compile_dir(path, quiet=2)
        elif path.suffix == ".py":
            compileall.compile_file(path, quiet=2)


def base_env(**extra: str) -> dict[str, str]:
    """The environment of every child: the repository on the path, unbuffered output."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("TENURE_", "BENCH_STMT_DIR", "BENCH_PING_PORT", "DJANGO_SETTINGS")):
            env.pop(k)
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def counting_env(env: dict[str, str], stmt_dir: Path) -> dict[str, str]:
    """``env`` plus the statement counter (``bench/hooks/sitecustomize.py``)."""
    out = dict(env)
    out["PYTHONPATH"] = f"{BENCH / 'hooks'}{os.pathsep}{env['PYTHONPATH']}"
    out["BENCH_STMT_DIR"] = str(stmt_dir)
    return out


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU time (user + system) used so far by the processes ``pids`` (``/proc/<pid>/stat``);
    a process that has gone counts nothing."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLOCK_TICKS


class Procs:
    """Child processes started for one measurement; all of them are ended by :meth:`stop`."""

    def __init__(self, label: str, grace: float = 15.0) -> None:
        self.label = label
        self.grace = grace
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        """Each process's log file, in the order started."""
        LOGS.mkdir(parents=True, exist_ok=True)

    def start(
        self, cmd: Sequence[str], env: dict[str, str], cwd: Path = ROOT
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in its own process group (in ``cwd``: the checkout whose code it
        runs), output to a log file."""
        path = LOGS / f"{self.label}-{len(self.procs)}.log"
        self.logs.append(path)
        log = open(path, "wb")
        p = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(p)
        return p

    def alive(self) -> int:
        """How many are still running."""
        return sum(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """SIGTERM every process group, then SIGKILL whatever is left after the grace (at
        once with no grace: a finished measurement needs no clean shutdown)."""
        grace = self.grace
        for p in self.procs:
            if p.poll() is None and grace > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)


@contextlib.contextmanager
def processes(label: str, grace: float = 15.0) -> Iterator[Procs]:
    """A :class:`Procs` whose processes are stopped however the block ends."""
    procs = Procs(label, grace)
    try:
        yield procs
    finally:
        procs.stop()


def free_udp_port() -> int:
    """A UDP port on the loopback nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    """The median of the finite values; NaN when there are none."""
    xs = [v for v in values if v == v]
    return statistics.median(xs) if xs else float("nan")


def _when(progress: Sequence[tuple[float, int]], target: float) -> float | None:
    """When ``target`` jobs were done, interpolated between ``(time, done)`` samples."""
    prev_t, prev_d = None, None
    for t, d in progress:
        if d >= target:
            if prev_t is None or prev_d is None or d == prev_d:
                return t
            return prev_t + (t - prev_t) * (target - prev_d) / (d - prev_d)
        prev_t, prev_d = t, d
    return None


def steady_window(progress: Sequence[tuple[float, int]], total: int) -> tuple[float, float] | None:
    """When 10 % and 90 % of ``total`` were done, interpolated between ``(time, done)``
    samples; ``None`` when 90 % was never reached."""
    t_lo, t_hi = _when(progress, 0.1 * total), _when(progress, 0.9 * total)
    if t_lo is None or t_hi is None or t_hi <= t_lo:
        return None
    return t_lo, t_hi


def steady_rate(progress: Sequence[tuple[float, int]], total: int) -> float:
    """Jobs per second between 10 % and 90 % of ``total`` done, from ``(time, done)`` samples.

    Excludes start-up (processes importing, connecting) and the tail (the last jobs spread
    over fewer workers), so the figure is the drain rate itself.
    """
    lo, hi = 0.1 * total, 0.9 * total
    t_lo, t_hi = _when(progress, lo), _when(progress, hi)
    if t_lo is not None and t_hi is not None and t_hi > t_lo:
        return (hi - lo) / (t_hi - t_lo)
    # Time-boxed before 90 %: the rate over what was done after the 10 % mark, or after the
    # first finished job when even 10 % was not reached.
    started = [(t, d) for t, d in progress if d > 0]
    if not started:
        return float("nan")
    t_first, d_first = (t_lo, lo) if t_lo is not None else started[0]
    t_last, d_last = progress[-1]
    return (d_last - d_first) / (t_last - t_first) if t_last > t_first else float("nan")
