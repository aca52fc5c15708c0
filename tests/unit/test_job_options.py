"""The job spec's one mapping to columns (``storage/records.py``): every field of
:class:`~scheduler_core.domain.options.JobOptions` is one column of the job row or of its spec
row, each driver's column list names every one of them, and a spec read back from its row's
values, by column name, is the spec written."""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import fields, replace

from scheduler_core.domain.options import JobOptions
from scheduler_core.models import Job, JobSpec
from scheduler_core.storage import pg_statements, sqlite_statements
from scheduler_core.storage.records import (
    JOB_OPTION_COLUMNS,
    JSON_COLUMNS,
    LEASE_COLUMNS,
    OPTION_COLUMNS,
    SPEC_COLUMNS,
    lease_from_row,
    options_from_row,
    row_values,
)

SPEC = JobOptions(
    name="tests.unit.spec",
    queue="urgent",
    max_attempts=7,
    lease_seconds=45,
    effect="idempotent",
    timeout_seconds=90.5,
    priority=12,
    run_at=dt.datetime(2026, 12, 7, 12, 30, tzinfo=dt.UTC),
    payload={"invoice": 1, "lines": [{"cents": 500}]},
    workflow_id=31,
    trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
)


def test_every_field_of_the_spec_is_one_column_of_the_job_row_or_of_its_spec_row() -> None:
    names = [f.name for f in fields(JobOptions)]
    assert sorted(OPTION_COLUMNS) == sorted(names)
    assert not set(JOB_OPTION_COLUMNS) & set(SPEC_COLUMNS)
    for c in JOB_OPTION_COLUMNS:
        assert Job._meta.get_field(c).column == c
    for c in SPEC_COLUMNS:
        assert JobSpec._meta.get_field(c).column == c
    assert set(JSON_COLUMNS) == {"payload", "trace_context"}


def test_each_drivers_statements_name_every_column_of_the_spec() -> None:
    assert set(pg_statements.PG_TYPES) == set(OPTION_COLUMNS)
    for c in OPTION_COLUMNS:
        assert c in pg_statements.INSERT_WORKFLOW_JOBS
        assert c in pg_statements.insert_job_sql(on_conflict="")
        assert c in pg_statements.insert_jobs_sql(hinted=False)
    for c in JOB_OPTION_COLUMNS:
        assert c in sqlite_statements.insert_jobs_sql(hinted=False)
    for c in SPEC_COLUMNS:
        assert c in sqlite_statements.INSERT_JOB_SPEC
    for c in LEASE_COLUMNS[:-1]:  # the attempt's id comes from the claim's second part
        assert c in sqlite_statements.claim_sql(by_id=True, nqueues=1)
        assert c in pg_statements.claim_sql(pg_statements.CLAIM_BY_ID)


def test_a_spec_read_back_from_its_columns_is_the_spec_written() -> None:
    row = row_values(SPEC)
    assert list(row) == list(OPTION_COLUMNS)
    assert options_from_row(row) == SPEC
    # As SQLite's raw statements return them: JSON and timestamps as text, in any order.
    as_text = {
        **{c: json.dumps(row[c]) for c in JSON_COLUMNS},
        "run_at": "2026-12-07 12:30:00",
        "timeout_seconds": 90.5,
    }
    texts = {**row, **as_text}
    shuffled = dict(random.sample(sorted(texts.items()), len(texts)))
    back = options_from_row(shuffled)
    assert back == SPEC and back.trace_context == SPEC.trace_context
    assert options_from_row({**row, "trace_context": None}).trace_context is None


def test_a_lease_carries_the_spec_its_claim_read() -> None:
    claimed = {
        **row_values(SPEC),
        "id": 5,
        "fence": 3,
        "attempts": 2,
        "attempt_base": 0,
        "next_kind": "run",
        "created_at": SPEC.run_at,
        "heartbeat_at": SPEC.run_at,
        "attempt_id": 9,
    }
    assert sorted(claimed) == sorted(LEASE_COLUMNS)
    lease = lease_from_row(claimed, executor="e", sent=1.0)
    assert lease.options == SPEC
    assert (lease.name, lease.queue, lease.payload, lease.priority, lease.due_at) == (
        SPEC.name,
        SPEC.queue,
        SPEC.payload,
        SPEC.priority,
        SPEC.run_at,
    )
    assert (lease.lease_seconds, lease.effect, lease.max_attempts) == (45, "idempotent", 7)
    assert (lease.timeout_seconds, lease.workflow_id, lease.trace_context) == (
        90.5,
        31,
        SPEC.trace_context,
    )
    assert (lease.job_id, lease.fence, lease.number, lease.attempt_id) == (5, 3, 2, 9)


def test_a_job_types_spec_takes_its_options_and_the_per_call_ones() -> None:
    from tests.storage import plain

    spec = plain.options(payload={"n": 1}, queue="other", priority=3)
    assert spec == replace(
        JobOptions(
            name=plain.name,
            queue=plain.queue,
            max_attempts=plain.max_attempts,
            lease_seconds=plain.lease_seconds,
            effect=plain.effect.value,
            timeout_seconds=plain.max_runtime,
        ),
        queue="other",
        priority=3,
        payload={"n": 1},
    )
    assert plain.options().queue == plain.queue
