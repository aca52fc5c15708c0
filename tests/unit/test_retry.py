"""Retry timing and the decisions after a failure: pure, with a seeded rng and fixed ages."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from scheduler_core.domain import states
from scheduler_core.domain.classify import FailureClass
from scheduler_core.domain.modes import EffectMode
from scheduler_core.domain.outcomes import (
    Kind,
    Situation,
    after_abandon,
    after_failure,
    after_snooze,
)
from scheduler_core.domain.retry import RetryPolicy, snooze_delay

NOW = dt.datetime(2030, 6, 1, 12, 0, tzinfo=dt.UTC)


def situation(**kw: object) -> Situation:
    base: dict[str, object] = {
        "mode": EffectMode.AT_LEAST_ONCE,
        "attempt": 1,
        "max_attempts": 5,
        "age_seconds": 10.0,
    }
    base.update(kw)
    return Situation(**base)  # type: ignore[arg-type]


# --- backoff timing ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_every_delay_lies_within_the_documented_bounds(seed: int) -> None:
    policy = RetryPolicy(base=0.5, cap=30.0, jitter=0.5)
    rng = random.Random(seed)
    for attempt in range(1, 40):
        lo, hi = policy.bounds(attempt)
        d = policy.delay(attempt, rng)
        assert lo <= d <= hi
        assert hi == min(30.0, 0.5 * 2 ** (attempt - 1))


def test_delays_grow_exponentially_until_the_cap() -> None:
    policy = RetryPolicy(base=1.0, cap=60.0, jitter=0.0)
    rng = random.Random(1)
    assert [policy.delay(n, rng) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_same_seed_gives_the_same_delays_and_jitter_spreads_them() -> None:
    policy = RetryPolicy(base=1.0, cap=100.0, jitter=1.0)
    a = [policy.delay(5, random.Random(7)) for _ in range(3)]
    assert len(set(a)) == 1
    spread = {round(policy.delay(5, random.Random(s)), 6) for s in range(50)}
    assert len(spread) > 40  # full jitter: retries of many jobs do not arrive together


def test_huge_attempt_numbers_stay_at_the_cap_without_overflow() -> None:
    policy = RetryPolicy(base=1.0, cap=3600.0, jitter=0.0)
    assert policy.delay(5000, random.Random(0)) == 3600.0


def test_next_run_at_is_now_plus_delay_with_a_frozen_clock() -> None:
    policy = RetryPolicy(base=2.0, cap=100.0, jitter=0.5)
    d = policy.delay(3, random.Random(3))
    assert policy.next_run_at(NOW, 3, random.Random(3)) == NOW + dt.timedelta(seconds=d)


@pytest.mark.parametrize(
    "kw",
    [
        {"base": 0},
        {"base": -1},
        {"base": 10, "cap": 5},
        {"jitter": 1.5},
        {"max_age": 0},
        {"base": float("nan")},
    ],
)
def test_a_nonsensical_policy_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kw)


# --- retry_after -------------------------------------------------------------------------------


def test_retry_after_replaces_the_backoff_and_is_capped() -> None:
    policy = RetryPolicy(base=1.0, cap=120.0)
    rng = random.Random(0)
    assert policy.delay(1, rng, retry_after=45) == 45
    assert policy.delay(9, rng, retry_after=0) == 0
    assert policy.delay(1, rng, retry_after=10_000) == 120.0
    assert policy.delay(1, rng, retry_after=-5) == 0


def test_transient_with_retry_after_waits_that_long() -> None:
    d = after_failure(
        situation(attempt=2),
        FailureClass.TRANSIENT,
        policy=RetryPolicy(base=1.0, cap=600.0),
        rng=random.Random(0),
        retry_after=90.0,
    )
    assert d.transition == states.RETRY
    assert d.delay == 90.0


# --- attempts and max_age ----------------------------------------------------------------------


def test_transient_failures_retry_until_attempts_are_exhausted() -> None:
    policy = RetryPolicy(base=1.0, cap=10.0)
    for attempt in range(1, 5):
        d = after_failure(
            situation(attempt=attempt), FailureClass.TRANSIENT, policy=policy, rng=random.Random()
        )
        assert d.transition == states.RETRY
    last = after_failure(
        situation(attempt=5),
        FailureClass.TRANSIENT,
        policy=policy,
        rng=random.Random(),
        message="x",
    )
    assert last.transition == states.FAIL
    assert last.reason.startswith("attempts exhausted (5)")


def test_max_age_ends_retrying_with_attempts_left() -> None:
    policy = RetryPolicy(base=1.0, cap=10.0, max_age=300.0)
    young = after_failure(
        situation(age_seconds=299.0), FailureClass.TRANSIENT, policy=policy, rng=random.Random()
    )
    old = after_failure(
        situation(age_seconds=300.0), FailureClass.TRANSIENT, policy=policy, rng=random.Random()
    )
    assert young.transition == states.RETRY
    assert old.transition == states.FAIL
    assert old.reason.startswith("maximum age reached")
    assert policy.too_old(300.0) and not policy.too_old(299.9)


def test_permanent_fails_at_once_and_says_why() -> None:
    d = after_failure(
        situation(attempt=1),
        FailureClass.PERMANENT,
        policy=RetryPolicy(),
        rng=random.Random(),
        message="card declined",
    )
    assert d.transition == states.FAIL
    assert d.reason == "permanent error: card declined"


def test_abandoned_attempts_also_end_after_the_budget() -> None:
    d = after_abandon(
        situation(attempt=5),
        unsettled_effect=False,
        policy=RetryPolicy(),
        rng=random.Random(),
        why="lease expired",
    )
    assert d.transition == states.REAP_FAIL
    assert d.reason.startswith("attempts exhausted (5)")


# --- snooze ------------------------------------------------------------------------------------


def test_snooze_waits_its_own_time_and_spends_no_attempt() -> None:
    d = after_snooze(situation(attempt=5, max_attempts=5), 30.0, policy=RetryPolicy())
    assert d.transition == states.RETRY
    assert d.delay == 30.0
    assert d.spend_attempt is False


def test_snooze_is_still_bounded_by_max_age() -> None:
    d = after_snooze(situation(age_seconds=100.0), 5.0, policy=RetryPolicy(max_age=60.0))
    assert d.transition == states.FAIL
    assert "maximum age" in d.reason


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(-1.0, 0.0), (float("nan"), 0.0), (float("inf"), 1000.0), (5.5, 5.5), (5000.0, 1000.0)],
)
def test_snooze_delay_is_clamped(seconds: float, expected: float) -> None:
    assert snooze_delay(seconds, cap=1000.0) == expected


def test_a_snoozed_fallback_stays_on_the_fallback() -> None:
    d = after_snooze(situation(kind=Kind.FALLBACK), 1.0, policy=RetryPolicy())
    assert d.next_kind == Kind.FALLBACK


# --- fallbacks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [FailureClass.TRANSIENT, FailureClass.PERMANENT])
def test_a_failed_primary_hands_over_to_the_fallback_at_once(failure: FailureClass) -> None:
    d = after_failure(
        situation(has_fallback=True), failure, policy=RetryPolicy(), rng=random.Random()
    )
    assert d.transition == states.RETRY
    assert d.next_kind == Kind.FALLBACK
    assert d.delay == 0.0


def test_an_indeterminate_primary_never_hands_over() -> None:
    d = after_failure(
        situation(has_fallback=True, mode=EffectMode.IDEMPOTENT),
        FailureClass.INDETERMINATE,
        policy=RetryPolicy(),
        rng=random.Random(),
    )
    assert d.next_kind == Kind.RUN


def test_a_fallback_without_the_key_waits_for_the_primary_effect_to_be_known() -> None:
    common = {"has_fallback": True, "fallback_shares_key": False}
    unknown = after_failure(
        situation(**common, unsettled_effect=True),
        FailureClass.TRANSIENT,
        policy=RetryPolicy(),
        rng=random.Random(),
    )
    known = after_failure(
        situation(**common, unsettled_effect=False),
        FailureClass.TRANSIENT,
        policy=RetryPolicy(),
        rng=random.Random(),
    )
    assert unknown.next_kind == Kind.RUN
    assert known.next_kind == Kind.FALLBACK


def test_no_fallback_past_the_budget() -> None:
    d = after_failure(
        situation(has_fallback=True, attempt=5, max_attempts=5),
        FailureClass.PERMANENT,
        policy=RetryPolicy(),
        rng=random.Random(),
    )
    assert d.transition == states.FAIL


def test_fallback_retries_stay_on_the_fallback() -> None:
    d = after_failure(
        situation(kind=Kind.FALLBACK, has_fallback=True),
        FailureClass.TRANSIENT,
        policy=RetryPolicy(),
        rng=random.Random(),
    )
    assert d.transition == states.RETRY
    assert d.next_kind == Kind.FALLBACK


def test_ambiguous_fallback_without_the_key_is_parked() -> None:
    s = situation(
        kind=Kind.FALLBACK,
        has_fallback=True,
        fallback_shares_key=False,
        mode=EffectMode.IDEMPOTENT,
    )
    failed = after_failure(s, FailureClass.INDETERMINATE, policy=RetryPolicy(), rng=random.Random())
    reaped = after_abandon(
        s, unsettled_effect=True, policy=RetryPolicy(), rng=random.Random(), why="lease expired"
    )
    assert failed.transition == states.PARK
    assert reaped.transition == states.REAP_PARK


def test_abandoned_fallback_with_a_shared_key_retries_the_fallback() -> None:
    d = after_abandon(
        situation(kind=Kind.FALLBACK, mode=EffectMode.IDEMPOTENT, fallback_shares_key=True),
        unsettled_effect=True,
        policy=RetryPolicy(),
        rng=random.Random(),
        why="lease expired",
    )
    assert d.transition == states.REAP_RETRY
    assert d.next_kind == Kind.FALLBACK
