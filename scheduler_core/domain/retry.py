"""Retry timing: bounded exponential backoff with jitter. Pure functions of their inputs.

Nothing here reads a clock or a global random source: ``now`` and ``rng`` are parameters, so
tests use a frozen clock and a seeded ``random.Random``.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass

# 2 ** 1023 is the largest power of two a float holds; past the cap the exponent is moot.
_MAX_EXPONENT = 1000


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long to wait before attempt ``n + 1`` after attempt ``n`` failed transiently.

    With ``d(n) = min(cap, base * 2 ** (n - 1))`` and ``u`` uniform in ``[0, 1)`` drawn from
    the caller's random source::

        delay(n) = d(n) * (1 - jitter * u)        so  (1 - jitter) * d(n) <= delay(n) <= d(n)

    A ``retry_after`` given by the failure (``Transient(retry_after=...)``, an HTTP 429's
    ``Retry-After``) replaces the computed delay, clamped to ``[0, cap]``. ``max_age`` (seconds
    since the job was enqueued) ends retrying regardless of attempts left: a failure at or past
    it is final. Attempts themselves are bounded by the job's ``max_attempts``
    (:func:`scheduler_core.domain.outcomes.after_failure`). A snooze is not a retry: it waits the
    snooze's own time and spends no attempt, but ``max_age`` still ends it.
    """

    base: float = 1.0
    cap: float = 3600.0
    jitter: float = 0.5
    max_age: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.base) and self.base > 0):
            raise ValueError("backoff base must be a positive number of seconds")
        if not (math.isfinite(self.cap) and self.cap >= self.base):
            raise ValueError("backoff cap must be a number of seconds at least the base")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be within [0, 1]")
        if self.max_age is not None and not (math.isfinite(self.max_age) and self.max_age > 0):
            raise ValueError("max_age must be a positive number of seconds (or None)")

    def ceiling(self, attempt: int) -> float:
        """``d(n)``: the un-jittered delay after attempt ``attempt`` (counting from 1)."""
        exponent = min(max(0, attempt - 1), _MAX_EXPONENT)
        return min(self.cap, self.base * 2.0**exponent)

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (counting from 1)."""
        if retry_after is not None and math.isfinite(retry_after):
            return max(0.0, min(self.cap, float(retry_after)))
        return self.ceiling(attempt) * (1.0 - self.jitter * rng.random())

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The smallest and largest delay :meth:`delay` can return for ``attempt``."""
        d = self.ceiling(attempt)
        return d * (1.0 - self.jitter), d

    def too_old(self, age_seconds: float) -> bool:
        """Whether a job ``age_seconds`` old may no longer be retried."""
        return self.max_age is not None and age_seconds >= self.max_age

    def next_run_at(
        self,
        now: dt.datetime,
        attempt: int,
        rng: random.Random,
        retry_after: float | None = None,
    ) -> dt.datetime:
        """When attempt ``attempt + 1`` becomes due, failing at ``now``."""
        return now + dt.timedelta(seconds=self.delay(attempt, rng, retry_after))


def snooze_delay(seconds: float, *, cap: float) -> float:
    """A snooze's wait: its own seconds, clamped to ``[0, cap]`` (a NaN waits 0)."""
    if not math.isfinite(seconds):
        return cap if seconds > 0 else 0.0
    return max(0.0, min(cap, float(seconds)))
