"""A Celery message's chain of jobs: completions written together, each fenced on its own, and
visible only once their commit is known; nothing held past its bound while a handler runs
(``scheduler_core.runtime.chain``).

The tests where timing matters are seeded (``TENURE_SEED``); ``TENURE_LONG=1`` runs more seeds.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from scheduler_core import job
from scheduler_core.models import Attempt, Effect, Job, StaleWrite
from scheduler_core.runtime import attempt, chain, completion, heartbeat
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:chain"
Q = "chaintest"
LONG = os.environ.get("TENURE_LONG") == "1"
SEED = int(os.environ.get("TENURE_SEED", "1729"))
ROUNDS = int(os.environ.get("TENURE_CHAIN_ROUNDS", "60" if LONG else "8"))
ran: list[int] = []
runs: list[tuple[int, int]] = []
timing: dict[tuple[int, int], tuple[float, float]] = {}
entered = threading.Event()
gate = threading.Event()


@job(name="tests.chain.ok", queue=Q, max_attempts=3, lease_seconds=60)
def ok(ctx: Any, *, n: int = 0) -> None:
    """Record the run."""
    ran.append(n)


@job(name="tests.chain.tx", queue=Q, effect="transactional", lease_seconds=60)
def tx(ctx: Any, *, n: int = 0) -> None:
    """A job whose completion commits with its handler's writes."""
    ran.append(n)


@job(name="tests.chain.hang", queue=Q, lease_seconds=60)
def hang(ctx: Any, *, n: int = 0) -> None:
    """Run until the test opens the gate: a hung handler."""
    ran.append(n)
    entered.set()
    assert gate.wait(30)


@job(name="tests.chain.sleepy", queue=Q, lease_seconds=60)
def sleepy(ctx: Any, *, n: int = 0, seconds: float = 0.0) -> None:
    """Take ``seconds``; record which attempt ran, and when (this process's wall clock)."""
    start = time.time()
    time.sleep(seconds)
    runs.append((ctx.job_id, ctx.fence))
    timing[(ctx.job_id, ctx.fence)] = (start, time.time())


def _swallow(ctx: Any, *, n: int = 0) -> None:
    try:
        with ctx.effect("send"):
            raise TimeoutError("sent; no reply")
    except TimeoutError:
        pass  # the handler's author thought "probably fine"
    ran.append(n)


swallow_idem = job(name="tests.chain.swallow_idem", queue=Q, effect="idempotent")(_swallow)
swallow_amo = job(name="tests.chain.swallow_amo", queue=Q, effect="at_most_once")(_swallow)


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    ran.clear()
    runs.clear()
    timing.clear()
    entered.clear()
    gate.clear()
    yield
    gate.set()  # never leave a chain's thread hanging


def _chain(
    window: float = 10.0,
    seconds: float = 10.0,
    hold: float | None = None,
    stopping: Callable[[], bool] | None = None,
) -> chain.Chain:
    hb = heartbeat.Heartbeater(EXEC, beat_executor=False)  # ticked by hand, no thread
    extra: dict[str, Any] = {}
    if hold is not None:
        extra["hold"] = hold
    if stopping is not None:
        extra["stopping"] = stopping
    return chain.Chain(
        executor_id=EXEC, queue=Q, heartbeater=hb, seconds=seconds, window=window, **extra
    )


def _in_thread(c: chain.Chain, first: Lease) -> tuple[threading.Thread, list[str]]:
    """Run the chain in a thread of its own (with its own connection), as a pool process's
    task runs it, so the test can look at the database while a handler hangs."""
    out: list[str] = []

    def go() -> None:
        try:
            out.append(c.run(first))
        finally:
            connection.close()

    t = threading.Thread(target=go, name="chain-under-test")
    t.start()
    return t, out


def _attempts(job_id: int) -> list[tuple[int, str]]:
    return list(
        Attempt.objects.filter(job_id=job_id).order_by("fence").values_list("fence", "outcome")
    )


def _first() -> Lease:
    [lease] = driver().claim(executor=EXEC, queues=[Q], limit=1)
    return lease


