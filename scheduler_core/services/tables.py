"""Table compaction (PostgreSQL): give back the pages a long snapshot or a burst made one of
Tenure's tables take, once vacuum has emptied them, with no lock a claim waits for.

Vacuum frees a table's dead row versions and lets later rows reuse the room, but it gives pages
back to the file system only from the table's end, and only those wholly empty. After a
snapshot was held for minutes every claim and completion of that time left versions behind;
once vacuum frees them the table keeps holes all through the pages written then, and with
finished jobs kept as history the last pages are never empty. So the table stays as large as
the snapshot made it until its history is pruned, and a backup, a replica and the cache carry
it meanwhile (docs/operations.md, "Table compaction").

A look of ``run_scheduler``'s upkeep (:mod:`scheduler_core.services.indexes`, which calls
:func:`compact` before it rebuilds indexes) measures each table whose statistics say it may be
worth it, and compacts one larger than :data:`COMPACT_RATIO` times what its rows need and by at
least :data:`COMPACT_MIN_BYTES`: its rows past the page where the rows fit
(:data:`CUT_SLACK` more than packed) are moved, every value unchanged, into the holes before
it, and a vacuum gives the emptied pages back. The statements are the driver's
(:mod:`scheduler_core.storage.pg_tables`). ``TENURE_TABLE_COMPACTION = False`` turns it off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..conf import tenure_settings
from ..storage.base import Driver
from ..storage.records import Compaction, TableSpace

log = logging.getLogger("tenure.tables")

COMPACT_RATIO = 1.2
"""A table is compacted once its heap is larger than this many times what its rows need. A
table in steady use keeps some room (versions not yet vacuumed, holes smaller than a row), well
below this (``tests/db/test_table_compaction.py::test_a_table_in_steady_use_is_left_alone``)."""
COMPACT_MIN_BYTES = 8 << 20
"""...and larger by at least this many bytes (8 MiB): moving rows writes each one again."""
CUT_SLACK = 1.03
"""The rows are moved to before the page where they would end packed this much looser: rows
moved into holes leave smaller holes behind, and a cut too tight would have the last rows find
no room before it (then the database adds pages at the end, and nothing is given back)."""


def cut_page(space: TableSpace) -> int | None:
    """The page from which ``space``'s rows are to be moved, or None when the table is not
    worth compacting."""
    need = max(space.needed_bytes, space.page_bytes)
    if space.bytes <= COMPACT_RATIO * need or space.bytes - need < COMPACT_MIN_BYTES:
        return None
    return int(need * CUT_SLACK) // space.page_bytes + 1


def compact(d: Driver, tables: Sequence[str]) -> list[Compaction]:
    """Compact each of ``tables`` worth it (:func:`cut_page`), one at a time; what each
    compaction did. Runs outside any transaction; raises ``DatabaseError`` when a statement
    fails (every statement is a transaction of its own: what it moved stays moved)."""
    if not tenure_settings().TABLE_COMPACTION:
        return []
    done = []
    for table in tables:
        estimate = d.table_space(table, exact=False)
        if estimate is not None and cut_page(estimate) is None:
            continue  # the statistics, which put the need below the truth, find it compact
        space = d.table_space(table)
        cut = None if space is None else cut_page(space)
        if space is None or cut is None:
            continue
        started = time.monotonic()
        result = d.compact_table(table, cut)
        done.append(result)
        log.info(
            "table compaction: %s, %.1f MB -> %.1f MB in %.1f s (its %d rows need about %.1f "
            "MB; %d rows moved, %d left past the cut for the next look)",
            table,
            result.bytes_before / 1e6,
            result.bytes_after / 1e6,
            time.monotonic() - started,
            space.rows,
            space.needed_bytes / 1e6,
            result.rows_moved,
            result.rows_left,
        )
        if result.no_room:
            log.warning(
                "table compaction: %s stopped early, a row found no room before page %d",
                table,
                cut,
            )
    return done
