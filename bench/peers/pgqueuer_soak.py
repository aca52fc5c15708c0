"""The soak's pgqueuer worker: the asyncpg driver, the soak's three job kinds as async
entrypoints, and the batch size and concurrency cap chosen in bench/README.md ("Soak"). The
drain at their best runs it too (its ``noop`` kind is the drain's no-op job).

Run as ``python -m bench.peers.pgqueuer_soak``: what ``pgq run bench.peers.pgqueuer_soak:main
--batch-size 4 --max-concurrent-tasks 8`` does, through the same documented entry point (see
``bench/peers/pgqueuer_app.py`` for why the command itself is not used).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from bench import ping
from bench.peers.soak_mix import KINDS

DSN = os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/bench_pgqueuer")
BATCH_SIZE = 4
MAX_CONCURRENT_TASKS = 8


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """Factory: one dedicated asyncpg connection for the queue manager, as its docs advise."""
    conn = await asyncpg.connect(DSN)
    try:
        pgq = PgQueuer(AsyncpgDriver(conn))

        def register(kind: str, seconds: float) -> None:
            @pgq.entrypoint(kind)
            async def handler(job: Job) -> None:
                ping.started(int(job.payload or b"-1"))
                if seconds:
                    await asyncio.sleep(seconds)

        for kind, seconds in KINDS.items():
            register(kind, seconds)
        yield pgq
    finally:
        await conn.close()


if __name__ == "__main__":
    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run

    asyncio_run(
        pgqueuer.run(
            main,
            batch_size=BATCH_SIZE,
            max_concurrent_tasks=MAX_CONCURRENT_TASKS,
            dequeue_timeout=timedelta(seconds=30),
        )
    )
