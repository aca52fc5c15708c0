"""Table compaction (:mod:`scheduler_core.services.tables`): a table vacuum left full of holes
gives its emptied pages back, every row's values unchanged; a table in steady use is left
alone; rows a write holds are skipped, not waited for, and the attempt that holds one finishes
as if nothing happened; nothing is compacted while an old snapshot is held."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from scheduler_core import job
from scheduler_core.models import Job
from scheduler_core.services import indexes, tables
from scheduler_core.storage.drivers import driver
from tests import conftest

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's vacuum gives back only a table's end"
)


@job(name="tests.compaction.noop", queue="compaction")
def noop(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _sql(statement: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchone() if cur.description else None


def _bytes(table: str = "tenure_job") -> int:
    return int(_sql("SELECT pg_relation_size(to_regclass(%s))", [table])[0])


def _index_bytes(table: str = "tenure_job") -> dict[str, int]:
    """Each index of ``table`` and its size."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            "WHERE indrelid = to_regclass(%s)",
            [table],
        )
        return {str(name): int(size) for name, size in cur.fetchall()}


def _fingerprint() -> tuple[int, str]:
    """Every job row's every value, in key order."""
    n, digest = _sql(
        "SELECT count(*), md5(string_agg(x::text, '|' ORDER BY x.id)) FROM tenure_job AS x"
    )
    return int(n), str(digest)


def _holes(jobs: int = 50_000) -> int:
    """Jobs whose rows were written three times, the first two versions vacuumed away: the
    table's first two thirds are holes, its rows in the last third, as a long snapshot leaves
    a table once vacuum has freed what it held. The table's size."""
    noop.enqueue_many([{"n": i} for i in range(jobs)])
    _sql("UPDATE tenure_job SET state = 'cancelled', finished_at = now()")
    _sql("UPDATE tenure_job SET reason = 'held back'")
    _sql("VACUUM ANALYZE tenure_job")
    return _bytes()


@postgres_only
def test_a_table_full_of_holes_gives_its_pages_back_every_value_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _holes()
    rows_before = _fingerprint()
    use = driver().page_use("tenure_job")
    assert use is not None and sum(use.rows) == 50_000
    assert before > 2.5 * use.needed_bytes  # two versions in three are holes

    # A table of 26 MB, where production's would be hundreds: the rebuild's floor to its scale.
    monkeypatch.setattr(indexes, "REBUILD_MIN_BYTES", 256 << 10)
    sizes_before = _index_bytes()
    report = indexes.upkeep_once()

    [done] = [c for c in report.compacted if c.table == "tenure_job"]
    assert done.bytes_before == before
    assert done.rows_moved > 0 and done.rows_left == 0
    assert _bytes() == done.bytes_after <= 1.05 * use.needed_bytes
    assert _fingerprint() == rows_before
    # The rows moved wrote every index again: the same look rebuilt each that holds
    # REBUILD_MIN_BYTES, so none is left above what a fresh build of it takes — the indexes of
    # many equal keys too, whose need the estimate puts above the truth (name and queue: about
    # 2.5 MB against 0.4), so no ratio of it would pick them.
    after = _index_bytes()
    assert {name for name, _, _ in report.rebuilt} == {
        name for name, size in sizes_before.items() if size >= indexes.REBUILD_MIN_BYTES
    } | {"tenure_job_name_state", "tenure_job_queue_state"}
    _sql("REINDEX TABLE tenure_job")
    fresh = _index_bytes()
    for name, size in after.items():
        assert size <= max(1.05 * fresh[name], fresh[name] + 16_384), (name, size, fresh[name])
    # Nothing is left to do, and the moved rows are found through every index.
    assert [c.table for c in indexes.upkeep_once().compacted] == []
    assert Job.objects.filter(state="cancelled", queue="compaction").count() == 50_000


def _through(jobs: int, *, batch: int = 50) -> None:
    """``jobs`` jobs enqueued, claimed and finished ``batch`` at a time, each batch's rows
    written as a claim and a completion write them, while the next batches are enqueued."""
    for k in range(0, jobs + 2 * batch, batch):
        if k < jobs:
            noop.enqueue_many([{"n": k + i} for i in range(batch)])
        _sql(
            "UPDATE tenure_job SET state = 'succeeded', lease_owner = '', lease_expires_at = "
            "NULL, finished_at = now(), updated_at = now() WHERE state = 'leased'"
        )
        _sql(
            "UPDATE tenure_job SET state = 'leased', fence = fence + 1, lease_owner = "
            "'host:1:0123456789ab', lease_expires_at = now(), heartbeat_at = now(), attempts = 1,"
            " updated_at = now() WHERE id IN (SELECT id FROM tenure_job WHERE state = 'waiting' "
            "ORDER BY id LIMIT %s)",
            [batch],
        )
        if k % 5_000 == 0:
            _sql("VACUUM tenure_job")