def _writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(completions written, jobs claimed) per completion statement."""
    calls: list[tuple[int, int]] = []
    real = driver().complete_many_and_claim

    def counted(leases: Any, **kw: Any) -> Any:
        xid, matched, got = real(leases, **kw)
        calls.append((len(leases), len(got)))
        return xid, matched, got

    monkeypatch.setattr(driver(), "complete_many_and_claim", counted)
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
def event_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[], list[Any]]:
    """The executor's event log, as a list of events."""
    from scheduler_core import hooks
    from verifier.failpoints import VerifierHooks

    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("TENURE_EVENT_LOG", str(log))
    monkeypatch.setattr(hooks, "_installed", VerifierHooks(""))

    def read() -> list[Any]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [json.loads(line) for line in lines]

    return read


@pytest.fixture
def events(event_log: Callable[[], list[Any]]) -> Callable[[], list[tuple[int, str]]]:
    """The executor's event log, read as (job, outcome) of each ``end`` event."""

    def ends() -> list[tuple[int, str]]:
        return [(e["job"], e["outcome"]) for e in event_log() if e["event"] == "end"]

    return ends


def test_a_refused_completion_is_left_out_and_recorded_the_others_commit(
    monkeypatch: pytest.MonkeyPatch, events: Callable[[], list[tuple[int, str]]]
) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(4)])
    real = attempt.run_lease

    def taken_over(lease: Lease, **kw: Any) -> str:
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
    monkeypatch.setattr(completion.time, "sleep", lambda s: None)
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
    real = attempt.run_lease

    def then_takeover(lease: Lease, **kw: Any) -> str:
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


def test_a_hint_for_a_job_this_process_completed_claims_only_its_queue(
    monkeypatch: pytest.MonkeyPatch, celery_task_process: Any
) -> None:
    celery_transport = celery_task_process
    ids = ok.enqueue_many([{"n": i} for i in range(3)])
    assert celery_transport.run_job(ids[0]) == "succeeded"
    assert ran == [0, 1, 2]
    claims: list[dict[str, Any]] = []
    real_claim = driver().claim

    def recorded(**kw: Any) -> Any:
        claims.append(kw)
        return real_claim(**kw)

    monkeypatch.setattr(driver(), "claim", recorded)
    # The job's success was seen here: no claim of it, only of its queue's next due job, and
    # the queue is empty.
    assert celery_transport.run_job(ids[2]) == "dropped"
    assert [kw.get("job_id") for kw in claims] == [None]
    assert [list(kw["queues"]) for kw in claims] == [[Q]]


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


# ---------------------------------------------------------------------------------------------
# Nothing held without a bound while a handler runs
# ---------------------------------------------------------------------------------------------


def test_waiting_completions_commit_while_a_later_handler_hangs(
    settings: Any, events: Callable[[], list[tuple[int, str]]]
) -> None:
    settings.TENURE_CELERY_QUEUED_HOLD_SECONDS = 60.0  # only the commit window is at stake
    ids = ok.enqueue_many([{"n": i} for i in range(5)])
    hung = hang.enqueue(n=5).pk
    last = ok.enqueue(n=6).pk
    c = _chain(window=0.05)
    t, out = _in_thread(c, _first())
    try:
        assert entered.wait(10)
        # Job 5's handler hangs; the completions of jobs 1-4, waiting since before it started,
        # commit once the window has passed, without waiting for it.
        wait_until(
            lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == len(ids),
            timeout=5,
        )
        assert sorted(j for j, outcome in events() if outcome == "succeeded") == ids
        assert t.is_alive() and Job.objects.get(pk=hung).state == "leased"
        assert {ctx.job_id for ctx in c.hb.active()} == {hung, last}
    finally:
        gate.set()
        t.join(30)
    assert out == ["succeeded"]
    everything = [*ids, hung, last]
    # Each completion written once, by one thread: one end event and one attempt each.
    assert c.succeeded == everything
    assert events() == [(j, "succeeded") for j in everything]
    assert Attempt.objects.filter(job_id__in=everything, outcome="succeeded").count() == 7
    assert not StaleWrite.objects.exists()
    assert c.hb.active() == []


