"""A design sketch, not a benchmark of Tenure: what the claim would cost if the lease lived in the
attempt row alone (``bench.sketch_lease``'s layout), where leased jobs stay in the claim index
and each claim must step over them.

``PYTHONPATH=. var/bench-venv/bin/python -m bench.sketch_claim [--claims 3000] [--in-flight 16]
[--batch 1]`` (under a minute; prints a table). On a cluster of its own with production
defaults, in a database migrated to the latest schema, one connection keeps a backlog of
``--backlog`` waiting jobs of one queue and ``--in-flight`` jobs leased and not yet completed
(as two executors of 8 threads keep them), and then, ``--claims`` times: claims up to
``--batch`` jobs with the layout's claim statement (timed from the client, the statement
without its commit), completes the jobs leased longest while more than ``--in-flight`` are, and enqueues as
many as it claimed. Once with no snapshot held, then as many claims while a ``REPEATABLE READ``
session holds the snapshot it took before them.

"As today": Tenure's own one-queue claim statement, without the gate of paused queues
(``tenure_job_claim`` walked in order, candidates locked ``SKIP LOCKED``, the job row updated to
leased with the spec's lease, the attempt inserted).
"Lease in the attempt": the same walk of an index of waiting jobs that now also holds the leased
ones, each candidate checked against the open-attempt index (``NOT EXISTS``), the candidate
locked (``FOR UPDATE SKIP LOCKED``: a lock, no version) and its attempt inserted, its lease
read from the job's spec row, with ``ON
CONFLICT DO NOTHING`` on that unique index (so a claimer whose snapshot predates another's
claim cannot open a second attempt). Both run from one connection, one statement after
another: the figures compare the statements' own work, not contention between claimers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg

from .common import connect
from .run import server
from .sketch_lease import SKETCH_DDL, SPEC_KEY_OFFSET
from .sketch_split import EXECUTOR
from .systems import Tenure


def _tenure_claim() -> Any:
    """Tenure's own claim statements (:mod:`scheduler_core.storage.pg_statements`), Django set
    up first."""
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from scheduler_core.storage import pg_statements

    return pg_statements


def _today_sql() -> str:
    """Tenure's own one-queue claim statement (``claim_ctes``), without the gate of paused and
    limited queues (the sketch has none)."""
    pg = _tenure_claim()
    return f"WITH {pg.claim_ctes(pg.CLAIM_ONE_QUEUE, gate=False)} SELECT id, attempt_id FROM got"


def _today_params(batch: int) -> Any:
    pg = _tenure_claim()
    return pg.claim_params(
        pg.CLAIM_ONE_QUEUE, executor=EXECUTOR, queues=["default"], limit=batch, gate=False
    )


CLAIM_IN_ATTEMPT = f"""
    WITH cand AS (
        SELECT j.id, j.attempts, j.next_kind FROM sketch3_job AS j
        WHERE j.state = 'waiting' AND j.queue = 'default' AND j.run_at <= clock_timestamp()
            AND NOT EXISTS (
                SELECT 1 FROM sketch3_attempt AS a WHERE a.job_id = j.id AND a.finished_at IS NULL
            )
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE OF j SKIP LOCKED
    )
    INSERT INTO sketch3_attempt (job_id, number, fence, kind, executor, claimed_at,
        lease_expires_at, heartbeat_at, deadline_at, outcome, error_class, error_type, message,
        traceback)
    SELECT cand.id, cand.attempts + 1, cand.attempts + 1, cand.next_kind, %(executor)s,
        clock_timestamp(), clock_timestamp() + make_interval(secs => s.lease_seconds),
        clock_timestamp(), clock_timestamp() + make_interval(secs => s.timeout_seconds), '', '',
        '', '', ''
    FROM cand JOIN tenure_job_spec AS s ON s.job_id = cand.id + {SPEC_KEY_OFFSET}
    ON CONFLICT (job_id) WHERE finished_at IS NULL DO NOTHING
    RETURNING job_id, id
"""
"""The sketch's claim: the same walk, stepping over jobs with an open attempt; a lock, no
job-row version; the attempt's lease from the job's spec row, as Tenure's claim reads it."""


def _sketch_params(batch: int) -> Any:
    return {"executor": EXECUTOR, "limit": batch}


COMPLETE_TODAY = (
    """UPDATE tenure_job SET state = 'succeeded', updated_at = clock_timestamp(),
        version = version + 1, lease_owner = '', lease_expires_at = NULL, reason = '',
        next_kind = 'run', finished_at = clock_timestamp()
    WHERE id = %s AND state = 'leased'""",
    "UPDATE tenure_attempt SET outcome = 'succeeded', finished_at = clock_timestamp() "
    "WHERE id = %s AND finished_at IS NULL",
)

COMPLETE_IN_ATTEMPT = (
    """UPDATE sketch3_job SET state = 'succeeded', attempts = attempts + 1,
        updated_at = clock_timestamp(), version = version + 1, reason = '', next_kind = 'run',
        finished_at = clock_timestamp()
    WHERE id = %s AND state = 'waiting'""",
    "UPDATE sketch3_attempt SET outcome = 'succeeded', finished_at = clock_timestamp() "
    "WHERE id = %s AND finished_at IS NULL",
)

