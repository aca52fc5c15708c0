"""Retry timing: bounded exponential backoff with jitter. Pure functions of their inputs."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long to wait before attempt ``n + 1`` after attempt ``n`` failed transiently.

    ``delay(n) = min(cap, base * 2 ** (n - 1)) * (1 - jitter * u)`` with ``u`` uniform in
    ``[0, 1)`` from the caller's random source, so the delay lies in
    ``[(1 - jitter) * d, d]`` where ``d = min(cap, base * 2 ** (n - 1))``. A ``retry_after``
    given by the failure (for example a 429's Retry-After) replaces the computed delay, still
    capped. ``max_age`` (seconds since enqueue) ends retrying regardless of attempts left.
    """

    base: float = 1.0
    cap: float = 3600.0
    jitter: float = 0.5
    max_age: float | None = None

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (counting from 1)."""
        if retry_after is not None:
            return max(0.0, min(self.cap, float(retry_after)))
        exp = min(self.cap, self.base * 2 ** max(0, attempt - 1))
        return exp * (1.0 - self.jitter * rng.random())

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The smallest and largest delay :meth:`delay` can return for ``attempt``."""
        exp = min(self.cap, self.base * 2 ** max(0, attempt - 1))
        return exp * (1.0 - self.jitter), exp
