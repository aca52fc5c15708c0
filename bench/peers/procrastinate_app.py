"""The comparison app for the asyncio worker queue (``procrastinate`` package)."""

from __future__ import annotations

import os

import procrastinate

from bench import ping

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get(
            "BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/bench_procrastinate"
        )
    )
)


@app.task(name="noop", queue="default")
def noop(seq: int = -1) -> None:
    """Nothing, except reporting its start for the latency workload."""
    if seq >= 0:
        ping.started(seq)
