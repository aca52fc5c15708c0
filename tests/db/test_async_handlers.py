"""``async def`` handlers run with the same guarantees as plain ones: one table of behaviours
(success, a transient error retried, a permanent one failed, an ambiguous outcome inside an
effect, a snooze, a cooperative cancel, a transactional handler's writes committed with its
completion or rolled back with its failure) run once by a plain handler and once by an
``async def`` one, with the same end; and what only a coroutine allows: it is cancelled at its
maximum runtime and when its lease is lost (its ``finally`` runs, its body stops).

Every test that runs an ``async def`` handler fails on the code before handlers were awaited:
the executor called the handler, got a coroutine back, and recorded the job ``succeeded``."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from demo.models import LedgerEntry
from scheduler_core import Permanent, Snooze, Transient, job
from scheduler_core.api import registry
from scheduler_core.domain.outcomes import Reconciliation
from scheduler_core.models import Attempt, Effect, Job, StaleWrite
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.runtime.heartbeat import Heartbeater
from scheduler_core.runtime.invoke import CANCELLED_WRITE
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

Q = "async-handlers"
EXEC = "t:1:async"
HB = Heartbeater(EXEC, beat_executor=False)
ran: list[tuple[str, int, str]] = []
"""(flavour, job id, step) for every step a handler's body reached."""


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ran.clear()


def _request_cancel(job_id: int) -> None:
    """The operator's cancel request, as the dashboard makes it, then one lease renewal."""
    operator.operator_action(
        job_id,
        action="cancel_running",
        expected_version=Job.objects.get(pk=job_id).version,
        actor="olivia",
        reason="called off",
    )
    HB.tick(0.0)


def _step_sync(ctx: Any, step: str) -> None:
    ran.append(("sync", ctx.job_id, step))
    if step == "transient":
        raise Transient("the destination said: later")
    if step == "permanent":
        raise Permanent("the destination said: never")
    if step == "snooze":
        raise Snooze(60)
    if step == "effect":
        with ctx.effect("send") as eff:
            assert eff.key == ctx.effect_key("send")
    if step == "lost_reply":
        with ctx.effect("send"):
            raise TimeoutError("sent; no reply")
    if step == "ledger":
        LedgerEntry.objects.create(
            account="a", cents=1, effect_key="k", job_id=ctx.job_id, fence=ctx.fence
        )
    if step == "cancel":
        _request_cancel(ctx.job_id)
        ctx.check_cancelled()


async def _step_async(ctx: Any, step: str) -> None:
    ran.append(("async", ctx.job_id, step))
    await asyncio.sleep(0)  # a real suspension between the steps
    if step == "transient":
        raise Transient("the destination said: later")
    if step == "permanent":
        raise Permanent("the destination said: never")
    if step == "snooze":
        raise Snooze(60)
    if step == "effect":
        async with ctx.effect("send") as eff:
            assert eff.key == await ctx.aeffect_key("send")
    if step == "lost_reply":
        async with ctx.effect("send"):
            raise TimeoutError("sent; no reply")
    if step == "ledger":
        await LedgerEntry.objects.acreate(
            account="a", cents=1, effect_key="k", job_id=ctx.job_id, fence=ctx.fence
        )
    if step == "cancel":
        await sync_to_async(_request_cancel)(ctx.job_id)
        ctx.check_cancelled()


def _plain(ctx: Any, *, steps: list[str]) -> None:
    for step in steps:
        _step_sync(ctx, step)


async def _coroutine(ctx: Any, *, steps: list[str]) -> None:
    for step in steps:
        await _step_async(ctx, step)


HANDLERS = {"sync": _plain, "async": _coroutine}
for _mode in ("idempotent", "transactional"):
    for _flavour, _fn in HANDLERS.items():
        job(name=f"tests.async.{_mode}.{_flavour}", queue=Q, effect=_mode, max_attempts=3)(_fn)


def _claim(job_id: int) -> Lease:
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=job_id)
    return lease


