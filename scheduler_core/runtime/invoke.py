"""Calling a handler, plain or ``async def``, under its attempt's limits: the one place an
attempt calls code of the application's (the handler, a fallback, a reconcile function).

A plain function is called on the attempt's thread, as it always was. An ``async def``
function (or a plain one that returned an awaitable) is run to its end on the same thread, on
an event loop that belongs to it (made on its first ``async def`` handler and kept for the
next). Its thread-sensitive calls — asgiref's ``sync_to_async``, the default, which Django's
async ORM methods use — run inline on that thread while the loop waits for them, so its
database work uses the attempt's own connection: in a ``transactional`` job, inside the job's
transaction, committed with the fenced completion or rolled back with it;
``async with ctx.effect(...)`` writes the ledger the same way. No second thread takes part, so
an ``async def`` handler costs a job about what a plain one does (``make bench``, the async
comparison). One consequence: while a thread-sensitive call runs, the attempt's other tasks
wait; blocking I/O that should overlap them belongs in ``sync_to_async(...,
thread_sensitive=False)`` or ``asyncio.to_thread``.

The coroutine is cancelled (``asyncio.CancelledError`` raised at its ``await``, its
``finally`` blocks and ``async with`` exits run) when the attempt is lost — its lease refused
or not renewed in time, the executor giving it up on shutdown — and when the attempt reaches
its maximum runtime (``timeout``) by this process's monotonic clock, counted like the
heartbeat's from the claim. The attempt then ends as a stale one (:class:`StaleAttempt`, or
:class:`AttemptOverrun` past the maximum runtime), exactly as the same handler written plain
would once its late writes were refused; tasks the coroutine started and left running are
cancelled with it. Code that blocks the loop without awaiting cannot be interrupted, as a
plain handler's thread cannot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import os
import selectors
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVarTuple

from asgiref.sync import AsyncToSync, SyncToAsync

from ..api.registry import is_async
from ..exceptions import AttemptOverrun, StaleAttempt
from .context import JobContext

log = logging.getLogger("tenure.executor")

_Ts = TypeVarTuple("_Ts")

CANCELLED_WRITE = "async handler cancelled"
"""What the refusal records (``StaleWrite.write``) when Tenure cancelled a coroutine."""


class CoroutineCancelled(RuntimeError):
    """An ``async def`` handler's coroutine ended cancelled by code of its own, not by Tenure:
    classified like any other error (transient, bounded; indeterminate once an effect's
    outcome is unknown)."""


def invoke(func: Callable[..., Any], ctx: JobContext, /, *args: Any, **kwargs: Any) -> Any:
    """Call ``func(ctx, *args, **kwargs)`` for ``ctx``'s attempt and return its result; an
    ``async def`` ``func`` is awaited to its end (see the module's docstring).

    Raises what ``func`` raised; :class:`StaleAttempt` when Tenure cancelled the coroutine
    because the attempt was lost, :class:`AttemptOverrun` when it reached its maximum runtime.
    """
    if is_async(func):
        return _await(lambda: func(ctx, *args, **kwargs), ctx)
    result = func(ctx, *args, **kwargs)
    if inspect.isawaitable(result):
        # A plain function that hands back a coroutine (a lambda, a wrapper registration could
        # not see through): its work is the coroutine, so it is awaited like an async def's.
        try:
            return _await(lambda: result, ctx)
        finally:
            if inspect.iscoroutine(result):
                result.close()  # never started (the attempt was lost): no "never awaited"
    return result


class _AttemptLoop(asyncio.SelectorEventLoop):
    """The event loop of one attempt thread, run on that thread for one coroutine at a time
    (:meth:`run`). The coroutine's thread-sensitive calls run inline, on this thread, while the
    loop waits for them (:class:`_Inline`)."""

    def __init__(self) -> None:
        super().__init__(_SparseSelector())
        self.pid = os.getpid()
        self.thread_id = threading.get_ident()
        self.inline = 0
        """How many thread-sensitive calls are running inline now (nested ones count)."""
        self.executor = _Inline(self)

    def usable(self) -> bool:
        # A forked child must not share its parent's selector.
        return self.pid == os.getpid() and not self.is_closed()

    def call_soon_threadsafe(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if threading.get_ident() == self.thread_id:
            if self.inline:
                # Code running inline asked for a coroutine to run on this loop and will wait
                # for it (a nested async_to_sync): the loop cannot run while it waits.
                # Refused, asgiref runs that coroutine on a loop of its own in another thread.
                raise RuntimeError("the attempt's event loop is waiting for this thread")
            # On the loop's own thread (a thread-sensitive call's result handed back): the
            # loop runs it at its next turn without being woken.
            return self.call_soon(callback, *args, context=context)
        return super().call_soon_threadsafe(callback, *args, context=context)

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` to its end here, its thread-sensitive calls inline."""
        local = SyncToAsync.threadlocal
        old_loop = getattr(local, "main_event_loop", None)
        old_pid = getattr(local, "main_event_loop_pid", None)
        old_executor = getattr(AsyncToSync.executors, "current", None)
        # sync_to_async (thread-sensitive) hands its call to the executor that asgiref's
        # AsyncToSync leaves for it in the calling context: this loop's, which runs it inline.
        AsyncToSync.executors.current = self.executor
        try:
            return self.run_until_complete(coroutine)
        finally:
            AsyncToSync.executors.current = old_executor
            # asgiref notes the loop of the last thread-sensitive call as this thread's; this
            # loop does not run between attempts, so a later async_to_sync must not wait on it.
            local.main_event_loop = old_loop
            local.main_event_loop_pid = old_pid


class _SparseSelector(selectors.DefaultSelector):
    """The loop's selector, which skips asking the system when the loop only wants to know
    what is ready now (it has callbacks to run) and nothing but the loop's own wake-up pipe is
    registered: the ask is a system call that lets go of the GIL, and an attempt thread that
    lets go of it between two steps of a coroutine waits for it again behind the process's
    other threads (the broker-less executor then writes its completions in smaller groups).
    Callbacks from other threads do not depend on it: they are queued with the ready ones."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0 and len(self.get_map()) <= 1:
            return []
        return list(super().select(timeout))


class _Inline(concurrent.futures.Executor):
    """Runs a thread-sensitive call at once, on the attempt's thread (the loop's own), as if no
    loop ran there: Django allows its synchronous database calls only outside a running loop,
    and this call is the loop's own work, which the loop waits for."""

    def __init__(self, loop: _AttemptLoop) -> None:
        self.loop = loop

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        running = asyncio._get_running_loop()
        asyncio._set_running_loop(None)
        self.loop.inline += 1
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread would
            done.set_exception(exc)
        finally:
            self.loop.inline -= 1
            asyncio._set_running_loop(running)
        return done


