"""Job types for the cancel process test; child processes import them via TENURE_JOB_MODULES."""

from __future__ import annotations

import time
from typing import Any

from scheduler_core import job


@job(name="tests.proc.cooperative_long", lease_seconds=2, timeout=120, max_attempts=1)
def cooperative_long(ctx: Any, *, seconds: float = 100.0, effects: int = 1) -> None:
    """A long job that stops when asked: ``effects`` steps each make a fenced effect, then it
    works in small slices for up to ``seconds``, checking ``ctx.check_cancelled()`` between
    them."""
    for n in range(effects):
        with ctx.effect(f"step-{n}"):
            pass
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.check_cancelled()
        time.sleep(0.02)
