"""The soak's procrastinate app: the soak's three job kinds as async tasks, so a worker's
``--concurrency`` runs them side by side on its event loop (its docs: no concurrency with
synchronous blocking tasks)."""

from __future__ import annotations

import asyncio
import os

import procrastinate

from bench import ping
from bench.peers.soak_mix import KINDS

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get(
            "BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/bench_procrastinate"
        )
    )
)


@app.task(name="soak.noop", queue="default")
async def noop(seq: int = -1) -> None:
    """Report the start, nothing else."""
    ping.started(seq)


@app.task(name="soak.short", queue="default")
async def short(seq: int = -1) -> None:
    """Report the start, then wait 5 ms without blocking the loop."""
    ping.started(seq)
    await asyncio.sleep(KINDS["short"])


@app.task(name="soak.long", queue="default")
async def long(seq: int = -1) -> None:
    """Report the start, then wait 50 ms without blocking the loop."""
    ping.started(seq)
    await asyncio.sleep(KINDS["long"])


TASKS = {"noop": noop, "short": short, "long": long}
