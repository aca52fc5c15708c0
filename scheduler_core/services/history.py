"""The console's history: ``run_scheduler``'s maintenance round rolls the attempts of each
finished minute up into ``MinuteStats`` and prunes rows older than
``TENURE_HISTORY_KEEP_SECONDS``.

The rollup is incremental and idempotent: each round rolls up the whole minutes from the
watermark (the end of the last range rolled up) to the last minute that ended
``ROLLUP_LAG_SECONDS`` ago, replacing any row of the same minute, queue and job type; a
scheduler that was stopped catches up from its watermark (at most the kept window) in one
statement, and schedulers running at once write the same figures.
"""

from __future__ import annotations

import datetime as dt

from ..conf import tenure_settings
from ..storage.drivers import driver

ROLLUP_LAG_SECONDS = 10.0
"""A minute is rolled up once it ended this long ago, so the attempts written in its last
moments (stamped by the database's clock before their transaction committed) are in."""


def minute_floor(at: dt.datetime) -> dt.datetime:
    """``at`` truncated to its minute."""
    return at.replace(second=0, microsecond=0)


def rollup(start: dt.datetime, end: dt.datetime) -> int:
    """Roll the whole minutes of ``[start, end)`` up (``start``, ``end`` truncated to
    minutes); returns how many rows were written. Re-running a range rewrites the same rows."""
    start, end = minute_floor(start), minute_floor(end)
    if end <= start:
        return 0
    d = driver()
    rows = d.minute_rollup(start, end)
    d.save_minute_stats(rows, through=end)
    return len(rows)


def rollup_once(now: dt.datetime | None = None) -> int:
    """Roll up every minute since the watermark that has ended (by the database's clock);
    the first run starts ``HISTORY_KEEP_SECONDS`` back. Returns rows written (0 when no new
    minute has ended)."""
    d = driver()
    now = now or d.now()
    keep = tenure_settings().HISTORY_KEEP_SECONDS
    end = minute_floor(now - dt.timedelta(seconds=ROLLUP_LAG_SECONDS))
    oldest = minute_floor(now - dt.timedelta(seconds=keep))
    mark = d.history_watermark()
    start = oldest if mark is None else max(mark, oldest)
    if end <= start:
        return 0
    return rollup(start, end)


def prune_once(now: dt.datetime | None = None) -> int:
    """Delete history rows older than ``HISTORY_KEEP_SECONDS``; how many."""
    d = driver()
    now = now or d.now()
    keep = tenure_settings().HISTORY_KEEP_SECONDS
    return d.prune_minute_stats(now - dt.timedelta(seconds=keep))