def test_queued_jobs_are_given_back_once_the_handler_before_them_runs_past_the_hold(
    settings: Any, events: Callable[[], list[tuple[int, str]]]
) -> None:
    settings.TENURE_CELERY_QUEUED_HOLD_SECONDS = 0.3
    ok.enqueue(n=0)
    hung = hang.enqueue(n=1).pk
    rest = ok.enqueue_many([{"n": i} for i in (2, 3, 4)])
    c = _chain()
    t, out = _in_thread(c, _first())
    try:
        assert entered.wait(10)
        # Claimed with the hung job, behind it: given back while it still runs.
        wait_until(
            lambda: Job.objects.filter(pk__in=rest, state="waiting").count() == len(rest),
            timeout=5,
        )
        assert t.is_alive()
        assert set(Job.objects.filter(pk__in=rest).values_list("attempts", flat=True)) == {0}
        assert [_attempts(j) for j in rest] == [[(1, "released")]] * 3
        assert {ctx.job_id for ctx in c.hb.active()} == {hung}
    finally:
        gate.set()
        t.join(30)
    assert out == ["succeeded"]
    # The chain claimed them again once the hung job ended; none ran under the fence given back.
    assert ran == [0, 1, 2, 3, 4]
    assert [_attempts(j) for j in rest] == [[(1, "released"), (2, "succeeded")]] * 3
    assert set(Job.objects.filter(pk__in=rest).values_list("attempts", flat=True)) == {1}
    assert [e for e in events() if e[0] in rest] == [
        *[(j, "released") for j in rest],
        *[(j, "succeeded") for j in rest],
    ]
    assert c.hb.active() == []


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_handlers_around_the_window_and_the_hold_keep_both_bounds_and_end_each_job_once(
    seed: int, settings: Any, event_log: Callable[[], list[Any]]
) -> None:
    # Handlers as long as nothing, the commit window, the hold, or far past it, in a seeded
    # order: the chain's thread and the warden race to write completions and to take queued
    # jobs. The first job is quick, so the next batch holds most of the rest, and one handler
    # early in it runs far past the hold with jobs queued behind it.
    rng = random.Random(seed)
    window, hold, slack = 0.05, 0.2, 0.15
    spans = [(0.0, 0.0), (0.0, 0.01), (0.01, 0.06), (0.17, 0.23), (0.45, 0.55)]
    durations = [rng.uniform(*rng.choices(spans, [3, 3, 3, 1.5, 1])[0]) for _ in range(12)]
    durations[0] = 0.0
    durations[rng.randrange(1, 4)] = rng.uniform(0.45, 0.55)
    ids = sleepy.enqueue_many([{"n": i, "seconds": d} for i, d in enumerate(durations)])
    settings.TENURE_CELERY_QUEUED_HOLD_SECONDS = hold
    c = _chain(window=window, seconds=60)
    assert c.run(_first()) == "succeeded"

    rows = list(
        Attempt.objects.filter(job_id__in=ids).values_list(
            "job_id", "fence", "outcome", "claimed_at"
        )
    )
    done = sorted((j, f) for j, f, outcome, _ in rows if outcome == "succeeded")
    assert [j for j, _ in done] == ids  # one accepted completion per job
    assert {outcome for _, _, outcome, _ in rows} <= {"succeeded", "released"}
    # Every job ran exactly once, under the attempt that succeeded: none given back ever ran.
    assert sorted(runs) == done
    assert sorted(c.succeeded) == ids
    log = event_log()
    ends = [(e["job"], e["fence"], e["outcome"]) for e in log if e["event"] == "end"]
    assert sorted(ends) == sorted((j, f, o) for j, f, o, _ in rows)  # one per attempt, once
    assert set(Job.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == {1}
    assert not StaleWrite.objects.exists()
    assert c.hb.active() == []

    # The window: a completion is committed (its end event) within the window of its
    # handler's return, whatever runs next.
    committed = {(e["job"], e["fence"]): e["t"] for e in log if e["event"] == "end"}
    late = {k: round(committed[k] - timing[k][1], 3) for k in done}
    assert {k: w for k, w in late.items() if w > window + slack} == {}, durations
    # The hold: no job started after waiting, claimed, across a handler longer than the hold.
    claimed = {(j, f): at.timestamp() for j, f, _, at in rows}
    held = [
        (k, h, round(he - hs, 3))
        for k in done
        for h, (hs, he) in timing.items()
        if h != k and claimed[k] <= hs and he <= timing[k][0] and he - hs > hold + slack
    ]
    assert held == [], durations


def test_once_stopping_the_chain_claims_nothing_and_gives_back_what_it_had_not_started(
    monkeypatch: pytest.MonkeyPatch, event_log: Callable[[], list[Any]]
) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(6)])
    stop = threading.Event()
    real = attempt.run_lease

    def then_stop(lease: Lease, **kw: Any) -> str:
        out = real(lease, **kw)
        if lease.job_id == ids[2]:
            stop.set()  # the worker begins to shut down while job 2 runs
        return out

    monkeypatch.setattr(chain, "run_lease", then_stop)
    c = _chain(stopping=stop.is_set)
    c.run(_first())
    assert ran == [0, 1, 2]
    assert c.succeeded == ids[:3]
    states = dict(Job.objects.filter(pk__in=ids).values_list("id", "state"))
    assert [states[j] for j in ids] == ["succeeded"] * 3 + ["waiting"] * 3
    assert [_attempts(j) for j in ids[3:]] == [[(1, "released")]] * 3
    claims = [e["job"] for e in event_log() if e["event"] == "claim"]
    assert claims == ids  # the first, then one batch; nothing after the stop


