"""How a handler is called (``scheduler_core/runtime/invoke.py``) and what registration refuses,
without a database: an ``async def`` handler is awaited to its end on its attempt thread's own
event loop, kept from one attempt to the next; its thread-sensitive calls run on the attempt's
thread (where its database connection lives); it is cancelled when the attempt is lost or
reaches its maximum runtime, and so are the tasks it left running; a function that cannot be
run to its end (a generator, a plain wrapper around an ``async def``) is refused when it is
registered.

Each test fails on the code before ``async def`` handlers were awaited: the attempt called the
handler and took the coroutine it returned for a result, and registration accepted all of
these."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, markcoroutinefunction, sync_to_async

from scheduler_core import job
from scheduler_core.domain.options import JobOptions
from scheduler_core.exceptions import AttemptOverrun, StaleAttempt
from scheduler_core.runtime import invoke as invoke_mod
from scheduler_core.runtime.context import JobContext
from scheduler_core.runtime.invoke import CoroutineCancelled, invoke
from scheduler_core.storage.records import Lease


def _ctx(*, timeout: float = 0.0) -> JobContext:
    return JobContext(
        Lease(
            job_id=1,
            fence=1,
            attempt=1,
            attempt_id=1,
            kind="run",
            created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            executor="t:1:unit",
            granted_at=time.monotonic() if timeout else 0.0,
            options=JobOptions(
                name="tests.unit.invoke",
                queue="default",
                payload={},
                lease_seconds=30,
                effect="at_least_once",
                max_attempts=1,
                timeout_seconds=timeout,
            ),
        )
    )


def test_a_coroutine_and_its_thread_sensitive_calls_run_on_the_attempt_thread() -> None:
    body: list[Any] = []

    def where() -> tuple[int, bool]:
        # Django refuses its synchronous database calls where an event loop runs.
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return threading.get_ident(), False
        return threading.get_ident(), True

    async def handler(ctx: JobContext, *, n: int) -> int:
        body.append(threading.get_ident())
        body.append(await sync_to_async(where)())
        return n * 2

    assert invoke(handler, _ctx(), n=21) == 42
    assert body == [threading.get_ident(), (threading.get_ident(), False)]


def test_async_to_sync_inside_a_thread_sensitive_call_and_after_an_attempt_works() -> None:
    async def inner() -> str:
        return "inner"

    def legacy() -> str:
        # A synchronous helper that bridges back (as channels' group_send users write).
        return async_to_sync(inner)()

    async def handler(ctx: JobContext) -> str:
        return await sync_to_async(legacy)()

    assert invoke(handler, _ctx()) == "inner"
    # A plain handler on the same thread afterwards: its async_to_sync must not wait on the
    # attempt's loop, which no longer runs.
    assert invoke(lambda ctx: legacy(), _ctx()) == "inner"


def test_each_attempt_thread_keeps_one_event_loop_from_one_attempt_to_the_next() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def handler(ctx: JobContext) -> None:
        loops.append(asyncio.get_running_loop())

    def two_attempts() -> None:
        invoke(handler, _ctx())
        invoke(handler, _ctx())

    two_attempts()
    t = threading.Thread(target=two_attempts)
    t.start()
    t.join()
    assert loops[0] is loops[1] and loops[2] is loops[3] and loops[0] is not loops[2]


def test_a_plain_function_that_returns_a_coroutine_has_it_awaited() -> None:
    ran: list[str] = []

    async def real(ctx: JobContext) -> str:
        ran.append("body")
        return "done"

    assert invoke(lambda ctx: real(ctx), _ctx()) == "done"
    assert ran == ["body"]


def test_a_coroutine_past_its_maximum_runtime_is_cancelled_and_cleans_up() -> None:
    seen: list[str] = []

    async def handler(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(10)
            seen.append("after")
        finally:
            seen.append("finally")

    began = time.monotonic()
    with pytest.raises(AttemptOverrun):
        invoke(handler, _ctx(timeout=0.3))
    assert time.monotonic() - began < 5
    assert seen == ["finally"]


def test_a_coroutine_is_cancelled_when_its_attempt_is_lost_from_another_thread() -> None:
    seen: list[str] = []
    ctx = _ctx()
    threading.Timer(0.2, ctx.mark_lost, args=("lease taken over (test)",)).start()

    async def handler(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(StaleAttempt) as refused:
        invoke(handler, ctx)
    assert not isinstance(refused.value, AttemptOverrun)
    assert seen == ["cancelled"]


def test_a_lost_attempt_does_not_start_its_coroutine() -> None:
    ctx = _ctx()
    ctx.mark_lost("lease taken over (test)")
    started: list[bool] = []

    async def handler(ctx: JobContext) -> None:
        started.append(True)

    with pytest.raises(StaleAttempt):
        invoke(handler, ctx)
    assert started == []


def test_a_coroutine_that_swallows_its_cancellation_still_ends_as_a_lost_attempt() -> None:
    ctx = _ctx()
    threading.Timer(0.2, ctx.mark_lost, args=("lease taken over (test)",)).start()

    async def stubborn(ctx: JobContext) -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return "finished anyway"

    with pytest.raises(StaleAttempt):
        invoke(stubborn, ctx)


def test_tasks_a_coroutine_left_running_are_cancelled_when_it_returns() -> None:
    seen: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            seen.append("background stopped")

    async def handler(ctx: JobContext) -> None:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0)

    invoke(handler, _ctx())
    assert seen == ["background stopped"]


def test_a_coroutine_cancelled_by_its_own_code_raises_an_ordinary_exception() -> None:
    async def handler(ctx: JobContext) -> None:
        raise asyncio.CancelledError

    with pytest.raises(CoroutineCancelled):
        invoke(handler, _ctx())


def test_a_forked_child_makes_its_own_loop_and_leaves_the_inherited_one_alone() -> None:
    mine = invoke_mod._thread_loop()
    assert mine.usable() and invoke_mod._thread_loop() is mine
    mine.pid = -1  # as in a child forked from this process, whose selector is its parent's
    assert invoke_mod._thread_loop() is not mine
    # Kept open: closing it would take its wake-up pipe off the selector it shares with the
    # parent's loop.
    assert not mine.is_closed() and mine in invoke_mod._inherited


async def _agen(ctx: Any) -> Any:
    yield 1


def _gen(ctx: Any) -> Any:
    yield 1


async def _coro(ctx: Any) -> None:
    return None


@functools.wraps(_coro)
def _plain_wrapper(ctx: Any) -> Any:
    return _coro(ctx)


class _AsyncCallable:
    async def __call__(self, ctx: Any) -> None:
        return None


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (_agen, "an async generator function"),
        (_gen, "a generator function"),
        (functools.partial(_agen), "an async generator function"),
        (_plain_wrapper, "a plain function wrapping the async def"),
    ],
)
def test_registration_refuses_what_could_be_called_but_not_run_to_its_end(
    fn: Any, says: str
) -> None:
    for what, register in (
        ("the handler", lambda: job(name="tests.unit.invoke.bad")(fn)),
        ("the fallback", lambda: job(name="tests.unit.invoke.bad", fallback=fn)(_coro)),
        (
            "the reconcile function",
            lambda: job(name="tests.unit.invoke.bad", effect="reconcilable", reconcile=fn)(_coro),
        ),
    ):
        with pytest.raises(ValueError, match=f"{what} is {says}"):
            register()


def test_registration_accepts_every_kind_of_coroutine_function() -> None:
    # A plain wrapper that only returns the coroutine, marked as one (asgiref's marker works
    # on every Python Tenure supports; inspect's from 3.12).
    marked = markcoroutinefunction(functools.wraps(_coro)(lambda ctx: _coro(ctx)))
    for n, fn in enumerate([_coro, functools.partial(_coro), _AsyncCallable(), marked]):
        job(name=f"tests.unit.invoke.ok{n}")(fn)
