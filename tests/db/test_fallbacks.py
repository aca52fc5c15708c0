"""Fallbacks run as attempts of the same job, under the claim protocol and the same effect key."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from scheduler_core import Permanent, Snooze, Transient, job
from scheduler_core.models import Attempt, Effect, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import reaper
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "fallbacks"
sent: list[tuple[str, int, str, int]] = []  # (destination, job id, effect key, fence)
seen_attempts: list[int] = []


def _secondary(ctx: Any, *, to: str = "x") -> None:
    with ctx.effect("send") as eff:
        if not eff.done:
            sent.append(("secondary", ctx.job_id, eff.key, eff.fence))


@job(
    name="tests.fb.shared",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    fallback=_secondary,
    fallback_shares_key=True,
)
def primary_down(ctx: Any, *, to: str = "x") -> None:
    with ctx.effect("send"):
        raise Transient("primary provider is down")


@job(
    name="tests.fb.unshared",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    fallback=_secondary,
    fallback_shares_key=False,
)
def primary_refused(ctx: Any, *, to: str = "x") -> None:
    with ctx.effect("send"):
        raise Permanent("primary refuses this recipient")


def _lost_reply_then_give_up(ctx: Any) -> None:
    try:
        with ctx.effect("send"):
            raise TimeoutError("no reply from the primary")
    except TimeoutError:
        pass
    raise Permanent("giving up on the primary")


unknown_shared = job(
    name="tests.fb.unknown_shared",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    fallback=_secondary,
    fallback_shares_key=True,
)(_lost_reply_then_give_up)
unknown_unshared = job(
    name="tests.fb.unknown_unshared",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    fallback=_secondary,
    fallback_shares_key=False,
)(_lost_reply_then_give_up)


def _hang(ctx: Any, *, to: str = "x") -> None:
    raise AssertionError("never called: the test abandons the attempt")


@job(
    name="tests.fb.abandoned",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    lease_seconds=1,
    fallback=_hang,
    fallback_shares_key=False,
)
def primary_fails(ctx: Any, *, to: str = "x") -> None:
    raise Transient("primary down")


@job(name="tests.fb.snoozer", queue=Q, max_attempts=2)
def snoozer(ctx: Any) -> None:
    seen_attempts.append(ctx.attempt)
    if Attempt.objects.filter(job_id=ctx.job_id).count() < 4:
        raise Snooze(0)


def _run_next(job_id: int) -> str:
    [lease] = driver().claim(executor="t:1:fb", queues=[Q], job_id=job_id)
    return run_lease(lease)


@pytest.fixture(autouse=True)
def _clear() -> None:
    sent.clear()


def test_failed_primary_hands_over_to_the_fallback_with_the_same_effect_key() -> None:
    j = primary_down.enqueue()
    assert _run_next(j.pk) == "retried"
    assert _run_next(j.pk) == "succeeded"
    j.refresh_from_db()
    assert j.state == "succeeded"
    attempts = list(Attempt.objects.filter(job=j).order_by("fence"))
    assert [(a.kind, a.outcome, a.fence) for a in attempts] == [
        ("run", "retried", 1),
        ("fallback", "succeeded", 2),
    ]
    # One effect key for the job, whichever function made the call.
    [effect] = Effect.objects.filter(job=j)
    assert sent == [("secondary", j.pk, effect.key, 2)]
    assert (effect.state, effect.fence, effect.intents) == ("applied", 2, 2)


def test_unshared_fallback_runs_when_the_primary_effect_is_known_not_applied() -> None:
    j = primary_refused.enqueue()
    _run_next(j.pk)
    assert Effect.objects.get(job=j).state == "not_applied"
    assert _run_next(j.pk) == "succeeded"
    assert [a.kind for a in Attempt.objects.filter(job=j).order_by("fence")] == [
        "run",
        "fallback",
    ]


def test_unshared_fallback_never_runs_while_the_primary_effect_is_unknown() -> None:
    j = unknown_unshared.enqueue()
    # A Permanent raised after an unknown outcome parks the job: "failed" would claim
    # nothing happened.
    assert _run_next(j.pk) == "indeterminate"
    j.refresh_from_db()
    assert j.state == "indeterminate"
    assert j.reason.startswith("permanent error")
    assert "may have happened" in j.reason
    assert Effect.objects.get(job=j).state == "unknown"
    assert sent == []


def test_shared_key_fallback_may_run_while_the_primary_effect_is_unknown() -> None:
    j = unknown_shared.enqueue()
    assert _run_next(j.pk) == "retried"
    assert _run_next(j.pk) == "succeeded"
    assert len(sent) == 1


def test_abandoned_unshared_fallback_with_an_effect_in_flight_is_parked_by_the_reaper() -> None:
    j = primary_fails.enqueue()
    assert _run_next(j.pk) == "retried"
    # The fallback attempt records its intent, then its executor vanishes.
    [lease] = driver().claim(executor="t:1:gone", queues=[Q], job_id=j.pk)
    assert lease.kind == "fallback"
    driver().effect_intend(lease, "send")
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=5))
    reaper.reap_once()
    j.refresh_from_db()
    assert j.state == "indeterminate"
    assert "cannot share the effect key" in j.reason


def test_snooze_spends_no_attempt() -> None:
    seen_attempts.clear()
    j = snoozer.enqueue()
    outcomes = [_run_next(j.pk) for _ in range(4)]
    assert outcomes[:3] == ["snoozed"] * 3
    j.refresh_from_db()
    assert j.state == "succeeded"
    assert Attempt.objects.filter(job=j).count() == 4
    # Four claims, yet every one was attempt 1 of a budget of 2: snoozes were handed back.
    assert seen_attempts == [1, 1, 1, 1]
    assert j.attempts == 1
