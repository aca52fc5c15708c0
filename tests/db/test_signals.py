"""Tenure's Django signals (``scheduler_core.signals``): each is sent once what it announces
has committed, outside the enqueue's, the claim's and the completion's transaction; none is
sent for a completion the database refused as stale; a receiver that raises is logged and
breaks nothing. Through the executor's path and the real database, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from scheduler_core import job, signals
from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Effect, Job
from scheduler_core.runtime import worker
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "signals"
EXEC = "t:1:signals"


@job(name="tests.signals.charge", queue=Q, effect="idempotent", max_attempts=3)
def charge(ctx: Any) -> None:
    with ctx.effect("charge"):
        pass


@job(name="tests.signals.booked", queue=Q, effect="transactional")
def booked(ctx: Any) -> None:
    with ctx.effect("ledger-line"):
        pass


@job(name="tests.signals.flaky", queue=Q, max_attempts=3)
def flaky(ctx: Any) -> None:
    raise RuntimeError("provider busy")


@job(name="tests.signals.other", queue=Q)
def other(ctx: Any) -> None:
    """Nothing."""


class Heard:
    """Every signal sent, in order, with what the database said when it was: whether a
    transaction was open on Tenure's connection and the job's state."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, signal: Any, sender: Any, **kw: Any) -> None:
        name = next(n for n in NAMES if getattr(signals, n) is signal)
        self.calls.append(
            {
                "signal": name,
                "sender": sender,
                "in_transaction": connection.in_atomic_block,
                "job_state": Job.objects.filter(pk=kw["job_id"])
                .values_list("state", flat=True)
                .first(),
                **kw,
            }
        )

    def names(self, job_id: int | None = None) -> list[str]:
        return [
            c["signal"]
            + (f":{c['outcome']}" if "outcome" in c else "")
            + (f":{c['state']}" if c["signal"] == "effect_recorded" else "")
            for c in self.calls
            if job_id is None or c["job_id"] == job_id
        ]


NAMES = ("job_enqueued", "attempt_started", "attempt_finished", "job_finished", "effect_recorded")


@pytest.fixture
def heard() -> Iterator[Heard]:
    h = Heard()
    receivers = []
    for n in NAMES:

        def receiver(sender: Any, signal: Any, _h: Heard = h, **kw: Any) -> None:
            _h(signal, sender, **kw)

        getattr(signals, n).connect(receiver, weak=False, dispatch_uid=f"test-{n}")
        receivers.append(n)
    yield h
    for n in receivers:
        getattr(signals, n).disconnect(dispatch_uid=f"test-{n}")


def _run_one(job_id: int) -> str:
    [lease] = driver().claim(executor=EXEC, job_id=job_id)
    return run_lease(lease)


def test_a_job_that_succeeds_sends_each_signal_once_in_order(heard: Heard) -> None:
    j = charge.enqueue()
    assert _run_one(j.pk) == "succeeded"
    assert heard.names() == [
        "job_enqueued",
        "attempt_started",
        "effect_recorded:intended",
        "effect_recorded:applied",
        "attempt_finished:succeeded",
        "job_finished:succeeded",
    ]
    fence = Job.objects.get(pk=j.pk).fence
    finished = heard.calls[-1]
    assert finished["sender"] is charge
    assert {k: finished[k] for k in ("name", "queue", "attempt", "fence", "kind", "state")} == {
        "name": "tests.signals.charge",
        "queue": Q,
        "attempt": 1,
        "fence": fence,
        "kind": "run",
        "state": "succeeded",
    }
    assert finished["error"] is None
    effect = Effect.objects.get(job_id=j.pk)
    assert heard.calls[3]["key"] == effect.key and heard.calls[3]["effect"] == "charge"


def test_every_signal_is_sent_after_its_write_committed(heard: Heard) -> None:
    j = charge.enqueue()
    _run_one(j.pk)
    assert [c["in_transaction"] for c in heard.calls] == [False] * len(heard.calls)
    by_name = {c["signal"]: c for c in heard.calls}
    assert by_name["job_enqueued"]["job_state"] == "waiting"
    assert by_name["attempt_started"]["job_state"] == "leased"
    assert by_name["attempt_finished"]["job_state"] == "succeeded"


def test_enqueue_in_a_transaction_is_announced_at_its_commit_and_never_on_rollback(
    heard: Heard,
) -> None:
    with transaction.atomic():
        kept = other.enqueue()
        assert heard.names() == []
    assert heard.names(kept.pk) == ["job_enqueued"]
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        other.enqueue()
        1 / 0  # noqa: B018
    assert heard.names() == ["job_enqueued"]
    again = other.enqueue(unique_key="once")
    assert other.enqueue(unique_key="once").pk == again.pk
    assert heard.names(again.pk) == ["job_enqueued"]  # the second enqueue accepted nothing


