"""Bulk enqueue, the one-statement completion, and the cached settings: the same guarantees as
the single-row paths they speed up."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from scheduler_core import EnqueueError, UnknownJob, conf, job
from scheduler_core.api import registry
from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.exceptions import StaleAttempt
from scheduler_core.models import Attempt, Job
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.bulk.item", lease_seconds=30, max_attempts=3)
def item(ctx: Any, *, n: int) -> None:
    """Nothing."""


def _claim(limit: int = 1) -> list[Lease]:
    return driver().claim(executor="t:1:bulk", queues=["default"], limit=limit)


def test_enqueue_many_inserts_waiting_jobs_in_payload_order() -> None:
    ids = item.enqueue_many([{"n": i} for i in range(5)])
    assert len(ids) == 5 and ids == sorted(ids)
    rows = list(Job.objects.filter(pk__in=ids).order_by("id").values_list("spec__payload", "state"))
    assert rows == [({"n": i}, "waiting") for i in range(5)]
    job0 = Job.objects.get(pk=ids[0])
    assert (job0.fence, job0.attempts, job0.max_attempts, job0.lease_seconds, job0.effect) == (
        0,
        0,
        3,
        30,
        "at_least_once",
    )


def test_enqueue_many_jobs_are_claimed_like_single_ones() -> None:
    ids = registry.enqueue_many("tests.bulk.item", [{"n": 1}, {"n": 2}])
    leases = _claim(limit=5)
    assert sorted(lease.job_id for lease in leases) == ids
    assert {lease.fence for lease in leases} == {1}
    assert Attempt.objects.filter(job_id__in=ids).count() == 2


def test_enqueue_many_validates_every_payload_before_writing() -> None:
    with pytest.raises(EnqueueError):
        item.enqueue_many([{"n": 1}, {"m": 2}])
    with pytest.raises(EnqueueError):
        item.enqueue_many([{"n": 1}, {"n": float("nan")}])
    with pytest.raises(UnknownJob):
        registry.enqueue_many("tests.bulk.nobody", [{}])
    assert not Job.objects.exists()
    assert item.enqueue_many([]) == []


def test_enqueue_many_joins_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        item.enqueue_many([{"n": 1}, {"n": 2}])
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


def _row(job_id: int) -> tuple[Any, ...]:
    j = Job.objects.get(pk=job_id)
    a = Attempt.objects.get(job_id=job_id)
    return (
        j.state,
        j.version,
        j.lease_owner,
        j.lease_expires_at,
        j.reason,
        j.next_kind,
        j.finished_at is not None,
        j.attempts,
        j.fence,
        a.outcome,
        a.finished_at is not None,
    )


def test_complete_writes_what_finish_writes_for_the_complete_transition() -> None:
    a, b = item.enqueue(n=1), item.enqueue(n=2)
    leases = {lease.job_id: lease for lease in _claim(limit=2)}
    driver().complete(leases[a.pk])
    driver().finish(leases[b.pk], Decision(transition=states.COMPLETE), outcome="succeeded")
    assert _row(a.pk) == _row(b.pk)
    assert _row(a.pk)[0] == "succeeded"


def test_complete_returns_the_transaction_id_on_postgresql() -> None:
    item.enqueue(n=1)
    [lease] = _claim()
    with transaction.atomic():
        xid = driver().complete(lease)
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT txid_current()")
                assert xid == cur.fetchone()[0]
        else:
            assert xid is None


def test_complete_under_a_stale_fence_is_refused_and_writes_nothing() -> None:
    j = item.enqueue(n=1)
    [lease] = _claim()
    Job.objects.filter(pk=j.pk).update(fence=lease.fence + 1)  # a newer claim's fence
    with pytest.raises(StaleAttempt):
        driver().complete(lease)
    j.refresh_from_db()
    assert j.state == "leased"
    assert Attempt.objects.get(pk=lease.attempt_id).outcome == ""


def test_settings_are_cached_and_follow_overrides(settings: Any, monkeypatch: Any) -> None:
    assert conf.tenure_settings() is conf.tenure_settings()
    settings.TENURE_DEFAULT_LEASE_SECONDS = 77
    assert conf.tenure_settings().DEFAULT_LEASE_SECONDS == 77
    del settings.TENURE_DEFAULT_LEASE_SECONDS
    monkeypatch.setenv("TENURE_DEFAULT_LEASE_SECONDS", "88")
    assert conf.reload().DEFAULT_LEASE_SECONDS == 88
    monkeypatch.delenv("TENURE_DEFAULT_LEASE_SECONDS")
    assert conf.reload().DEFAULT_LEASE_SECONDS == 30
