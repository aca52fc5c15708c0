"""PostgreSQL's index upkeep statements: the sizes of the B-tree indexes of Tenure's tables and
the bytes their entries need, their rebuild (``REINDEX INDEX CONCURRENTLY``), the unfinished
copies a failed rebuild leaves, and the advisory lock that lets one process rebuild at a time.
When to rebuild is decided above, in :mod:`scheduler_core.services.indexes`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from .core import DriverCore
from .records import IndexSize, named_rows

_INDEX_SIZES = """
    SELECT ci.relname AS name, ct.relname AS table_name, pg_relation_size(ci.oid) AS bytes,
        ci.reltuples::bigint AS entries, i.indpred IS NOT NULL AS partial,
        -- An entry: an 8-byte header, the key (its columns' average widths, padded to 8) and
        -- a 4-byte line pointer. NULL when a key column has no statistics yet, or is an
        -- expression.
        (SELECT CASE WHEN bool_and(s.avg_width IS NOT NULL)
                THEN 12 + ((sum(s.avg_width)::int + 7) / 8) * 8 END
            FROM unnest(i.indkey::int2[]) AS k(attnum)
            LEFT JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            LEFT JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = ct.relname
                AND s.attname = a.attname) AS entry_bytes
    FROM pg_index AS i
    JOIN pg_class AS ci ON ci.oid = i.indexrelid
    JOIN pg_class AS ct ON ct.oid = i.indrelid
    JOIN pg_namespace AS n ON n.oid = ct.relnamespace
    JOIN pg_am AS am ON am.oid = ci.relam
    WHERE i.indrelid = ANY(SELECT to_regclass(t) FROM unnest(%s::text[]) AS t)
        AND am.amname = 'btree' AND i.indisvalid AND i.indisready
    ORDER BY ct.relname, ci.relname
"""

_UNFINISHED_COPIES = """
    SELECT ci.relname FROM pg_index AS i JOIN pg_class AS ci ON ci.oid = i.indexrelid
    WHERE i.indrelid = ANY(SELECT to_regclass(t) FROM unnest(%s::text[]) AS t)
        AND NOT i.indisvalid AND ci.relname ~ '_cc(new|old)[0-9]*$'
    ORDER BY ci.relname
"""

_LOCK_KEY = "tenure: index upkeep"
"""The advisory lock's name (hashed to its key): one process rebuilds at a time."""


class PgIndexUpkeep(DriverCore):
    """The index upkeep operations of :class:`~scheduler_core.storage.postgres.PostgresDriver`.
    Each runs outside any transaction (``REINDEX … CONCURRENTLY`` and ``DROP INDEX
    CONCURRENTLY`` refuse to run in one), on this thread's connection."""

    def index_sizes(self, tables: Sequence[str], *, counted: bool = False) -> list[IndexSize]:
        with self.connection.cursor() as cur:
            cur.execute(_INDEX_SIZES, [list(tables)])
            rows = named_rows(cur)
            rows_of: dict[str, int] = {}
            if counted:
                # One count per table (an index-only scan of its primary key, mostly): the
                # statistics' count is what the last vacuum extrapolated from the pages it read.
                for table in sorted({str(r["table_name"]) for r in rows if not r["partial"]}):
                    cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
                    one: Any = cur.fetchone()
                    rows_of[table] = int(one[0])
        return [
            IndexSize(
                name=str(r["name"]),
                table=str(r["table_name"]),
                bytes=int(r["bytes"]),
                entries=rows_of.get(str(r["table_name"]), int(r["entries"]))
                if not r["partial"]
                else int(r["entries"]),
                entry_bytes=None if r["entry_bytes"] is None else int(r["entry_bytes"]),
                counted=bool(rows_of) and not r["partial"],
            )
            for r in rows
        ]

    def drop_unfinished_rebuilds(self, tables: Sequence[str]) -> list[str]:
        # A rebuild that failed (a lock it waited for too long, a cancel, a crash) leaves its
        # new copy invalid under the index's name plus ``_ccnew``, or the old one plus
        # ``_ccold``: each is still written by every insert and update, and read by nothing.
        with self.connection.cursor() as cur:
            cur.execute(_UNFINISHED_COPIES, [list(tables)])
            names = [str(r[0]) for r in cur.fetchall()]
            for name in names:
                cur.execute(
                    sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name))
                )
        return names

    def rebuild_index(self, name: str) -> int:
        with self.connection.cursor() as cur:
            cur.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(name)))
            cur.execute("SELECT pg_relation_size(to_regclass(%s))", [name])
            row: Any = cur.fetchone()
        return int(row[0] or 0)

    def try_upkeep_lock(self) -> bool:
        with self.connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [_LOCK_KEY])
            return bool(cur.fetchone()[0])

    def release_upkeep_lock(self) -> None:
        with self.connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", [_LOCK_KEY])