def test_each_step_of_a_workflow_is_announced_once_at_the_workflow_s_commit(
    heard: Heard,
) -> None:
    from scheduler_core import workflow

    with transaction.atomic():
        wf = workflow("tests.signals.flow", unique_key="flow-1")
        first = wf.step(charge)
        wf.step(other, after=[first])
        jobs = wf.enqueue().jobs
        assert heard.names() == []
    assert sorted((c["job_id"], c["sender"]) for c in heard.calls) == sorted(
        [(jobs["tests.signals.charge"], charge), (jobs["tests.signals.other"], other)]
    )
    assert {c["in_transaction"] for c in heard.calls} == {False}
    # The same unique key again accepts nothing and announces nothing.
    workflow("tests.signals.flow", unique_key="flow-1").step(charge).builder.enqueue()
    assert len(heard.calls) == 2


def test_a_transactional_job_s_effect_is_announced_after_the_job_s_transaction_commits(
    heard: Heard,
) -> None:
    j = booked.enqueue()
    assert _run_one(j.pk) == "succeeded"
    effects = [c for c in heard.calls if c["signal"] == "effect_recorded"]
    assert [e["state"] for e in effects] == ["intended", "applied"]
    # Sent at the commit that wrote the ledger row and the completion together.
    assert {(e["in_transaction"], e["job_state"]) for e in effects} == {(False, "succeeded")}


def test_a_retry_then_a_failure_send_their_outcomes_and_the_job_finishes_once(
    heard: Heard,
) -> None:
    j = flaky.enqueue()
    assert _run_one(j.pk) == "retried"
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=1))
    assert _run_one(j.pk) == "retried"
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=1))
    assert _run_one(j.pk) == "failed"
    ends = [c for c in heard.calls if c["signal"] in ("attempt_finished", "job_finished")]
    assert [(c["signal"], c["attempt"], c["outcome"], c["state"]) for c in ends] == [
        ("attempt_finished", 1, "retried", "waiting"),
        ("attempt_finished", 2, "retried", "waiting"),
        ("attempt_finished", 3, "failed", "failed"),
        ("job_finished", 3, "failed", "failed"),
    ]
    assert all(isinstance(c["error"], RuntimeError) for c in ends)


def test_no_attempt_finished_when_the_completion_was_refused_as_stale(heard: Heard) -> None:
    other.enqueue()
    [old] = driver().claim(executor=EXEC, queues=[Q])
    # The lease is lost: the reaper moves the job on and another executor claims it.
    Job.objects.filter(pk=old.job_id).update(lease_expires_at=driver().now())
    assert reaper.reap_once()["reap_retry"] == 1
    [new] = driver().claim(executor="t:2:signals", queues=[Q])
    heard.calls.clear()
    assert run_lease(old) == "stale"
    assert heard.names() == ["attempt_started"]
    driver().finish(new, Decision(transition=states.COMPLETE, reason="done"), outcome="succeeded")
    assert Job.objects.get(pk=new.job_id).state == "succeeded"


def test_a_receiver_that_raises_is_logged_and_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(sender: Any, **kw: Any) -> None:
        raise LookupError("the receiver's own bug")

    for n in NAMES:
        getattr(signals, n).connect(broken, weak=False, dispatch_uid=f"broken-{n}")
    try:
        caplog.set_level(logging.ERROR, logger="django.dispatch")
        j = charge.enqueue()
        assert _run_one(j.pk) == "succeeded"
    finally:
        for n in NAMES:
            getattr(signals, n).disconnect(dispatch_uid=f"broken-{n}")
    assert Job.objects.get(pk=j.pk).state == "succeeded"
    errors = [r for r in caplog.records if r.name == "django.dispatch"]
    assert len(errors) == 6  # enqueued, started, two effects, finished, job finished
    assert all(r.exc_info and r.exc_info[0] is LookupError for r in errors)


def test_completions_written_together_are_announced_once_committed(heard: Heard) -> None:
    ids = other.enqueue_many([{}, {}, {}])
    worker.Worker(
        queues=[Q], concurrency=3, burst=True, poll_interval=0.05, group_commit=True
    ).run()
    finished = [c for c in heard.calls if c["signal"] == "attempt_finished"]
    assert sorted(c["job_id"] for c in finished) == sorted(ids)
    assert {(c["outcome"], c["job_state"], c["in_transaction"]) for c in finished} == {
        ("succeeded", "succeeded", False)
    }
    assert sorted(c["job_id"] for c in heard.calls if c["signal"] == "job_enqueued") == sorted(ids)


def test_an_attempt_the_reaper_ended_is_announced_with_lease_expired(heard: Heard) -> None:
    j = other.enqueue()
    [lease] = driver().claim(executor=EXEC, queues=[Q])
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now())
    heard.calls.clear()
    assert reaper.reap_once()["reap_retry"] == 1
    [c] = heard.calls
    assert (c["signal"], c["outcome"], c["state"], c["fence"]) == (
        "attempt_finished",
        "lease_expired",
        "waiting",
        lease.fence,
    )
    assert c["sender"] is other and not c["in_transaction"]
