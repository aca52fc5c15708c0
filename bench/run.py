"""Run the benchmarks and write the report: ``python -m bench.run --profile quick|full``.

Every round measures every system in turn for each workload, so each Tenure / peer ratio is
taken from figures measured minutes apart under the same conditions; the report shows the
median over rounds of each figure and of each ratio.

The drain runs in two shapes (``--shapes``, both by default): every system at its best, 2
processes x 8 concurrent jobs as its documentation recommends for throughput (the headline),
and the same shape for every system, N processes of one job at a time (not the headline); see
:mod:`bench.systems`. By default the run ``initdb``s a PostgreSQL cluster of its own with
production defaults (autovacuum on; the soak's :class:`bench.soak.SoakCluster`) and removes it
at the end; ``--server shared`` uses ``BENCH_PG_HOST``:``BENCH_PG_PORT`` instead.

``BENCH_SCALE`` (default 1) multiplies every job count, for a fast end-to-end check of the
harness (for example ``BENCH_SCALE=0.05``); ``BENCH_ROUNDS`` overrides the number of rounds;
``BENCH_SYSTEMS`` restricts the systems (comma-separated keys, Tenure's always included).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import common, report, workloads
from .common import BENCH, ROOT, VAR, compile_bytecode, non_default_settings, server_facts
from .systems import (
    BEST,
    BEST_CONCURRENCY,
    BEST_PROCESSES,
    SAME,
    SHAPES,
    System,
    Tenure,
    TenureAsync,
    TenureBefore,
    TenureBesideLimited,
    TenureOtelOn,
    TenureUntraced,
    all_systems,
)


@dataclass(frozen=True, kw_only=True)
class Profile:
    """How much each workload does."""

    name: str
    rounds: int
    enqueue_single: int
    enqueue_bulk: int
    best_jobs: int
    """Jobs of each drain at their best (the headline table)."""
    best_timeout: float
    drain_jobs: int
    """Jobs of each same-shape drain."""
    drain_workers: tuple[int, ...]
    drain_timeout: float
    cost_jobs: int
    latency_rate: float
    latency_seconds: float
    dashboard_jobs: int
    dashboard_attempts_per_job: int
    dashboard_requests: int
    pgbench_seconds: int
    workflows: int = 1000
    """Workflows of the workflow comparison (14 jobs each)."""

    def scaled(self, scale: float) -> Profile:
        """The same profile with every job count multiplied by ``scale``."""
        if scale == 1:
            return self

        def n(x: int, low: int) -> int:
            return max(low, int(x * scale))

        return Profile(
            name=f"{self.name} x{scale:g}",
            rounds=self.rounds,
            enqueue_single=n(self.enqueue_single, 20),
            enqueue_bulk=n(self.enqueue_bulk, 100),
            best_jobs=n(self.best_jobs, 200),
            best_timeout=self.best_timeout,
            drain_jobs=n(self.drain_jobs, 100),
            drain_workers=self.drain_workers,
            drain_timeout=self.drain_timeout,
            cost_jobs=n(self.cost_jobs, 100),
            latency_rate=self.latency_rate,
            latency_seconds=max(1.0, self.latency_seconds * scale),
            dashboard_jobs=n(self.dashboard_jobs, 1000),
            dashboard_attempts_per_job=self.dashboard_attempts_per_job,
            dashboard_requests=max(3, int(self.dashboard_requests * scale)),
            pgbench_seconds=max(2, int(self.pgbench_seconds * scale)),
            workflows=n(self.workflows, 20),
        )


PROFILES = {
    # Within 10 minutes on 2 cores: short rounds, the headline at 4,000 jobs, two same-shape
    # worker counts, one attempt per job.
    "quick": Profile(
        name="quick",
        rounds=3,
        enqueue_single=60,
        enqueue_bulk=5_000,
        best_jobs=4_000,
        best_timeout=60.0,
        drain_jobs=1_000,
        drain_workers=(1, 4),
        # Start-up counts inside the box; the Celery executor's first hints wait up to ~6 s
        # for the dispatcher (bench/README.md), so 10 s lets its 1,000 jobs finish.
        drain_timeout=10.0,
        cost_jobs=120,
        latency_rate=50.0,
        latency_seconds=2.0,
        dashboard_jobs=1_000_000,
        dashboard_attempts_per_job=1,
        dashboard_requests=12,
        pgbench_seconds=4,
    ),
    "full": Profile(
        name="full",
        rounds=3,
        enqueue_single=10_000,
        enqueue_bulk=10_000,
        best_jobs=20_000,
        best_timeout=120.0,
        drain_jobs=20_000,
        drain_workers=(1, 2, 4, 8),
        # The slowest peers finish a few thousand of the 20,000 jobs in a minute: enough for a
        # steady rate, and the whole profile stays near an hour on 2 cores.
        drain_timeout=60.0,
        cost_jobs=5_000,
        latency_rate=50.0,
        latency_seconds=10.0,
        dashboard_jobs=1_000_000,
        dashboard_attempts_per_job=3,
        dashboard_requests=40,
        pgbench_seconds=20,
    ),
}

PEER_PACKAGES = (
    "django",
    "psycopg",
    "celery",
    "kombu",
    "redis",
    "procrastinate",
    "django-tasks",
    "django-tasks-db",
    "django-q2",
    "pgqueuer",
    "asyncpg",
    "matplotlib",
)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(
    profile: Profile,
    systems: list[System],
    best: list[System],
    out_dir: Path,
    cluster: dict[str, Any],
    command: str,
    limits: list[System] | None = None,
    coroutines: list[System] | None = None,
    traced: list[System] | None = None,
    flows: System | None = None,
) -> dict[str, Any]:
    """Install every system, run ``profile.rounds`` rounds, return everything measured.

    ``systems`` are the same-shape systems (every workload), ``best`` the systems at their
    best (the headline drain only); either may be empty. ``limits`` are the systems of the
    queue-limits comparison (:func:`limits_round`): Tenure at its best, before queue limits
    existed and beside a paused and a limited queue, each also in the same shape for the
    cost per job. ``coroutines`` are those of the async comparison (:func:`async_round`):
    the plain no-op against the ``async def`` one, in both shapes. ``traced`` are those of the
    OpenTelemetry comparison (:func:`otel_round`): before tracing existed, off, and on.
    ``flows`` is the database of the workflow comparison (:func:`workflows_round`).
    """
    limits = limits or []
    coroutines = coroutines or []
    traced = traced or []
    started = time.monotonic()
    compile_bytecode()
    facts = server_facts()
    _log(f"server: {facts}")
    installed: set[tuple[str, str | None]] = set()
    for s in [*systems, *best, *limits, *coroutines, *traced, *([flows] if flows else [])]:
        # Both shapes of a system share its database unless its settings differ.
        if (s.key, s.db) in installed:
            continue
        _log(f"install {s.key} ({s.db or 'no database'})")
        s.install()
        installed.add((s.key, s.db))
    tenure = next((s for s in systems if s.key == "tenure"), None)
    dash: Tenure | None = None
    if tenure is not None:
        dash = Tenure(key="tenure-dash", db="bench_tenure_dash")
        dash.install()
    rounds: list[dict[str, Any]] = []
    for r in range(profile.rounds):
        rec: dict[str, Any] = {
            "enqueue_single": {},
            "enqueue_bulk": {},
            "best": {},
            "drain": {},
            "cost": {},
            "latency": {},
        }
        _log(f"round {r + 1}/{profile.rounds}: pgbench")
        rec["pgbench"] = workloads.pgbench_tps(profile.pgbench_seconds)
        for s in best:
            _log(f"round {r + 1}: drain at its best {s.key} ({BEST_PROCESSES} x {s.concurrency})")
            rec["best"][s.key] = workloads.drain(
                s, profile.best_jobs, BEST_PROCESSES, timeout=profile.best_timeout
            )
        if limits:
            rec["limits"] = limits_round(profile, limits, first=r == 0, label=f"round {r + 1}")
        if coroutines:
            rec["async"] = async_round(profile, coroutines, label=f"round {r + 1}")
        if traced:
            rec["otel"] = otel_round(profile, traced, label=f"round {r + 1}")
        if flows is not None:
            rec["workflows"] = workflows_round(profile, flows, label=f"round {r + 1}")
        for s in systems:
            _log(f"round {r + 1}: enqueue {s.key}")
            got = workloads.enqueue(s, profile.enqueue_single, profile.enqueue_bulk)
            rec["enqueue_single"][s.key] = got["single"]
            rec["enqueue_bulk"][s.key] = got.get("bulk", {"per_second": float("nan")})
        for w in profile.drain_workers if systems else ():
            for s in systems:
                _log(f"round {r + 1}: drain, same shape, {s.key} x{w}")
                res = workloads.drain(s, profile.drain_jobs, w, timeout=profile.drain_timeout)
                rec["drain"].setdefault(str(w), {})[s.key] = res
        if r == 0:
            # Counts, not timings: one measurement is enough.
            for s in systems:
                _log(f"round {r + 1}: cost per job {s.key}")
                rec["cost"][s.key] = workloads.cost(
                    s, profile.cost_jobs, timeout=max(60.0, profile.drain_timeout)
                )
        for s in systems:
            _log(f"round {r + 1}: latency {s.key}")
            try:
                rec["latency"][s.key] = workloads.latency(
                    s, profile.latency_rate, profile.latency_seconds
                )
            except RuntimeError as e:
                rec["latency"][s.key] = {"error": str(e)[-500:]}
        if isinstance(tenure, Tenure) and dash is not None:
            _log(f"round {r + 1}: recovery after SIGKILL")
            rec["recovery"] = workloads.recovery(tenure)
            _log(f"round {r + 1}: dashboard")
            rec["dashboard"] = workloads._agent(
                dash,
                "dashboard",
                profile.dashboard_jobs,
                profile.dashboard_attempts_per_job,
                profile.dashboard_requests,
                1 if r == 0 else 0,
                timeout=3600,
            )
        rounds.append(rec)
        (out_dir / "raw-partial.json").write_text(json.dumps(rounds, indent=1))
    return {
        "command": command,
        "bytecode_compiled_ahead": True,
        "profile": profile.__dict__,
        "server": facts,
        "cluster": {**cluster, "not_default": non_default_settings()},
        "versions": _versions(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "systems": {s.key: s.label for s in systems},
        "best_systems": {s.key: s.label for s in best},
        "limits_systems": {s.key: s.label for s in limits if s.shape == BEST},
        "async_systems": {s.key: s.label for s in coroutines if s.shape == BEST},
        "otel_systems": {s.key: s.label for s in traced if s.shape == BEST},
        "workflow_systems": (
            {
                "tenure": "Tenure (broker-less), workflows and independent jobs",
                "celery-canvas": "Celery canvas on Redis, results on Redis",
            }
            if flows is not None
            else {}
        ),
        "configs": {
            "best": {s.key: s.describe(BEST_PROCESSES) for s in best},
            "same": {
                s.key: {str(w): s.describe(w) for w in profile.drain_workers} for s in systems
            },
        },
        "rounds": rounds,
        "elapsed_seconds": time.monotonic() - started,
        "date": dt.date.today().isoformat(),
    }


LIMIT_TURNS = 2
"""Drains of each queue-limits system per round, taken in turn (A B C A B C): adjacent
drains see the same machine, so the comparison is within seconds, not minutes."""


def limits_systems() -> list[System]:
    """The queue-limits comparison's systems: at their best (the drain) and in the same shape
    (the cost per job), Tenure now, before queue limits, and beside a paused and a limited
    queue. Tenure now draining an unlimited queue with no ``tenure_queue`` row is the
    reference."""
    out: list[System] = []
    for shape in (BEST, SAME):
        now = Tenure(key="tenure", db="bench_tenure", shape=shape)
        out += [now, TenureBefore(shape=shape), TenureBesideLimited(shape=shape)]
    return out


def limits_round(
    profile: Profile, limits: list[System], *, first: bool, label: str
) -> dict[str, Any]:
    """One round of the queue-limits comparison: :data:`LIMIT_TURNS` drains of each system
    at its best, in turn; in the first round also each one's cost per job (one worker)."""
    out: dict[str, Any] = {"drains": {}, "cost": {}}
    best = [s for s in limits if s.shape == BEST]
    for _ in range(LIMIT_TURNS):
        for s in best:
            _log(f"{label}: queue limits, drain {s.key}")
            res = workloads.drain(
                s, profile.best_jobs, BEST_PROCESSES, timeout=profile.best_timeout
            )
            out["drains"].setdefault(s.key, []).append(res)
    if first:
        for s in limits:
            if s.shape == SAME:
                _log(f"{label}: queue limits, cost per job {s.key}")
                out["cost"][s.key] = workloads.cost(s, profile.cost_jobs, timeout=60.0)
    return out


