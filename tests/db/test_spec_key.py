"""The spec row's key is Tenure's to keep (migration 0014): no foreign key in the database, every
enqueue writes exactly its jobs' spec rows, and deleting a job deletes its spec row (retention's:
tests/storage/test_driver_bookkeeping.py)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.db.migrations.recorder import MigrationRecorder

from scheduler_core import job
from scheduler_core.models import Job, JobSpec

from .migrating import migrate

ORPHANS_DELETE = importlib.import_module(
    "scheduler_core.migrations.0014_spec_key_unchecked"
).ORPHANS_DELETE

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.spec_key.kind", queue="spec-key")
def kind(ctx: Any, n: int = 0) -> None:
    """Never run: the tests only enqueue and delete."""


def _spec_foreign_keys() -> list[str]:
    with connection.cursor() as cur:
        found = connection.introspection.get_constraints(cur, "tenure_job_spec")
    return [name for name, c in found.items() if c["foreign_key"]]


def test_the_spec_key_is_not_a_foreign_key_and_reversing_0014_restores_it(latest: None) -> None:
    assert _spec_foreign_keys() == []
    migrate([("scheduler_core", "0013_autovacuum_settings")])
    assert len(_spec_foreign_keys()) == 1
    migrate([("scheduler_core", "0014_spec_key_unchecked")])
    assert _spec_foreign_keys() == []


def test_every_enqueue_writes_one_spec_row_and_a_key_already_taken_none() -> None:
    one = kind.enqueue(n=1)
    many = kind.enqueue_many([{"n": 2}, {"n": 3}])
    keyed = kind.enqueue(unique_key="k", n=4)
    assert kind.enqueue(unique_key="k", n=5).pk == keyed.pk  # the existing job; nothing written
    jobs = set(Job.objects.values_list("pk", flat=True))
    assert jobs == {one.pk, *many, keyed.pk}
    specs = dict(JobSpec.objects.values_list("job_id", "payload"))
    assert specs == {one.pk: {"n": 1}, many[0]: {"n": 2}, many[1]: {"n": 3}, keyed.pk: {"n": 4}}


def test_deleting_a_job_through_django_deletes_its_spec() -> None:
    gone, kept = kind.enqueue(n=1), kind.enqueue(n=2)
    Job.objects.filter(pk=gone.pk).delete()
    assert list(JobSpec.objects.values_list("job_id", flat=True)) == [kept.pk]


def test_reversing_0014_refuses_a_spec_row_whose_job_was_deleted_by_hand(latest: None) -> None:
    orphan, kept = kind.enqueue(n=1), kind.enqueue(n=2)
    with connection.cursor() as cur:
        cur.execute("DELETE FROM tenure_job WHERE id = %s", [orphan.pk])
    with pytest.raises(IntegrityError) as refused:
        migrate([("scheduler_core", "0013_autovacuum_settings")])
    # The refusal counts the rows and quotes the statement that removes them.
    assert "1 row(s) of tenure_job_spec belong to no job" in str(refused.value)
    assert ORPHANS_DELETE in str(refused.value)
    # Nothing changed and nothing was left open: still 0014's schema, both spec rows kept, and
    # this connection outside any transaction (SQLite's rebuild used to refuse from inside it).
    assert not connection.in_atomic_block
    assert _spec_foreign_keys() == []
    assert set(JobSpec.objects.values_list("job_id", flat=True)) == {orphan.pk, kept.pk}
    recorder = MigrationRecorder(connection)
    assert ("scheduler_core", "0014_spec_key_unchecked") in recorder.applied_migrations()
    with connection.cursor() as cur:
        cur.execute(ORPHANS_DELETE)
    migrate([("scheduler_core", "0013_autovacuum_settings")])
    assert len(_spec_foreign_keys()) == 1
    assert list(JobSpec.objects.values_list("job_id", flat=True)) == [kept.pk]