def _run(mode: str, flavour: str, steps: list[str]) -> dict[str, Any]:
    """Run one attempt of a job of ``mode`` whose handler (of ``flavour``) walks ``steps``;
    everything that attempt left behind, the same for either flavour."""
    jt = registry.get(f"tests.async.{mode}.{flavour}")
    assert jt is not None
    pk = jt.enqueue(steps=steps).pk
    # HB renews the attempt when a step asks it to (the cancel).
    outcome = run_lease(_claim(pk), heartbeater=HB)
    row = Job.objects.get(pk=pk)
    return {
        "outcome": outcome,
        "state": row.state,
        "attempts_spent": row.attempts,
        "error_class": Attempt.objects.get(job_id=pk).error_class,
        "effects": sorted(Effect.objects.filter(job_id=pk).values_list("name", "state")),
        "ledger_rows": LedgerEntry.objects.filter(job_id=pk).count(),
        "steps_reached": [s for f, i, s in ran if i == pk and f == flavour],
    }


CASES: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "success": (
        "idempotent",
        ["body", "effect"],
        {"outcome": "succeeded", "state": "succeeded", "effects": [("send", "applied")]},
    ),
    "transient error: retried": (
        "idempotent",
        ["body", "transient"],
        {"outcome": "retried", "state": "waiting", "error_class": "transient"},
    ),
    "permanent error: failed": (
        "idempotent",
        ["body", "permanent"],
        {"outcome": "failed", "state": "failed", "error_class": "permanent"},
    ),
    "lost reply inside an effect: unknown, retried under the key": (
        "idempotent",
        ["lost_reply"],
        {
            "outcome": "retried",
            "state": "waiting",
            "error_class": "indeterminate",
            "effects": [("send", "unknown")],
        },
    ),
    "snooze: waits again, no attempt spent": (
        "idempotent",
        ["snooze"],
        {"outcome": "snoozed", "state": "waiting", "attempts_spent": 0},
    ),
    "cooperative cancel: cancelled": (
        "idempotent",
        ["body", "cancel", "body"],
        {"outcome": "cancelled", "state": "cancelled", "steps_reached": ["body", "cancel"]},
    ),
    "transactional: the handler's writes commit with the completion": (
        "transactional",
        ["ledger", "effect"],
        {"outcome": "succeeded", "ledger_rows": 1, "effects": [("send", "applied")]},
    ),
    "transactional: the handler's writes roll back with its failure": (
        "transactional",
        ["ledger", "effect", "transient"],
        {"outcome": "retried", "ledger_rows": 0, "effects": []},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_async_handler_ends_as_the_same_plain_handler_ends(case: str) -> None:
    mode, steps, expected = CASES[case]
    plain = _run(mode, "sync", steps)
    coroutine = _run(mode, "async", steps)
    assert coroutine == plain
    for key, value in expected.items():
        assert coroutine[key] == value, (key, coroutine)
    if "steps_reached" not in expected:
        assert coroutine["steps_reached"] == steps


@job(name="tests.async.five", queue=Q)
async def counted(ctx: Any, *, n: int) -> None:
    await asyncio.sleep(0)
    ran.append(("async", ctx.job_id, f"body {n}"))


def test_five_async_jobs_run_five_bodies() -> None:
    ids = [counted.enqueue(n=n).pk for n in range(5)]
    for pk in ids:
        assert run_lease(_claim(pk)) == "succeeded"
    assert sorted(s for _, _, s in ran) == [f"body {n}" for n in range(5)]
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == 5


timeline: dict[str, float] = {}


@job(name="tests.async.overrun", queue=Q, timeout=0.5, lease_seconds=30)
async def overrunning(ctx: Any) -> None:
    timeline["started"] = time.monotonic()
    try:
        await asyncio.sleep(10)
        ran.append(("async", ctx.job_id, "after the sleep"))
    finally:
        timeline["finally"] = time.monotonic()


def test_an_async_handler_past_its_maximum_runtime_is_cancelled_and_its_finally_runs() -> None:
    j = overrunning.enqueue()
    lease = _claim(j.pk)
    began = time.monotonic()
    assert run_lease(lease) == "stale"
    took = time.monotonic() - began
    assert took < 5, took  # cancelled at 0.5 s, not after the 10 s sleep
    assert "finally" in timeline and timeline["finally"] - timeline["started"] < 5
    assert ran == []  # the body after the await never ran
    refused = StaleWrite.objects.get(job_id=j.pk)
    assert refused.write == CANCELLED_WRITE
    # The job stays leased, past its deadline, until the reaper moves it on (as a plain
    # handler's would): nothing more was written for the attempt.
    row = Job.objects.get(pk=j.pk)
    assert (row.state, row.fence) == ("leased", lease.fence)


held = threading.Event()


@job(name="tests.async.hold", queue=Q, lease_seconds=30, effect="idempotent")
async def holding(ctx: Any) -> None:
    try:
        async with ctx.effect("send"):
            held.set()
            await asyncio.sleep(30)
        ran.append(("async", ctx.job_id, "after the effect"))
    finally:
        timeline["finally"] = time.monotonic()


def test_an_async_handler_whose_lease_is_lost_is_cancelled_and_writes_nothing_more() -> None:
    held.clear()
    j = holding.enqueue()
    lease = _claim(j.pk)
    hb = Heartbeater(EXEC, beat_executor=False)
    out: list[str] = []

    def attempt() -> None:
        try:
            out.append(run_lease(lease, heartbeater=hb))
        finally:
            connections.close_all()

    t = threading.Thread(target=attempt)
    t.start()
    assert held.wait(10)
    # The lease runs out by the database's clock; the reaper ends the attempt; the next
    # renewal is refused, which marks the attempt lost.
    Job.objects.filter(pk=j.pk).update(
        lease_expires_at=Job.objects.get(pk=j.pk).lease_expires_at - dt.timedelta(hours=1)
    )
    reaper.reap_once()
    lost_at = time.monotonic()
    hb.tick(0.0)
    t.join(10)
    assert not t.is_alive()
    assert out == ["stale"]
    assert timeline["finally"] - lost_at < 5
    assert ran == []
    # The effect's intent, opened before the lease was lost, stays in doubt: the attempt's
    # settle was refused as stale, so a later attempt treats the request as possibly sent.
    assert Effect.objects.get(job_id=j.pk).state in (Effect.INTENDED, Effect.UNKNOWN)
    assert StaleWrite.objects.filter(job_id=j.pk, write=CANCELLED_WRITE).exists()


async def _lookup(ctx: Any, effect: Any = None) -> str:
    ran.append(("async", ctx.job_id, f"asked about {effect.key}"))
    assert effect.key == await ctx.aeffect_key(effect.name)
    return Reconciliation.APPLIED.value


@job(name="tests.async.reconciled", queue=Q, effect="reconcilable", reconcile=_lookup)
async def charged(ctx: Any) -> None:
    async with ctx.effect("charge") as eff:
        if not eff.done:
            raise TimeoutError("sent; no reply")


def test_an_async_reconcile_function_is_awaited_and_its_answer_settles_the_effect() -> None:
    j = charged.enqueue()
    assert run_lease(_claim(j.pk)) == "retried"  # as a reconcile attempt, after the grace
    assert Job.objects.get(pk=j.pk).next_kind == "reconcile"
    Job.objects.filter(pk=j.pk).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    lease = _claim(j.pk)
    assert lease.kind == "reconcile"
    run_lease(lease)
    assert [s for _, _, s in ran] == [f"asked about {Effect.objects.get(job_id=j.pk).key}"]
    assert Effect.objects.get(job_id=j.pk).state == Effect.APPLIED
    # The job resumes: its next attempt finds the effect applied and skips it.
    Job.objects.filter(pk=j.pk).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    assert run_lease(_claim(j.pk)) == "succeeded"


@job(name="tests.async.sync_form", queue=Q, effect="idempotent")
async def sync_form(ctx: Any) -> None:
    with ctx.effect("send"):
        ran.append(("async", ctx.job_id, "inside"))


def test_the_plain_effect_form_in_an_async_handler_is_refused_with_a_clear_error() -> None:
    j = sync_form.enqueue()
    assert run_lease(_claim(j.pk)) == "failed"
    a = Attempt.objects.get(job_id=j.pk)
    assert "async with ctx.effect" in a.message
    assert ran == [] and not Effect.objects.filter(job_id=j.pk).exists()


@job(name="tests.async.self_cancelled", queue=Q, max_attempts=2)
async def self_cancelled(ctx: Any) -> None:
    raise asyncio.CancelledError


def test_a_coroutine_cancelled_by_its_own_code_is_an_ordinary_error_not_a_dead_thread() -> None:
    j = self_cancelled.enqueue()
    assert run_lease(_claim(j.pk)) == "retried"
    a = Attempt.objects.get(job_id=j.pk)
    assert a.error_type.endswith("CoroutineCancelled")