ASYNC_TURNS = 2
"""Drains of each system of the async comparison per round and shape, taken in turn."""


def async_systems() -> list[System]:
    """The async comparison's systems: Tenure's broker-less executor draining the plain no-op
    and the ``async def`` one, at their best (2 x 8) and one process of one job at a time."""
    out: list[System] = []
    for shape in (BEST, SAME):
        out += [Tenure(key="tenure", db="bench_tenure", shape=shape), TenureAsync(shape=shape)]
    return out


def async_round(
    profile: Profile, systems: list[System], *, label: str, what: str = "async"
) -> dict[str, Any]:
    """One round of the async comparison: :data:`ASYNC_TURNS` drains of each system in each
    shape, in turn, so each pair sees the same machine; every other turn in the reverse order
    (plain, async, async, plain), so that a system drained first in a turn (after the others'
    writes) is not always the same one."""
    out: dict[str, Any] = {BEST: {}, SAME: {}}
    for turn in range(ASYNC_TURNS):
        for s in systems if turn % 2 == 0 else systems[::-1]:
            _log(f"{label}: {what} comparison, {s.key} ({s.shape})")
            if s.shape == BEST:
                res = workloads.drain(
                    s, profile.best_jobs, BEST_PROCESSES, timeout=profile.best_timeout
                )
            else:
                res = workloads.drain(s, profile.drain_jobs, 1, timeout=profile.drain_timeout)
            out[s.shape].setdefault(s.key, []).append(res)
    return out


