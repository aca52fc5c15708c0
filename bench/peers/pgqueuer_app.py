"""The comparison app for the asyncio queue built on ``FOR UPDATE SKIP LOCKED`` and
``LISTEN`` (``pgqueuer`` package), on the psycopg driver every system here shares."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from pgqueuer import PgQueuer
from pgqueuer.db import PsycopgDriver
from pgqueuer.models import Job

from bench import ping

DSN = os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/bench_pgqueuer")


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """Factory for ``pgq run bench.peers.pgqueuer_app:main``."""
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        pgq = PgQueuer(PsycopgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            seq = int(job.payload or b"-1")
            if seq >= 0:
                ping.started(seq)

        yield pgq


if __name__ == "__main__":
    # What ``pgq run bench.peers.pgqueuer_app:main --batch-size 1 --max-concurrent-tasks 2``
    # does (same event loop), through the package's documented entry point. One job per
    # dequeue, as every other worker here; the package refuses a concurrency cap below twice
    # the batch size, so a worker may hold two jobs at once.
    from datetime import timedelta

    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run

    asyncio_run(
        pgqueuer.run(
            main,
            batch_size=1,
            max_concurrent_tasks=2,
            dequeue_timeout=timedelta(seconds=30),
        )
    )
