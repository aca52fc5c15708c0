"""A design sketch, not a benchmark of Tenure: what a job would cost its tables while a snapshot
is held if a claim wrote no version of the job row — the lease (owner, expiry, renewal,
deadline) and the fence kept in the attempt row alone, so the job row is written at its enqueue
and at its end.

``PYTHONPATH=. var/bench-venv/bin/python -m bench.sketch_lease [--jobs 5000]`` (about a
minute; prints a table). On a cluster of its own with production defaults, in a database
migrated to the latest schema, the harness runs each job's enqueue, claim and completion as
single statements, one job after another, on Tenure's tables ("as today": the claim rewrites
the job row) and on sketch tables ("lease in the attempt"): a job row without the lease
columns, with Tenure's indexes, and an attempt table with Tenure's (among them, since
migration 0015, at most one open attempt per job) and one more, the open attempts by lease
expiry (the reaper's). There a
claim locks the job row (``FOR UPDATE``: a lock, not a version) and inserts the attempt; a
completion writes the job row once and closes the attempt. Each phase is measured as
:mod:`bench.versions` does (no snapshot held, then as many jobs while a ``REPEATABLE READ``
session holds the snapshot it took before them, each from tables rewritten compactly).

The soak's size verdict needs, relation by relation, held at most twice compact
(:mod:`bench.versions`): the script prints the relations over it for each layout.
"""

from __future__ import annotations

import argparse
from typing import Any

import psycopg

from .common import connect
from .run import server
from .sketch_split import EXECUTOR, _one
from .systems import Tenure
from .versions import phases, print_layouts

SKETCH_DDL = """
DROP TABLE IF EXISTS sketch3_attempt, sketch3_job CASCADE;
CREATE TABLE sketch3_job (LIKE tenure_job INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE sketch3_job DROP COLUMN lease_owner, DROP COLUMN lease_expires_at,
    DROP COLUMN heartbeat_at, DROP COLUMN deadline_at, DROP COLUMN fence;
ALTER TABLE sketch3_job ADD PRIMARY KEY (id);
CREATE INDEX sketch3_job_claim ON sketch3_job (queue, priority DESC, run_at, id)
    WHERE state = 'waiting';
CREATE INDEX sketch3_job_state ON sketch3_job (state, updated_at, id)
    WHERE state IN ('cancelled', 'failed', 'indeterminate', 'succeeded');
CREATE INDEX sketch3_job_name_state ON sketch3_job (name, state)
    WHERE state IN ('cancelled', 'failed', 'indeterminate', 'succeeded');
CREATE INDEX sketch3_job_queue_state ON sketch3_job (queue, state)
    WHERE state IN ('cancelled', 'failed', 'indeterminate', 'succeeded');
CREATE INDEX sketch3_job_retried ON sketch3_job (updated_at) WHERE state = 'waiting' AND attempts > 0;
-- With Tenure's attempt indexes, among them (since migration 0015) the unique index of the
-- open attempts, one per job, and the deadline column.
CREATE TABLE sketch3_attempt (LIKE tenure_attempt INCLUDING ALL);
CREATE INDEX sketch3_attempt_leases ON sketch3_attempt (lease_expires_at)
    WHERE finished_at IS NULL;
-- Migration 0013's autovacuum settings, as Tenure's job and attempt tables have them.
ALTER TABLE sketch3_job SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);
ALTER TABLE sketch3_attempt
    SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);
"""

SPEC_KEY_OFFSET = 1_000_000_000
"""The sketch's jobs keep spec rows in Tenure's spec table, under their ids plus this (rising,
as Tenure's own keys rise, so the spec key's pages fill as they do)."""

INSERT_JOB = """
    INSERT INTO {table} (name, queue, priority, run_at, state, {fence} attempts, max_attempts,
        next_kind, version, created_at, updated_at, last_error, reason {lease_owner})
    VALUES ('bench.noop', 'default', 0, now(), 'waiting', {fence_value} 0, 5, 'run', 1, now(),
        now(), '', '' {lease_owner_value})
    RETURNING id
"""


