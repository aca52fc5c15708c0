"""What a held snapshot costs per job: the bytes each of Tenure's job and attempt tables and
their indexes gain per job while an old snapshot is held, beside what they gain with none
held and what a job costs them once compact.

``PYTHONPATH=. var/bench-venv/bin/python -m bench.versions [--jobs 5000]`` (a few minutes;
prints a table, writes ``var/bench/versions.json``). On a cluster of the run's own with
production defaults (autovacuum on), ``--jobs`` no-op jobs go through their whole lifecycle
one after another (``bench.agent tenure cycle``: the enqueue, the claim, the completion, as an
executor writes them) with no snapshot held; then as many again while a ``REPEATABLE READ``
session holds the snapshot it took before them; then the session ends. Every phase starts
from tables rewritten compactly (``VACUUM FULL``), and so does the last measure. Each relation's growth is divided by the jobs that
caused it; compact is the rewritten size divided by the jobs the table holds.

It explains the soak's size verdict (``bench/soak.py``: the tables after the hour against
after 10 minutes plus the compact bytes of the jobs finished since): while the snapshot is
held every version a claim and a completion leave behind stays, with its index entries, and
after it only the jobs that come later reuse that space — as many jobs as came while it was
held, in the soak. So the verdict needs, relation by relation (space a table or an index
frees is reused by it alone), a job's held bytes at most twice its compact bytes; a primary
key's freed space is not reused at all (its keys only grow), and a partial index whose jobs
have all moved on keeps its pages empty (``run_scheduler``'s index upkeep rebuilds such
indexes once the snapshot has ended: ``scheduler_core/services/indexes.py``). The total's
ratio is printed too, but a total under 2 does not pass the verdict: the job table's heap
over 2 is not offset by the spec table under it. It is a diagnostic, not a benchmark
figure.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from .common import VAR, connect
from .run import server
from .systems import Tenure
from .workloads import _agent

SIZES_SQL = """
    SELECT c.relname, pg_relation_size(c.oid)
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') AND c.relname ~ %s
"""


def phases(
    db: str, jobs: int, tables: list[str], pattern: str, cycle: Callable[[int], Any]
) -> tuple[dict[str, dict[str, float]], int, Any, Any]:
    """The three phases on the relations whose names match ``pattern``: ``cycle(n)`` puts n
    jobs through their lifecycle with no snapshot held, then while one is held, each phase
    from ``tables`` rewritten compactly (the first is the one the holder reads). Returns the
    bytes per job of each relation (free, held, compact), the jobs the tables hold, and what
    the two measured cycles returned."""
    conn = connect(db)

    def sizes() -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in conn.execute(SIZES_SQL, [pattern]).fetchall()}

    sizes_before_compact: dict[str, int] = {}

    def compact_now() -> None:
        sizes_before_compact.clear()
        sizes_before_compact.update(sizes())
        for table in tables:
            conn.execute(f"VACUUM FULL {table}")

    try:
        cycle(500)  # first pages and index levels: not counted
        compact_now()
        start = sizes()
        free = cycle(jobs)
        # Each phase starts from compact tables: no free space left by the one before (how
        # much of it there was depends on when autovacuum happened to run) to fill first.
        compact_now()
        after_free = sizes()
        free_growth = {k: v - start.get(k, 0) for k, v in sizes_before_compact.items()}
        holder = connect(db)
        try:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute(f"SELECT count(*) FROM {tables[0]}").fetchone()
            held = cycle(jobs)
            after_held = sizes()
        finally:
            holder.close()
        compact_now()
        compact = sizes()
        kept = int(conn.execute(f"SELECT count(*) FROM {tables[0]}").fetchone()[0])  # type: ignore[index]
    finally:
        conn.close()
    rows = {
        name: {
            "free": free_growth.get(name, 0) / jobs,
            "held": (after_held[name] - after_free[name]) / jobs,
            "compact": compact.get(name, 0) / kept,
        }
        for name in sorted(after_held)
    }
    return rows, kept, free, held


def measure(jobs: int) -> dict[str, Any]:
    """The bytes per job of every job and attempt relation: free, held, compact."""
    system = Tenure()
    system.install()
    system.reset()
    assert system.db
    rows, kept, free, held = phases(
        system.db,
        jobs,
        ["tenure_job", "tenure_job_spec", "tenure_attempt"],
        "^tenure_(job|attempt)",
        lambda n: _agent(system, "cycle", n),
    )
    total = {k: sum(r[k] for r in rows.values()) for k in ("free", "held", "compact")}
    return {
        "jobs": jobs,
        "jobs_kept": kept,
        "free_per_second": free["per_second"],
        "held_per_second": held["per_second"],
        "relations": rows,
        "total": total,
    }


def over_twice(rows: dict[str, dict[str, float]]) -> str:
    """The relations of ``rows`` (bytes per job by relation: free, held, compact) that hold more
    than twice their compact bytes while a snapshot is held, with that excess, largest first."""
    over = {
        n: r["held"] - 2 * r["compact"] for n, r in rows.items() if r["held"] > 2 * r["compact"] + 1
    }
    ranked = sorted(over.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {excess:.0f}" for name, excess in ranked) or "none"


def print_layouts(layouts: dict[str, dict[str, dict[str, float]]]) -> None:
    """The design sketches' output: each layout's relations, then each layout's totals and the
    relations over twice their compact bytes."""
    print("| layout | relation | bytes per job, no snapshot held | held | compact |")
    print("|---|---|---|---|---|")
    for layout, rows in layouts.items():
        for name, r in rows.items():
            print(f"| {layout} | {name} | {r['free']:.0f} | {r['held']:.0f} | {r['compact']:.0f} |")
    for layout, rows in layouts.items():
        t = {k: sum(r[k] for r in rows.values()) for k in ("free", "held", "compact")}
        print(
            f"{layout}: {t['free']:.0f} / {t['held']:.0f} / {t['compact']:.0f} bytes per job, "
            f"held / compact = {t['held'] / t['compact']:.2f}; over twice compact (held - 2 x "
            f"compact bytes per job): {over_twice(rows)}"
        )


def main() -> None:
    """Command line: measure, print the table, keep the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()
    with server("own"):
        out = measure(args.jobs)
    print("| relation | bytes per job, no snapshot held | held | compact |")
    print("|---|---|---|---|")
    for name, r in [*out["relations"].items(), ("total", out["total"])]:
        print(f"| {name} | {r['free']:.0f} | {r['held']:.0f} | {r['compact']:.0f} |")
    t = out["total"]
    print(f"held / compact = {t['held'] / t['compact']:.2f} in total")
    print(
        "over twice their compact bytes (the soak's size verdict needs none), held - 2 x "
        f"compact bytes per job: {over_twice(out['relations'])}"
    )
    path = VAR / "bench" / "versions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"figures in {path}")


if __name__ == "__main__":
    main()