def otel_systems() -> list[System]:
    """The OpenTelemetry comparison's systems: Tenure's broker-less executor draining the plain
    no-op with its tracing and signal hooks emptied (:class:`bench.systems.TenureUntraced`),
    with tracing off (the extra installed, no tracer provider set: the default) and on (the
    SDK's provider), at their best (2 x 8) and one process of one job at a time."""
    out: list[System] = []
    for shape in (BEST, SAME):
        out += [
            TenureUntraced(shape=shape),
            Tenure(key="tenure", db="bench_tenure", shape=shape),
            TenureOtelOn(shape=shape),
        ]
    return out


def otel_round(profile: Profile, systems: list[System], *, label: str) -> dict[str, Any]:
    """One round of the OpenTelemetry comparison: :data:`ASYNC_TURNS` drains of each system in
    each shape, in turn (emptied, off, on, on, off, emptied)."""
    return async_round(profile, systems, label=label, what="OpenTelemetry")


WORKFLOW_TIMEOUT = 600.0
"""The box of one workflow-comparison drain (seconds)."""


def workflow_system() -> Tenure:
    """The database of the workflow comparison, with the workflow job type loaded."""
    return Tenure(
        key="tenure-workflows",
        db="bench_tenure_workflows",
        shape=BEST,
        TENURE_JOB_MODULES="bench.workflow_jobs",
    )


