"""Index upkeep (PostgreSQL): rebuild an index of Tenure's tables that vacuum has emptied but
cannot shrink.

Vacuum frees a B-tree's dead entries but never gives the pages back. While a long snapshot is
held every claim and completion leaves entries behind, and two kinds of index keep the room
they took once the snapshot ends: the claim and lease indexes, whose jobs have all moved on
(empty pages that wait for the next burst), and the primary keys, whose pages of ever-growing
keys are never written again (docs/operations.md, "A long transaction"). ``run_scheduler``
looks every ``INDEX_UPKEEP_SECONDS`` (10 minutes) and rebuilds, one at a time and without
blocking writes (``REINDEX INDEX CONCURRENTLY``), each index larger than
:data:`REBUILD_RATIO` times what its entries need and by at least :data:`REBUILD_MIN_BYTES`.

It waits while a snapshot older than :data:`SNAPSHOT_LIMIT_SECONDS` is held (a rebuild waits
for every older snapshot to end, holding off vacuum of the table meanwhile, and the entries the
snapshot keeps could not go anyway), takes an advisory lock so one process rebuilds at a time,
and first drops the invalid copies an earlier rebuild that failed left behind. The decision is
here; the statements are the driver's (:mod:`scheduler_core.storage.pg_indexes`). Where the
database reuses freed pages itself (SQLite), nothing is done.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import DatabaseError

from ..conf import tenure_settings
from ..read import health
from ..storage.drivers import driver
from ..storage.records import Compaction, IndexSize
from . import tables as table_compaction

log = logging.getLogger("tenure.indexes")

REBUILD_RATIO = 1.5
"""An index is rebuilt once it is larger than this many times what its entries need. A B-tree
filled in random key order ends about 1.3 times its freshly built size, so none is rebuilt for
that (``tests/db/test_index_upkeep.py::test_an_index_filled_in_random_key_order_is_left_alone``)."""
REBUILD_MIN_BYTES = 1 << 20
"""...and larger by at least this many bytes (1 MiB): a rebuild must be worth its reads."""
SNAPSHOT_LIMIT_SECONDS = health.HELD_BACK_AFTER_SECONDS
"""No rebuild while a snapshot older than this (60 s) is held."""


@dataclass
class UpkeepReport:
    """What one look did."""

    rebuilt: list[tuple[str, int, int]] = field(default_factory=list)
    """``(index, bytes before, bytes after)`` of each index rebuilt."""
    dropped: list[str] = field(default_factory=list)
    """The invalid copies of failed rebuilds dropped."""
    postponed: str = ""
    """Why nothing was looked at ("" when the look ran)."""
    compacted: list[Compaction] = field(default_factory=list)
    """The tables compacted first (:mod:`scheduler_core.services.tables`): rows moved from
    their last pages write the indexes again, so these are rebuilt afterwards if need be."""


_after_rebuild: dict[str, int] = {}
"""Each index's size right after this process last rebuilt it: it is not rebuilt again until it
is :data:`REBUILD_RATIO` times that too, so an index whose need the estimate puts too low is
rebuilt once, not every look."""


def to_rebuild(sizes: list[IndexSize]) -> list[IndexSize]:
    """The indexes of ``sizes`` worth rebuilding, largest excess first; an index whose need is
    unknown (its table never vacuumed nor analysed) is left alone."""
    out = []
    for ix in sizes:
        need = ix.needed_bytes
        if need is None:
            continue
        floor = max(need, _after_rebuild.get(ix.name, 0))
        if ix.bytes > REBUILD_RATIO * floor and ix.bytes - floor >= REBUILD_MIN_BYTES:
            out.append(ix)
    return sorted(out, key=lambda ix: ix.bytes - (ix.needed_bytes or 0), reverse=True)


def upkeep_once(*, snapshot_limit: float = SNAPSHOT_LIMIT_SECONDS) -> UpkeepReport:
    """One look: drop unfinished copies, compact the tables worth it, rebuild the indexes
    :func:`to_rebuild` picks. Runs outside any transaction. Raises ``DatabaseError`` when a
    statement fails (a rebuild's copy is dropped first)."""
    report = UpkeepReport()
    d = driver()
    pressure = health.database_pressure()
    if pressure is None:
        return report
    if pressure["oldest_snapshot_seconds"] > snapshot_limit:
        oldest = pressure["oldest_snapshot"] or {}
        report.postponed = (
            f"a snapshot has been held {pressure['oldest_snapshot_seconds']:.0f} s "
            f"(pid {oldest.get('pid')}, {oldest.get('application') or 'no application name'})"
        )
        log.info("index upkeep postponed: %s", report.postponed)
        return report
    if not d.try_upkeep_lock():
        report.postponed = "another process holds the index upkeep lock"
        return report
    tables = health.tenure_tables()
    try:
        report.dropped = d.drop_unfinished_rebuilds(tables)
        for name in report.dropped:
            log.warning("index upkeep: dropped %s, the unfinished copy of a failed rebuild", name)
        report.compacted = table_compaction.compact(d, tables)
        for ix in to_rebuild(d.index_sizes(tables)):
            started = time.monotonic()
            try:
                after = d.rebuild_index(ix.name)
            except DatabaseError as e:
                log.warning("index upkeep: rebuilding %s failed (%s)", ix.name, e)
                try:
                    d.drop_unfinished_rebuilds(tables)
                except DatabaseError as again:
                    # The next look drops it; the rebuild's own error is the one to report.
                    log.warning("index upkeep: its unfinished copy stays for now (%s)", again)
                raise
            _after_rebuild[ix.name] = after
            report.rebuilt.append((ix.name, ix.bytes, after))
            log.info(
                "index upkeep: rebuilt %s, %.1f MB -> %.1f MB in %.1f s (its %d entries need "
                "about %.1f MB)",
                ix.name,
                ix.bytes / 1e6,
                after / 1e6,
                time.monotonic() - started,
                ix.entries,
                (ix.needed_bytes or 0) / 1e6,
            )
    finally:
        d.release_upkeep_lock()
    return report


def not_owner(e: BaseException) -> bool:
    """Whether ``e`` is the server's refusal of a rebuild to a role that does not own the table
    (SQLSTATE 42501, ``insufficient_privilege``)."""
    cause = e.__cause__ or e
    return getattr(cause, "sqlstate", None) == "42501"


class IndexUpkeep:
    """``run_scheduler``'s index upkeep: :func:`upkeep_once` in a thread of its own (a rebuild of
    a big index takes minutes; the rounds, and the reaper in them, go on meanwhile), first one
    interval after the start, then every interval, never two at once."""

    def __init__(self, *, every: float | None = None) -> None:
        self.every = tenure_settings().INDEX_UPKEEP_SECONDS if every is None else every
        self._next_at = time.monotonic() + self.every
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Start a look if one is due and none is running; whether one started."""
        if self.every <= 0 or time.monotonic() < self._next_at:
            return False
        if self._thread is not None and self._thread.is_alive():
            return False
        self._next_at = time.monotonic() + self.every
        self._thread = threading.Thread(target=self._run, name="tenure-index-upkeep", daemon=True)
        self._thread.start()
        return True

    def join(self, timeout: float | None = None) -> None:
        """Wait for a running look (tests; a stopping scheduler does not wait: a rebuild it
        leaves unfinished leaves a copy the next look drops)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        d = driver()
        try:
            upkeep_once()
        except DatabaseError as e:
            if not_owner(e):
                # Only a table's owner may rebuild its indexes: no later look would do better.
                log.warning(
                    "index upkeep stopped: %s. Run run_scheduler as the role that owns Tenure's "
                    "tables (the one that migrated them), or set TENURE_INDEX_UPKEEP_SECONDS = 0",
                    str(e).strip(),
                )
                self.every = 0
            else:
                log.warning("index upkeep failed (%s); next look in %.0f s", e, self.every)
        finally:
            # This thread's own connection: nothing else uses it.
            d.connection.close()
