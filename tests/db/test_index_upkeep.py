"""Index upkeep (:mod:`scheduler_core.services.indexes`): an index vacuum has emptied is rebuilt
to the size its entries need, a compact one never is; nothing is rebuilt while an old snapshot
is held or another process holds the upkeep; the invalid copy a failed rebuild leaves is
dropped; ``run_scheduler`` looks in a thread of its own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection

from scheduler_core import job
from scheduler_core.read import health
from scheduler_core.services import indexes
from scheduler_core.storage.drivers import driver
from tests import conftest

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's indexes keep the pages vacuum empties"
)


@job(name="tests.upkeep.noop", queue="upkeep")
def noop(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


@pytest.fixture(autouse=True)
def _forget_rebuilds() -> Iterator[None]:
    indexes._after_rebuild.clear()
    yield
    indexes._after_rebuild.clear()


def _sql(statement: str) -> None:
    with connection.cursor() as cur:
        cur.execute(statement)


def _size(index: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_relation_size(to_regclass(%s))", [index])
        return int(cur.fetchone()[0])


def _claim_index_emptied(jobs: int = 60_000) -> int:
    """Fill the claim index with waiting jobs, move them all to rest and vacuum: the index's
    pages are empty and still its own, as after a burst or a held snapshot. Its size."""
    noop.enqueue_many([{"n": i} for i in range(jobs)])
    _sql("UPDATE tenure_job SET state = 'cancelled'")
    _sql("VACUUM ANALYZE tenure_job")
    return _size("tenure_job_claim")


@postgres_only
def test_an_index_vacuum_emptied_is_rebuilt_to_what_its_entries_need() -> None:
    before = _claim_index_emptied()
    assert before > 2 * indexes.REBUILD_MIN_BYTES

    report = indexes.upkeep_once()

    rebuilt = {name: (b, a) for name, b, a in report.rebuilt}
    assert rebuilt["tenure_job_claim"][0] == before
    assert _size("tenure_job_claim") == rebuilt["tenure_job_claim"][1] < 64 * 1024
    # The resting indexes were written once per job: compact, left alone.
    assert "tenure_job_state" not in rebuilt
    # Nothing is left to do, and the claim still works through the new index.
    assert indexes.upkeep_once().rebuilt == []
    handle = noop.enqueue(n=-1)
    [lease] = driver().claim(executor="t:1:upkeep", queues=["upkeep"], limit=1)
    assert lease.job_id == handle.id


def _metric(text: str, name: str, index: str) -> float | None:
    """The value of ``name`` for ``index`` in a ``/metrics`` page (None when absent)."""
    for line in text.splitlines():
        if line.startswith(f'{name}{{index="{index}",'):
            return float(line.rsplit(" ", 1)[1])
    return None


@postgres_only
def test_metrics_show_each_index_beside_what_its_entries_need(admin_client: Any) -> None:
    before = _claim_index_emptied()
    text = admin_client.get("/metrics").content.decode()
    assert _metric(text, "tenure_db_index_bytes", "tenure_job_claim") == before
    need = _metric(text, "tenure_db_index_needed_bytes", "tenure_job_claim")
    assert need is not None and need < before / indexes.REBUILD_RATIO  # what upkeep rebuilds
    indexes.upkeep_once()
    text = admin_client.get("/metrics").content.decode()
    assert _metric(text, "tenure_db_index_bytes", "tenure_job_claim") == _size("tenure_job_claim")
    assert _size("tenure_job_claim") < before


@postgres_only
def test_compact_indexes_are_left_alone() -> None:
    # Every state a job rests or works in, entries written once each, statistics fresh: the
    # estimate of each index's need must not put it below what the index really takes.
    noop.enqueue_many([{"n": i} for i in range(20_000)])
    d = driver()
    for _ in range(20):
        leases = d.claim(executor="t:1:upkeep", queues=["upkeep"], limit=200)
        for lease in leases[:150]:
            with d.atomic():
                d.complete(lease)
    _sql("VACUUM FULL tenure_job")
    _sql("VACUUM FULL tenure_attempt")
    _sql("ANALYZE")
    sizes = d.index_sizes(health.tenure_tables())
    assert {ix.name for ix in sizes} >= {"tenure_job_claim", "tenure_job_pkey", "tenure_job_state"}
    assert all(ix.needed_bytes is not None for ix in sizes if ix.table == "tenure_job")
    big = [ix for ix in sizes if ix.bytes >= 256 * 1024]
    assert {ix.name for ix in big} >= {"tenure_job_claim", "tenure_job_pkey"}
    for ix in big:
        assert ix.needed_bytes is not None
        assert abs(ix.needed_bytes - ix.bytes) < 0.05 * ix.bytes, ix
    assert indexes.to_rebuild(sizes) == []
    assert indexes.upkeep_once().rebuilt == []


@postgres_only
def test_nothing_is_rebuilt_while_an_old_snapshot_is_held() -> None:
    before = _claim_index_emptied()
    with psycopg.connect(conftest.test_database_url(), application_name="a report") as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM tenure_job").fetchone()
        time.sleep(1.2)
        report = indexes.upkeep_once(snapshot_limit=1.0)
        assert report.rebuilt == []
        assert "a snapshot has been held" in report.postponed
        assert "a report" in report.postponed
        assert _size("tenure_job_claim") == before
        reader.rollback()
    assert [r[0] for r in indexes.upkeep_once(snapshot_limit=1.0).rebuilt][:1] == [
        "tenure_job_claim"
    ]


@postgres_only
def test_one_process_keeps_the_indexes_at_a_time() -> None:
    before = _claim_index_emptied()
    with psycopg.connect(conftest.test_database_url(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('tenure: index upkeep'))")
        report = indexes.upkeep_once()
        assert report.rebuilt == [] and "lock" in report.postponed
        assert _size("tenure_job_claim") == before
    # The lock went with the other session: the next look rebuilds.
    assert indexes.upkeep_once().rebuilt


@postgres_only
def test_the_invalid_copy_a_failed_rebuild_left_is_dropped_and_valid_indexes_are_kept() -> None:
    noop.enqueue_many([{}, {}])
    # A unique index over duplicates fails after its entry in the catalogue was made: what a
    # rebuild that failed (a lock timeout, a cancel) leaves, under a rebuild's name.
    with pytest.raises(Exception, match="could not create unique index"):
        _sql("CREATE UNIQUE INDEX CONCURRENTLY tenure_job_claim_ccnew ON tenure_job (queue)")
    _sql("CREATE INDEX CONCURRENTLY tenure_job_kept_ccnew ON tenure_job (priority)")
    try:
        assert _size("tenure_job_claim_ccnew") >= 0
        report = indexes.upkeep_once()
        assert report.dropped == ["tenure_job_claim_ccnew"]
        with connection.cursor() as cur:
            cur.execute(
                "SELECT to_regclass('tenure_job_claim_ccnew'), to_regclass('tenure_job_kept_ccnew')"
            )
            gone, kept = cur.fetchone()
        assert gone is None and kept is not None
    finally:
        _sql("DROP INDEX IF EXISTS tenure_job_claim_ccnew")
        _sql("DROP INDEX IF EXISTS tenure_job_kept_ccnew")


@postgres_only
def test_the_scheduler_looks_in_a_thread_of_its_own_one_interval_after_it_starts() -> None:
    before = _claim_index_emptied()
    upkeep = indexes.IndexUpkeep(every=0.3)
    assert upkeep.poll() is False  # not before the first interval
    time.sleep(0.35)
    assert upkeep.poll() is True
    assert upkeep.poll() is False  # one look at a time, the next an interval later
    upkeep.join(60)
    assert _size("tenure_job_claim") < before


def test_no_upkeep_where_the_database_reuses_pages_itself() -> None:
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's case")
    noop.enqueue_many([{}])
    report = indexes.upkeep_once()
    assert report == indexes.UpkeepReport()
    assert health.index_sizes() == []


def test_sqlite_metrics_show_no_index_sizes(admin_client: Any) -> None:
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's case")
    text = admin_client.get("/metrics").content.decode()
    assert "tenure_db_up 1.0" in text and "tenure_db_index_bytes" not in text


@postgres_only
def test_a_scheduler_that_does_not_own_the_tables_says_so_and_stops_looking(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _claim_index_emptied()
    _sql("DROP ROLE IF EXISTS tenure_upkeep_tenant")
    _sql("CREATE ROLE tenure_upkeep_tenant NOLOGIN")
    _sql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO tenure_upkeep_tenant")
    real = indexes.upkeep_once

    def as_tenant(**kw: Any) -> indexes.UpkeepReport:
        # The look runs as a role that may read the tables but owns none of them.
        _sql("SET ROLE tenure_upkeep_tenant")
        try:
            return real(**kw)
        finally:
            _sql("RESET ROLE")

    monkeypatch.setattr(indexes, "upkeep_once", as_tenant)
    upkeep = indexes.IndexUpkeep(every=0.01)
    time.sleep(0.02)
    try:
        with caplog.at_level("WARNING", logger="tenure.indexes"):
            assert upkeep.poll() is True
            upkeep.join(60)
    finally:
        _sql("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM tenure_upkeep_tenant")
        _sql("DROP ROLE tenure_upkeep_tenant")
    assert "must be owner" in caplog.text, caplog.text
    assert "TENURE_INDEX_UPKEEP_SECONDS = 0" in caplog.text
    assert _size("tenure_job_claim") == before
    assert upkeep.every == 0
    time.sleep(0.02)
    assert upkeep.poll() is False


@postgres_only
def test_a_rebuild_that_times_out_leaves_a_copy_the_next_look_drops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _claim_index_emptied()
    with psycopg.connect(conftest.test_database_url()) as writer:
        # A write in flight: the rebuild waits for it to end, past its lock_timeout.
        writer.execute(
            "UPDATE tenure_job SET priority = priority WHERE id = (SELECT min(id) FROM tenure_job)"
        )
        _sql("SET lock_timeout = '300ms'")
        try:
            with (
                caplog.at_level("WARNING", logger="tenure.indexes"),
                pytest.raises(DatabaseError, match="lock timeout"),
            ):
                indexes.upkeep_once()
        finally:
            _sql("RESET lock_timeout")
        assert "rebuilding tenure_job_claim failed" in caplog.text
        # Dropping the copy waited for the same write: it stays, invalid, until the next look.
        assert "unfinished copy stays" in caplog.text
        with connection.cursor() as cur:
            cur.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('tenure_job_claim_ccnew')"
            )
            assert cur.fetchone() == (False,)
        writer.rollback()
    report = indexes.upkeep_once()
    assert report.dropped == ["tenure_job_claim_ccnew"]
    assert "tenure_job_claim" in [name for name, _, _ in report.rebuilt]
    assert _size("tenure_job_claim") < before


@postgres_only
def test_an_index_filled_in_random_key_order_is_left_alone() -> None:
    # Keys arriving out of order split pages in the middle, which end part full: bigger than a
    # fresh build, but not by the 1.5 times that makes an index worth rebuilding.
    _sql("DROP TABLE IF EXISTS upkeep_random")
    _sql("CREATE TABLE upkeep_random (key text PRIMARY KEY)")
    try:
        _sql("INSERT INTO upkeep_random SELECT md5(random()::text) FROM generate_series(1, 50000)")
        _sql("ANALYZE upkeep_random")
        [ix] = driver().index_sizes(["upkeep_random"])
        assert indexes.to_rebuild([ix]) == []
        _sql("REINDEX INDEX upkeep_random_pkey")
        fresh = _size("upkeep_random_pkey")
        assert 1.1 * fresh < ix.bytes < indexes.REBUILD_RATIO * fresh
    finally:
        _sql("DROP TABLE IF EXISTS upkeep_random")


@postgres_only
def test_a_look_after_a_held_snapshot_rebuilds_what_it_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An index 1.1 to 1.5 times its need is left alone by an ordinary look (random key order
    # leaves it so, and would again), but the look after a held snapshot takes it back to its
    # need: a snapshot's entries sit where the ordinary run does not write again. The scheduler
    # samples between looks, so a snapshot that ended before the look still counts, once.
    _sql("DROP TABLE IF EXISTS upkeep_random")
    _sql("CREATE TABLE upkeep_random (key text PRIMARY KEY)")
    try:
        _sql("INSERT INTO upkeep_random SELECT md5(random()::text) FROM generate_series(1, 100000)")
        _sql("ANALYZE upkeep_random")
        monkeypatch.setattr(health, "tenure_tables", lambda: ["upkeep_random"])
        monkeypatch.setattr(indexes, "SNAPSHOT_LIMIT_SECONDS", 1.0)
        [ix] = driver().index_sizes(["upkeep_random"])
        assert ix.needed_bytes is not None
        assert indexes.REBUILD_RATIO_AFTER_HOLD * ix.needed_bytes < ix.bytes
        assert indexes.upkeep_once().rebuilt == []

        keeper = indexes.IndexUpkeep(every=3600, sample_every=0, settle=3.0)
        keeper.sample()
        assert keeper.held_at is None
        with psycopg.connect(conftest.test_database_url(), application_name="a report") as r:
            r.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            r.execute("SELECT count(*) FROM upkeep_random").fetchone()
            time.sleep(1.2)
            keeper.sample()
            r.rollback()
        seen = keeper.held_at
        assert seen is not None

        def look() -> indexes.UpkeepReport:
            keeper._next_at = 0
            assert keeper.poll()
            keeper.join(120)
            assert keeper.last is not None
            return keeper.last

        # Right after the snapshot ends vacuum has not yet caught up: an ordinary look.
        first = look()
        assert not first.after_hold and first.rebuilt == []
        assert keeper.held_at == seen
        time.sleep(max(0.0, seen + 3.0 - time.monotonic()))
        second = look()
        assert second.after_hold
        assert [name for name, _, _ in second.rebuilt] == ["upkeep_random_pkey"]
        assert _size("upkeep_random_pkey") < ix.bytes / indexes.REBUILD_RATIO_AFTER_HOLD
        assert keeper.held_at is None
        third = look()
        assert not third.after_hold and third.rebuilt == []
    finally:
        _sql("DROP TABLE IF EXISTS upkeep_random")


@postgres_only
def test_the_look_after_a_hold_counts_the_rows_the_statistics_overstate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The statistics' count is what the last vacuum or analyse saw or extrapolated; here half
    # the rows went after it, so the index is twice what its entries need while the estimate
    # says it is compact. The look after a hold (1.1 times the need) counts the rows.
    _sql("DROP TABLE IF EXISTS upkeep_counted")
    _sql("CREATE TABLE upkeep_counted (id bigint PRIMARY KEY)")
    try:
        _sql("INSERT INTO upkeep_counted SELECT g FROM generate_series(1, 200000) AS g")
        _sql("ANALYZE upkeep_counted")
        _sql("DELETE FROM upkeep_counted WHERE id % 2 = 0")
        monkeypatch.setattr(health, "tenure_tables", lambda: ["upkeep_counted"])
        [estimated] = driver().index_sizes(["upkeep_counted"])
        assert (estimated.entries, estimated.counted) == (200_000, False)
        assert estimated.needed_bytes is not None
        assert estimated.bytes < indexes.REBUILD_RATIO_AFTER_HOLD * estimated.needed_bytes
        [counted] = driver().index_sizes(["upkeep_counted"], counted=True)
        assert (counted.entries, counted.counted) == (100_000, True)

        assert indexes.upkeep_once().rebuilt == []
        report = indexes.upkeep_once(after_hold=True)

        assert [name for name, _, _ in report.rebuilt] == ["upkeep_counted_pkey"]
        assert _size("upkeep_counted_pkey") < 0.6 * estimated.bytes
    finally:
        _sql("DROP TABLE IF EXISTS upkeep_counted")


def test_a_failed_look_is_tried_again_soon_not_an_interval_later(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A look that failed (in a soak hour, the look after the held snapshot, on a lock an
    autovacuum held) is tried again :data:`~indexes.RETRY_SECONDS` later, doubling while it
    fails, and the next interval starts over once one succeeds; it waited the whole interval,
    which left the snapshot's room in place ten more minutes."""
    outcome: list[str] = ["fail"]

    def look(**kw: Any) -> indexes.UpkeepReport:
        if outcome[0] == "fail":
            raise DatabaseError("canceling statement due to lock timeout")
        return indexes.UpkeepReport()

    monkeypatch.setattr(indexes, "upkeep_once", look)
    monkeypatch.setattr(indexes, "RETRY_SECONDS", 1.0)
    upkeep = indexes.IndexUpkeep(every=3600, sample_every=3600)
    upkeep._next_at = time.monotonic()  # the first look is due
    with caplog.at_level("WARNING", logger="tenure.indexes"):
        for wait in (1.0, 2.0):
            assert upkeep.poll() is True
            upkeep.join(10)
            assert f"next look in {wait:.0f} s" in caplog.text
            assert upkeep.poll() is False
            time.sleep(wait + 0.1)
    assert upkeep.failures == 2
    outcome[0] = "succeed"
    assert upkeep.poll() is True
    upkeep.join(10)
    assert upkeep.failures == 0
    assert upkeep.poll() is False
    assert upkeep._next_at - time.monotonic() > 3000
