"""One verifier run end to end, and the helper roles its child processes play.

The run: a fresh PostgreSQL cluster and database (``migrate``), the demo destinations, the
executors behind their proxy links, the schedulers, and the workload; the nemesis for the
plan's seconds; then every fault healed, the work drained, parked jobs settled by the
operator and drained again, the hostile-input sweep, every process stopped, and the checker.
Its verdicts are the exit status: 0 when every invariant held.

This process never opens a Django connection to the run's database: the roles that need one
(``workload``, ``operator``, ``sweep``, ``check``) are ``manage.py chaos --role ...``
children whose ``DATABASE_URL`` points at it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from scheduler_core.domain.workflows import BLOCKED_AT

from .broker import RedisBroker
from .cluster import PgCluster, free_port
from .fleet import MANAGE, Fleet
from .nemesis import Nemesis
from .plan import Plan
from .proxy import ProxyServer

ONE_OPEN_ATTEMPT_OFF = "ALTER TABLE tenure_open_attempt DROP CONSTRAINT tenure_open_attempt_pkey"
"""Drops the key of the table of open attempts (migration 0017; it holds one active attempt),
which the ``fence`` negative control does with the fence. The triggers still keep the table, so
the reaper's sweep still finds every open attempt there, stray ones included."""


class Writer(Protocol):
    """Where the run reports progress and the final report (a stream or Django's stdout)."""

    def write(self, msg: str, /) -> Any: ...

    def flush(self) -> Any: ...


def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on port {port}") from None
            time.sleep(0.2)


UNFINISHED_SQL = """
    SELECT count(*) FROM tenure_job
    WHERE state IN ('waiting', 'leased') AND NOT (state = 'waiting' AND run_at = %s)
"""
"""Jobs the fleet still has to run. A workflow step blocked on its parents is left out: it
moves when they end (counted here while they wait or run), or it stays held behind a parent
whose outcome is unknown until an operator settles that parent — waiting for it would only
wait out the drain's timeout. I17 judges such steps by their parents."""


def _unfinished(cluster: PgCluster) -> int | None:
    try:
        rows = cluster.query(UNFINISHED_SQL, [BLOCKED_AT])
        return int(rows[0][0])
    except Exception:
        return None


