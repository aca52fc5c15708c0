"""A Celery message's chain of jobs: completions written together, each fenced on its own, and
visible only once their commit is known (``scheduler_core.chain``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler_core import chain, executor, job, store
from scheduler_core.models import Attempt, Job, StaleWrite

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:chain"
Q = "chaintest"
ran: list[int] = []


@job(name="tests.chain.ok", queue=Q, max_attempts=3, lease_seconds=60)
def ok(ctx: Any, *, n: int = 0) -> None:
    """Record the run."""
    ran.append(n)


@job(name="tests.chain.tx", queue=Q, effect="transactional", lease_seconds=60)
def tx(ctx: Any, *, n: int = 0) -> None:
    """A job whose completion commits with its handler's writes."""
    ran.append(n)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ran.clear()


def _chain(window: float = 10.0, seconds: float = 10.0) -> chain.Chain:
    hb = executor.Heartbeater(EXEC, beat_executor=False)  # ticked by hand, no thread
    return chain.Chain(executor_id=EXEC, queue=Q, heartbeater=hb, seconds=seconds, window=window)


def _first() -> store.Lease:
    [lease] = store.claim(executor=EXEC, queues=[Q], limit=1)
    return lease


def _writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(completions written, jobs claimed) per completion statement."""
    calls: list[tuple[int, int]] = []
    real = store.complete_many_and_claim

    def counted(leases: Any, **kw: Any) -> Any:
        xid, matched, got = real(leases, **kw)
        calls.append((len(leases), len(got)))
        return xid, matched, got

    monkeypatch.setattr(store, "complete_many_and_claim", counted)
    return calls


def test_completions_of_a_batch_commit_together_and_the_batch_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(10)])
    calls = _writes(monkeypatch)
    c = _chain()
    assert c.run(_first()) == "succeeded"
    assert ran == list(range(10))
    # The message's job commits with the claim of the next batch (sized to the window at the
    # pace measured: all the rest), whose nine completions then commit in one statement.
    assert calls == [(1, 9), (9, 0)]
    assert c.succeeded == ids
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert Attempt.objects.filter(job_id__in=ids, outcome="succeeded").count() == 10
    assert c.hb.active() == []


def test_with_no_window_every_completion_commits_with_the_next_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ok.enqueue_many([{"n": i} for i in range(4)])
    calls = _writes(monkeypatch)
    assert _chain(window=0).run(_first()) == "succeeded"
    assert calls == [(1, 1), (1, 1), (1, 1), (1, 0)]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[], list[tuple[int, str]]]:
    """The executor's event log, read as (job, outcome) of each ``end`` event."""
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("TENURE_EVENT_LOG", str(log))

    def ends() -> list[tuple[int, str]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [(e["job"], e["outcome"]) for e in map(json.loads, lines) if e["event"] == "end"]

    return ends


def test_a_refused_completion_is_left_out_and_recorded_the_others_commit(
    monkeypatch: pytest.MonkeyPatch, events: Callable[[], list[tuple[int, str]]]
) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(4)])
    real = executor.run_lease

    def taken_over(lease: store.Lease, **kw: Any) -> str:
        out = real(lease, **kw)
        if lease.job_id == ids[2]:
            # After its handler returned, another executor took the job over.
            Job.objects.filter(pk=lease.job_id).update(fence=lease.fence + 1, lease_owner="x")
        return out

    monkeypatch.setattr(chain, "run_lease", taken_over)
    c = _chain()
    c.run(_first())
    states = dict(Job.objects.filter(pk__in=ids).values_list("id", "state"))
    assert [states[i] for i in ids] == ["succeeded", "succeeded", "leased", "succeeded"]
    assert c.succeeded == [ids[0], ids[1], ids[3]]
    assert StaleWrite.objects.filter(job_id=ids[2], write="complete").count() == 1
    assert Attempt.objects.get(job_id=ids[2]).finished_at is None
    assert events() == [
        (ids[0], "succeeded"),
        (ids[1], "succeeded"),
        (ids[2], "stale"),
        (ids[3], "succeeded"),
    ]


