"""The job and attempt tables carry only the indexes their queries need, and the unique key
and the schedule are indexed only where set: every claim and completion writes a new row
version, and each version costs an entry in every index it appears in — none of which a
vacuum can remove while an old snapshot is held (docs/operations.md, "A long transaction")."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, models, transaction

from scheduler_core import job
from scheduler_core.models import Job, Schedule

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.indexentries.ok", queue="indexentries")
def ok(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _indexes(table: str) -> dict[str, list[str]]:
    with connection.cursor() as cur:
        found = connection.introspection.get_constraints(cur, table)
    return {
        name: list(c["columns"])
        for name, c in found.items()
        if c["index"] or c["unique"] or c["primary_key"]
    }


def test_the_job_and_attempt_tables_carry_only_their_listed_indexes() -> None:
    # A new index here costs every job three more entries (its insert, claim and completion
    # versions): add it to this list with the query that needs it.
    job_indexes = {
        "tenure_job_claim",
        "tenure_job_leases",
        # A limited queue's count of its leased jobs (storage/queues.py): leased rows only,
        # so an entry for each claim and renewal, none for the enqueue or the end (0016).
        "tenure_job_queue_leased",
        "tenure_job_state",
        "tenure_job_name_state",
        "tenure_job_queue_state",
        "tenure_job_schedule",
        "tenure_job_unique_key",
    }
    if connection.vendor == "postgresql":
        # The retried index holds waiting jobs claimed before: a new job's versions and a
        # claim's add it no entry (0011).
        job_indexes |= {"tenure_job_retried"}
    got = {n for n in _indexes("tenure_job") if not n.endswith("_pkey") and n != "__primary__"}
    assert got == job_indexes
    # The spec row is written once; its payload index (PostgreSQL's payload search) has one
    # entry set per job, not one per job version (0012).
    spec = {n for n in _indexes("tenure_job_spec") if not n.endswith("_pkey")}
    assert spec - {"__primary__"} == (
        {"tenure_job_spec_payload"} if connection.vendor == "postgresql" else set()
    )
    attempt = {n for n in _indexes("tenure_attempt") if not n.endswith("_pkey")}
    # No index reads ``finished_at``: an attempt's end writes no entry on PostgreSQL (a
    # heap-only update); "one active attempt" is the key of ``tenure_open_attempt`` (0017).
    assert attempt - {"__primary__"} == {"tenure_attempt_job_fence"}


def _index_tuples() -> dict[str, float]:
    """Entries in each index of the job table, as ``ANALYZE`` counts them."""
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
        cur.execute(
            "SELECT indexrelid::regclass::text, reltuples FROM pg_index "
            "JOIN pg_class ON pg_class.oid = pg_index.indexrelid "
            "WHERE indrelid = 'tenure_job'::regclass"
        )
        return dict(cur.fetchall())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's index statistics")
def test_jobs_without_a_key_or_a_schedule_add_no_entry_to_those_indexes() -> None:
    ok.enqueue_many([{"n": i} for i in range(50)])
    ok.enqueue(n=99, unique_key="indexentries-99")
    tuples = _index_tuples()
    assert tuples["tenure_job_unique_key"] == 1
    assert tuples["tenure_job_schedule"] == 0
    assert tuples["tenure_job_pkey"] == 51


def test_a_key_is_still_held_by_one_job_only() -> None:
    first = ok.enqueue(n=1, unique_key="indexentries-once")
    again = ok.enqueue(n=2, unique_key="indexentries-once")
    assert again.pk == first.pk
    assert Job.objects.filter(unique_key="indexentries-once").count() == 1
    # The database refuses a second row with the key whatever writes it.
    row = Job.objects.get(pk=first.pk)
    row.pk = None
    with pytest.raises(IntegrityError), transaction.atomic():
        models.Model.save(row, force_insert=True)  # past Job.save()'s refusal, as by hand
    # Jobs without a key are many.
    ok.enqueue(n=3)
    ok.enqueue(n=4)
    assert Job.objects.filter(unique_key__isnull=True, queue="indexentries").count() == 2


def test_deleting_a_schedule_still_detaches_its_jobs() -> None:
    sched = Schedule.objects.create(
        name="indexentries-every-minute",
        job_name=ok.name,
        cron="* * * * *",
    )
    j = ok.enqueue(n=5)
    Job.objects.filter(pk=j.pk).update(schedule=sched)
    sched.delete()
    assert Job.objects.get(pk=j.pk).schedule_id is None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's index statistics")
def test_the_state_name_and_queue_indexes_hold_only_jobs_at_rest() -> None:
    """A waiting or leased row is in the claim or the leases index only: each claim and
    completion leaves such a version behind, and those versions cost these indexes nothing."""
    from scheduler_core.storage.drivers import driver

    ok.enqueue_many([{"n": i} for i in range(60)])
    leases = driver().claim(executor="t:1:entries", queues=["indexentries"], limit=30)
    for lease in leases[:10]:
        driver().complete(lease)
    tuples = _index_tuples()
    assert tuples["tenure_job_claim"] == 30
    assert tuples["tenure_job_leases"] == 20
    assert tuples["tenure_job_queue_leased"] == 20
    for name in ("tenure_job_state", "tenure_job_name_state", "tenure_job_queue_state"):
        assert tuples[name] == 10, name
    assert tuples["tenure_job_retried"] == 0
    # Back to waiting after an attempt: in the retried index (the history rollup's read).
    driver().release_unstarted(leases[10], why="test")
    assert _index_tuples()["tenure_job_retried"] == 1


def _spec_versions(ids: list[int]) -> dict[int, tuple[str, str]]:
    """Each spec row's physical address and writing transaction: a new version changes both."""
    marks = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT job_id, ctid::text, xmin::text FROM tenure_job_spec WHERE job_id IN ({marks})",
            ids,
        )
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row versions")
def test_claims_completions_and_retries_never_write_the_spec_row() -> None:
    """What a job was accepted as is written once: the versions a claim, a completion and a
    release write are of the job row only (the spec's address and writer stay)."""
    from scheduler_core.storage.drivers import driver

    ids = ok.enqueue_many([{"n": i} for i in range(6)])
    before = _spec_versions(ids)
    assert set(before) == set(ids)
    leases = driver().claim(executor="t:1:entries", queues=["indexentries"], limit=6)
    assert {lease.payload["n"] for lease in leases} == set(range(6))
    for lease in leases[:3]:
        driver().complete(lease)
    driver().release_unstarted(leases[3], why="test")
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == 3
    assert _spec_versions(ids) == before


