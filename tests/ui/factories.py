"""Job states for dashboard tests, made through the real write seam.

Every job is enqueued through the registry, claimed with ``driver().claim`` and ended with
``driver().finish`` and a ``Decision``, exactly as an executor would, or by the reaper
(``reaper.reap``) once its lease ran out; nothing writes Job rows directly.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth import get_user_model

from admin_ui.permissions import grant
from scheduler_core import job
from scheduler_core.api import registry
from scheduler_core.domain import states
from scheduler_core.domain.classify import FailureClass
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Job
from scheduler_core.read import health
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Failure, Lease
from tests.conftest import wait_until

EXECUTOR = "ui-test-host:1:exec-ui"
OWNER = "ui-paused-host:7:exec-owner"
"""An earlier owner whose lease ran out: the reaper ends its attempt while it may still run."""
PASSWORD = "correct horse battery staple"
XSS = "<script>alert('x')</script>"


def _any(ctx: Any, **payload: Any) -> None:
    """Dashboard tests never run handlers; they drive the store directly."""


# One type per effect mode the dashboard must explain; registration is idempotent per module.
IDEMPOTENT = job(name="ui.charge", queue="billing", effect="idempotent", max_attempts=5)(_any)
AT_MOST_ONCE = job(name="ui.notify", queue="mail", effect="at_most_once", max_attempts=5)(_any)
AT_LEAST_ONCE = job(name="ui.sync", queue="default", effect="at_least_once", max_attempts=5)(_any)
SHORT_LEASE = job(
    name="ui.short", queue="default", effect="at_least_once", max_attempts=5, lease_seconds=1
)(_any)
# Reaped with an effect intent: at most once parks it; idempotent with no attempt left too.
SHORT_AT_MOST_ONCE = job(
    name="ui.short_notify", queue="mail", effect="at_most_once", max_attempts=5, lease_seconds=1
)(_any)
SHORT_IDEMPOTENT = job(
    name="ui.short_charge", queue="billing", effect="idempotent", max_attempts=1, lease_seconds=1
)(_any)
HANGS = job(name="ui.hang", queue="default", effect="at_least_once", timeout=0.2)(_any)
"""Overruns its 0.2 s maximum runtime while its 30 s lease is still valid."""


def user(username: str, *, operate: bool = False, view: bool = True) -> Any:
    """A dashboard user with the given permissions and the shared test password."""
    u = get_user_model().objects.create_user(username=username, password=PASSWORD)
    if view:
        grant(u, operate=operate)
    return u


def enqueue(name: str = "ui.sync", **kw: Any) -> Job:
    """A waiting job (``run_at`` and ``unique_key`` pass through)."""
    run_at = kw.pop("run_at", None)
    unique_key = kw.pop("unique_key", None)
    return registry.enqueue(name, kw, run_at=run_at, unique_key=unique_key)


def claim(j: Job, executor: str = EXECUTOR) -> Lease:
    """Claim exactly ``j`` (it must be due and waiting)."""
    leases = driver().claim(executor=executor, queues=[j.queue], job_id=j.pk)
    assert len(leases) == 1, f"job {j.pk} was not claimable"
    return leases[0]


def _failure(cls: FailureClass, message: str) -> Failure:
    return Failure(
        error_class=cls.value,
        error_type="DemoError",
        message=message,
        traceback=f"Traceback (most recent call last):\n  ...\nDemoError: {message}\n",
    )


def running(name: str = "ui.sync", **payload: Any) -> tuple[Job, Lease]:
    """A leased job with a valid lease."""
    j = enqueue(name, **payload)
    lease = claim(j)
    j.refresh_from_db()
    return j, lease


def succeeded(name: str = "ui.sync", **payload: Any) -> Job:
    """A job whose one attempt completed."""
    j, lease = running(name, **payload)
    driver().complete(lease)
    j.refresh_from_db()
    return j


def failed(name: str = "ui.sync", message: str = "card declined", **payload: Any) -> Job:
    """A job failed by a permanent error in its first attempt."""
    j, lease = running(name, **payload)
    driver().finish(
        lease,
        Decision(transition=states.FAIL, reason=f"permanent error: {message}"),
        outcome="failed",
        failure=_failure(FailureClass.PERMANENT, message),
    )
    j.refresh_from_db()
    return j


def indeterminate(
    name: str = "ui.charge",
    message: str = "timed out",
    *,
    effects: tuple[str, ...] = ("charge",),
    **payload: Any,
) -> Job:
    """A job parked after an ambiguous outcome, with effect intents the ledger calls unknown."""
    j, lease = running(name, **payload)
    for effect in effects:
        driver().effect_intend(lease, effect)
    driver().finish(
        lease,
        Decision(transition=states.PARK, reason=f"indeterminate: {message}"),
        outcome="indeterminate",
        failure=_failure(FailureClass.INDETERMINATE, message),
    )
    j.refresh_from_db()
    return j


def with_unknown_effect(transition: states.Transition, name: str = "ui.charge") -> Job:
    """A job whose attempt recorded an intent and ended by ``transition`` (``FAIL``: failed,
    ``RETRY``: waiting again) without an outcome: its effect is unknown in the ledger."""
    j, lease = running(name)
    driver().effect_intend(lease, "charge")
    fail = transition == states.FAIL
    driver().finish(
        lease,
        Decision(transition=transition, reason="ended without an outcome"),
        outcome="failed" if fail else "retry",
        failure=_failure(
            FailureClass.PERMANENT if fail else FailureClass.TRANSIENT, "handler raised"
        ),
    )
    j.refresh_from_db()
    return j


def reaped(
    name: str = "ui.short_notify",
    *,
    effects: tuple[str, ...] = ("charge",),
    stopped: bool = False,
) -> Job:
    """A job whose owner (``OWNER``) recorded its effect intents and then went silent: once
    its one-second lease ran out the reaper ended the attempt (``lease_expired``) and parked
    the job indeterminate. The owner's executor never recorded its stop, unless ``stopped``.
    """
    driver().executor_started(OWNER, transport="polling", queues=["mail", "billing"], concurrency=1)
    j = enqueue(name)
    lease = claim(j, OWNER)
    for effect in effects:
        driver().effect_intend(lease, effect)
    wait_until(lambda: reaper.reap(), timeout=10)
    if stopped:
        driver().executor_stopped(OWNER)
    j.refresh_from_db()
    assert j.state == states.State.INDETERMINATE, j.state
    return j


def overrunning() -> Job:
    """A leased job past its attempt's maximum runtime (``deadline_at`` in the past), its
    lease still valid."""
    j, _ = running("ui.hang")
    overran = health.health_q("overrunning")
    wait_until(lambda: Job.objects.filter(overran, pk=j.pk).exists(), timeout=10)
    j.refresh_from_db()
    return j


def backing_off(name: str = "ui.sync", *, attempts: int = 1, **payload: Any) -> Job:
    """A waiting job after ``attempts`` transient failures, next try an hour away."""
    j = enqueue(name, **payload)
    for n in range(attempts):
        lease = claim(j)
        last = n == attempts - 1
        driver().finish(
            lease,
            Decision(transition=states.RETRY, delay=3600.0 if last else 0.0, reason="transient"),
            outcome="retry",
            failure=_failure(FailureClass.TRANSIENT, f"try {n + 1} refused"),
        )
    j.refresh_from_db()
    return j


def scheduled(name: str = "ui.sync", **payload: Any) -> Job:
    """A waiting job due tomorrow."""
    return enqueue(name, run_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1), **payload)


def stuck(name: str = "ui.sync", **payload: Any) -> Job:
    """A waiting job due ten minutes ago and never claimed."""
    return enqueue(name, run_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10), **payload)


def abandoned(**payload: Any) -> Job:
    """A leased job whose one-second lease will have expired once the caller waits."""
    j, _ = running("ui.short", **payload)
    return j


def state_of(j: Job) -> tuple[str, int]:
    """The job's current state and version, read fresh."""
    row = Job.objects.values_list("state", "version").get(pk=j.pk)
    return row[0], row[1]
