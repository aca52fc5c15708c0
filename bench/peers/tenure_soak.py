"""Tenure job types for the soak (``bench/soak.py``), loaded through ``TENURE_JOB_MODULES``.

Tenure's executor runs handlers on threads, so the sleeping kinds block with ``time.sleep``.
"""

from __future__ import annotations

import time
from typing import Any

from bench import ping
from bench.peers.soak_mix import KINDS
from scheduler_core import job


@job(name="soak.noop", lease_seconds=30, max_attempts=3)
def noop(ctx: Any, *, seq: int = -1) -> None:
    """Report the start, nothing else."""
    ping.started(seq)


@job(name="soak.short", lease_seconds=30, max_attempts=3)
def short(ctx: Any, *, seq: int = -1) -> None:
    """Report the start, then block for 5 ms."""
    ping.started(seq)
    time.sleep(KINDS["short"])


@job(name="soak.long", lease_seconds=30, max_attempts=3)
def long(ctx: Any, *, seq: int = -1) -> None:
    """Report the start, then block for 50 ms."""
    ping.started(seq)
    time.sleep(KINDS["long"])
