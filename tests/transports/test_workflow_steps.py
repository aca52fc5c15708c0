"""Workflow steps on every transport: the broker-less executor, Celery (filesystem, Redis,
RabbitMQ brokers) and RQ run each step as an ordinary job, none before every parent
succeeded, and a fan-in sees every parent's result. Brokers that cannot be reached skip their
case with the reason (see ``conftest.py``). Fails on the code before workflows existed."""

from __future__ import annotations

from typing import ClassVar

import pytest

from scheduler_core import workflow
from scheduler_core.models import Attempt, Job
from tests.conftest import wait_until
from tests.transports import jobs
from tests.transports.conftest import Harness

pytestmark = [pytest.mark.process]


class WorkflowContract:
    """The workflow case, run once per transport (``spec_id``, see ``conftest.SPECS``)."""

    spec_id: ClassVar[str]

    def test_steps_run_after_their_parents_and_see_their_results(self, transport: Harness) -> None:
        transport.start_worker()
        transport.start_scheduler()
        wf = workflow("transport.fan")
        root = wf.step(jobs.step, name="root", label="root")
        parts = wf.map(jobs.step, [{"label": f"p{i}"} for i in range(8)], after=[root], name="p")
        wf.step(jobs.step, name="join", after=parts, label="join")
        run = wf.enqueue()
        ids = list(run.jobs.values())
        wait_until(
            lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == len(ids),
            timeout=90,
        )
        done = {a.job_id: a for a in Attempt.objects.filter(job_id__in=ids, outcome="succeeded")}
        parts_ids = [run.jobs[f"p[{i}]"] for i in range(8)]
        for p in parts_ids:
            assert done[p].claimed_at >= done[run.jobs["root"]].finished_at
        join = done[run.jobs["join"]]
        assert all(join.claimed_at >= done[p].finished_at for p in parts_ids)
        assert join.return_value == {
            "label": "join",
            "parents": sorted(f"p[{i}]" for i in range(8)),
        }
        assert Attempt.objects.filter(job_id__in=ids).count() == len(ids)


class TestPollingWorkflow(WorkflowContract):
    spec_id = "polling"


@pytest.mark.broker
class TestCeleryFilesystemWorkflow(WorkflowContract):
    spec_id = "celery-filesystem"


@pytest.mark.broker
class TestCeleryRedisWorkflow(WorkflowContract):
    spec_id = "celery-redis"


@pytest.mark.broker
class TestCeleryRabbitmqWorkflow(WorkflowContract):
    spec_id = "celery-rabbitmq"


@pytest.mark.broker
class TestRqRedisWorkflow(WorkflowContract):
    spec_id = "rq-redis"
