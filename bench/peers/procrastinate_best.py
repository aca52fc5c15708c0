"""procrastinate at its best for the drain (bench/README.md, "The two drain tables").

Its documentation runs several jobs in one worker only for asynchronous tasks ("Execute
multiple jobs at the same time"), so the task here is a coroutine; and it asks for a pool that,
for short jobs, holds as many connections as the concurrency plus one ("Mind the size of your
PostgreSQL pool"), where the pool's own default is 4 connections.
"""

from __future__ import annotations

import os

import procrastinate

from bench import ping

CONCURRENCY = 8
"""``procrastinate worker --concurrency`` of the drain at its best (``BEST_CONCURRENCY``)."""
POOL_SIZE = CONCURRENCY + 1

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get(
            "BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/bench_procrastinate"
        ),
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
    )
)


@app.task(name="noop_async", queue="default")
async def noop_async(seq: int = -1) -> None:
    """Nothing, except reporting its start when asked to."""
    if seq >= 0:
        ping.started(seq)
