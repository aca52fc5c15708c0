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
Two events lower the bar for one look, because the room they leave is not taken again by the
ordinary run: the first look at least :data:`HOLD_SETTLE_SECONDS` after a snapshot older
than :data:`SNAPSHOT_LIMIT_SECONDS` was last seen (each process samples once a minute) rebuilds
what is :data:`REBUILD_RATIO_AFTER_HOLD` times its need, the entries counted (one read of each
table) rather than taken from the statistics, and every index of a table the same look compacted
(:mod:`scheduler_core.services.tables`) is rebuilt, whatever its ratio, once it holds
:data:`REBUILD_MIN_BYTES`: each moved row wrote a new entry in it and left the old one's room
behind, in a key range the ordinary run seldom writes again.

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
from ..storage.records import Compaction, IndexSize, sqlstate
from . import tables as table_compaction

log = logging.getLogger("tenure.indexes")

REBUILD_RATIO = 1.5
"""An index is rebuilt once it is larger than this many times what its entries need. A B-tree
filled in random key order ends about 1.3 times its freshly built size, so none is rebuilt for
that (``tests/db/test_index_upkeep.py::test_an_index_filled_in_random_key_order_is_left_alone``)."""
REBUILD_MIN_BYTES = 1 << 20
"""...and larger by at least this many bytes (1 MiB): a rebuild must be worth its reads."""
REBUILD_RATIO_AFTER_HOLD = 1.1
"""The ratio of the first look after a held snapshot was seen: the entries the snapshot kept
were written where the ordinary run will not write again (the primary keys' rising keys, the
attempts' job-and-fence index), so an index 10 % above its need after one stays so. An index
filled in random key order is rebuilt by such a look too, once per held snapshot, not every
look (``tests/db/test_index_upkeep.py::test_a_look_after_a_held_snapshot_rebuilds_what_it_left``)."""
SNAPSHOT_LIMIT_SECONDS = health.HELD_BACK_AFTER_SECONDS
"""No rebuild while a snapshot older than this (60 s) is held."""
RETRY_SECONDS = 60.0
"""A look that failed (a lock not granted within ``lock_timeout``, a connection lost) is tried
again this long after, doubling with each failure in a row up to ``INDEX_UPKEEP_SECONDS``: the
look after a held snapshot is the one that gives its room back, and waiting a whole interval
after it failed left that room in place ten more minutes."""
SAMPLE_SECONDS = 60.0
"""How often ``run_scheduler`` looks at the oldest snapshot between looks."""
HOLD_SETTLE_SECONDS = 300.0
"""The look after a held snapshot is the first that starts this long after the snapshot was
last seen held, so that vacuum has run on the tables since: until it has, their statistics may
still count the versions the snapshot kept, and an index's need with them. (It was first a
guess at why two attempt indexes ended soak hours above their need; the cause was elsewhere,
each attempt written into them twice, which migration 0017 ended: docs/operations.md, "Table
compaction".)"""


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
    their last pages write the indexes again, so each index of theirs of at least
    :data:`REBUILD_MIN_BYTES` is rebuilt afterwards."""
    after_hold: bool = False
    """Whether this look followed a held snapshot (:data:`REBUILD_RATIO_AFTER_HOLD`)."""


_after_rebuild: dict[str, int] = {}
"""Each index's size right after this process last rebuilt it: it is not rebuilt again until it
is :data:`REBUILD_RATIO` times that too, so an index whose need the estimate puts too low is
rebuilt once, not every look."""


def to_rebuild(
    sizes: list[IndexSize],
    *,
    ratio: float = REBUILD_RATIO,
    rewritten: frozenset[str] = frozenset(),
) -> list[IndexSize]:
    """The indexes of ``sizes`` worth rebuilding, largest excess first: those ``ratio`` times
    their need, and those of the tables in ``rewritten`` (compacted this look) of at least
    :data:`REBUILD_MIN_BYTES`. Otherwise an index whose need is unknown (its table never
    vacuumed nor analysed) is left alone."""
    out = []
    for ix in sizes:
        if ix.table in rewritten and ix.bytes >= REBUILD_MIN_BYTES:
            # The estimate counts no deduplication, so it puts an index of many equal keys
            # above its need; the moved rows' room is there whatever the estimate says.
            out.append(ix)
            continue
        need = ix.needed_bytes
        if need is None:
            continue
        floor = max(need, _after_rebuild.get(ix.name, 0))
        if ix.bytes > ratio * floor and ix.bytes - floor >= REBUILD_MIN_BYTES:
            out.append(ix)
    return sorted(out, key=lambda ix: ix.bytes - (ix.needed_bytes or 0), reverse=True)


def _described(ix: IndexSize) -> str:
    """``name size/need MB (entries)`` for the look's log line."""
    need = "?" if ix.needed_bytes is None else f"{ix.needed_bytes / 1e6:.1f}"
    how = "counted" if ix.counted else "estimated"
    return f"{ix.name} {ix.bytes / 1e6:.1f}/{need} MB ({ix.entries} entries, {how})"


