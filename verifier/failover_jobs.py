"""The failover nemesis's job type (:mod:`verifier.failover`): one effect per job, delivered to
a destination that records every request's effect key and fence.

The destination is a file per executor process under ``TENURE_FAILOVER_DIR``: a line when an
attempt starts (``run``: job, attempt number, fence) and a line when its effect is sent
(``sent``: key and fence), each written and flushed before the handler goes on, so the lines
are what the destination saw whatever the store later forgets. ``failover.tick`` is the job of
the run's schedule: its line (``tick``) also names the occurrence (the job's ``unique_key``) and
the job's identity across timelines (id and creation instant: a promoted standby can hand out
again an id the lost timeline had used). Loaded only where ``TENURE_JOB_MODULES`` names this
module.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import IO, Any

from scheduler_core import job
from scheduler_core.models import Job

QUEUE = os.environ.get("TENURE_FAILOVER_QUEUE", "failover")
"""``default`` on RQ, whose settings declare a broker queue per Tenure queue."""
WORK_SECONDS = 0.05
"""Time a job spends before its effect, so a crash finds attempts in flight."""

_out: dict[int, IO[str]] = {}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def micros(at: dt.datetime) -> int:
    """An instant as whole microseconds since the epoch (exact, unlike a float)."""
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


def _record(**line: Any) -> None:
    pid = os.getpid()
    out = _out.get(pid)
    if out is None:
        folder = Path(os.environ["TENURE_FAILOVER_DIR"]) / "destination"
        folder.mkdir(parents=True, exist_ok=True)
        out = _out[pid] = open(folder / f"{pid}.jsonl", "a", buffering=1)
    out.write(json.dumps({**line, "at": time.time()}) + "\n")
    out.flush()


@job(name="failover.deliver", queue=QUEUE, effect="idempotent", lease_seconds=6, max_attempts=20)
def deliver(ctx: Any, *, n: int) -> None:
    """Record the attempt, work a moment, send one effect under its key and fence."""
    created = micros(ctx.lease.created_at)
    _record(kind="run", job=ctx.job_id, created=created, attempt=ctx.attempt, fence=ctx.fence, n=n)
    time.sleep(WORK_SECONDS)
    with ctx.effect("deliver") as eff:
        _record(kind="sent", job=ctx.job_id, key=eff.key, fence=eff.fence, n=n)


@job(name="failover.tick", queue=QUEUE, effect="idempotent", lease_seconds=6, max_attempts=20)
def tick(ctx: Any) -> None:
    """One occurrence of the run's schedule: record which occurrence and which job, then send
    one effect under its key and fence."""
    occurrence = Job.objects.filter(pk=ctx.job_id).values_list("unique_key", flat=True).first()
    _record(
        kind="tick",
        job=ctx.job_id,
        created=micros(ctx.lease.created_at),
        occurrence=occurrence,
        attempt=ctx.attempt,
        fence=ctx.fence,
    )
    with ctx.effect("tick") as eff:
        _record(kind="sent", job=ctx.job_id, key=eff.key, fence=eff.fence, n=-1)
