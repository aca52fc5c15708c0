"""PostgreSQL's table compaction statements: what the statistics say a table's rows need,
where its rows are page by page, the no-op updates that move the rows of its last pages into
the free space before them, and the vacuum that then gives the emptied last pages back to the
file system. When a table is
compacted, and down to which page, is decided above, in :mod:`scheduler_core.services.tables`.

Why an update moves a row: PostgreSQL writes a row's new version on the row's own page when it
fits there, and otherwise on a page its free space map says has room — after a vacuum, the
holes a long snapshot's dead versions left. A row whose page still has room is updated again
until the page is full of its own dead versions (read by nothing: the update finds rows by
their place, which prunes no page). Each update sets the key column to itself: every value
stays, no trigger of Tenure's exists, and a foreign key that did not change is not checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import DatabaseError
from psycopg import sql

from .core import DriverCore
from .records import Compaction, PageUse, TableSpace, named_rows, sqlstate

_SPACE = """
    SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes,
        current_setting('block_size')::int AS page_bytes,
        coalesce((SELECT split_part(o, '=', 2)::int FROM unnest(c.reloptions) AS o
                  WHERE o LIKE 'fillfactor=%%'), 100) AS fillfactor,
        a.attname AS key, c.reltuples::bigint AS rows_estimated,
        -- The columns' average widths: no header, padding nor null bitmap, so below the
        -- rows' real width (NULL when the table was never analysed).
        (SELECT sum(s.avg_width) FROM pg_stats AS s JOIN pg_namespace AS n
            ON n.nspname = s.schemaname
         WHERE n.oid = c.relnamespace AND s.tablename = c.relname) AS width_estimated
    FROM pg_class AS c
    JOIN pg_index AS i ON i.indrelid = c.oid AND i.indisprimary
    JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
    WHERE c.oid = to_regclass(%s)
"""

_PAGE_HEADER = 24
_ROW_OVERHEAD = 28
"""A row's header (24 bytes, as PostgreSQL aligns it) and its line pointer (4): the most rows a
page can hold is (page - header) / 28, 291 on 8 KiB pages."""

_CHUNK_PAGES = 8
"""Pages whose rows one statement moves: its list of places is 8 x 291 long."""

TRIES = 100
"""The most updates of one row within one round: a row alone on a page moves once some 40 of
its versions have filled the page."""

ROUNDS = 3
"""Rounds of moving and vacuuming: a round's stragglers (rows locked by a write, rows an
insert put past the cut while the vacuum ran) are few, and the next round moves them."""


MOVE_LOCK_TIMEOUT = "100ms"
"""How long a statement moving rows waits for a lock other than a row's (which it skips)."""


def lock_not_available(e: BaseException) -> bool:
    """Whether ``e`` is the server's ``lock_timeout`` (SQLSTATE 55P03, ``lock_not_available``)."""
    return sqlstate(e) == "55P03"