class _Owned:
    """A thread's loop, in that thread's own storage: closed when the thread has ended (its
    storage freed)."""

    def __init__(self, loop: _AttemptLoop) -> None:
        self.loop = loop

    def __del__(self) -> None:
        if self.loop.pid == os.getpid() and not self.loop.is_running():
            self.loop.close()


_local = threading.local()
_inherited: list[_AttemptLoop] = []
"""Loops a forked child inherited: kept, never closed, since closing one would take its
wake-up pipe off the selector it shares with its parent's."""


def _thread_loop() -> _AttemptLoop:
    """This thread's event loop (made on first use, and again in a forked child)."""
    mine: _Owned | None = getattr(_local, "owned", None)
    if mine is None or not mine.loop.usable():
        if mine is not None and mine.loop.pid != os.getpid():
            _inherited.append(mine.loop)
        mine = _local.owned = _Owned(_AttemptLoop())
    return mine.loop


def _await(make: Callable[[], Awaitable[Any]], ctx: JobContext) -> Any:
    return _thread_loop().run(_supervised(make, ctx))


def _deadline(ctx: JobContext) -> float | None:
    """The attempt's maximum runtime's end by this process's monotonic clock, counted from
    the claim as the heartbeat counts it (None when the lease does not say)."""
    lease = ctx.lease
    if not lease.timeout_seconds or not lease.granted_at:
        return None
    return lease.granted_at + lease.timeout_seconds


class _Stop:
    """Cancels one coroutine's task, once, and says why (in the loop's thread)."""

    def __init__(self, task: asyncio.Task[Any], ctx: JobContext, deadline: float | None) -> None:
        self.task = task
        self.ctx = ctx
        self.deadline = deadline
        self.why = ""
        self.finished = False

    def overrun(self) -> None:
        self._cancel("overrun")

    def lost(self) -> None:
        overrun = self.deadline is not None and time.monotonic() >= self.deadline
        self._cancel("overrun" if overrun else "lost")

    def _cancel(self, why: str) -> None:
        if self.finished or self.why:
            return
        self.why = why
        log.warning(
            "job %s fence %s: cancelling the async handler (%s)",
            self.ctx.job_id,
            self.ctx.fence,
            "past its maximum runtime" if why == "overrun" else self.ctx.lost_reason,
        )
        self.task.cancel()

    def error(self) -> StaleAttempt:
        lease = self.ctx.lease
        if self.why == "overrun":
            return AttemptOverrun(lease.job_id, lease.fence, CANCELLED_WRITE)
        return StaleAttempt(lease.job_id, lease.fence, CANCELLED_WRITE)


async def _supervised(make: Callable[[], Awaitable[Any]], ctx: JobContext) -> Any:
    """Await ``make()`` in this task, cancelling it when the attempt is lost or overruns."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    deadline = _deadline(ctx)
    stop = _Stop(task, ctx, deadline)
    if ctx.lost or (deadline is not None and time.monotonic() >= deadline):
        stop.lost()
        raise stop.error()  # never started: nothing to cancel

    def from_other_thread() -> None:
        try:
            loop.call_soon_threadsafe(stop.lost)
        except RuntimeError:  # the loop is closed or this thread's inline call: none to stop
            if threading.get_ident() == getattr(loop, "thread_id", None):
                stop.lost()

    timer = loop.call_later(deadline - time.monotonic(), stop.overrun) if deadline else None
    withdraw = ctx.when_lost(from_other_thread)
    try:
        result = await make()
    except BaseException as exc:
        if stop.why:
            # Whatever the coroutine made of its cancellation, its attempt has lost the right
            # to act: it ends as a stale attempt, as its refused writes would end it.
            raise stop.error() from exc
        if isinstance(exc, asyncio.CancelledError):
            raise CoroutineCancelled(
                f"job {ctx.job_id}: the handler's coroutine was cancelled by its own code"
            ) from exc
        raise
    finally:
        stop.finished = True
        withdraw()
        if timer is not None:
            timer.cancel()
        await _cancel_leftovers(task)
    if stop.why:
        raise stop.error()
    return result


async def _cancel_leftovers(current: asyncio.Task[Any]) -> None:
    """Cancel the tasks the coroutine started and left running (the loop runs one attempt at
    a time, so every other task on it is the attempt's), and wait for them to end, as
    ``asyncio.run`` does: nothing an attempt started runs on after it."""
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if not left:
        return
    for t in left:
        t.cancel()
    await asyncio.gather(*left, return_exceptions=True)
