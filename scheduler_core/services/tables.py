"""Table compaction (PostgreSQL): give back the pages a long snapshot or a burst made one of
Tenure's tables take, once vacuum has emptied them, with no lock a claim waits for.

Vacuum frees a table's dead row versions and lets later rows reuse the room, but it gives pages
back to the file system only from the table's end, and only those wholly empty. After a
snapshot was held for minutes every claim and completion of that time left versions behind;
once vacuum frees them the table keeps holes all through the pages written then, and with
finished jobs kept as history the last pages are never empty. So the table keeps the size the
snapshot gave it (later rows fill its holes; pruning the history makes more holes, not a
smaller file), and a backup, a replica and the cache carry it (docs/operations.md, "Table compaction").

A look of ``run_scheduler``'s upkeep (:mod:`scheduler_core.services.indexes`, which calls
:func:`compact` before it rebuilds indexes) vacuums and reads, page by page, each table whose statistics
say it may be worth it, and finds the first page before which the holes hold every row from
it on (:data:`ROOM_MARGIN`); if that gives back at least a sixth of the table and
:data:`COMPACT_MIN_BYTES`, the rows from that page on are moved, every value unchanged, into
the holes before it, and a vacuum gives the emptied pages back. The statements are the driver's
(:mod:`scheduler_core.storage.pg_tables`). ``TENURE_TABLE_COMPACTION = False`` turns it off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..conf import tenure_settings
from ..storage.contract import StorageDriver
from ..storage.records import Compaction, PageUse

log = logging.getLogger("tenure.tables")

COMPACT_RATIO = 1.2
"""A table is looked at once its heap is larger than this many times what its statistics say
its rows need (an estimate below the truth), and compacted only if moving rows gives back at
least ``1 - 1/COMPACT_RATIO`` of it (a sixth). A table in steady use keeps some room (versions
not yet vacuumed, holes smaller than a row), well below this
(``tests/db/test_table_compaction.py::test_a_table_in_steady_use_is_left_alone``)."""
COMPACT_MIN_BYTES = 8 << 20
"""...and at least this many bytes (8 MiB): moving rows writes each one again."""
ROOM_MARGIN = 1.25
"""The holes before the cut must hold this many times the rows past it, and
:data:`ROOM_RESERVE_ROWS` more: the jobs enqueued, claimed and finished while the rows move
take holes too, and a row does not fit a hole smaller than itself. Were the holes to run out,
the rows left would be written past the table's end and nothing given back."""
ROOM_RESERVE_ROWS = 5_000


def cut_page(use: PageUse) -> int | None:
    """The page from which ``use``'s rows are to be moved into the holes before it — the
    first page before which there is room for every row from it on — or None when that gives
    back too little to be worth the writes."""
    total = sum(use.rows)
    if total == 0:
        return None  # nothing to move: vacuum gives an empty table's pages back itself
    row = max(1, sum(use.used) // total)
    room = 0
    after = total
    cut = None
    for page, (n, used) in enumerate(zip(use.rows, use.used, strict=True)):
        if room >= ROOM_MARGIN * after + ROOM_RESERVE_ROWS:
            cut = page
            break
        room += max(0, use.usable_bytes - used) // row
        after -= n
    if cut is None:
        return None
    gain = use.bytes - cut * use.page_bytes
    if gain < COMPACT_MIN_BYTES or gain < (1 - 1 / COMPACT_RATIO) * use.bytes:
        return None
    return cut


def compact(d: StorageDriver, tables: Sequence[str]) -> list[Compaction]:
    """Compact each of ``tables`` worth it (:func:`cut_page`), one at a time; what each
    compaction did. Runs outside any transaction; raises ``DatabaseError`` when a statement
    fails (every statement is a transaction of its own: what it moved stays moved)."""
    if not tenure_settings().TABLE_COMPACTION:
        return []
    done = []
    for table in tables:
        estimate = d.table_space(table)
        if estimate is None or estimate.bytes <= max(
            COMPACT_RATIO * estimate.needed_bytes, COMPACT_MIN_BYTES
        ):
            continue  # the statistics, which put the need below the truth, find it compact
        use = d.page_use(table)
        cut = None if use is None else cut_page(use)
        if use is None or cut is None:
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
            sum(use.rows),
            use.needed_bytes / 1e6,
            result.rows_moved,
            result.rows_left,
        )
        if result.no_room:
            log.warning(
                "table compaction: %s stopped early, a row found no room before page %d",
                table,
                cut,
            )
        if result.vacuum_refused:
            log.warning(
                "table compaction: %s, another vacuum held the table past lock_timeout; the "
                "rows moved stay moved and a later vacuum gives their pages back",
                table,
            )
    return done
