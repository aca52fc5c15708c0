"""A warm shutdown stops a Celery chain from claiming (``scheduler_core/runtime/chain.py``).

A real ``celery -A config worker`` (prefork, one pool process) on a real broker runs a long job
as a message's first job, with many due jobs of the same queue waiting behind it and the chain
allowed a minute of claiming. SIGTERM reaches the worker's main process while that job runs,
at a seeded moment. The pool process finishes the job, and then claims nothing: no ``claim``
event is logged after the signal, the waiting jobs keep their state without an attempt spent,
and a fresh worker then runs every one of them exactly once.

Seeded (``TENURE_SEED``); ``TENURE_LONG=1`` makes more shutdowns per run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.db.models import Count

from scheduler_core.models import Attempt, Job
from tests.conftest import wait_until
from tests.transports import jobs
from tests.transports.conftest import Harness

pytestmark = [pytest.mark.process, pytest.mark.broker]

LONG = os.environ.get("TENURE_LONG") == "1"
ROUNDS = int(os.environ.get("TENURE_SHUTDOWN_ROUNDS", "10" if LONG else "3"))
SEED = int(os.environ.get("TENURE_SEED", "1729"))
NAP = 1.5
BEHIND = 40


def _events(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


class ChainShutdown:
    """The shutdown scenario on one broker (``spec_id``, as in ``conftest.SPECS``)."""

    spec_id: ClassVar[str]

    def test_a_warm_shutdown_stops_the_chain_from_claiming(
        self, transport: Harness, tmp_path: Path
    ) -> None:
        rng = random.Random(SEED)
        events = tmp_path / "events.jsonl"
        transport.env.update(TENURE_EVENT_LOG=str(events), TENURE_CELERY_CHAIN_SECONDS="60")
        behind: list[int] = []
        for round_ in range(ROUNDS):
            w = transport.start_worker(concurrency=1)
            first = jobs.nap.enqueue(seconds=NAP).pk
            wait_until(
                lambda first=first: any(
                    e["event"] == "claim" and e["job"] == first for e in _events(events)
                ),
                timeout=60,
            )
            # Queued behind the running job: its chain would claim them once it returns.
            mine = jobs.noop.enqueue_many([{"n": i} for i in range(BEHIND)])
            behind += mine
            time.sleep(rng.uniform(0.1, NAP - 0.5))
            signalled = time.time()
            w.send_signal(signal.SIGTERM)
            assert w.wait(timeout=60) == 0, f"round {round_}: the worker did not stop cleanly"

            late = [e for e in _events(events) if e["event"] == "claim" and e["t"] >= signalled]
            assert late == [], f"round {round_}: claimed after the shutdown signal"
            [end] = [e for e in _events(events) if e["event"] == "end" and e["job"] == first]
            # The signal reached the worker while the first job ran, and the job finished.
            assert end["t"] > signalled and end["outcome"] == "succeeded", end
            assert list(Attempt.objects.filter(job_id=first).values_list("outcome", flat=True)) == [
                "succeeded"
            ]
            # Nothing behind it was started; a job given back spent no attempt. (Earlier
            # rounds' jobs may have run since: a starting pool process hints the jobs that
            # waited for a consumer.)
            rows = Job.objects.filter(pk__in=mine)
            assert set(rows.values_list("state", flat=True)) == {"waiting"}
            assert set(rows.values_list("attempts", flat=True)) == {0}
            assert set(
                Attempt.objects.filter(job_id__in=mine).values_list("outcome", flat=True)
            ) <= {"released"}
            # The hints left on the broker are thrown away: the next round's pool process, or
            # the dispatcher at the end, sends them again.
            transport.purge()

        # Nothing was lost: a fresh worker (and the dispatcher, for the hints spent or thrown
        # away) runs every job left waiting, each exactly once.
        transport.env["TENURE_CELERY_CHAIN_SECONDS"] = "1"
        transport.start_worker(concurrency=1)
        transport.start_scheduler()
        wait_until(
            lambda: Job.objects.filter(pk__in=behind, state="succeeded").count() == len(behind),
            timeout=120,
        )
        succeeded = (
            Attempt.objects.filter(job_id__in=behind, outcome="succeeded")
            .values("job_id")
            .annotate(c=Count("id"))
        )
        assert {row["c"] for row in succeeded} == {1}
        assert len(succeeded) == len(behind)


class TestChainShutdownFilesystem(ChainShutdown):
    """Celery on the filesystem broker."""

    spec_id = "celery-filesystem"


class TestChainShutdownRedis(ChainShutdown):
    """Celery on Redis."""

    spec_id = "celery-redis"
