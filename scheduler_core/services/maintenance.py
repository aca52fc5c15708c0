"""``run_scheduler``'s round: the reaper (:mod:`~scheduler_core.services.reaper`), schedule
firing (:mod:`~scheduler_core.services.scheduling`), the hint dispatcher, retention, the
dashboard's count snapshot — the last three defined here — the history rollup
(:mod:`~scheduler_core.services.history`), and, in a thread of its own, the index upkeep
(:mod:`~scheduler_core.services.indexes`). The loop beats its own liveness row (an
``Executor`` row with ``transport="scheduler"``, no queues) every round, so the console can
say whether a scheduler is alive.

Each service has a ``*_once()`` returning counts, and :class:`Maintenance` runs a round of
them in a loop; tests call them directly. Every service is safe to run in many processes at
once: the writes are conditional and skip rows others hold.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import DatabaseError

from ..api import hints
from ..conf import tenure_settings
from ..read import health, liveness
from ..runtime.connections import register_executor
from ..runtime.process_signals import StopOnSignal
from ..storage.drivers import driver
from ..storage.records import new_executor_id
from . import history, reaper, scheduling
from .indexes import IndexUpkeep

log = logging.getLogger("tenure.maintenance")

BACKOFF_CAP_SECONDS = 5.0
"""The longest a maintenance loop waits between rounds that fail (the database unreachable):
the wait doubles from 0.5 s up to this, so expired leases are rescued soon after the database
returns."""


def dispatch_once(*, limit: int = 500) -> int:
    """Publish broker hints for due jobs whose hint is missing or old, on the queues a live
    consumer takes hints from (``hints.hinted_queues``); returns how many."""
    if not hints.uses_broker():
        return 0
    sent = 0
    for job_id, queue in driver().take_due_hints(limit=limit, queues=hints.hinted_queues()):
        if hints.publish(job_id, queue):
            sent += 1
    if sent:
        log.info("dispatcher: re-sent %d hints", sent)
    return sent


def prune_once() -> dict[str, int]:
    """Delete one batch of succeeded and one of failed jobs past their retention (see
    ``RETAIN_SUCCEEDED_SECONDS``); counts by state. One batch a round keeps rounds short, so
    pruning never delays a rescue."""
    s = tenure_settings()
    out: dict[str, int] = {}
    for state, keep in (
        ("succeeded", s.RETAIN_SUCCEEDED_SECONDS),
        ("failed", s.RETAIN_FAILED_SECONDS),
    ):
        if keep > 0:
            n = driver().prune_finished(state, keep, limit=s.PRUNE_BATCH)
            if n:
                out[state] = n
    return out


COUNT_SPACING = 20.0
"""A recount of the dashboard's snapshot waits at least this many times as long as this
process's last recount took. The count reads every succeeded and cancelled job, and the history
grows with retention (7 days at 300 jobs/s is 180 million rows): whatever its size, recounting
takes at most a twentieth of a scheduler's time, and the dashboard says how old the count is."""


class _CountCost:
    """How long this process's last recount took (seconds)."""

    seconds = 0.0


def refresh_counts() -> bool:
    """Recount succeeded jobs for the dashboard when the table is big and the count is old:
    older than ``COUNTS_REFRESH_SECONDS`` and than :data:`COUNT_SPACING` times the last
    recount's time."""
    if not health.counts_are_snapshotted():
        return False
    every = tenure_settings().COUNTS_REFRESH_SECONDS
    older_than = max(every, COUNT_SPACING * _CountCost.seconds)
    started = time.monotonic()
    recounted = driver().refresh_count_snapshot(older_than=older_than)
    if recounted:
        _CountCost.seconds = took = time.monotonic() - started
        if COUNT_SPACING * took > every:
            log.info(
                "the dashboard's count took %.1f s: the next comes in %.0f s at the earliest",
                took,
                COUNT_SPACING * took,
            )
    return recounted


def run_once() -> dict[str, Any]:
    """One round of every maintenance service."""
    # Dates a promotion of the store's server to within a round (``read.failover``).
    driver().record_timeline()
    reaped = reaper.reap_once()
    # Idempotent: writes only when a code-declared schedule is new or changed.
    scheduling.sync_code_schedules()
    fired = scheduling.fire_due()
    hinted = dispatch_once()
    pruned = prune_once()
    recounted = refresh_counts()
    rolled = history.rollup_once()
    history.prune_once()
    return {
        "reaped": dict(reaped),
        "hinted": hinted,
        "scheduled": fired,
        "pruned": pruned,
        "recounted": recounted,
        "history_rows": rolled,
    }


class Maintenance:
    """``run_scheduler``'s loop: a round every ``interval`` seconds until SIGTERM or SIGINT."""

    def __init__(self, *, interval: float | None = None) -> None:
        self.interval = tenure_settings().SWEEP_INTERVAL if interval is None else interval
        self._stop = threading.Event()
        self.scheduler_id = new_executor_id("scheduler")
        self._registered = False
        self.indexes = IndexUpkeep()

    def beat(self) -> None:
        """Register (first round) or beat this scheduler's liveness row. Its transport is
        ``scheduler`` and it names no queue, so nothing counts it as a consumer of work."""
        if not self._registered:
            register_executor(
                self.scheduler_id, transport=liveness.SCHEDULER_TRANSPORT, queues=[], concurrency=0
            )
            self._registered = True
        else:
            driver().executor_beat(self.scheduler_id, active=0)

    def request_stop(self, *_: Any) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop after its round, SIGUSR1 writes its threads'
        stacks (:mod:`..runtime.process_signals`: no handler takes a lock)."""
        StopOnSignal(self.request_stop).install()

    def run(self, *, rounds: int | None = None) -> None:
        """Rounds until stopped (or ``rounds`` of them); the liveness row records the stop."""
        try:
            self._loop(rounds)
        finally:
            if self._registered:
                try:
                    driver().executor_stopped(self.scheduler_id)
                except DatabaseError as e:
                    log.warning("could not record the scheduler's stop: %s", e)

    def _loop(self, rounds: int | None) -> None:
        backoff = 0.0
        done = 0
        while not self._stop.is_set():
            try:
                self.beat()
                result = run_once()
                self.indexes.poll()
                backoff = 0.0
                if result["reaped"] or result["hinted"] or result["scheduled"] or result["pruned"]:
                    log.info("maintenance: %s", result)
            except DatabaseError as e:
                # Capped low: expired leases are rescued soon after the database returns.
                backoff = min(BACKOFF_CAP_SECONDS, max(0.5, backoff * 2))
                log.warning("maintenance round failed (%s); next in %.1fs", e, backoff)
                driver().connection.close()
            done += 1
            if rounds is not None and done >= rounds:
                break
            self._stop.wait(max(self.interval, backoff))
