"""Migration 0012 moves what a job was accepted as (payload, effect mode, lease length, maximum
runtime) into ``tenure_job_spec`` with every job's values, and back again when reversed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from scheduler_core import job
from scheduler_core.models import Job
from scheduler_core.storage.drivers import driver

from .migrating import latest_after, migrate, migrate_latest

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("scheduler_core", "0011_retried_index")]
AFTER = [("scheduler_core", "0012_job_spec")]

OLD = [
    ({"invoice_id": 1, "note": "é"}, "idempotent", 45, 120.5),
    ({}, "at_least_once", 30, 600.0),
    ({"nested": {"a": [1, 2]}}, "reconcilable", 7, 3.25),
]


@job(name="tests.specmigration.item", queue="specmigration")
def item(ctx: Any, **kwargs: Any) -> None:
    """Nothing."""


@pytest.fixture
def at_0011() -> Iterator[None]:
    """The schema as migration 0011 left it, for the test; the latest one again after."""
    with latest_after():
        migrate(BEFORE)
        yield


def _insert_old_jobs() -> list[int]:
    """Jobs as the schema before 0012 held them, written with its columns."""
    ids = []
    with connection.cursor() as cur:
        for payload, effect, lease, timeout in OLD:
            cur.execute(
                "INSERT INTO tenure_job (name, queue, payload, priority, run_at, state, fence, "
                "lease_owner, attempts, max_attempts, lease_seconds, timeout_seconds, effect, "
                "next_kind, version, created_at, updated_at, last_error, reason) "
                "VALUES (%s, 'specmigration', %s, 0, %s, 'waiting', 0, '', 0, 5, %s, %s, %s, "
                "'run', 1, %s, %s, '', '') RETURNING id",
                [
                    item.name,
                    json.dumps(payload),
                    driver().now(),
                    lease,
                    timeout,
                    effect,
                    driver().now(),
                    driver().now(),
                ],
            )
            ids.append(cur.fetchone()[0])
    return ids


def test_0012_copies_every_jobs_spec_and_0011_takes_it_back(at_0011: None) -> None:
    ids = _insert_old_jobs()
    migrate(AFTER)
    got = {
        j.pk: (j.payload, j.effect, j.lease_seconds, j.timeout_seconds)
        # The spec as 0012 made it: columns later migrations add are left out.
        for j in Job.objects.select_related("spec")
        .defer("attempt_base", "spec__workflow_id", "spec__trace_context")
        .filter(pk__in=ids)
    }
    assert got == dict(zip(ids, OLD, strict=True))
    # A job migrated is claimed with its own lease length and payload (by today's claim, on
    # today's schema).
    migrate_latest()
    leases = driver().claim(executor="t:1:specmig", queues=["specmigration"], limit=3)
    assert {(lease.job_id, lease.lease_seconds, lease.effect) for lease in leases} == {
        (i, lease, effect) for i, (_, effect, lease, _) in zip(ids, OLD, strict=True)
    }
    assert {lease.job_id: lease.payload for lease in leases} == {
        i: payload for i, (payload, *_) in zip(ids, OLD, strict=True)
    }

    migrate(BEFORE)
    marks = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, payload, effect, lease_seconds, timeout_seconds FROM tenure_job "
            f"WHERE id IN ({marks})",
            ids,
        )
        rows = cur.fetchall()
    back = {
        r[0]: (json.loads(r[1]) if isinstance(r[1], str) else r[1], r[2], r[3], r[4]) for r in rows
    }
    assert back == dict(zip(ids, OLD, strict=True))
    assert "tenure_job_spec" not in connection.introspection.table_names()
