"""Job rows written outside Tenure: Django's model refuses to write a job (it would have no spec
row and bypass every fence), and a job row written by hand without its spec is passed over by
every claim instead of stopping its queue, and reported as stuck."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from scheduler_core import job
from scheduler_core.exceptions import WriteRefused
from scheduler_core.models import Job, JobSpec
from scheduler_core.read import liveness
from scheduler_core.storage.drivers import driver
from tests.hand_rows import hand_job

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.outside.record", queue="outside")
def record(ctx: Any, n: int = 0) -> None:
    """Does nothing: the tests read what a claim takes."""


def test_djangos_model_refuses_to_write_a_job_and_nothing_is_written() -> None:
    kept = record.enqueue(n=1)
    now = driver().now()
    fields = {"name": "tests.outside.record", "queue": "outside", "run_at": now}
    fields.update(created_at=now, updated_at=now)
    attempts = [
        ("Job.objects.create()", lambda: Job.objects.create(**fields)),
        ("Job.save()", lambda: Job(**fields).save()),
        ("Job.objects.bulk_create()", lambda: Job.objects.bulk_create([Job(**fields)])),
        ("Job.save()", lambda: Job.objects.get(pk=kept.pk).save()),
        ("Job.delete()", lambda: Job.objects.get(pk=kept.pk).delete()),
    ]
    for how, write in attempts:
        with pytest.raises(WriteRefused, match=rf"^{how.replace('(', '[(]').replace(')', '[)]')}"):
            write()
    assert list(Job.objects.values_list("pk", "state", "version")) == [
        (kept.pk, "waiting", kept.version)
    ]
    assert JobSpec.objects.count() == 1


def test_a_claim_passes_over_a_job_without_its_spec_and_the_verdict_calls_it_stuck(
    settings: Any,
) -> None:
    """A hand-written job with no spec row, due first: a claim of one job takes the next one
    (PostgreSQL's claim came back empty, SQLite's failed), and the job stays due, stuck."""
    settings.TENURE_STUCK_AFTER_SECONDS = 60.0
    now = driver().now()
    bare = hand_job(
        name="tests.outside.record",
        queue="outside",
        run_at=now - dt.timedelta(seconds=120),
        created_at=now,
        updated_at=now,
    )
    behind = [record.enqueue(n=i) for i in (1, 2)]
    got = [driver().claim(executor=f"t:{i}:a", queues=["outside"], limit=1) for i in (1, 2)]
    assert [[x.job_id for x in g] for g in got] == [[j.pk] for j in behind]
    assert driver().claim(executor="t:3:a", queues=["outside"], limit=4) == []
    assert Job.objects.get(pk=bare.pk).state == "waiting"
    assert "stuck" in {r.key for r in liveness.assess(pressure=None).reasons}
