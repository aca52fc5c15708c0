"""Queue limits as decisions: which limits an operator may set (:func:`check_limits`), how the
rate limit's token bucket refills (:func:`refill`) and how many jobs one claim of a limited
queue may take (:func:`allowance`). Pure: the clock is a parameter, the storage driver reads
the queue's row and writes what is decided here.

The rate limit is a token bucket: ``max_per_second`` tokens arrive each second, up to a bucket
of :func:`bucket_size` (one second's worth, at least one claim); each claimed job takes one.
The global concurrency limit counts the queue's leased jobs, whoever holds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

MAX_LEASED_LIMIT = 1_000_000
"""The largest ``max_leased`` accepted: beyond it a limit means nothing (a typo)."""
MAX_PER_SECOND_LIMIT = 100_000.0
"""The largest ``max_per_second`` accepted."""
MIN_PER_SECOND = 0.001
"""The smallest non-zero ``max_per_second`` accepted (one claim in about 17 minutes)."""


class LimitError(ValueError):
    """A limit an operator may not set; nothing was changed."""


def check_limits(max_leased: int | None, max_per_second: float | None) -> None:
    """Raise :class:`LimitError` unless ``max_leased`` is None or an integer in
    ``0..MAX_LEASED_LIMIT`` and ``max_per_second`` is None or a finite number in
    ``MIN_PER_SECOND..MAX_PER_SECOND_LIMIT`` (0 means: claim nothing, as a pause does)."""
    if max_leased is not None:
        if isinstance(max_leased, bool) or not isinstance(max_leased, int):
            raise LimitError(f"max_leased must be a whole number, not {max_leased!r}")
        if not 0 <= max_leased <= MAX_LEASED_LIMIT:
            raise LimitError(
                f"max_leased must be between 0 and {MAX_LEASED_LIMIT:,}, not {max_leased}"
            )
    if max_per_second is not None:
        if isinstance(max_per_second, bool) or not isinstance(max_per_second, int | float):
            raise LimitError(f"max_per_second must be a number, not {max_per_second!r}")
        rate = float(max_per_second)
        if not math.isfinite(rate) or rate < 0 or rate > MAX_PER_SECOND_LIMIT:
            raise LimitError(
                f"max_per_second must be between {MIN_PER_SECOND} and "
                f"{MAX_PER_SECOND_LIMIT:,.0f}, not {max_per_second}"
            )
        if 0 < rate < MIN_PER_SECOND:
            raise LimitError(f"max_per_second must be 0 or at least {MIN_PER_SECOND}")


def bucket_size(max_per_second: float) -> float:
    """The rate limit's bucket: one second's worth of claims, and at least one claim (a rate
    under one per second still lets a claim through once a token has arrived)."""
    return max(1.0, float(max_per_second))


def refill(
    tokens: float, tokens_at: datetime | None, *, max_per_second: float, now: datetime
) -> float:
    """The bucket at ``now``: ``tokens`` at ``tokens_at`` plus ``max_per_second`` per second
    since, at most :func:`bucket_size`. A bucket never used (``tokens_at`` None) is full; a
    clock that went back adds nothing."""
    if max_per_second <= 0:
        return 0.0
    size = bucket_size(max_per_second)
    if tokens_at is None:
        return size
    elapsed = max(0.0, (now - tokens_at).total_seconds())
    return min(size, max(0.0, tokens) + elapsed * max_per_second)


@dataclass(frozen=True, kw_only=True)
class Allowance:
    """What one claim of a limited queue may take, and the bucket if it takes all of it."""

    jobs: int
    tokens: float | None
    """The bucket after refilling, before this claim's jobs are taken (None: no rate limit)."""


def allowance(
    *,
    want: int,
    max_leased: int | None,
    leased: int,
    max_per_second: float | None,
    tokens: float,
    tokens_at: datetime | None,
    now: datetime,
) -> Allowance:
    """How many of a limited queue's jobs one claim may lease: no more than ``want``, than
    ``max_leased`` less the ``leased`` jobs counted now, and than the whole tokens in the
    refilled bucket."""
    n = max(0, want)
    if max_leased is not None:
        n = min(n, max(0, max_leased - leased))
    bucket = None
    if max_per_second is not None:
        bucket = refill(tokens, tokens_at, max_per_second=max_per_second, now=now)
        # A hair under a whole token (float sums of elapsed time) counts as one.
        n = min(n, math.floor(bucket + 1e-9))
    return Allowance(jobs=n, tokens=bucket)


def after_claim(bucket: float | None, claimed: int) -> float:
    """The bucket once ``claimed`` jobs took their tokens."""
    if bucket is None:
        return 0.0
    return max(0.0, bucket - claimed)
