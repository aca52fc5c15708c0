"""Prometheus figures: this process's counters, and the whole system's read from the database.

Two kinds of figure, kept apart by name:

* **In-process** (``tenure_claimed_total``, ``tenure_attempt_duration_seconds``,
  ``tenure_claim_latency_seconds``, ``tenure_stale_writes_refused_total``,
  ``tenure_leases_reaped_total``): what *this* process did. Executors and schedulers update
  them; a process that serves ``/metrics`` shows its own.
* **From the database** (:class:`DatabaseCollector`, computed at each scrape, so any web
  process shows the whole system): ``tenure_jobs{state}``, ``tenure_jobs_health{category}``,
  ``tenure_executors_alive``, ``tenure_scheduler_alive``, ``tenure_verdict`` (0 healthy,
  1 degraded, 2 down: :func:`scheduler_core.read.liveness.assess`) with
  ``tenure_verdict_reason{reason}``, ``tenure_db_stale_writes_refused_total{write}``,
  ``tenure_db_leases_reaped_total``, on PostgreSQL what holds vacuum back
  (``tenure_db_oldest_snapshot_seconds``, ``tenure_db_job_dead_rows``, ``tenure_db_held_back``)
  and each index's size beside what its entries need (``tenure_db_index_bytes{index,table}``,
  ``tenure_db_index_needed_bytes{index,table}``: the index upkeep's figures) and each table's
  beside what its rows need (``tenure_db_table_bytes{table}``,
  ``tenure_db_table_needed_bytes{table}``: the table compaction's gate), and gauge
  histograms over the last hour
  ``tenure_db_attempt_duration_seconds`` and ``tenure_db_claim_latency_seconds``.
  ``tenure_db_up`` is 0 when the database could not be read.

The database figures are read through :mod:`scheduler_core.read.health`.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Iterator, Sequence

from django.db import DatabaseError
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..storage.records import Lease
from . import health, liveness

log = logging.getLogger("tenure.metrics")

DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)

CLAIMED = Counter("tenure_claimed_total", "Jobs claimed by this process")
STALE = Counter("tenure_stale_writes_refused_total", "Stale attempt writes refused", ["write"])
ATTEMPT_SECONDS = Histogram(
    "tenure_attempt_duration_seconds", "Attempt durations", ["job"], buckets=DURATION_BUCKETS
)
CLAIM_LATENCY = Histogram(
    "tenure_claim_latency_seconds",
    "Time from a job's due time to its claim by this process (database clock)",
    buckets=LATENCY_BUCKETS,
)
REAPED = Counter("tenure_leases_reaped_total", "Expired leases moved on", ["transition"])
STRAY_CLOSED = Counter(
    "tenure_stray_attempts_closed_total",
    "Open attempts that were not their job's current one, closed as superseded",
)


def claimed(leases: Sequence[Lease]) -> None:
    """Count claims that committed, and each one's latency: its job's due time to its claim,
    both by the database's clock."""
    if not leases:
        return
    CLAIMED.inc(len(leases))
    for lease in leases:
        if lease.due_at is not None and lease.claimed_at is not None:
            claim_latency((lease.claimed_at - lease.due_at).total_seconds())


def stale_refused(write: str) -> None:
    """Count one refused stale write of kind ``write``."""
    STALE.labels(write=write).inc()


def attempt_finished(job: str, seconds: float) -> None:
    """Observe one attempt's duration."""
    ATTEMPT_SECONDS.labels(job=job).observe(seconds)


def claim_latency(seconds: float) -> None:
    """Observe one claim's latency: seconds from the job's due time to its claim."""
    CLAIM_LATENCY.observe(max(0.0, seconds))


def reaped(transition: str, n: int) -> None:
    """Count ``n`` reaped leases by the transition they took."""
    REAPED.labels(transition=transition).inc(n)


def stray_attempts_closed(n: int) -> None:
    """Count ``n`` stray open attempts closed by this process's reaper."""
    STRAY_CLOSED.inc(n)


def _gauge_histogram(
    name: str, doc: str, values: Sequence[float], buckets: Iterable[float]
) -> GaugeHistogramMetricFamily:
    """A gauge histogram (cumulative buckets) of ``values``."""
    ordered = sorted(values)
    rows = [(str(float(b)), bisect.bisect_right(ordered, b)) for b in buckets]
    rows.append(("+Inf", len(ordered)))
    return GaugeHistogramMetricFamily(name, doc, buckets=rows, gsum_value=sum(ordered))


