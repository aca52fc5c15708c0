"""How long migration 0012 (a job's spec into a row of its own) takes on a large store, forwards
and back.

``PYTHONPATH=. var/bench-venv/bin/python -m bench.migration [--jobs 1000000]`` (a few minutes;
prints a table). On a cluster of its own with production defaults, a database migrated to
0011 gets ``--jobs`` jobs in one ``INSERT ... SELECT generate_series`` (the mix of
:mod:`bench.dashboard`: most succeeded, payloads with an invoice id and a customer email),
``VACUUM ANALYZE``; then ``manage.py migrate scheduler_core 0012`` and ``manage.py migrate
scheduler_core 0011`` are timed as an operator runs them, and the job tables' sizes taken
after each. A diagnostic for docs/operations.md ("Upgrading"), not a benchmark figure.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

from .common import PYTHON, connect
from .run import server
from .systems import Tenure

OLD_JOBS_SQL = """
INSERT INTO tenure_job (name, queue, payload, priority, run_at, state, fence, lease_owner,
    attempts, max_attempts, lease_seconds, timeout_seconds, effect, next_kind, version,
    created_at, updated_at, finished_at, last_error, reason)
SELECT 'bench.kind' || (g %% 12), (ARRAY['default', 'mail', 'billing'])[1 + g %% 3],
    jsonb_build_object('n', g, 'invoice_id', g,
        'customer', jsonb_build_object('email', 'c' || (g %% 5000) || '@example.com')),
    0, now(), CASE WHEN g %% 100 < 90 THEN 'succeeded' ELSE 'waiting' END,
    CASE WHEN g %% 100 < 90 THEN 1 ELSE 0 END, '', CASE WHEN g %% 100 < 90 THEN 1 ELSE 0 END,
    5, 30, 600, 'at_least_once', 'run', 1, now(), now(),
    CASE WHEN g %% 100 < 90 THEN now() END, '', ''
FROM generate_series(1, %s) AS g
"""
"""Jobs with the columns of the schema before 0012."""

SIZE_SQL = """
    SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class AS c
    WHERE c.relname IN ('tenure_job', 'tenure_job_spec') AND c.relkind = 'r'
"""


def _timed_migrate(system: Tenure, target: str) -> tuple[float, str]:
    """``manage.py migrate scheduler_core <target>`` as an operator runs it: seconds, output."""
    t = time.perf_counter()
    done = subprocess.run(
        [PYTHON, "manage.py", "migrate", "scheduler_core", target],
        env=system.env(),
        cwd=system.root,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - t, done.stdout


def measure(jobs: int) -> dict[str, Any]:
    """Fill a 0011 store with ``jobs`` jobs; time 0012 forwards and back."""
    system = Tenure()
    system.install()
    system._run([PYTHON, "manage.py", "migrate", "scheduler_core", "0011", "-v0"])
    system.reset()
    assert system.db
    out: dict[str, Any] = {"jobs": jobs}
    with connect(system.db) as conn:
        t = time.perf_counter()
        conn.execute(OLD_JOBS_SQL, [jobs])
        conn.execute("VACUUM ANALYZE tenure_job")
        out["fill_seconds"] = time.perf_counter() - t
    for step, target in (("forwards", "0012"), ("backwards", "0011")):
        seconds, log = _timed_migrate(system, target)
        with connect(system.db) as conn:
            sizes = {str(r[0]): int(r[1]) for r in conn.execute(SIZE_SQL).fetchall()}
        out[step] = {"seconds": seconds, "sizes": sizes, "log": log}
    return out


def main() -> None:
    """Command line: measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    with server("own"):
        got = measure(args.jobs)
    print(f"{got['jobs']:,} jobs filled in {got['fill_seconds']:.1f} s")
    print("| step | seconds | tenure_job MB | tenure_job_spec MB |")
    print("|---|---|---|---|")
    for step in ("forwards", "backwards"):
        r = got[step]
        mb = {k: v / 1e6 for k, v in r["sizes"].items()}
        print(
            f"| {step} | {r['seconds']:.1f} | {mb.get('tenure_job', 0):.1f} "
            f"| {mb.get('tenure_job_spec', 0):.1f} |"
        )
    print(got["forwards"]["log"])


if __name__ == "__main__":
    main()