ENQUEUE = {
    "as today": """
        INSERT INTO tenure_job (name, queue, priority, run_at, state, fence, attempts,
            max_attempts, next_kind, version, created_at, updated_at, last_error, reason,
            lease_owner)
        SELECT 'bench.noop', 'default', 0, clock_timestamp(), 'waiting', 0, 0, 5, 'run', 1,
            clock_timestamp(), clock_timestamp(), '', '', '' FROM generate_series(1, %s)
        RETURNING id
    """,
    "lease in the attempt": """
        INSERT INTO sketch3_job (name, queue, priority, run_at, state, attempts,
            max_attempts, next_kind, version, created_at, updated_at, last_error, reason)
        SELECT 'bench.noop', 'default', 0, clock_timestamp(), 'waiting', 0, 5, 'run', 1,
            clock_timestamp(), clock_timestamp(), '', '' FROM generate_series(1, %s)
        RETURNING id
    """,
}

LAYOUTS: dict[str, tuple[Callable[[], str], tuple[str, str], int, Callable[[int], Any]]] = {
    "as today": (_today_sql, COMPLETE_TODAY, 0, _today_params),
    "lease in the attempt": (
        lambda: CLAIM_IN_ATTEMPT,
        COMPLETE_IN_ATTEMPT,
        SPEC_KEY_OFFSET,
        _sketch_params,
    ),
}


def _enqueue(conn: psycopg.Connection[Any], layout: str, n: int) -> None:
    """``n`` waiting jobs of the layout, each with its spec row, in one transaction."""
    offset = LAYOUTS[layout][2]
    with conn.transaction():
        ids = [r[0] for r in conn.execute(ENQUEUE[layout], [n]).fetchall()]
        conn.execute(
            "INSERT INTO tenure_job_spec (job_id, payload, effect, lease_seconds, "
            "timeout_seconds) SELECT unnest(%s::bigint[]), '{}', 'at_least_once', 30, 3600",
            [[i + offset for i in ids]],
        )


def run(
    conn: psycopg.Connection[Any], layout: str, *, claims: int, in_flight: int, batch: int = 1
) -> dict[str, float]:
    """``claims`` timed claim statements of ``layout``, each of up to ``batch`` jobs, with
    ``in_flight`` jobs leased throughout (as many completed and enqueued as each claimed);
    the statements' times in milliseconds, and their mean per job claimed."""
    sql, (complete_job, complete_attempt), _, params = LAYOUTS[layout]
    claim_sql = sql()
    leased: deque[tuple[int, int]] = deque()
    times: list[float] = []
    empty = 0
    jobs = 0
    for _ in range(claims):
        # The statement alone: its commit (a WAL flush, the same for both layouts) is not
        # timed, so the disk's flush time does not drown the statements' difference.
        with conn.transaction():
            t0 = time.perf_counter()
            got = conn.execute(claim_sql, params(batch), prepare=True).fetchall()
            times.append((time.perf_counter() - t0) * 1000)
        if not got:
            empty += 1
        jobs += len(got)
        leased.extend((int(r[0]), int(r[1])) for r in got)
        while len(leased) > in_flight:
            job_id, attempt_id = leased.popleft()
            with conn.transaction():
                conn.execute(complete_job, [job_id])
                conn.execute(complete_attempt, [attempt_id])
        _enqueue(conn, layout, max(1, len(got)))
    # Leave no job leased for the next phase.
    while leased:
        job_id, attempt_id = leased.popleft()
        with conn.transaction():
            conn.execute(complete_job, [job_id])
            conn.execute(complete_attempt, [attempt_id])
    total = sum(times)
    times.sort()
    return {
        "per_job_ms": total / jobs if jobs else float("nan"),
        "mean_ms": statistics.fmean(times),
        "p50_ms": times[len(times) // 2],
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
        "empty": float(empty),
    }


def measure(
    db: str,
    layout: str,
    *,
    backlog: int,
    claims: int,
    in_flight: int,
    batch: int,
    reset: Callable[[], None],
) -> dict[str, dict[str, float]]:
    """The layout's claim times with no snapshot held, then while one is held."""
    reset()
    out: dict[str, dict[str, float]] = {}
    shape = {"in_flight": in_flight, "batch": batch}
    with connect(db) as conn:
        conn.autocommit = True
        _enqueue(conn, layout, backlog)
        conn.execute("VACUUM ANALYZE")
        run(conn, layout, claims=200, **shape)  # warm: not counted
        out["no snapshot held"] = run(conn, layout, claims=claims, **shape)
        holder = connect(db)
        try:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM tenure_job_spec").fetchone()
            out["snapshot held"] = run(conn, layout, claims=claims, **shape)
        finally:
            holder.close()
    return out


def main() -> None:
    """Command line: both layouts' claim times, without and with a held snapshot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=3000)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1, help="jobs a claim statement may take")
    parser.add_argument(
        "--reverse", action="store_true", help="the sketch's layout first (to see order effects)"
    )
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    with server("own"):
        system = Tenure()
        system.install()
        system.reset()
        assert system.db
        db = system.db

        def reset() -> None:
            system.reset()
            with connect(db) as conn:
                conn.execute(SKETCH_DDL)

        for layout in reversed(LAYOUTS) if args.reverse else LAYOUTS:
            results[layout] = measure(
                db,
                layout,
                backlog=args.backlog,
                claims=args.claims,
                in_flight=args.in_flight,
                batch=args.batch,
                reset=reset,
            )
    print(
        f"{args.claims} claim statements a phase of up to {args.batch} jobs each, "
        f"{args.in_flight} jobs leased throughout, a backlog of {args.backlog}; one connection"
    )
    print("| layout | phase | ms per job claimed | statement mean ms | p50 | p99 | found nothing |")
    print("|---|---|---|---|---|---|---|")
    for layout, phases in results.items():
        for phase, r in phases.items():
            print(
                f"| {layout} | {phase} | {r['per_job_ms']:.3f} | {r['mean_ms']:.3f} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['empty']:.0f} |"
            )


if __name__ == "__main__":
    main()
