"""Where a drain's first seconds go: the start-up timeline of Tenure's executors on a
pre-filled queue, read from the database's own timestamps.

``PYTHONPATH=. var/bench-venv/bin/python -m bench.startup [--systems tenure-celery,tenure]
[--jobs 4000] [--rounds 3]`` (a few minutes; prints a table, writes
``var/bench/startup.json``). Each round is one :func:`bench.workloads.drain` of ``--jobs``
no-op jobs at their best (2 worker processes x 8, the jobs enqueued
first, the workers started the moment the enqueue returned, on a cluster of the run's own with
production defaults), and then reads, relative to that moment by the database's clock: when
the executor rows were registered (first, median, last), when hints were first and last
published (``hinted_at``), and when the first jobs were claimed and finished. It explains a
whole-run time; it is not a benchmark figure and nothing is compared in it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from .common import VAR, compile_bytecode, connect, median
from .run import server
from .systems import BEST, Tenure, TenureCelery
from .workloads import drain

SYSTEMS: dict[str, type[Tenure]] = {"tenure": Tenure, "tenure-celery": TenureCelery}


def _offsets(conn: Any, sql: str, t0: dt.datetime) -> list[float]:
    return [(r[0] - t0).total_seconds() for r in conn.execute(sql, (t0,)).fetchall()]


def timeline(system: Tenure, jobs: int, workers: int, timeout: float = 120) -> dict[str, Any]:
    """One :func:`bench.workloads.drain` of ``jobs`` pre-loaded jobs by ``workers`` processes,
    then its start-up as read from the rows it left, from the moment the workers started."""
    assert system.db
    conn = connect(system.db)
    started: list[dt.datetime] = []
    try:
        run = drain(
            system,
            jobs,
            workers,
            timeout=timeout,
            on_start=lambda: started.append(
                conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            ),
        )
        t0 = started[0]
        executors = _offsets(
            conn,
            "SELECT started_at FROM tenure_executor WHERE started_at >= %s ORDER BY started_at",
            t0,
        )
        hinted = _offsets(
            conn,
            "SELECT hinted_at FROM tenure_job WHERE hinted_at >= %s ORDER BY hinted_at",
            t0,
        )
        claimed = _offsets(
            conn,
            "SELECT claimed_at FROM tenure_attempt WHERE claimed_at >= %s ORDER BY claimed_at",
            t0,
        )
        finished = _offsets(
            conn,
            "SELECT finished_at FROM tenure_attempt WHERE finished_at >= %s ORDER BY finished_at",
            t0,
        )
    finally:
        conn.close()

    def at(xs: list[float], i: int) -> float:
        return xs[min(i, len(xs) - 1)] if xs else float("nan")

    return {
        "system": system.key,
        "jobs": jobs,
        "done": run["done"],
        "whole_seconds": run["whole_seconds"],
        "executors_registered": len(executors),
        "executor_first": at(executors, 0),
        "executor_median": median(executors),
        "executor_last": at(executors, len(executors) - 1),
        "hints": len(hinted),
        "hint_first": at(hinted, 0),
        "hint_last": at(hinted, len(hinted) - 1),
        "claim_first": at(claimed, 0),
        "claim_100th": at(claimed, 99),
        "finished_first": at(finished, 0),
        "finished_half": at(finished, jobs // 2),
        "finished_last": at(finished, len(finished) - 1),
    }


def _s(x: float) -> str:
    return "—" if x != x else f"{x:.2f}"


def main() -> None:
    """Command line: run the rounds, print the timeline table, keep the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="tenure-celery,tenure")
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    compile_bytecode()
    with server("own"):
        systems = [SYSTEMS[k.strip()](shape=BEST) for k in args.systems.split(",") if k.strip()]
        for s in systems:
            s.install()
        for _ in range(args.rounds):
            for s in systems:
                row = timeline(s, args.jobs, 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    cols = [
        "whole_seconds",
        "executor_first",
        "executor_median",
        "executor_last",
        "hint_first",
        "hint_last",
        "claim_first",
        "claim_100th",
        "finished_first",
        "finished_half",
        "finished_last",
    ]
    print("| system | " + " | ".join(cols) + " |")
    print("|" + "---|" * (len(cols) + 1))
    for row in rows:
        cells = [
            " ".join(_s(x) for x in row[c]) if isinstance(row[c], list) else _s(row[c])
            for c in cols
        ]
        print(f"| {row['system']} | " + " | ".join(cells) + " |")
    out = VAR / "bench" / "startup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"seconds from the workers' start; figures in {Path(out)}")


if __name__ == "__main__":
    main()
