"""The job spec end to end on each driver: what an insert writes from a
:class:`~scheduler_core.domain.options.JobOptions` is what a claim's lease carries back, for a
single job, a batch and a workflow's step alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_core.domain.options import JobOptions
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.workflows import NewStep

from . import EXEC, OTHER_QUEUE, claim, job_row, plain

pytestmark = pytest.mark.django_db(transaction=True)

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def spec() -> JobOptions:
    """A spec whose every field differs from the type's defaults."""
    return replace(
        plain.options(payload={"n": [1, 2], "to": "é"}, queue=OTHER_QUEUE, priority=7),
        max_attempts=3,
        lease_seconds=41,
        effect="idempotent",
        timeout_seconds=77.5,
        trace_context=TRACE,
    )


def test_a_single_jobs_spec_comes_back_on_its_lease() -> None:
    written = spec()
    j = driver().insert_job(written, unique_key="spec-1")
    assert j is not None
    [lease] = claim(queues=[OTHER_QUEUE], job_id=j.pk)
    row = job_row(j.pk)
    assert lease.options == replace(written, run_at=row.run_at)
    assert lease.trace_context == TRACE
    assert (row.unique_key, lease.executor) == ("spec-1", EXEC)


def test_a_batchs_spec_comes_back_on_each_lease_with_its_own_payload() -> None:
    written = replace(spec(), payload={})
    payloads = [{"n": 1}, {"n": 2}]
    rows = driver().insert_jobs(written, payloads)
    leases = claim(2, queues=[OTHER_QUEUE])
    by_id = {x.job_id: x for x in leases}
    for (job_id, run_at), p in zip(rows, payloads, strict=True):
        assert by_id[job_id].options == replace(written, run_at=run_at, payload=p)
        assert by_id[job_id].trace_context == TRACE


def test_a_workflow_steps_spec_comes_back_on_its_lease_with_its_workflow() -> None:
    d = driver()
    wf, _ = d.insert_workflow(name="spec", unique_key=None, on_failure="cancel")
    written = spec()
    [job_id] = d.insert_workflow_jobs(
        wf.pk,
        [NewStep(options=written, hinted=False, name="only", parents=())],
        trace_context=TRACE,
    )
    [lease] = claim(queues=[OTHER_QUEUE], job_id=job_id)
    assert lease.options == replace(written, run_at=job_row(job_id).run_at, workflow_id=wf.pk)
