"""A running job cancelled by an operator, on every transport: the broker-less executor, Celery
(filesystem, Redis, RabbitMQ brokers) and RQ all run attempts through
``scheduler_core/runtime/attempt.py`` with the same heartbeat, so each one's long cooperative
job learns the request at its next renewal and ends ``cancelled`` within about two heartbeats.

Brokers that cannot be reached skip their case with the reason (see ``conftest.py``).
Fails on the code before running jobs could be cancelled."""

from __future__ import annotations

import datetime as dt
from typing import ClassVar

import pytest

from scheduler_core.models import Attempt, Job
from scheduler_core.services import operator
from tests.conftest import wait_until
from tests.process import jobs_cancel
from tests.transports.conftest import Harness

pytestmark = [pytest.mark.process]


class CancelContract:
    """The cancel case, run once per transport (``spec_id``, see ``conftest.SPECS``)."""

    spec_id: ClassVar[str]

    def test_a_running_job_cancelled_by_an_operator_ends_cancelled(
        self, transport: Harness
    ) -> None:
        transport.env["TENURE_JOB_MODULES"] = "tests.transports.jobs,tests.process.jobs_cancel"
        transport.start_worker()
        transport.start_scheduler()
        j = jobs_cancel.cooperative_long.enqueue(seconds=60.0, effects=0)
        wait_until(lambda: Job.objects.get(pk=j.pk).state == "leased", timeout=60)
        first = Attempt.objects.get(job_id=j.pk)
        wait_until(lambda: Job.objects.get(pk=j.pk).heartbeat_at > first.claimed_at, timeout=10)
        operator.operator_action(
            j.pk,
            action="cancel_running",
            expected_version=Job.objects.get(pk=j.pk).version,
            actor="olivia",
            reason="stop it",
        )
        wait_until(lambda: Job.objects.get(pk=j.pk).state == "cancelled", timeout=30)
        row = Job.objects.get(pk=j.pk)
        attempt = Attempt.objects.get(job_id=j.pk)
        assert attempt.outcome == "cancelled"
        assert row.cancel_requested_at is not None and attempt.finished_at is not None
        took = attempt.finished_at - row.cancel_requested_at
        heartbeat = dt.timedelta(seconds=row.lease_seconds / 3)
        assert took <= 2 * heartbeat + dt.timedelta(seconds=0.5), took


class TestPollingCancel(CancelContract):
    spec_id = "polling"


@pytest.mark.broker
class TestCeleryFilesystemCancel(CancelContract):
    spec_id = "celery-filesystem"


@pytest.mark.broker
class TestCeleryRedisCancel(CancelContract):
    spec_id = "celery-redis"


@pytest.mark.broker
class TestCeleryRabbitmqCancel(CancelContract):
    spec_id = "celery-rabbitmq"


@pytest.mark.broker
class TestRqRedisCancel(CancelContract):
    spec_id = "rq-redis"
