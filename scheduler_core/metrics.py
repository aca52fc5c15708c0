"""In-process counters for this process's Prometheus exposition.

Cross-process figures (counts by state and health, stale writes recorded by every executor)
are read from the database by :mod:`scheduler_core.health`; these counters describe what this
process did.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CLAIMED = Counter("tenure_claimed_total", "Jobs claimed by this process")
STALE = Counter("tenure_stale_writes_refused_total", "Stale attempt writes refused", ["write"])
ATTEMPT_SECONDS = Histogram(
    "tenure_attempt_duration_seconds",
    "Attempt durations",
    ["job"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)
REAPED = Counter("tenure_leases_reaped_total", "Expired leases moved on", ["transition"])


def claimed(n: int) -> None:
    """Count ``n`` claims."""
    CLAIMED.inc(n)


def stale_refused(write: str) -> None:
    """Count one refused stale write of kind ``write``."""
    STALE.labels(write=write).inc()


def attempt_finished(job: str, seconds: float) -> None:
    """Observe one attempt's duration."""
    ATTEMPT_SECONDS.labels(job=job).observe(seconds)


def reaped(transition: str, n: int) -> None:
    """Count ``n`` reaped leases by the transition they took."""
    REAPED.labels(transition=transition).inc(n)