def test_completions_that_cannot_commit_are_left_to_their_leases(
    monkeypatch: pytest.MonkeyPatch,
    events: Callable[[], list[tuple[int, str]]],
    commit_breaks: None,
) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(3)])
    monkeypatch.setattr(executor.time, "sleep", lambda s: None)
    c = _chain()
    c.run(_first())
    # The first job's completion (with the next claim) never committed: it is still leased,
    # nothing else was claimed, and no completion was reported.
    assert ran == [0]
    assert c.succeeded == []
    assert list(Job.objects.filter(pk__in=ids).order_by("id").values_list("state", flat=True)) == [
        "leased",
        "waiting",
        "waiting",
    ]
    assert c.hb.active() == []  # no longer renewed: the lease runs out, the reaper retries it
    assert events() == []


def test_a_queued_job_whose_renewal_is_refused_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(3)])
    c = _chain()
    real = executor.run_lease

    def then_takeover(lease: store.Lease, **kw: Any) -> str:
        out = real(lease, **kw)
        if lease.job_id == ids[1]:
            # While job 1 runs, job 2 (claimed in the same batch, not started) is taken over;
            # the next renewal is refused.
            Job.objects.filter(pk=ids[2]).update(fence=99, lease_owner="x")
            c.hb.tick(0.0)
        return out

    monkeypatch.setattr(chain, "run_lease", then_takeover)
    c.run(_first())
    assert ran == [0, 1]
    assert c.succeeded == [ids[0], ids[1]]
    assert StaleWrite.objects.filter(job_id=ids[2], write="heartbeat").count() == 1
    assert Job.objects.get(pk=ids[2]).lease_owner == "x"
    assert c.hb.active() == []


def test_a_transactional_job_commits_with_its_handler_inside_a_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = ok.enqueue(n=0)
    b = tx.enqueue(n=1)
    d = ok.enqueue(n=2)
    calls = _writes(monkeypatch)
    c = _chain()
    c.run(_first())
    assert ran == [0, 1, 2]
    # The transactional job's completion is not among the batched ones.
    assert calls == [(1, 2), (1, 0)]
    assert c.succeeded == [a.pk, d.pk]
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}
    assert Attempt.objects.get(job_id=b.pk).outcome == "succeeded"


def test_the_chain_stops_claiming_after_its_seconds() -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(3)])
    c = _chain(seconds=0)
    assert c.run(_first()) == "succeeded"
    assert ran == [0]
    assert list(Job.objects.filter(pk__in=ids).order_by("id").values_list("state", flat=True)) == [
        "succeeded",
        "waiting",
        "waiting",
    ]


def test_a_hint_for_a_job_this_process_completed_is_dropped_without_a_query(
    monkeypatch: pytest.MonkeyPatch, celery_task_process: Any
) -> None:
    celery_transport = celery_task_process
    ids = ok.enqueue_many([{"n": i} for i in range(3)])
    assert celery_transport.run_job(ids[0]) == "succeeded"
    assert ran == [0, 1, 2]

    def no_claim(**kw: Any) -> Any:
        raise AssertionError("a hint for a job completed here needs no claim")

    monkeypatch.setattr(store, "claim", no_claim)
    assert celery_transport.run_job(ids[2]) == "dropped"


def test_the_memory_of_completed_jobs_is_bounded_in_size_and_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scheduler_core.transports.celery import _Recent

    now = [100.0]
    monkeypatch.setattr("scheduler_core.transports.celery.time.monotonic", lambda: now[0])
    r = _Recent(3, ttl=60.0)
    r.extend([1, 2, 3, 4])
    assert 1 not in r and {2, 3, 4} == {i for i in range(6) if i in r}
    now[0] += 61
    assert 4 not in r
    r.extend([5])
    assert {i for i in range(6) if i in r} == {5}