def upkeep_once(
    *, snapshot_limit: float = SNAPSHOT_LIMIT_SECONDS, after_hold: bool = False
) -> UpkeepReport:
    """One look: drop unfinished copies, compact the tables worth it, rebuild the indexes
    :func:`to_rebuild` picks (at :data:`REBUILD_RATIO_AFTER_HOLD` when ``after_hold``: a
    snapshot older than ``snapshot_limit`` was seen since the last look). Runs outside any
    transaction. Raises ``DatabaseError`` when a statement fails (a rebuild's copy is dropped
    first)."""
    report = UpkeepReport(after_hold=after_hold)
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
        rewritten = frozenset(c.table for c in report.compacted if c.rows_moved)
        ratio = REBUILD_RATIO_AFTER_HOLD if after_hold else REBUILD_RATIO
        # The look after a hold compares at 1.1: a statistics count a few percent off is half
        # that margin (vacuum extrapolates it from the pages it read), so it counts the rows.
        sizes = d.index_sizes(tables, counted=after_hold)
        # Every look says what it saw, so a rebuild that did not happen can be explained.
        log.info(
            "index upkeep: looking at %d indexes (rebuild above %.1f times the need%s): %s",
            len(sizes),
            ratio,
            ", the look after a held snapshot" if after_hold else "",
            "; ".join(_described(ix) for ix in sizes),
        )
        for ix in to_rebuild(sizes, ratio=ratio, rewritten=rewritten):
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
    return sqlstate(e) == "42501"


class IndexUpkeep:
    """``run_scheduler``'s index upkeep: :func:`upkeep_once` in a thread of its own (a rebuild of
    a big index takes minutes; the rounds, and the reaper in them, go on meanwhile), first one
    interval after the start, then every interval, never two at once. Between looks it samples
    the oldest snapshot every :data:`SAMPLE_SECONDS`, so the look after one was held longer than
    :data:`SNAPSHOT_LIMIT_SECONDS` knows it (``after_hold``) even if the snapshot ended between
    looks; that is the first look :data:`HOLD_SETTLE_SECONDS` or more after the last
    sighting."""

    def __init__(
        self,
        *,
        every: float | None = None,
        sample_every: float = SAMPLE_SECONDS,
        settle: float = HOLD_SETTLE_SECONDS,
    ) -> None:
        self.every = tenure_settings().INDEX_UPKEEP_SECONDS if every is None else every
        self.sample_every = sample_every
        self.settle = settle
        self._next_at = time.monotonic() + self.every
        self._next_sample = time.monotonic()
        self._thread: threading.Thread | None = None
        self.held_at: float | None = None
        """When (``time.monotonic()``) a snapshot older than the limit was last seen, if one
        was since the last look after a hold ran; None otherwise."""
        self.last: UpkeepReport | None = None
        """What the last look did (None before the first, or when it failed)."""
        self.failures = 0
        """Looks failed in a row (:data:`RETRY_SECONDS`)."""

    def sample(self) -> None:
        """Note whether a snapshot older than :data:`SNAPSHOT_LIMIT_SECONDS` is held now."""
        pressure = health.database_pressure()
        if pressure is not None and pressure["oldest_snapshot_seconds"] > SNAPSHOT_LIMIT_SECONDS:
            self.held_at = time.monotonic()

    def poll(self) -> bool:
        """Sample the oldest snapshot if due; start a look if one is due and none is running;
        whether one started."""
        if self.every <= 0:
            return False
        now = time.monotonic()
        if now >= self._next_sample:
            self._next_sample = now + self.sample_every
            self.sample()
        if now < self._next_at:
            return False
        if self._thread is not None and self._thread.is_alive():
            return False
        self._next_at = now + self.every
        held_at = self.held_at
        after_hold = held_at is not None and now - held_at >= self.settle
        if after_hold:
            self.held_at = None
        self._thread = threading.Thread(
            target=self._run, args=(after_hold,), name="tenure-index-upkeep", daemon=True
        )
        self._thread.start()
        return True

    def join(self, timeout: float | None = None) -> None:
        """Wait for a running look (tests; a stopping scheduler does not wait: a rebuild it
        leaves unfinished leaves a copy the next look drops)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, after_hold: bool) -> None:
        d = driver()
        report = None
        try:
            report = upkeep_once(after_hold=after_hold)
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
                self.failures += 1
                retry = min(self.every, RETRY_SECONDS * 2 ** (self.failures - 1))
                self._next_at = time.monotonic() + retry
                log.warning("index upkeep failed (%s); next look in %.0f s", e, retry)
        else:
            self.failures = 0
        finally:
            if report is not None and report.postponed.startswith("a snapshot"):
                self.held_at = time.monotonic()  # held still: a sighting like a sample's
            elif after_hold and (report is None or report.postponed) and self.held_at is None:
                # The look after the hold did not run: the next one is it.
                self.held_at = time.monotonic() - self.settle
            self.last = report
            # This thread's own connection: nothing else uses it.
            d.connection.close()
