"""Claiming the next job inside a successful attempt's completion transaction: one commit per
job, and the claim stands only if that transaction committed."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core import job
from scheduler_core.models import Attempt, Job
from scheduler_core.runtime import attempt, completion, worker
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:claim-next"


@job(name="tests.claimnext.ok", queue="claimnext", max_attempts=3)
def ok(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _claim(limit: int = 1) -> list[Lease]:
    return driver().claim(executor=EXEC, queues=["claimnext"], limit=limit)


def _next() -> completion.NextClaim:
    return completion.NextClaim(executor=EXEC, queues=["claimnext"], wanted=lambda: 1)


def test_completion_claims_the_next_job_in_the_same_transaction() -> None:
    a, b = ok.enqueue(n=1), ok.enqueue(n=2)
    [lease] = _claim()
    assert lease.job_id == a.pk
    nxt = _next()
    assert attempt.run_lease(lease, next_claim=nxt) == "succeeded"
    assert [(x.job_id, x.fence) for x in nxt.got] == [(b.pk, 1)]
    b.refresh_from_db()
    assert (b.state, b.lease_owner, b.fence) == ("leased", EXEC, 1)
    assert Attempt.objects.filter(job_id=b.pk, fence=1, finished_at__isnull=True).count() == 1
    assert Job.objects.get(pk=a.pk).state == "succeeded"
    # The claimed lease runs like any other.
    assert attempt.run_lease(nxt.got[0]) == "succeeded"


def test_a_refused_completion_claims_nothing() -> None:
    a, b = ok.enqueue(n=1), ok.enqueue(n=2)
    [lease] = _claim()
    # Another executor took the job over meanwhile: this attempt's completion is refused.
    Job.objects.filter(pk=a.pk).update(fence=lease.fence + 1, lease_owner="t:2:other")
    nxt = _next()
    assert attempt.run_lease(lease, next_claim=nxt) == "stale"
    assert nxt.got == []
    b.refresh_from_db()
    assert (b.state, b.fence) == ("waiting", 0)
    assert not Attempt.objects.filter(job_id=b.pk).exists()


def test_a_commit_that_fails_keeps_no_claim(commit_breaks: None) -> None:
    a, b = ok.enqueue(n=1), ok.enqueue(n=2)
    [lease] = _claim()
    nxt = _next()
    # Every try fails before COMMIT; the read-back finds the job still this attempt's, so the
    # attempt ends as a transient failure and the claims of every try were rolled back.
    assert attempt.run_lease(lease, next_claim=nxt) == "retried"
    assert nxt.got == []
    b.refresh_from_db()
    assert (b.state, b.fence) == ("waiting", 0)
    assert not Attempt.objects.filter(job_id=b.pk).exists()
    assert Job.objects.get(pk=a.pk).state == "waiting"


def test_a_worker_drains_mostly_through_completion_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(20)])
    loop_claims: list[int] = []
    real = worker.Worker._claim

    def counted(self: worker.Worker, free: int) -> int:
        got = real(self, free)
        if got:
            loop_claims.append(got)
        return got

    monkeypatch.setattr(worker.Worker, "_claim", counted)
    w = worker.Worker(queues=["claimnext"], concurrency=1, burst=True, poll_interval=0.05)
    stats = w.run()
    assert stats.claimed == 20
    assert stats.outcomes == {"succeeded": 20}
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert Attempt.objects.filter(job_id__in=ids).count() == 20
    # The first job came from the claim loop; the rest from the completions before them.
    assert sum(loop_claims) < 5, loop_claims


def test_a_celery_message_runs_the_queues_due_jobs_back_to_back(
    settings: Any, celery_task_process: Any
) -> None:
    celery_transport = celery_task_process
    ids = ok.enqueue_many([{"n": i} for i in range(3)])
    # The first message's task takes all three: the next job is claimed in each completion.
    assert celery_transport.run_job(ids[0]) == "succeeded"
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert Attempt.objects.filter(job_id__in=ids).count() == 3
    # The other jobs' messages then find nothing to run.
    assert celery_transport.run_job(ids[1]) == "dropped"
    # With chaining off, a message runs its own job only.
    settings.TENURE_CELERY_CHAIN_SECONDS = 0
    more = ok.enqueue_many([{"n": i} for i in range(2)])
    assert celery_transport.run_job(more[0]) == "succeeded"
    assert Job.objects.get(pk=more[1]).state == "waiting"
    # A message is a wake-up: the same hint again (its job succeeded in this process) claims
    # the queue's next due job instead.
    assert celery_transport.run_job(more[0]) == "succeeded"
    assert Job.objects.get(pk=more[1]).state == "succeeded"
    assert Attempt.objects.filter(job_id__in=more).count() == 2


def test_a_hint_whose_job_another_process_holds_runs_the_queues_next_job(
    settings: Any, celery_task_process: Any
) -> None:
    celery_transport = celery_task_process
    settings.TENURE_CELERY_CHAIN_SECONDS = 0
    a, b, c = ok.enqueue_many([{"n": i} for i in range(3)])
    (held,) = driver().claim(executor="t:2:elsewhere", job_id=a, limit=1)
    # a is leased elsewhere: its hint claims b (the queue's next due job), and only b.
    assert celery_transport.run_job(a) == "succeeded"
    states = dict(Job.objects.filter(pk__in=[a, b, c]).values_list("id", "state"))
    assert states == {a: "leased", b: "succeeded", c: "waiting"}
    assert Job.objects.get(pk=a).fence == held.fence
    assert list(Attempt.objects.filter(job_id=a).values_list("executor", flat=True)) == [
        "t:2:elsewhere"
    ]