def cycle_today(conn: psycopg.Connection[Any], jobs: int) -> None:
    """``jobs`` no-op jobs through their lifecycle on Tenure's own tables: the claim rewrites
    the job row (state, fence, lease), the completion rewrites it again."""
    for _ in range(jobs):
        jid = _one(
            conn,
            INSERT_JOB.format(
                table="tenure_job",
                fence="fence,",
                fence_value="0,",
                lease_owner=", lease_owner",
                lease_owner_value=", ''",
            ),
            [],
        )
        conn.execute(
            "INSERT INTO tenure_job_spec (job_id, payload, effect, lease_seconds, "
            "timeout_seconds) VALUES (%s, '{}', 'at_least_once', 30, 3600)",
            [jid],
        )
        conn.execute(
            """UPDATE tenure_job SET state = 'leased', fence = fence + 1,
                attempts = attempts + 1, lease_owner = %s,
                lease_expires_at = now() + interval '30 s',
                deadline_at = now() + interval '1 hour', heartbeat_at = now(),
                updated_at = now(), version = version + 1
            WHERE id = %s""",
            [EXECUTOR, jid],
        )
        aid = _one(
            conn,
            """INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at,
                lease_expires_at, heartbeat_at, outcome, error_class, error_type, message,
                traceback)
            SELECT id, attempts, fence, next_kind, lease_owner, now(), lease_expires_at,
                heartbeat_at, '', '', '', '', '' FROM tenure_job WHERE id = %s RETURNING id""",
            [jid],
        )
        conn.execute(
            """UPDATE tenure_job SET state = 'succeeded', updated_at = now(),
                version = version + 1, lease_owner = '', lease_expires_at = NULL,
                reason = '', next_kind = 'run', finished_at = now()
            WHERE id = %s""",
            [jid],
        )
        conn.execute(
            "UPDATE tenure_attempt SET outcome = 'succeeded', finished_at = now() WHERE id = %s",
            [aid],
        )


def cycle_lease_in_attempt(conn: psycopg.Connection[Any], jobs: int) -> None:
    """``jobs`` no-op jobs through the same lifecycle with the lease in the attempt row: the
    claim locks the job row and inserts the attempt, the completion writes the job row once."""
    for _ in range(jobs):
        jid = _one(
            conn,
            INSERT_JOB.format(
                table="sketch3_job", fence="", fence_value="", lease_owner="", lease_owner_value=""
            ),
            [],
        )
        conn.execute(
            "INSERT INTO tenure_job_spec (job_id, payload, effect, lease_seconds, "
            "timeout_seconds) VALUES (%s, '{}', 'at_least_once', 30, 3600)",
            [SPEC_KEY_OFFSET + jid],
        )
        with conn.transaction():
            conn.execute(
                "SELECT id FROM sketch3_job WHERE id = %s AND state = 'waiting' FOR UPDATE", [jid]
            )
            aid = _one(
                conn,
                """INSERT INTO sketch3_attempt (job_id, number, fence, kind, executor,
                    claimed_at, lease_expires_at, heartbeat_at, deadline_at, outcome,
                    error_class, error_type, message, traceback)
                SELECT j.id, j.attempts + 1, j.attempts + 1, j.next_kind, %s, now(),
                    now() + interval '30 s', now(), now() + interval '1 hour', '', '', '', '',
                    '' FROM sketch3_job AS j WHERE j.id = %s RETURNING id""",
                [EXECUTOR, jid],
            )
        conn.execute(
            """UPDATE sketch3_job SET state = 'succeeded', attempts = attempts + 1,
                updated_at = now(), version = version + 1, reason = '', next_kind = 'run',
                finished_at = now()
            WHERE id = %s""",
            [jid],
        )
        conn.execute(
            "UPDATE sketch3_attempt SET outcome = 'succeeded', finished_at = now() WHERE id = %s",
            [aid],
        )


def main() -> None:
    """Command line: both layouts, per relation and in total, and the relations over 2x."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()
    with server("own"):
        system = Tenure()
        system.install()
        system.reset()
        assert system.db
        with connect(system.db) as conn:
            conn.execute(SKETCH_DDL)
        with connect(system.db) as conn:
            layouts = {
                "as today": phases(
                    system.db,
                    args.jobs,
                    ["tenure_job", "tenure_job_spec", "tenure_attempt"],
                    "^tenure_(job|attempt)",
                    lambda n: cycle_today(conn, n),
                )[0],
            }
            system.reset()
            layouts["lease in the attempt"] = phases(
                system.db,
                args.jobs,
                ["sketch3_job", "tenure_job_spec", "sketch3_attempt"],
                "^(sketch3_|tenure_job_spec)",
                lambda n: cycle_lease_in_attempt(conn, n),
            )[0]
    print_layouts(layouts)


if __name__ == "__main__":
    main()
