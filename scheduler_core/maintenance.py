"""Maintenance services: the reaper, the hint dispatcher and (later) schedules and pruning.

Each service has ``run_once()`` returning counts, and :class:`Maintenance` runs them in a
loop; tests call ``run_once()`` directly. Every service is safe to run in many processes at
once: the reaper's and dispatcher's writes are conditional and skip rows others hold.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections import Counter
from typing import Any

from django.db import DatabaseError

from . import conf, metrics, store, transports
from .db import connection as db_connection

log = logging.getLogger("tenure.maintenance")

BACKOFF_CAP_SECONDS = 5.0
"""The longest a maintenance loop waits between rounds that fail (the database unreachable):
the wait doubles from 0.5 s up to this, so expired leases are rescued soon after the database
returns."""


def reap_once(*, limit: int = 500, rng: random.Random | None = None) -> Counter[str]:
    """Move every expired lease on (in batches of ``limit``); counts by transition."""
    total: Counter[str] = Counter()
    while True:
        got = store.reap(limit=limit, rng=rng)
        total.update(got)
        if sum(got.values()) < limit:
            break
    for name, n in total.items():
        metrics.reaped(name, n)
    return total


def dispatch_once(*, limit: int = 500) -> int:
    """Publish broker hints for due jobs whose hint is missing or old, on the queues a live
    consumer takes hints from (``transports.hinted_queues``); returns how many."""
    if not transports.uses_broker():
        return 0
    sent = 0
    for job_id, queue in store.take_due_hints(limit=limit, queues=transports.hinted_queues()):
        if transports.publish(job_id, queue):
            sent += 1
    if sent:
        log.info("dispatcher: re-sent %d hints", sent)
    return sent


def prune_once() -> dict[str, int]:
    """Delete one batch of succeeded and one of failed jobs past their retention (see
    ``RETAIN_SUCCEEDED_SECONDS``); counts by state. One batch a round keeps rounds short, so
    pruning never delays a rescue."""
    s = conf.get()
    out: dict[str, int] = {}
    for state, keep in (
        ("succeeded", s.RETAIN_SUCCEEDED_SECONDS),
        ("failed", s.RETAIN_FAILED_SECONDS),
    ):
        if keep > 0:
            n = store.prune_finished(state, keep, limit=s.PRUNE_BATCH)
            if n:
                out[state] = n
    return out


def refresh_counts() -> bool:
    """Recount succeeded jobs for the dashboard when the table is big and the count is old."""
    from . import health

    if not health.counts_are_snapshotted():
        return False
    return store.refresh_count_snapshot(older_than=conf.get().COUNTS_REFRESH_SECONDS)


def run_once() -> dict[str, Any]:
    """One round of every maintenance service."""
    from . import schedules

    reaped = reap_once()
    # Idempotent: writes only when a code-declared schedule is new or changed.
    schedules.sync_code_schedules()
    fired = schedules.fire_due()
    hinted = dispatch_once()
    pruned = prune_once()
    recounted = refresh_counts()
    return {
        "reaped": dict(reaped),
        "hinted": hinted,
        "scheduled": fired,
        "pruned": pruned,
        "recounted": recounted,
    }


class Maintenance:
    """``run_scheduler``'s loop: a round every ``interval`` seconds until SIGTERM or SIGINT."""

    def __init__(self, *, interval: float | None = None) -> None:
        self.interval = conf.get().SWEEP_INTERVAL if interval is None else interval
        self._stop = threading.Event()

    def request_stop(self, *_: Any) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def run(self, *, rounds: int | None = None) -> None:
        backoff = 0.0
        done = 0
        while not self._stop.is_set():
            try:
                result = run_once()
                backoff = 0.0
                if result["reaped"] or result["hinted"] or result["scheduled"] or result["pruned"]:
                    log.info("maintenance: %s", result)
            except DatabaseError as e:
                # Capped low: expired leases are rescued soon after the database returns.
                backoff = min(BACKOFF_CAP_SECONDS, max(0.5, backoff * 2))
                log.warning("maintenance round failed (%s); next in %.1fs", e, backoff)
                db_connection.close()
            done += 1
            if rounds is not None and done >= rounds:
                break
            self._stop.wait(max(self.interval, backoff))