# ---------------------------------------------------------------------------------------------
# A COMMIT that lands while its reply is lost
# ---------------------------------------------------------------------------------------------


def test_claims_made_with_refused_completions_stand_when_the_commit_reply_is_lost(
    monkeypatch: pytest.MonkeyPatch, commit_reply_lost: Callable[[], None]
) -> None:
    ids = ok.enqueue_many([{"n": i} for i in range(4)])
    real = attempt.run_lease

    def taken_over(lease: Lease, **kw: Any) -> str:
        out = real(lease, **kw)
        if lease.job_id == ids[0]:
            # Its completion will be refused; the statement that refuses it claims jobs 1-3,
            # and the reply to its COMMIT is lost.
            Job.objects.filter(pk=lease.job_id).update(fence=lease.fence + 1, lease_owner="x")
            commit_reply_lost()
        return out

    monkeypatch.setattr(chain, "run_lease", taken_over)
    c = _chain()
    c.run(_first())
    # Read back: the transaction committed, so its claims stand and their jobs ran.
    assert ran == [0, 1, 2, 3]
    assert c.succeeded == ids[1:]
    assert [_attempts(j) for j in ids[1:]] == [[(1, "succeeded")]] * 3
    assert StaleWrite.objects.filter(job_id=ids[0], write="complete").count() == 1


def test_a_claim_alone_stands_when_its_commit_reply_is_lost(
    monkeypatch: pytest.MonkeyPatch, commit_reply_lost: Callable[[], None]
) -> None:
    first = tx.enqueue(n=0).pk
    rest = ok.enqueue_many([{"n": i} for i in (1, 2, 3)])
    real = attempt.run_lease

    def then_lose(lease: Lease, **kw: Any) -> str:
        out = real(lease, **kw)
        if lease.job_id == first:
            # The transactional job committed with its handler: nothing waits, so the next
            # claim is made alone, and the reply to its commit is lost.
            commit_reply_lost()
        return out

    monkeypatch.setattr(chain, "run_lease", then_lose)
    c = _chain()
    assert c.run(_first()) == "succeeded"
    assert ran == [0, 1, 2, 3]
    assert c.succeeded == rest
    assert [_attempts(j) for j in [first, *rest]] == [[(1, "succeeded")]] * 4


def test_a_completion_refused_while_an_effect_is_unknown_ends_under_the_effect_mode(
    events: Callable[[], list[tuple[int, str]]],
) -> None:
    idem = swallow_idem.enqueue(n=0).pk
    amo = swallow_amo.enqueue(n=1).pk
    fine = ok.enqueue(n=2).pk
    c = _chain()
    c.run(_first())
    assert ran == [0, 1, 2]
    # The handlers returned, but their effect may or may not have happened: never succeeded.
    assert c.succeeded == [fine]
    states = dict(Job.objects.values_list("id", "state"))
    # Idempotent: retried under the same key; at most once: parked for an operator.
    assert (states[idem], states[amo], states[fine]) == ("waiting", "indeterminate", "succeeded")
    assert _attempts(idem) == [(1, "retried")]
    assert _attempts(amo) == [(1, "indeterminate")]
    assert set(Effect.objects.values_list("state", flat=True)) == {"unknown"}
    assert events() == [(idem, "retried"), (amo, "indeterminate"), (fine, "succeeded")]
    assert not StaleWrite.objects.exists()
    assert c.hb.active() == []
