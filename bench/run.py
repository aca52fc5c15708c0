"""Run the benchmarks and write the report: ``python -m bench.run --profile quick|full``.

Every round measures every system in turn for each workload, so each Tenure / peer ratio is
taken from figures measured minutes apart under the same conditions; the report shows the
median over rounds of each figure and of each ratio.

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
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import report, workloads
from .common import BENCH, server_facts
from .systems import System, Tenure, all_systems


@dataclass(frozen=True, kw_only=True)
class Profile:
    """How much each workload does."""

    name: str
    rounds: int
    enqueue_single: int
    enqueue_bulk: int
    drain_jobs: int
    drain_workers: tuple[int, ...]
    drain_timeout: float
    cost_jobs: int
    latency_rate: float
    latency_seconds: float
    dashboard_jobs: int
    dashboard_attempts_per_job: int
    dashboard_requests: int
    pgbench_seconds: int

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
        )


PROFILES = {
    # Within 10 minutes on 2 cores: short rounds, two worker counts, one attempt per job.
    "quick": Profile(
        name="quick",
        rounds=3,
        enqueue_single=60,
        enqueue_bulk=5_000,
        drain_jobs=1_000,
        drain_workers=(1, 4),
        drain_timeout=5.0,
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
    "matplotlib",
)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(profile: Profile, systems: list[System], out_dir: Path) -> dict[str, Any]:
    """Install every system, run ``profile.rounds`` rounds, return everything measured."""
    started = time.monotonic()
    facts = server_facts()
    _log(f"server: {facts}")
    for s in systems:
        _log(f"install {s.key}")
        s.install()
    dash = Tenure(key="tenure-dash", db="bench_tenure_dash")
    dash.install()
    tenure = next(s for s in systems if s.key == "tenure")
    assert isinstance(tenure, Tenure)
    rounds: list[dict[str, Any]] = []
    for r in range(profile.rounds):
        rec: dict[str, Any] = {
            "enqueue_single": {},
            "enqueue_bulk": {},
            "drain": {},
            "cost": {},
            "latency": {},
        }
        _log(f"round {r + 1}/{profile.rounds}: pgbench")
        rec["pgbench"] = workloads.pgbench_tps(profile.pgbench_seconds)
        for s in systems:
            _log(f"round {r + 1}: enqueue {s.key}")
            got = workloads.enqueue(s, profile.enqueue_single, profile.enqueue_bulk)
            rec["enqueue_single"][s.key] = got["single"]
            rec["enqueue_bulk"][s.key] = got.get("bulk", {"per_second": float("nan")})
        for w in profile.drain_workers:
            for s in systems:
                _log(f"round {r + 1}: drain {s.key} x{w}")
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
        "profile": profile.__dict__,
        "server": facts,
        "versions": _versions(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "systems": {s.key: s.label for s in systems},
        "rounds": rounds,
        "elapsed_seconds": time.monotonic() - started,
        "date": dt.date.today().isoformat(),
    }


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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--out", default=str(BENCH / "results"))
    args = parser.parse_args()
    profile = PROFILES[args.profile].scaled(float(os.environ.get("BENCH_SCALE", "1")))
    if "BENCH_ROUNDS" in os.environ:
        profile = Profile(**{**profile.__dict__, "rounds": int(os.environ["BENCH_ROUNDS"])})
    chosen = os.environ.get("BENCH_SYSTEMS", "")
    systems = [
        s for k, s in all_systems().items() if not chosen or k == "tenure" or k in chosen.split(",")
    ]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = run(profile, systems, out_dir)
    # The quick profile's report is <date>.md; the full one and scaled checks are kept apart.
    suffix = "" if profile.name == "quick" else "-" + profile.name.replace(" ", "")
    stem = f"{data['date']}{suffix}"
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out_dir / "raw-partial.json").unlink(missing_ok=True)
    md = report.write(data, out_dir, stem)
    _log(f"wrote {md} in {data['elapsed_seconds']:.0f} s")


if __name__ == "__main__":
    main()