def workflows_round(profile: Profile, flows: System, *, label: str) -> dict[str, Any]:
    """One round of the workflow comparison, in turn: Tenure's workflows, as many independent
    jobs, Celery's canvas, as many independent Celery tasks (:mod:`bench.workflows`,
    :mod:`bench.peers.celery_canvas`), each 2 processes x 8 as the drain at their best."""
    out: dict[str, Any] = {}
    runs = [
        ("tenure", "workflows", "bench.workflows", ["--executors", str(BEST_PROCESSES)]),
        ("tenure", "independent", "bench.workflows", ["--executors", str(BEST_PROCESSES)]),
        ("celery", "workflows", "bench.peers.celery_canvas", ["--workers", str(BEST_PROCESSES)]),
        ("celery", "independent", "bench.peers.celery_canvas", ["--workers", str(BEST_PROCESSES)]),
    ]
    for who, load, module, extra in runs:
        _log(f"{label}: workflows comparison, {who} {load} ({profile.workflows} workflows)")
        cmd = [
            sys.executable,
            "-m",
            module,
            "--load",
            load,
            "--workflows",
            str(profile.workflows),
            "--concurrency",
            str(BEST_CONCURRENCY),
            "--timeout",
            str(WORKFLOW_TIMEOUT),
            *extra,
        ]
        got = subprocess.run(
            cmd,
            env=flows.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WORKFLOW_TIMEOUT * 2,
        )
        if got.returncode != 0:
            raise RuntimeError(f"{who} {load} failed:\n{got.stderr[-3000:]}")
        out.setdefault(who, {})[load] = json.loads(got.stdout.strip().splitlines()[-1])
    return out


