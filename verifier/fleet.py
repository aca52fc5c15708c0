"""The system under test's processes: executors, schedulers, the demo destinations, and the
verifier's own helper roles (workload, operator, sweep, checker), each a ``manage.py`` child.

Executors reach PostgreSQL through their own proxy link and name their connections
``chaos-exec-<slot>`` (``PGAPPNAME``), so a fault can cut or end exactly one executor's
connections. The first executors and the first scheduler run with an offset wall clock.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .cluster import APP_PREFIX, PgCluster
from .plan import CONTROL_DRIVERS, DOWN_URL_ENV, Plan

ROOT = Path(__file__).resolve().parents[1]
MANAGE = str(ROOT / "manage.py")
JOB_MODULES = "verifier.job_types"
RESPAWN_EVERY = 3.0
"""Seconds between restarts of one executor slot whose process died on its own."""


@dataclass
class Child:
    """One child process of the run."""

    name: str
    kind: str
    slot: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    clock: str = ""
    started: float = 0.0

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the verifier dies, so no executor outlives
    an interrupted run (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def faketime_library() -> str | None:
    """Path of the ``faketime`` preload library (Debian package ``faketime``), if installed."""
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds a process has used (Linux ``/proc``), None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class Fleet:
    """Starts, signals and restarts the run's child processes."""

    def __init__(
        self,
        plan: Plan,
        workdir: Path,
        cluster: PgCluster,
        *,
        http_port: int,
        smtp_port: int,
        link_ports: dict[int, int],
        broker_url: str = "",
        down_port: int = 0,
    ) -> None:
        self.plan = plan
        self.workdir = workdir
        self.cluster = cluster
        self.http_port = http_port
        self.smtp_port = smtp_port
        self.link_ports = link_ports
        self.broker_url = broker_url
        self.down_port = down_port
        self.children: list[Child] = []
        self._respawned: dict[int, float] = {}
        self.faketime = faketime_library()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        (workdir / "events").mkdir(parents=True, exist_ok=True)

    # -- environment ----------------------------------------------------------------------
    def base_env(self, database_url: str | None = None) -> dict[str, str]:
        """What every child shares: the run's database, job modules, fast maintenance."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PG"))}
        p = self.plan
        env.update(
            DATABASE_URL=database_url or self.cluster.url(),
            DJANGO_SETTINGS_MODULE="config.settings",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            TENURE_VAR_DIR=str(self.workdir / "var"),
            TENURE_TRANSPORT="polling",
            TENURE_JOB_MODULES=JOB_MODULES,
            TENURE_REAP_GRACE_SECONDS=str(p.reap_grace),
            TENURE_SWEEP_INTERVAL=str(p.sweep_interval),
            TENURE_POLL_INTERVAL="0.25",
            TENURE_SHUTDOWN_GRACE_SECONDS="3",
            TENURE_CHAOS_LEASE=str(p.lease_seconds),
            DEMO_PAY_URL=f"http://127.0.0.1:{self.http_port}",
            DEMO_SMTP=f"127.0.0.1:{self.smtp_port}",
            TENURE_LOG_LEVEL="INFO",
            # Job types that declare no maximum runtime get this one, so their hung attempts
            # end within the run (the shipped default, 600 s, is longer than a smoke run).
            TENURE_DEFAULT_TIMEOUT_SECONDS=str(p.default_timeout),
        )
        if self.down_port:
            env[DOWN_URL_ENV] = f"http://127.0.0.1:{self.down_port}"
        if self.broker_url:
            # The broker queue's jobs are announced through the run's own Redis and run by
            # its Celery workers; every other queue stays broker-less.
            from .broker import BROKER_QUEUE

            env.update(
                TENURE_TRANSPORT="celery",
                CELERY_BROKER_URL=self.broker_url,
                TENURE_BROKER_QUEUES=BROKER_QUEUE,
                TENURE_REDISPATCH_AFTER_SECONDS=str(p.redispatch_after),
            )
        env.update(p.extra_env)
        return env

    def _spawn(
        self,
        name: str,
        kind: str,
        slot: int,
        args: list[str],
        env: dict[str, str],
        *,
        clock: str = "",
        module: str = "",
    ) -> Child:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")
        cmd = [sys.executable, "-m", module, *args] if module else [sys.executable, MANAGE, *args]
        if clock and self.faketime:
            # The library is preloaded into the process itself (the ``faketime`` command would
            # fork, and signals meant for the executor would reach only the wrapper).
            env = {
                **env,
                "LD_PRELOAD": self.faketime,
                "FAKETIME": clock,
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
            cmd = [sys.executable, "-m", "verifier.skew", MANAGE, *args]
        else:
            clock = ""
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            preexec_fn=_die_with_parent,
        )
        child = Child(name, kind, slot, proc, log, clock, time.time())
        self.children.append(child)
        return child

    # -- the system under test ------------------------------------------------------------
    def start_destinations(self) -> Child:
        """The demo payment provider (HTTP) and SMTP sink, on the run's database."""
        args = ["run_destinations", "--http-port", str(self.http_port)]
        args += ["--smtp-port", str(self.smtp_port)]
        return self._spawn("destinations", "destinations", 0, args, self.base_env())

    def _clock(self, slot: int, *, reverse: bool = False) -> str:
        offsets = list(self.plan.clock_offsets)
        if reverse:
            offsets.reverse()
        return offsets[slot] if slot < len(offsets) else ""

    def start_executor(self, slot: int) -> Child:
        """Executor ``slot``, through its proxy link, with its event log."""
        env = self.base_env(self.cluster.url(self.link_ports[slot]))
        env.update(
            PGAPPNAME=f"{APP_PREFIX}{slot}",
            TENURE_EVENT_LOG=str(self.workdir / "events" / f"exec-{slot}.jsonl"),
        )
        env.update(self._negative_env())
        args = ["run_executor", "--concurrency", str(self.plan.concurrency), "--grace", "3"]
        return self._spawn(f"exec-{slot}", "executor", slot, args, env, clock=self._clock(slot))

    def _negative_env(self, *, celery: bool = False) -> dict[str, str]:
        """What a negative control switches off in the processes that run jobs: the fence
        check (broker-less executors only: the Celery workers' faults are the broker's), or
        another guard through a driver of the verifier's own (every process that runs jobs:
        :data:`~verifier.plan.CONTROL_DRIVERS`)."""
        if self.plan.negative_control == "fence" and not celery:
            return {"TENURE_DRIVER": "verifier.drivers.FenceOff"}
        driver = CONTROL_DRIVERS.get(self.plan.negative_control)
        return {"TENURE_DRIVER": driver} if driver else {}

    def start_scheduler(self, slot: int) -> Child:
        """A maintenance process (reaper, dispatcher); the first runs on an offset clock."""
        env = self.base_env()
        env["PGAPPNAME"] = f"chaos-sched-{slot}"
        args = ["run_scheduler", "--interval", str(self.plan.sweep_interval)]
        clock = self._clock(slot, reverse=True) if slot == 0 else ""
        return self._spawn(f"sched-{slot}", "scheduler", slot, args, env, clock=clock)

    def start_celery(self, slot: int) -> Child:
        """Celery worker ``slot`` (prefork, two pool processes) on the broker queue, straight
        to the database (its faults are the broker's), with its event log."""
        from .broker import BROKER_QUEUE

        env = self.base_env()
        env.update(
            PGAPPNAME=f"chaos-celery-{slot}",
            TENURE_EVENT_LOG=str(self.workdir / "events" / f"celery-{slot}.jsonl"),
        )
        env.update(self._negative_env(celery=True))
        args = ["-A", "config", "worker", "-Q", BROKER_QUEUE, "--pool", "prefork", "-c", "2"]
        args += ["-n", f"chaos-celery-{slot}@%h", "-l", "INFO"]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        return self._spawn(f"celery-{slot}", "celery", slot, args, env, module="celery")

    def start_role(self, role: str, *extra: str, env: dict[str, str] | None = None) -> Child:
        """One of the verifier's own roles (``manage.py chaos --role ...``)."""
        e = self.base_env()
        e["PGAPPNAME"] = f"chaos-{role}"
        e.update(env or {})
        args = ["chaos", "--role", role, "--dir", str(self.workdir), *extra]
        return self._spawn(role, "role", 0, args, e)

    # -- control --------------------------------------------------------------------------
    def executors(self) -> list[Child]:
        """Live executor processes."""
        return [c for c in self.children if c.kind == "executor" and c.alive()]

    def of_kind(self, kind: str) -> list[Child]:
        return [c for c in self.children if c.kind == kind and c.alive()]

    def signal(self, child: Child, sig: int) -> bool:
        """Send ``sig``; False if the process is gone."""
        try:
            os.kill(child.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def respawn(self, child: Child) -> Child:
        """Start a fresh executor in a dead one's slot."""
        child.proc.wait()
        return self.start_executor(child.slot)

    def ensure_executors(self) -> list[Child]:
        """Restart any executor slot whose process has ended; returns the new ones.

        A slot whose process keeps dying (for example while the database is down at start-up)
        is restarted at most every few seconds, so a crash loop cannot eat the machine.
        """
        live = {c.slot for c in self.executors()}
        now = time.monotonic()
        started = []
        for s in range(self.plan.executors):
            if s in live or now - self._respawned.get(s, -1e9) < RESPAWN_EVERY:
                continue
            self._respawned[s] = now
            started.append(self.start_executor(s))
        # Celery workers too, as their process supervisor would: a worker may exit on its own
        # when its broker connection breaks (the report counts these exits).
        if self.broker_url:
            live = {c.slot for c in self.of_kind("celery")}
            for s in range(self.plan.celery_workers):
                key = -1 - s
                if s in live or now - self._respawned.get(key, -1e9) < RESPAWN_EVERY:
                    continue
                self._respawned[key] = now
                started.append(self.start_celery(s))
        return started

    def stop_all(self, *, timeout: float = 15.0) -> None:
        """SIGCONT then SIGTERM every child; SIGKILL whatever outlives ``timeout``."""
        live = [c for c in self.children if c.alive()]
        for c in live:
            self.signal(c, signal.SIGCONT)
            self.signal(c, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for c in live:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal(c, signal.SIGKILL)
                c.proc.wait()
        for c in self.children:
            c.log.close()

    def pids(self) -> dict[str, Any]:
        """Every child ever started: name, kind, slot, pid, clock offset, start time."""
        return {
            str(c.pid): {
                "name": c.name,
                "kind": c.kind,
                "slot": c.slot,
                "clock": c.clock,
                "started": c.started,
            }
            for c in self.children
        }