class DatabaseCollector(Collector):
    """Reads the system-wide figures from the database at each scrape."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("tenure_db_up", "1 when the database could be read at scrape")
        try:
            figures = list(self._figures())
        except DatabaseError as e:
            log.warning("metrics: could not read the database: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from figures

    @staticmethod
    def _figures() -> Iterator[Metric]:

        states = GaugeMetricFamily("tenure_jobs", "Jobs by lifecycle state", labels=["state"])
        for state, n in health.state_counts().items():
            states.add_metric([state], n)
        yield states
        cats = GaugeMetricFamily(
            "tenure_jobs_health", "Jobs by derived health category", labels=["category"]
        )
        categories = health.health_counts()
        for category, n in categories.items():
            cats.add_metric([category], n)
        yield cats
        execs = health.executors()
        alive = GaugeMetricFamily("tenure_executors_alive", "Executors with a fresh heartbeat")
        alive.add_metric([], len(execs))
        yield alive
        pressure = health.database_pressure()
        judged = liveness.assess(categories=categories, executors=execs, pressure=pressure)
        verdict = GaugeMetricFamily(
            "tenure_verdict", "The console's verdict: 0 healthy, 1 degraded, 2 down"
        )
        verdict.add_metric([], judged.level_index)
        yield verdict
        reasons = GaugeMetricFamily(
            "tenure_verdict_reason", "1 for each reason the verdict gives", labels=["reason"]
        )
        for r in judged.reasons:
            reasons.add_metric([r.key], 1)
        yield reasons
        sched = GaugeMetricFamily(
            "tenure_scheduler_alive", "run_scheduler processes with a fresh liveness beat"
        )
        sched.add_metric([], judged.scheduler.count)
        yield sched
        stale = CounterMetricFamily(
            "tenure_db_stale_writes_refused",
            "Stale attempt writes refused, as recorded by every executor",
            labels=["write"],
        )
        for write, n in sorted(health.stale_writes()["by_write"].items()):
            stale.add_metric([write], n)
        yield stale
        reaped_total = CounterMetricFamily(
            "tenure_db_leases_reaped", "Attempts ended because their lease expired"
        )
        reaped_total.add_metric([], health.leases_reaped())
        yield reaped_total
        if pressure is not None:
            snap = GaugeMetricFamily(
                "tenure_db_oldest_snapshot_seconds",
                "Age of the oldest transaction holding a snapshot in this database",
            )
            snap.add_metric([], pressure["oldest_snapshot_seconds"])
            yield snap
            dead = GaugeMetricFamily(
                "tenure_db_job_dead_rows", "Dead rows in the job table vacuum has not removed"
            )
            dead.add_metric([], pressure["job_dead_rows"])
            yield dead
            held = GaugeMetricFamily(
                "tenure_db_held_back",
                "1 when an old snapshot keeps dead rows of the job table from being removed",
            )
            held.add_metric([], 1 if pressure["held_back"] else 0)
            yield held
        sizes = health.index_sizes()
        if sizes:
            size = GaugeMetricFamily(
                "tenure_db_index_bytes",
                "Size of each B-tree index of Tenure's tables",
                labels=["index", "table"],
            )
            need = GaugeMetricFamily(
                "tenure_db_index_needed_bytes",
                "What each index's entries need packed (entries at the table's last vacuum or "
                "analyse x entry width); absent while unknown",
                labels=["index", "table"],
            )
            for ix in sizes:
                size.add_metric([ix.name, ix.table], ix.bytes)
                if ix.needed_bytes is not None:
                    need.add_metric([ix.name, ix.table], ix.needed_bytes)
            yield size
            yield need
        spaces = health.table_spaces()
        if spaces:
            heap = GaugeMetricFamily(
                "tenure_db_table_bytes",
                "Size of each of Tenure's tables (its heap: TOAST and indexes apart)",
                labels=["table"],
            )
            rows_need = GaugeMetricFamily(
                "tenure_db_table_needed_bytes",
                "What each table's rows need packed, estimated from its statistics (rows at the "
                "last vacuum or analyse x average width): below the truth",
                labels=["table"],
            )
            for t in spaces:
                heap.add_metric([t.name], t.bytes)
                rows_need.add_metric([t.name], t.needed_bytes)
            yield heap
            yield rows_need
        yield _gauge_histogram(
            "tenure_db_attempt_duration_seconds",
            "Durations of attempts that finished in the last hour",
            health.recent_attempt_durations(),
            DURATION_BUCKETS,
        )
        yield _gauge_histogram(
            "tenure_db_claim_latency_seconds",
            "Due time to claim of claims made in the last hour (database clock)",
            health.recent_claim_latencies(),
            LATENCY_BUCKETS,
        )


class _ProcessCollector(Collector):
    """This process's own figures (the default registry)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def exposition_registry() -> CollectorRegistry:
    """A registry holding this process's figures and the database's, for ``/metrics``."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_ProcessCollector())
    reg.register(DatabaseCollector())
    return reg
