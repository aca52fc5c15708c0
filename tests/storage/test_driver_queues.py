"""The driver contract, queues: the settings row's writes (:meth:`Driver.write_queue`,
:meth:`Driver.queue_row`), the claim's gate for paused and limited queues, the claim within
limits (:meth:`Driver.claim_within_limits`) and the dispatcher's hints for paused queues."""

from __future__ import annotations

import pytest
from django.db.models import F

from scheduler_core.models import Job, Queue
from scheduler_core.storage.clock import DbNow
from scheduler_core.storage.drivers import driver

from . import EXEC, OTHER_QUEUE, QUEUE, claim, insert

pytestmark = pytest.mark.django_db(transaction=True)


def _write(name: str = QUEUE, version: int | None = 0, **fields: object) -> bool:
    return driver().write_queue(name, expected_version=version, fields=dict(fields))


def test_write_queue_creates_the_row_at_version_one_and_refuses_a_second_create() -> None:
    assert driver().queue_row(QUEUE) is None
    assert _write(paused=True, paused_by="x", paused_reason="r", paused_at=DbNow())
    row = driver().queue_row(QUEUE)
    assert row is not None and (row.paused, row.version) == (True, 1)
    assert not _write(paused=False)
    assert driver().queue_row(QUEUE).version == 1  # type: ignore[union-attr]


def test_write_queue_is_conditioned_on_the_version() -> None:
    _write(max_leased=3)
    assert not _write(version=5, max_leased=4)
    assert _write(version=1, max_leased=4)
    row = Queue.objects.get(pk=QUEUE)
    assert (row.max_leased, row.version) == (4, 2)
    assert [q.name for q in driver().queue_rows()] == [QUEUE]


def test_a_new_rate_starts_with_a_full_bucket() -> None:
    _write(max_per_second=2.0)
    Queue.objects.filter(pk=QUEUE).update(tokens=0.0, tokens_at=DbNow())
    assert _write(version=1, max_per_second=3.0)
    row = Queue.objects.get(pk=QUEUE)
    assert (row.tokens, row.tokens_at) == (0.0, None)


def test_the_claim_skips_a_paused_queue_and_a_row_with_nothing_set_gates_nothing() -> None:
    a = insert()
    b = insert(queue=OTHER_QUEUE)
    _write(paused=True)
    assert [x.job_id for x in claim(5, queues=(QUEUE, OTHER_QUEUE))] == [b.pk]
    assert claim(1, job_id=a.pk) == []
    assert _write(version=1, paused=False)
    assert [x.job_id for x in claim(5)] == [a.pk]


def test_limited_queues_names_the_limited_ones_only() -> None:
    _write(max_leased=1)
    _write(OTHER_QUEUE, paused=True, max_leased=1)
    assert driver().limited_queues([QUEUE, OTHER_QUEUE, "none"]) == [QUEUE]
    j = insert()
    assert driver().limited_queues([], job_id=j.pk) == [QUEUE]


def test_claim_within_limits_counts_leased_jobs_and_takes_tokens() -> None:
    for _ in range(5):
        insert()
    _write(max_leased=2, max_per_second=10.0)
    got = driver().claim_within_limits([QUEUE], executor=EXEC, limit=5)
    assert len(got) == 2
    row = Queue.objects.get(pk=QUEUE)
    assert row.tokens == pytest.approx(8.0, abs=0.5) and row.tokens_at is not None
    assert driver().claim_within_limits([QUEUE], executor=EXEC, limit=5) == []
    # Not its business: queues paused or without limits.
    Queue.objects.filter(pk=QUEUE).update(paused=True, version=F("version") + 1)
    Job.objects.filter(state="leased").update(state="succeeded")
    assert driver().claim_within_limits([QUEUE], executor=EXEC, limit=5) == []


def test_claim_limited_queue_claims_past_the_gate() -> None:
    a = insert()
    _write(max_leased=0)
    assert claim(1) == []
    [lease] = driver().claim_limited_queue(QUEUE, executor=EXEC, limit=1)
    assert lease.job_id == a.pk


def test_take_due_hints_leaves_out_paused_queues() -> None:
    a = insert()
    b = insert(queue=OTHER_QUEUE)
    _write(paused=True)
    assert driver().take_due_hints() == [(b.pk, OTHER_QUEUE)]
    assert Job.objects.get(pk=a.pk).hinted_at is None