def drain(cluster: PgCluster, fleet: Fleet, timeout: float) -> tuple[bool, float]:
    """Wait until no job is waiting or leased; returns (drained, seconds waited)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        fleet.ensure_executors()
        if _unfinished(cluster) == 0:
            return True, time.monotonic() - start
        time.sleep(0.5)
    return False, time.monotonic() - start


def _say(out: Writer, msg: str) -> None:
    out.write(f"[chaos {time.strftime('%H:%M:%S')}] {msg}\n")
    out.flush()


def _wait_role(child: Any, timeout: float) -> int:
    try:
        return int(child.proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        child.proc.kill()
        child.proc.wait()
        return -9


def _plan_json(plan: Plan) -> dict[str, Any]:
    d = dataclasses.asdict(plan)
    d["workdir"] = str(plan.workdir) if plan.workdir else None
    d["recovery_bound"] = plan.recovery_bound
    d["hint_bound"] = plan.hint_bound
    d["default_timeout"] = plan.default_timeout
    return d


def run(plan: Plan, *, out: Writer, report_path: Path | None = None) -> int:
    """Run the verifier; returns 0 when every invariant held, 1 when one failed, 2 when the
    run itself could not be carried out."""
    from . import report

    workdir = plan.workdir or Path(tempfile.mkdtemp(prefix="tenure-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # The database server runs as ``postgres`` and must reach its folder inside this one.
    workdir.chmod(0o755)
    plan = dataclasses.replace(plan, workdir=workdir)
    cluster = PgCluster(
        workdir / "pg", port=plan.pg_port, negative_control=plan.negative_control == "fence"
    )
    proxy = ProxyServer()
    broker = RedisBroker(workdir / "broker", port=plan.broker_port) if plan.celery_workers else None
    fleet: Fleet | None = None
    # Where the payment provider refuses connections: a port bound and never listened on,
    # held for the whole run so nothing else can take it.
    refusing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    refusing.bind(("127.0.0.1", 0))
    meta: dict[str, Any] = {"plan": _plan_json(plan), "phases": {}}
    (workdir / "plan.json").write_text(json.dumps(meta["plan"], indent=1))
    status = 2
    try:
        t0 = time.monotonic()
        _say(out, f"cluster in {workdir} on port {cluster.port} (seed {plan.seed})")
        cluster.init()
        cluster.start()
        cluster.create_database()
        proxy.start()
        if broker is not None:
            broker.start()
        links = {
            s: proxy.add_link(f"exec-{s}", ("127.0.0.1", cluster.port))
            for s in range(plan.executors)
        }
        fleet = Fleet(
            plan,
            workdir,
            cluster,
            http_port=free_port(),
            smtp_port=free_port(),
            link_ports=links,
            broker_url=broker.url if broker is not None else "",
            down_port=int(refusing.getsockname()[1]),
        )
        migrate = subprocess.run(
            [sys.executable, MANAGE, "migrate", "--noinput"],
            env=fleet.base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{migrate.stdout.decode()[-2000:]}")
        if plan.negative_control == "fence":
            # The database's own guard of one active attempt goes with the fence: a stale
            # attempt's accepted write could leave its job waiting beside a newer open attempt,
            # and every later claim of that job would then fail on the key, where the
            # checker is to see what the missing fence let through.
            cluster.query(ONE_OPEN_ATTEMPT_OFF)
        fleet.start_destinations()
        for s in range(plan.schedulers):
            fleet.start_scheduler(s)
        for s in range(plan.executors):
            fleet.start_executor(s)
        for s in range(plan.celery_workers):
            fleet.start_celery(s)
        _wait_port(fleet.http_port)
        _wait_port(fleet.smtp_port)
        meta["phases"]["setup"] = round(time.monotonic() - t0, 1)

        _say(out, f"faults for {plan.seconds:.0f}s: {', '.join(plan.fault_kinds)}")
        workload = fleet.start_role(
            "workload",
            "--seed",
            str(plan.seed),
            "--seconds",
            str(plan.seconds),
            "--rate",
            str(plan.rate),
        )
        nemesis = Nemesis(
            plan,
            fleet,
            cluster,
            proxy,
            workdir / "faults.jsonl",
            rng=random.Random(plan.seed),
            broker=broker,
        )
        faults_started = time.time()
        counts = nemesis.run(time.monotonic() + plan.seconds)
        nemesis.heal_all()
        meta["faults"] = dict(counts)
        meta["fault_window"] = [faults_started, time.time()]
        _wait_role(workload, timeout=120)
        _say(out, f"healed after {sum(counts.values())} faults; draining")

        drained, waited = drain(cluster, fleet, plan.drain_timeout)
        meta["phases"]["drain"] = round(waited, 1)
        operator = fleet.start_role("operator")
        _wait_role(operator, timeout=120)
        drained2, waited2 = drain(cluster, fleet, plan.drain_timeout)
        meta["phases"]["drain_after_operator"] = round(waited2, 1)
        meta["drained"] = drained and drained2

        if plan.bad_input:
            _say(out, "hostile-input sweep")
            t_sweep = time.monotonic()
            sweep_env = {
                "CHAOS_REDIS_URL": plan.redis_url,
                "CELERY_BROKER_URL": plan.redis_url,
                "TENURE_BROKER_QUEUES": "",
            }
            sweep = fleet.start_role("sweep", env=sweep_env)
            _wait_role(sweep, timeout=300)
            drain(cluster, fleet, 60)
            meta["phases"]["sweep"] = round(time.monotonic() - t_sweep, 1)

        fleet.stop_all()
        meta["processes"] = fleet.pids()
        (workdir / "run.json").write_text(json.dumps(meta, indent=1, default=str))
        _say(out, "checking")
        check = fleet.start_role("check")
        _wait_role(check, timeout=600)
        results = json.loads((workdir / "results.json").read_text())
        out.write(report.render(results))
        if report_path is not None:
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
            _say(out, f"report written to {report_path}")
        status = 0 if results.get("passed") else 1
    except Exception as e:
        detail = getattr(e, "stderr", b"") or b""
        _say(out, f"the run could not be completed: {type(e).__name__}: {e} {detail[-500:]!r}")
        status = 2
    finally:
        # Each step on its own: one that fails must not leave the others undone.
        if fleet is not None:
            with contextlib.suppress(Exception):
                fleet.stop_all(timeout=5)
        with contextlib.suppress(Exception):
            proxy.close()
        refusing.close()
        if broker is not None:
            with contextlib.suppress(Exception):
                broker.stop()
        with contextlib.suppress(Exception):
            cluster.stop("fast" if plan.keep else "immediate")
        if plan.keep:
            _say(out, f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return status


# ---------------------------------------------------------------------------------------------
# Roles: what a `manage.py chaos --role ...` child does, with Django set up on the run's database
# ---------------------------------------------------------------------------------------------


def run_role(role: str, workdir: Path, *, seed: int, seconds: float, rate: float) -> int:
    """Play one helper role inside the run's database; returns the process's exit status."""
    if role == "workload":
        from . import workload

        plan = json.loads((workdir / "plan.json").read_text())
        workload.run(
            workdir,
            seed=seed,
            seconds=seconds,
            rate=rate,
            long_share=plan["long_share"],
            broker_share=plan["broker_share"] if plan.get("celery_workers") else 0.0,
            fallback_share=plan["fallback_share"],
            async_share=plan.get("async_share", 0.0),
            paths_share=plan.get("paths_share", 0.0),
            workflow_share=plan.get("workflow_share", 0.0),
        )
        return 0
    if role == "operator":
        from . import workload

        workload.operator_pass(workdir)
        return 0
    if role == "sweep":
        from . import badinput

        badinput.sweep(workdir)
        return 0
    if role == "check":
        from . import checker

        results = checker.check(workdir)
        (workdir / "results.json").write_text(
            json.dumps(results, indent=1, sort_keys=True, default=str)
        )
        return 0
    raise ValueError(f"unknown role {role!r}")
