"""The nemesis: seeded faults, one at a time, each healed before the next.

Faults are dealt from a shuffled deck of the plan's kinds, so every kind recurs evenly however
long the run. Each fault picks the executor holding the most leases (by the database), so it
lands on work in flight, and logs what it did to ``faults.jsonl`` with wall-clock times (the
database runs on this machine's clock, unskewed, so the checker can line the two up).

================  ================================================================  ===============
kind              what                                                              catalogue
================  ================================================================  ===============
kill              SIGKILL an executor mid-job; a fresh one takes its slot           1, 2
pause_long        SIGSTOP an executor past its lease (+grace +sweep), then SIGCONT   5, 6
pause_short       SIGSTOP for under a third of the lease: no rescue may happen      7
term              SIGTERM mid-job: it stops claiming, finishes or releases           4
backend_kill      ``pg_terminate_backend`` of one executor's connections             9, 10
pg_restart        ``pg_ctl -m immediate restart`` under load                         12
pg_down           the server stopped for seconds; executors' CPU measured            13
blackhole         one executor's link held past its lease, then let through late     14
drop_replies      one executor's replies lost (a COMMIT's outcome unknown)           11
broker_restart    the run's Redis killed and started empty: queued hints are lost     22, 24
broker_duplicate  every queued and unacknowledged hint published 2-5 times more       23
pool_kill         SIGKILL the Celery pool process running a job (not the worker)     3
================  ================================================================  ===============
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .broker import BROKER_QUEUE, RedisBroker
from .cluster import APP_PREFIX, PgCluster
from .fleet import Child, Fleet, cpu_seconds
from .plan import Plan
from .proxy import ProxyServer

STARTUP_SECONDS = 5.0
"""A process younger than this is still starting up (imports, Django set-up)."""


class Nemesis:
    """Injects the plan's faults until a deadline, then heals everything."""

    def __init__(
        self,
        plan: Plan,
        fleet: Fleet,
        cluster: PgCluster,
        proxy: ProxyServer,
        log_path: Path,
        *,
        rng: random.Random,
        broker: RedisBroker | None = None,
    ) -> None:
        self.plan = plan
        self.fleet = fleet
        self.cluster = cluster
        self.proxy = proxy
        self.log_path = log_path
        self.rng = rng
        self.broker = broker
        self.counts: Counter[str] = Counter()
        self._stopped: list[Child] = []

    # -- the loop -------------------------------------------------------------------------
    def run(self, deadline: float) -> Counter[str]:
        """Inject faults until ``deadline`` (``time.monotonic``); returns counts by kind."""
        deck: list[str] = []
        while time.monotonic() < deadline:
            if not deck:
                deck = list(self.plan.fault_kinds)
                self.rng.shuffle(deck)
            kind = deck.pop()
            started = time.time()
            try:
                record = getattr(self, f"_{kind}")()
            except Exception as e:  # a fault that could not be injected is reported, not fatal
                record = {"error": f"{type(e).__name__}: {e}"[:300]}
            record.update(kind=kind, start=started, end=time.time())
            self._log(record)
            self.counts[kind] += 0 if "error" in record else 1
            self.fleet.ensure_executors()
            gap = self.rng.uniform(*self.plan.fault_gap)
            time.sleep(max(0.0, min(gap, deadline - time.monotonic())))
        return self.counts

    def heal_all(self) -> None:
        """Undo every fault still in effect: resume processes, open links, start the database."""
        for c in self.fleet.children:
            if c.alive():
                self.fleet.signal(c, signal.SIGCONT)
        for slot in range(self.plan.executors):
            self.proxy.set_mode(f"exec-{slot}", "pass")
        try:
            self.cluster.wait_up(timeout=2)
        except Exception:
            self.cluster.start()
            self.cluster.wait_up()
        self.fleet.ensure_executors()

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    # -- targets --------------------------------------------------------------------------
    def _leases_by_pid(self) -> dict[int, list[int]]:
        """Jobs leased right now, by the pid in their owner's executor id."""
        out: dict[int, list[int]] = {}
        try:
            rows = self.cluster.query(
                "SELECT id, lease_owner FROM tenure_job WHERE state = 'leased'"
            )
        except Exception:
            return out
        for job_id, owner in rows:
            parts = str(owner).split(":")
            if len(parts) >= 3 and parts[1].isdigit():
                out.setdefault(int(parts[1]), []).append(int(job_id))
        return out

    def _busiest(self) -> tuple[Child | None, list[int]]:
        """The live executor holding the most leases (ties broken by the seeded rng)."""
        live = self.fleet.executors()
        if not live:
            return None, []
        leases = self._leases_by_pid()
        self.rng.shuffle(live)
        best = max(live, key=lambda c: len(leases.get(c.pid, [])))
        return best, sorted(leases.get(best.pid, []))

    def _target(self, patience: float = 3.0) -> dict[str, Any]:
        """The busiest executor, waiting up to ``patience`` seconds for one with work."""
        deadline = time.monotonic() + patience
        child, jobs = self._busiest()
        while not jobs and time.monotonic() < deadline:
            time.sleep(0.2)
            child, jobs = self._busiest()
        if child is None:
            raise RuntimeError("no live executor")
        return {"child": child, "pid": child.pid, "slot": child.slot, "jobs": jobs}

    @staticmethod
    def _public(t: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in t.items() if k != "child"}

    # -- faults ---------------------------------------------------------------------------
    def _kill(self) -> dict[str, Any]:
        t = self._target()
        self.fleet.signal(t["child"], signal.SIGKILL)
        time.sleep(self.rng.uniform(0.3, 1.5))
        new = self.fleet.respawn(t["child"])
        return {**self._public(t), "replacement": new.pid}

    def _pause(self, seconds: float) -> dict[str, Any]:
        t = self._target()
        self.fleet.signal(t["child"], signal.SIGSTOP)
        time.sleep(seconds)
        self.fleet.signal(t["child"], signal.SIGCONT)
        return {**self._public(t), "paused": round(seconds, 3)}

    def _pause_long(self) -> dict[str, Any]:
        return self._pause(self.plan.recovery_bound + self.rng.uniform(1.0, 3.0))

    def _pause_short(self) -> dict[str, Any]:
        return self._pause(self.plan.lease_seconds * self.rng.uniform(0.15, 0.3))

    def _term(self) -> dict[str, Any]:
        t = self._target()
        self.fleet.signal(t["child"], signal.SIGTERM)
        begun = time.monotonic()
        forced = False
        try:
            t["child"].proc.wait(timeout=10)
        except Exception:
            forced = True
            self.fleet.signal(t["child"], signal.SIGKILL)
        took = time.monotonic() - begun
        new = self.fleet.respawn(t["child"])
        return {
            **self._public(t),
            "exit_after": round(took, 3),
            "forced": forced,
            "replacement": new.pid,
        }

    def _backend_kill(self) -> dict[str, Any]:
        t = self._target()
        n = self.cluster.terminate_backends(f"{APP_PREFIX}{t['slot']}")
        return {**self._public(t), "terminated": n}

    def _pg_restart(self) -> dict[str, Any]:
        begun = time.time()
        self.cluster.restart_immediate()
        waited = self.cluster.wait_up()
        return {"outage": [begun, time.time()], "recovery_wait": round(waited, 3)}

    def _pg_down(self) -> dict[str, Any]:
        seconds = self.rng.uniform(4.0, 8.0)
        begun = time.time()
        # A process still starting up spends its start-up CPU, not an outage's: leave it out.
        alive = self.fleet.of_kind("executor") + self.fleet.of_kind("scheduler")
        watched = [c for c in alive if begun - c.started > STARTUP_SECONDS]
        self.cluster.stop("immediate")
        before = {c.name: cpu_seconds(c.pid) for c in watched}
        time.sleep(seconds)
        after = {c.name: cpu_seconds(c.pid) for c in watched}
        self.cluster.start()
        self.cluster.wait_up()
        cpu: dict[str, float] = {}
        for name, start in before.items():
            end = after.get(name)
            if start is not None and end is not None:
                cpu[name] = round(end - start, 3)
        skipped = sorted(c.name for c in alive if c not in watched)
        return {
            "outage": [begun, time.time()],
            "measured": round(seconds, 3),
            "cpu": cpu,
            "starting_up": skipped,
        }

    def _blackhole(self) -> dict[str, Any]:
        t = self._target()
        link = f"exec-{t['slot']}"
        seconds = self.plan.recovery_bound + self.rng.uniform(1.0, 3.0)
        self.proxy.set_mode(link, "hold")
        time.sleep(seconds)
        figures = self.proxy.set_mode(link, "pass")
        return {**self._public(t), "held": round(seconds, 3), "link": figures}

    def _drop_replies(self) -> dict[str, Any]:
        t = self._target()
        link = f"exec-{t['slot']}"
        seconds = self.rng.uniform(0.5, 2.0)
        self.proxy.set_mode(link, "drop")
        time.sleep(seconds)
        figures = self.proxy.set_mode(link, "pass")
        return {**self._public(t), "dropped_for": round(seconds, 3), "link": figures}

    def _broker_restart(self) -> dict[str, Any]:
        if self.broker is None:
            raise RuntimeError("this run has no broker")
        begun = time.time()
        record = self.broker.restart(self.rng.uniform(0.5, 3.0))
        return {**record, "broker_outage": [begun, time.time()]}

    def _broker_duplicate(self) -> dict[str, Any]:
        if self.broker is None:
            raise RuntimeError("this run has no broker")
        return self.broker.duplicate(BROKER_QUEUE, self.rng.randint(2, 5))

    def _pool_kill(self) -> dict[str, Any]:
        """SIGKILL a Celery pool process that holds a lease (its worker forks a new one; the
        message was acknowledged late, and the job waits for its lease and the reaper)."""
        parents = {c.pid for c in self.fleet.of_kind("celery")}
        deadline = time.monotonic() + 3.0
        while True:
            leases = self._leases_by_pid()
            pool = [pid for pid in leases if _parent_pid(pid) in parents]
            if pool or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not pool:
            raise RuntimeError("no Celery pool process holds a lease")
        pid = self.rng.choice(sorted(pool))
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid, "jobs": sorted(leases[pid]), "worker": _parent_pid(pid)}


def _parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (from ``/proc``), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            # The command name may hold spaces; the fields after its closing parenthesis do not.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