def test_in_states_finds_every_job_in_the_states_asked_for() -> None:
    """The filter that reads each state through its own index matches what a plain ``IN``
    matches, for any mix of moving and resting states."""
    from scheduler_core.models import in_states
    from scheduler_core.storage.drivers import driver

    ok.enqueue_many([{"n": i} for i in range(12)])
    leases = driver().claim(executor="t:1:entries", queues=["indexentries"], limit=8)
    for lease in leases[:3]:
        driver().complete(lease)
    for wanted in (
        ["waiting"],
        ["leased", "succeeded"],
        ["waiting", "leased", "failed", "indeterminate"],
        ["succeeded", "cancelled"],
        [],
    ):
        got = set(Job.objects.filter(in_states(wanted)).values_list("pk", flat=True))
        want = set(Job.objects.filter(state__in=wanted).values_list("pk", flat=True))
        assert got == want, wanted


def test_migration_0016_indexes_the_leased_jobs_by_queue_and_its_reverse_drops_the_index() -> None:
    from scheduler_core.storage.drivers import driver

    from .migrating import latest_after, migrate

    ok.enqueue_many([{"n": i} for i in range(5)])
    # Claimed on today's schema (today's claim reads columns later migrations add), then
    # taken back to 0015 with two jobs leased.
    driver().claim(executor="t:1:entries", queues=["indexentries"], limit=2)
    with latest_after():
        migrate([("scheduler_core", "0015_one_open_attempt")])
        assert "tenure_job_queue_leased" not in _indexes("tenure_job")
        migrate([("scheduler_core", "0016_queue_leased_index")])
        assert _indexes("tenure_job")["tenure_job_queue_leased"] == ["queue"]
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                assert _index_tuples()["tenure_job_queue_leased"] == 2
            else:
                cur.execute(
                    "SELECT count(*) FROM tenure_job INDEXED BY tenure_job_queue_leased "
                    "WHERE queue = 'indexentries' AND state = 'leased'"
                )
                assert cur.fetchone()[0] == 2
        migrate([("scheduler_core", "0015_one_open_attempt")])
        assert "tenure_job_queue_leased" not in _indexes("tenure_job")
    assert "tenure_job_queue_leased" in _indexes("tenure_job")
