"""Queue limits as pure decisions: the token bucket's refill and one claim's allowance."""

from __future__ import annotations

import datetime as dt

import pytest

from scheduler_core.domain import queues as q

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("tokens", "tokens_at", "rate", "now", "expected"),
    [
        (0.0, None, 5.0, at(0), 5.0),  # never used: full
        (0.0, at(0), 5.0, at(0.4), 2.0),
        (0.0, at(0), 5.0, at(10), 5.0),  # capped at one second's worth
        (0.0, at(0), 0.5, at(10), 1.0),  # at least one claim
        (3.0, at(5), 5.0, at(4), 3.0),  # a clock that went back adds nothing
        (1.0, None, 0.0, at(0), 0.0),  # rate 0: nothing
    ],
)
def test_refill(
    tokens: float, tokens_at: dt.datetime | None, rate: float, now: dt.datetime, expected: float
) -> None:
    assert q.refill(tokens, tokens_at, max_per_second=rate, now=now) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("want", "max_leased", "leased", "rate", "tokens", "expected"),
    [
        (10, None, 0, None, 0.0, 10),
        (10, 3, 1, None, 0.0, 2),
        (10, 3, 5, None, 0.0, 0),  # over the limit (set lower meanwhile): none
        (10, None, 0, 4.0, 2.9999999999, 3),  # a hair under a token counts as one
        (10, 5, 0, 4.0, 1.5, 1),
        (1, 5, 0, 4.0, 4.0, 1),  # never more than asked
    ],
)
def test_allowance(
    want: int, max_leased: int | None, leased: int, rate: float | None, tokens: float, expected: int
) -> None:
    got = q.allowance(
        want=want,
        max_leased=max_leased,
        leased=leased,
        max_per_second=rate,
        tokens=tokens,
        tokens_at=at(0),
        now=at(0),
    )
    assert got.jobs == expected
    if rate is not None:
        assert q.after_claim(got.tokens, got.jobs) >= 0.0


@pytest.mark.parametrize(
    ("max_leased", "rate"),
    [(-1, None), (True, None), (2_000_000, None), (None, -1.0), (None, float("inf")), (None, 1e-6)],
)
def test_check_limits_refuses_what_means_nothing(max_leased: object, rate: object) -> None:
    with pytest.raises(q.LimitError):
        q.check_limits(max_leased, rate)  # type: ignore[arg-type]


def test_check_limits_accepts_zero_and_none() -> None:
    q.check_limits(0, 0.0)
    q.check_limits(None, None)
    q.check_limits(10, 2.5)
