"""Which RQ messages the Tenure worker runs: only a plain hint for ``run_job`` (no broker)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from rq import Callback
from rq.serializers import JSONSerializer

from scheduler_core.transports import rq as adapter
from tests.transports.conftest import REDIS


def message(func: str = adapter.TASK_PATH, args: Any = (7,), **options: Any) -> Any:
    """An RQ job as a publisher would write it (no Redis round trip: the client is lazy)."""
    return adapter.Job.create(
        func, args=args, connection=redis.Redis(), serializer=JSONSerializer, **options
    )


def test_a_plain_hint_is_accepted() -> None:
    assert adapter.refusal(message()) is None


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (lambda: message("os.system", args=["touch /tmp/x"]), "it names 'os.system'"),
        (lambda: message(args=(1, 2)), "not exactly one job id"),
        (lambda: message(kwargs={"job_id": 1}), "not exactly one job id"),
        (lambda: message(on_success=Callback("os.system")), "callbacks"),
        (lambda: message(on_failure=Callback("os.system")), "callbacks"),
    ],
    ids=["other-function", "two-args", "kwargs", "success-callback", "failure-callback"],
)
def test_anything_else_is_refused(build: Any, why: str) -> None:
    reason = adapter.refusal(build())
    assert reason is not None and why in reason


def test_a_payload_that_is_not_json_is_refused() -> None:
    job = message()
    job.data = b"\x80\x04not json"
    assert "not JSON" in (adapter.refusal(job) or "")


def test_the_job_class_reads_json_whatever_serializer_it_is_given() -> None:
    job = adapter.Job(connection=redis.Redis(), serializer="rq.serializers.DefaultSerializer")
    assert job.serializer is JSONSerializer


@pytest.mark.broker
def test_a_warm_shutdown_does_not_wait_out_a_read_of_the_control_channel() -> None:
    # The reader takes the reply to UNSUBSCRIBE and starts another read before it is told to
    # stop (the worker's thread paused in between, as on a loaded machine): the stop then
    # waits for that read to end. RQ's own reads last 60 s; this worker's, one.
    worker = adapter.Worker(["tenure-test-unsubscribe"], connection=redis.Redis.from_url(REDIS))
    worker.subscribe()
    time.sleep(0.3)
    send = worker.pubsub.unsubscribe

    def send_then_pause(*args: Any) -> Any:
        sent = send(*args)
        time.sleep(0.3)
        return sent

    worker.pubsub.unsubscribe = send_then_pause  # type: ignore[method-assign]
    started = time.monotonic()
    worker.unsubscribe()
    assert time.monotonic() - started < 5
