"""``django.tasks`` tasks for the TenureBackend tests (registered on import; child processes
import them via ``TENURE_JOB_MODULES``)."""

from __future__ import annotations

import math
from typing import Any

from scheduler_core import Indeterminate
from scheduler_core.backends import tenure_options

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def add(a: int, b: int, *, scale: int = 1) -> int:
    """Positional and keyword arguments, a JSON return value."""
    return (a + b) * scale


@task()
def nested(n: int) -> dict[str, Any]:
    return {"n": n, "squares": [i * i for i in range(n)], "pair": (n, "x")}


@task()
def returns_nothing() -> None:
    return None


@task()
@tenure_options(max_attempts=3)
def returns_a_set() -> Any:
    """Not JSON: refused, and not retried although three attempts are allowed."""
    return {1, 2}


@task()
@tenure_options(max_attempts=3)
def returns_nan() -> float:
    return math.nan


@task()
@tenure_options(max_attempts=3)
def returns_text(n: int) -> str:
    return "x" * n


@task()
@tenure_options(max_attempts=2)
def fails() -> None:
    raise ValueError("boom")


@task()
@tenure_options(effect="at_most_once")
def reply_lost() -> None:
    raise Indeterminate("the reply never came")


@task()
@tenure_options(
    max_attempts=1, lease_seconds=7, timeout=60, unique_key=lambda order: f"order-{order}"
)
def once_per_order(order: int) -> int:
    return order


@task()
@tenure_options(effect="transactional")
def transactional_total(values: list[int]) -> int:
    """Its return value commits with its completion, in one transaction."""
    return sum(values)


@task(takes_context=True)
def with_context(context: Any, x: int) -> dict[str, Any]:
    return {
        "job": context.tenure.job_id,
        "fence": context.tenure.fence,
        "attempt": context.attempt,
        "status": str(context.task_result.status),
        "x": x,
    }


@task()
async def async_add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
@tenure_options(effect="transactional")
async def async_counted(context: Any, account: str) -> dict[str, Any]:
    """An async task whose ORM write (Django's async ORM) commits with its completion."""
    from demo.models import LedgerEntry

    ctx = context.tenure
    await LedgerEntry.objects.acreate(
        account=account, cents=1, effect_key=account, job_id=ctx.job_id, fence=ctx.fence
    )
    return {"job": ctx.job_id, "rows": await LedgerEntry.objects.filter(account=account).acount()}


SLOW_TASK_STOPPED: list[str] = []


@task()
@tenure_options(timeout=0.5)
async def async_overrunning() -> None:
    """Sleeps past its maximum runtime: cancelled there, its ``finally`` runs."""
    import asyncio

    try:
        await asyncio.sleep(10)
        SLOW_TASK_STOPPED.append("woke up")
    finally:
        SLOW_TASK_STOPPED.append("finally")


@task(priority=50)
def urgent() -> str:
    return "urgent"


@task(priority=-50)
def whenever() -> str:
    return "whenever"


def plain(x: int) -> int:
    """Not a task here: a test makes it one on a backend of its own."""
    return x


def reconcilable() -> None:
    """Not a task: a test tries to make it a reconcilable one."""
