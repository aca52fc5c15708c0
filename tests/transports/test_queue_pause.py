"""A paused queue on every transport, for real: a worker that receives the hint of a paused
queue's job claims nothing and drops it with a log line, the job waits; once the queue is
resumed the next hint runs it, once."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest

from scheduler_core.models import Executor, Job
from scheduler_core.services import queues
from tests.conftest import wait_until
from tests.transports import jobs
from tests.transports.conftest import QUEUE, Harness
from tests.transports.contract import attempts, dropped_lines, state

pytestmark = [pytest.mark.process, pytest.mark.broker, pytest.mark.django_db(transaction=True)]


class PausedQueueContract:
    """What a paused queue means to every transport (``spec_id`` names it)."""

    spec_id: ClassVar[str]

    def test_a_paused_queue_is_claimed_by_no_worker_and_resume_runs_it(
        self, transport: Harness
    ) -> None:
        paused = queues.pause(QUEUE, actor="test:operator", reason="transport test")
        transport.start_worker()
        j = jobs.noop.enqueue()
        transport.publish(j.pk)
        if transport.spec.carries_messages:
            # The worker got the hint and dropped it: the claim refused the paused queue.
            wait_until(lambda: dropped_lines(transport, j.pk) >= 1, timeout=60)
        else:
            # The executor is up and has polled many times (every 0.1 s here).
            wait_until(lambda: Executor.objects.filter(transport="polling").exists(), timeout=60)
            time.sleep(1.0)
        assert state(j.pk) == "waiting" and attempts(j.pk) == []
        queues.resume(
            QUEUE, actor="test:operator", reason="done", expected_version=paused.queue.version
        )
        transport.publish(j.pk)
        wait_until(lambda: state(j.pk) == "succeeded", timeout=60)
        assert attempts(j.pk) == [(1, "succeeded")]
        assert Job.objects.get(pk=j.pk).fence == 1


class TestPausedQueuePolling(PausedQueueContract):
    """The broker-less executor."""

    spec_id = "polling"


class TestPausedQueueCeleryFilesystem(PausedQueueContract):
    """Celery on the filesystem broker."""

    spec_id = "celery-filesystem"


class TestPausedQueueRqRedis(PausedQueueContract):
    """RQ on Redis."""

    spec_id = "rq-redis"
