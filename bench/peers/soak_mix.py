"""The soak's job mix, shared by the generator and every system's soak handlers.

One job in twenty sleeps 50 ms, two sleep 5 ms, the other seventeen do nothing: 85 / 10 / 5 %.
The kind follows from the job's sequence number, so every system gets the same jobs in the same
order.
"""

from __future__ import annotations

KINDS: dict[str, float] = {"noop": 0.0, "short": 0.005, "long": 0.050}
"""Each kind's handler time in seconds."""

WARMUP_SEQ = 1_000_000_000
"""Sequence numbers from here on are warm-up jobs, left out of every figure."""


def kind_of(seq: int) -> str:
    """The kind of job ``seq``: ``long`` for 1 in 20, ``short`` for 2 in 20, else ``noop``."""
    r = seq % 20
    if r == 0 and seq < WARMUP_SEQ:
        return "long"
    if r in (7, 14) and seq < WARMUP_SEQ:
        return "short"
    return "noop"