@postgres_only
def test_the_holes_a_held_snapshot_leaves_at_the_end_take_the_rows_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As in the soak: jobs with vacuum keeping up, then as many while a snapshot is held (every
    # version of theirs stays, on pages added at the end), then half as many once it ends. The
    # holes are in the table's last part, among the rows: the cut must leave room for the rows
    # past it in the holes before it, or they would be written past the end.
    _through(25_000)
    with psycopg.connect(conftest.test_database_url()) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM tenure_job").fetchone()
        _through(25_000)
        reader.rollback()
    _sql("VACUUM tenure_job")
    _through(12_500)
    _sql("VACUUM ANALYZE tenure_job")
    before = _bytes()
    rows_before = _fingerprint()
    # A table of 18 MB, where production's would be hundreds: thresholds to its scale.
    monkeypatch.setattr(tables, "COMPACT_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(tables, "ROOM_RESERVE_ROWS", 500)
    d = driver()
    use = d.page_use("tenure_job")
    assert use is not None
    cut = tables.cut_page(use)
    assert cut is not None

    [done] = tables.compact(d, ["tenure_job"])

    assert not done.no_room and done.rows_left == 0
    assert _bytes() == done.bytes_after <= (cut + 1) * use.page_bytes
    assert done.bytes_after <= before * (1 / tables.COMPACT_RATIO)
    assert _fingerprint() == rows_before


@postgres_only
def test_a_table_in_steady_use_is_left_alone() -> None:
    # Jobs enqueued, claimed and finished as executors do, vacuum keeping up: whatever room the
    # tables keep is far from what compaction is for, and no table is measured as worth it.
    noop.enqueue_many([{"n": i} for i in range(20_000)])
    d = driver()
    for _ in range(100):
        leases = d.claim(executor="t:1:steady", queues=["compaction"], limit=200)
        for lease in leases:
            with d.atomic():
                d.complete(lease)
        if _ % 10 == 9:
            _sql("VACUUM tenure_job")
            _sql("VACUUM tenure_attempt")
    _sql("VACUUM ANALYZE")
    for table in ("tenure_job", "tenure_attempt", "tenure_job_spec"):
        use = d.page_use(table)
        assert use is not None and sum(use.rows) > 0
        assert use.bytes < tables.COMPACT_RATIO * use.needed_bytes, table
        assert tables.cut_page(use) is None
    assert tables.compact(d, ["tenure_job", "tenure_attempt", "tenure_job_spec"]) == []


@postgres_only
def test_a_row_a_write_holds_is_skipped_and_its_attempt_finishes_unharmed() -> None:
    _holes()
    d = driver()
    # A job in the table's last third, claimed: the claim wrote its row again at the end.
    last = int(_sql("SELECT max(id) FROM tenure_job")[0])
    _sql("UPDATE tenure_job SET state = 'waiting', finished_at = NULL WHERE id = %s", [last])
    _sql("VACUUM tenure_job")
    [lease] = d.claim(executor="t:1:held", queues=["compaction"], limit=1)
    assert lease.job_id == last
    held = threading.Event()
    release = threading.Event()

    def hold_the_row() -> None:
        # An attempt's write in flight: its transaction holds the job's row.
        with psycopg.connect(conftest.test_database_url()) as other:
            other.execute("SELECT 1 FROM tenure_job WHERE id = %s FOR UPDATE", [last])
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert held.wait(10)
        place = _sql("SELECT ctid::text FROM tenure_job WHERE id = %s", [last])[0]
        started = time.monotonic()
        [done] = tables.compact(d, ["tenure_job"])
        assert time.monotonic() - started < 60
        # The held row was not waited for: it is where it was, and said to be left.
        assert _sql("SELECT ctid::text FROM tenure_job WHERE id = %s", [last])[0] == place
        assert done.rows_left >= 1
    finally:
        release.set()
        holder.join(30)
    # The attempt's fenced completion finds its row as the claim left it.
    with d.atomic():
        d.complete(lease)
    j = Job.objects.get(pk=last)
    assert (j.state, j.fence) == ("succeeded", 1)
    # The next look moves what this one left.
    [again] = tables.compact(d, ["tenure_job"])
    assert again.rows_left == 0


def _vacuum_lock_held(
    after_a_waiter: float | None = None,
) -> tuple[threading.Thread, threading.Event]:
    """Another session holding the lock a vacuum of the job table takes (as an autovacuum of it
    does): until ``after_a_waiter`` seconds after a statement began to wait for it, or, when
    None, until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(conftest.test_database_url()) as other:
            other.execute("LOCK TABLE tenure_job IN SHARE UPDATE EXCLUSIVE MODE")
            held.set()
            if after_a_waiter is None:
                release.wait(120)
                return
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                waiting = other.execute(
                    "SELECT count(*) FROM pg_locks WHERE relation = 'tenure_job'::regclass "
                    "AND NOT granted"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.02)
            time.sleep(after_a_waiter)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    return holder, release


def _holes_and_cut() -> tuple[int, tuple[int, str], Any, int]:
    """:func:`_holes`' table, its rows' fingerprint, the driver and the cut the look's first
    read of the table finds."""
    before = _holes()
    rows_before = _fingerprint()
    d = driver()
    use = d.page_use("tenure_job")
    assert use is not None
    cut = tables.cut_page(use)
    assert cut is not None
    return before, rows_before, d, cut


@postgres_only
def test_a_compaction_waits_out_an_autovacuum_of_its_table() -> None:
    """The vacuum that gives the emptied pages back waits for another vacuum of the table
    (its lock conflicts with no claim or completion); it gave up within the moves' 100 ms and
    failed the whole look, as it did in a soak hour the minute an autovacuum of the job table
    ran."""
    before, rows_before, d, cut = _holes_and_cut()
    holder, _ = _vacuum_lock_held(after_a_waiter=1.0)
    try:
        done = d.compact_table("tenure_job", cut)
    finally:
        holder.join(150)
    assert not done.vacuum_refused
    assert done.rows_moved > 0 and done.bytes_after < before / 2
    assert _fingerprint() == rows_before


@postgres_only
def test_a_vacuum_refused_its_lock_keeps_the_rows_moved_and_fails_nothing() -> None:
    """Past the session's own lock_timeout the compaction ends without its vacuum: no error
    (the look goes on to the indexes), the rows moved stay moved, and the next vacuum gives
    their pages back."""
    before, rows_before, d, cut = _holes_and_cut()
    _sql("SET lock_timeout = '300ms'")
    holder, release = _vacuum_lock_held()
    try:
        # The look's first read of the table, which vacuums it first, finds nothing to do.
        assert d.page_use("tenure_job") is None
        done = d.compact_table("tenure_job", cut)
    finally:
        release.set()
        holder.join(30)
        _sql("RESET lock_timeout")
    assert done.vacuum_refused and done.rows_moved > 0
    assert done.bytes_after == before  # nothing given back yet
    assert _fingerprint() == rows_before
    _sql("VACUUM tenure_job")
    assert _bytes() < before / 2


@postgres_only
def test_nothing_is_compacted_while_an_old_snapshot_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tables, "COMPACT_MIN_BYTES", 1 << 20)
    before = _holes(30_000)
    with psycopg.connect(conftest.test_database_url(), application_name="a report") as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM tenure_job").fetchone()
        time.sleep(1.2)
        report = indexes.upkeep_once(snapshot_limit=1.0)
        assert report.compacted == [] and "a snapshot has been held" in report.postponed
        assert _bytes() == before
        reader.rollback()
    assert [c.table for c in indexes.upkeep_once(snapshot_limit=1.0).compacted] == ["tenure_job"]
    assert _bytes() < before / 2


@postgres_only
def test_a_cut_with_no_room_before_it_stops_instead_of_writing_rows_again() -> None:
    before = _holes(30_000)
    rows_before = _fingerprint()
    d = driver()
    # The rows cannot all fit before page 10: they fill the holes, the first that then finds no
    # room is written past the table's end, and the compaction stops there rather than moving
    # rows round and round (a hundred writes a row, were it to go on).
    done = d.compact_table("tenure_job", 10)
    assert done.no_room and done.rows_left > 0
    assert done.updates < 3 * 30_000
    assert done.bytes_after <= before + 8 * 8192
    assert _fingerprint() == rows_before


@postgres_only
def test_turned_off_it_moves_nothing(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "COMPACT_MIN_BYTES", 1 << 20)  # as in the test above
    settings.TENURE_TABLE_COMPACTION = False
    before = _holes(30_000)
    rows_before = _fingerprint()
    assert indexes.upkeep_once().compacted == []
    assert _bytes() == before and _fingerprint() == rows_before


def test_no_compaction_where_the_database_reuses_pages_itself() -> None:
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's case")
    noop.enqueue_many([{}])
    assert driver().table_space("tenure_job") is None
    assert driver().page_use("tenure_job") is None
    assert tables.compact(driver(), ["tenure_job"]) == []


def test_sqlite_metrics_show_no_table_sizes(admin_client: Any) -> None:
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's case")
    text = admin_client.get("/metrics").content.decode()
    assert "tenure_db_up 1.0" in text and "tenure_db_table_bytes" not in text


def _table_metric(text: str, name: str, table: str) -> float | None:
    """The value of ``name`` for ``table`` in a ``/metrics`` page (None when absent)."""
    for line in text.splitlines():
        if line.startswith(f'{name}{{table="{table}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


@postgres_only
def test_metrics_show_each_table_beside_what_its_rows_need(
    admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tables, "COMPACT_MIN_BYTES", 1 << 20)  # as in the tests above
    before = _holes(30_000)
    text = admin_client.get("/metrics").content.decode()
    assert _table_metric(text, "tenure_db_table_bytes", "tenure_job") == before
    need = _table_metric(text, "tenure_db_table_needed_bytes", "tenure_job")
    assert need is not None and need < before / tables.COMPACT_RATIO  # what a look compacts
    [done] = tables.compact(driver(), ["tenure_job"])
    text = admin_client.get("/metrics").content.decode()
    assert _table_metric(text, "tenure_db_table_bytes", "tenure_job") == done.bytes_after < before