class PgTableUpkeep(DriverCore):
    """The table compaction operations of :class:`~scheduler_core.storage.postgres.PostgresDriver`.
    Each runs outside any transaction (``VACUUM`` refuses to run in one), on this thread's
    connection, each statement in a transaction of its own."""

    def _meta(self, table: str) -> dict[str, Any] | None:
        """The table's size, page size, fill factor, key column and statistics; None for a
        table without a primary key (none of Tenure's), whose rows it does not move."""
        with self.connection.cursor() as cur:
            cur.execute(_SPACE, [table])
            rows = named_rows(cur)
        return rows[0] if rows else None

    def table_space(self, table: str) -> TableSpace | None:
        meta = self._meta(table)
        if meta is None or meta["width_estimated"] is None or int(meta["rows_estimated"]) < 0:
            return None
        page = int(meta["page_bytes"])
        rows = int(meta["rows_estimated"])
        row_bytes = rows * (int(meta["width_estimated"]) + _ROW_OVERHEAD)
        usable = (page - _PAGE_HEADER) * int(meta["fillfactor"]) // 100
        return TableSpace(
            name=table,
            bytes=int(meta["bytes"]),
            rows=rows,
            needed_bytes=-(-row_bytes // usable) * page if row_bytes else 0,
            page_bytes=page,
        )

    def page_use(self, table: str) -> PageUse | None:
        meta = self._meta(table)
        if meta is None:
            return None
        page = int(meta["page_bytes"])
        # First free the dead versions, so that what is not a live row is room a moved row can
        # take, and the free space map the moves follow says so.
        if not self._vacuum(table):
            return None  # another vacuum holds the table past lock_timeout: the next look
        with self.connection.cursor() as cur:
            cur.execute(
                sql.SQL(
                    "SELECT (x.ctid::text::point)[0]::bigint AS page, count(*) AS n, "
                    "sum((pg_column_size(x.*) + 7) / 8 * 8 + 4) AS used "
                    "FROM {} AS x GROUP BY 1"
                ).format(sql.Identifier(table))
            )
            found = named_rows(cur)
        pages = self._pages(table, page)
        rows, used = [0] * pages, [0] * pages
        for r in found:
            p = int(r["page"])
            if p < pages:  # a page added since the size was read: too new to matter
                rows[p], used[p] = int(r["n"]), int(r["used"])
        return PageUse(
            name=table,
            page_bytes=page,
            usable_bytes=(page - _PAGE_HEADER) * int(meta["fillfactor"]) // 100,
            rows=rows,
            used=used,
        )

    def compact_table(self, table: str, cut_page: int) -> Compaction:
        meta = self._meta(table)
        if meta is None:
            raise ValueError(f"{table}: no primary key to move its rows by")
        page = int(meta["page_bytes"])
        before = int(meta["bytes"])
        with self.connection.cursor() as cur:
            cur.execute("SHOW lock_timeout")
            row: Any = cur.fetchone()
        own = str(row[0])
        try:
            result = self._compact_rounds(table, str(meta["key"]), cut_page, page, own)
        finally:
            self._lock_timeout(own)
        return dataclasses.replace(
            result, bytes_before=before, bytes_after=self._pages(table, page) * page
        )

    def _vacuum(self, table: str) -> bool:
        """``VACUUM`` ``table``; False when another vacuum of it held its lock past
        ``lock_timeout`` (any other error is raised)."""
        try:
            with self.connection.cursor() as cur:
                cur.execute(sql.SQL("VACUUM {}").format(sql.Identifier(table)))
        except DatabaseError as e:
            if not lock_not_available(e):
                raise
            return False
        return True

    def _lock_timeout(self, value: str) -> None:
        with self.connection.cursor() as cur:
            cur.execute("SELECT set_config('lock_timeout', %s, false)", [value])

    def _compact_rounds(
        self, table: str, key: str, cut_page: int, page: int, own_lock_timeout: str
    ) -> Compaction:
        """Move the rows at or past ``cut_page`` before it and vacuum, up to :data:`ROUNDS`
        times; what it did (sizes left for the caller).

        A move never waits on a row a claim or a completion holds (SKIP LOCKED) and gives up
        on any other lock within :data:`MOVE_LOCK_TIMEOUT` (the next look moves what is left);
        the vacuum waits as long as the session's own ``lock_timeout``: its lock conflicts
        with no claim or completion, only with another vacuum of the table, and the server
        cancels an autovacuum that holds a waiter up past ``deadlock_timeout``. Under the
        moves' timeout it lost to every autovacuum of the table it met, and the whole look
        with it (tests/db/test_table_compaction.py::test_a_compaction_waits_out_an_autovacuum_of_its_table).
        A vacuum still refused its lock ends the compaction: the rows moved stay moved, and the
        next vacuum gives their pages back."""
        per_page = (page - _PAGE_HEADER) // _ROW_OVERHEAD
        move = sql.SQL(
            "WITH c AS MATERIALIZED (SELECT ctid AS at FROM {t} WHERE ctid = ANY(%s::tid[]) "
            "FOR UPDATE SKIP LOCKED) "
            "UPDATE {t} AS x SET {k} = x.{k} FROM c WHERE x.ctid = c.at RETURNING x.ctid::text"
        ).format(t=sql.Identifier(table), k=sql.Identifier(key))
        past_cut = sql.SQL("SELECT count(*) FROM {} WHERE ctid >= %s::tid").format(
            sql.Identifier(table)
        )
        moved = updates = left = 0
        no_room = vacuum_refused = False
        for _ in range(ROUNDS):
            pages = self._pages(table, page)
            if pages <= cut_page:
                break
            # From the last page down: a row that moves to a page past the cut but before the
            # pages being emptied moves again when its new page's turn comes.
            hi = pages
            lock_refused = False
            self._lock_timeout(MOVE_LOCK_TIMEOUT)
            while hi > cut_page and not lock_refused:
                lo = max(cut_page, hi - _CHUNK_PAGES)
                places = [f"({p},{i})" for p in range(lo, hi) for i in range(1, per_page + 1)]
                for _ in range(TRIES):
                    try:
                        with self.connection.cursor() as cur:
                            cur.execute(move, [places])
                            new = [str(r[0]) for r in cur.fetchall()]
                    except DatabaseError as e:
                        if not lock_not_available(e):
                            raise
                        lock_refused = True  # this round's vacuum runs; the next round retries
                        break
                    updates += len(new)
                    moved += sum(1 for p in new if _page(p) < lo)
                    places = [p for p in new if _page(p) >= lo]
                    # A row written past the table's end: the holes before the cut are full.
                    # Moving more would only write rows again; the vacuum below still runs.
                    no_room = any(_page(p) >= pages for p in places)
                    if not places or no_room:
                        break
                hi = cut_page if no_room else lo
            self._lock_timeout(own_lock_timeout)
            with self.connection.cursor() as cur:
                cur.execute(past_cut, [f"({cut_page},0)"])
                counted: Any = cur.fetchone()
                left = int(counted[0])
            if not self._vacuum(table):
                vacuum_refused = True
                break
            if not left or no_room:
                break
        return Compaction(
            table=table,
            bytes_before=0,
            bytes_after=0,
            rows_moved=moved,
            updates=updates,
            rows_left=left,
            no_room=no_room,
            vacuum_refused=vacuum_refused,
        )

    def _pages(self, table: str, page: int) -> int:
        with self.connection.cursor() as cur:
            cur.execute("SELECT pg_relation_size(to_regclass(%s))", [table])
            row: Any = cur.fetchone()
        return int(row[0] or 0) // page


def _page(place: str) -> int:
    """The page of a row's place, ``"(page,line)"``."""
    return int(place[1:].split(",", 1)[0])