@contextmanager
def server(kind: str) -> Iterator[dict[str, Any]]:
    """The PostgreSQL server the run uses, described for the report.

    ``own``: a cluster ``initdb``'d into ``var/bench-cluster`` on a free port, started with
    PostgreSQL's defaults (autovacuum on, durable commits, 128 MB ``shared_buffers``) plus the
    soak's :data:`bench.soak.CLUSTER_SETTINGS`, and removed when the block ends. ``shared``:
    the server at ``BENCH_PG_HOST``:``BENCH_PG_PORT`` as it is configured.
    """
    if kind == "shared":
        yield {
            "kind": "shared",
            "address": f"{common.PG_HOST}:{common.PG_PORT}",
            "changed_by_run": {},
        }
        return
    from verifier.cluster import free_port

    from .soak import CLUSTER_SETTINGS, SoakCluster

    root = VAR / "bench-cluster"
    # A previous run's server may still hold the folder (an interrupted run).
    if (root / "pgdata" / "postmaster.pid").exists():
        SoakCluster(root, port=0).stop("immediate")
    shutil.rmtree(root, ignore_errors=True)
    cluster = SoakCluster(root, port=free_port())
    _log(f"initdb and start a cluster of the run's own in {root} (port {cluster.port})")
    cluster.init()
    cluster.start()
    try:
        cluster.wait_up()
        common.use_server("127.0.0.1", cluster.port)
        yield {
            "kind": "own",
            "address": f"127.0.0.1:{cluster.port}",
            "folder": str(root.relative_to(VAR.parent)),
            "changed_by_run": dict(CLUSTER_SETTINGS),
        }
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _versions() -> dict[str, str]:
    out = {}
    for p in PEER_PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def main() -> None:
    """Command line: choose a profile, run, write ``bench/results/<date>.md`` and the plots."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help=f"drain shapes, comma-separated: {BEST} (the headline), {SAME} (default: both)",
    )
    parser.add_argument(
        "--server",
        choices=("own", "shared"),
        default="own",
        help="own: a cluster of the run's own with production defaults (default); "
        "shared: BENCH_PG_HOST:BENCH_PG_PORT",
    )
    parser.add_argument(
        "--only",
        choices=("async", "otel", "workflows"),
        help="async: the async comparison alone (plain against async def no-op jobs); "
        "otel: the OpenTelemetry comparison alone (before tracing, off, on); "
        "workflows: workflows against independent jobs, and Celery's canvas",
    )
    parser.add_argument("--out", default=str(BENCH / "results"))
    args = parser.parse_args()
    shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    if not shapes or any(x not in SHAPES for x in shapes):
        parser.error(f"--shapes takes {BEST} and/or {SAME}")
    profile = PROFILES[args.profile].scaled(float(os.environ.get("BENCH_SCALE", "1")))
    if "BENCH_ROUNDS" in os.environ:
        profile = Profile(**{**profile.__dict__, "rounds": int(os.environ["BENCH_ROUNDS"])})
    env = " ".join(
        f"{k}={shlex.quote(os.environ[k])}"
        for k in ("BENCH_SCALE", "BENCH_ROUNDS", "BENCH_SYSTEMS")
        if k in os.environ
    )
    command = (f"{env} " if env else "") + "PYTHONPATH=. var/bench-venv/bin/python -m bench.run "
    command += " ".join(shlex.quote(a) for a in sys.argv[1:])
    chosen = [k for k in os.environ.get("BENCH_SYSTEMS", "").split(",") if k]

    def wanted(key: str) -> bool:
        return not chosen or key == "tenure" or key in chosen

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with server(args.server) as cluster:
        # Built after the server is chosen: each system's address is taken when it is made.
        coroutines = async_systems() if BEST in shapes else []
        if args.only == "async":
            data = run(profile, [], [], out_dir, cluster, command.strip(), [], coroutines)
        elif args.only == "workflows":
            data = run(profile, [], [], out_dir, cluster, command.strip(), flows=workflow_system())
        elif args.only == "otel":
            traced = otel_systems() if BEST in shapes else []
            data = run(profile, [], [], out_dir, cluster, command.strip(), [], [], traced)
        else:
            systems = (
                [s for k, s in all_systems(SAME).items() if wanted(k)] if SAME in shapes else []
            )
            best = [s for k, s in all_systems(BEST).items() if wanted(k)] if BEST in shapes else []
            # The queue-limits comparison needs this checkout's history (the earlier
            # revision's files come from git); it is left out with the Tenure drain at its best.
            limits = limits_systems() if BEST in shapes and (ROOT / ".git").exists() else []
            data = run(
                profile, systems, best, out_dir, cluster, command.strip(), limits, coroutines
            )
    # The quick profile's report is <date>.md; the full one and scaled checks are kept apart.
    suffix = "" if profile.name == "quick" else "-" + profile.name.replace(" ", "")
    if set(shapes) != set(SHAPES):
        suffix += "-" + "-".join(shapes)
    if args.only:
        suffix += f"-{args.only}"
    stem = f"{data['date']}{suffix}"
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out_dir / "raw-partial.json").unlink(missing_ok=True)
    md = report.write(data, out_dir, stem)
    _log(f"wrote {md} in {data['elapsed_seconds']:.0f} s")


if __name__ == "__main__":
    main()
