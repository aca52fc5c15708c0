"""The failover nemesis's schedule check (``verifier.failover._check_schedule``) judged on
made-up evidence: an occurrence that ran under two jobs passes only in ``async`` mode, once,
when the first job ran before the crash and is absent from the promoted store; any other
second job fails the run. The runs themselves are tests/process/test_failover.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

from verifier.failover import ModeResult, _check_schedule
from verifier.failover_jobs import micros

T = dt.datetime(2026, 12, 7, 1, 0, tzinfo=dt.UTC)
CRASH = T.timestamp() + 10
OCC = "schedule:1@2026-12-07T01:00:05Z"


class Store:
    """The promoted store's schedule jobs, answering the check's two queries."""

    def __init__(self, jobs: list[tuple[str, int, dt.datetime]]) -> None:
        self.jobs = jobs

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        if "GROUP BY" in sql:
            keys = [k for k, _, _ in self.jobs]
            return [(k,) for k in sorted(set(keys)) if keys.count(k) > 1]
        return [(k, i, c, "succeeded") for k, i, c in self.jobs]


def tick(job: int, created: dt.datetime, at: float, occurrence: str = OCC) -> dict[str, Any]:
    return {
        "kind": "tick",
        "job": job,
        "created": micros(created),
        "occurrence": occurrence,
        "fence": 1,
        "at": at,
    }


def judge(mode: str, store: Store, seen: list[dict[str, Any]]) -> ModeResult:
    result = ModeResult(mode)
    _check_schedule(mode, store, seen, CRASH, result)
    return result


LOST = (7, T + dt.timedelta(seconds=5))
"""The first job of the occurrence, on the lost timeline."""
SURVIVOR = (7, T + dt.timedelta(seconds=12))
"""The occurrence fired again on the new primary (the same id: the sequence went back too)."""


def test_one_job_per_occurrence_passes() -> None:
    r = judge("sync", Store([(OCC, *SURVIVOR)]), [tick(*SURVIVOR, at=CRASH + 3)])
    assert not r.failures
    assert r.figures["schedule_occurrences_fired_again"] == 0


def test_fired_again_in_async_mode_when_the_first_job_was_lost_before_the_crash() -> None:
    seen = [tick(*LOST, at=CRASH - 4), tick(*SURVIVOR, at=CRASH + 3)]
    r = judge("async", Store([(OCC, *SURVIVOR)]), seen)
    assert not r.failures, r.failures
    assert r.figures["schedule_occurrences_fired_again"] == 1
    (again,) = r.figures["schedule_occurrences_fired_again_detail"]
    assert again["lost_job"] == 7 and again["lost_job_ran_before_crash"]


def test_fired_again_in_sync_mode_fails() -> None:
    seen = [tick(*LOST, at=CRASH - 4), tick(*SURVIVOR, at=CRASH + 3)]
    assert judge("sync", Store([(OCC, *SURVIVOR)]), seen).failures


def test_a_first_job_that_ran_after_the_crash_or_survived_fails() -> None:
    after = [tick(*LOST, at=CRASH + 1), tick(*SURVIVOR, at=CRASH + 3)]
    assert judge("async", Store([(OCC, *SURVIVOR)]), after).failures
    other = (8, T + dt.timedelta(seconds=6))
    kept = [tick(*other, at=CRASH - 4), tick(*SURVIVOR, at=CRASH + 3)]
    store = Store([(OCC, *SURVIVOR), ("schedule:1@2026-12-07T01:00:06Z", *other)])
    assert judge("async", store, kept).failures


def test_three_jobs_for_one_occurrence_fail() -> None:
    seen = [
        tick(*LOST, at=CRASH - 4),
        tick(9, T + dt.timedelta(seconds=6), at=CRASH - 3),
        tick(*SURVIVOR, at=CRASH + 3),
    ]
    assert judge("async", Store([(OCC, *SURVIVOR)]), seen).failures


def test_two_jobs_in_the_store_for_one_occurrence_fail() -> None:
    store = Store([(OCC, *SURVIVOR), (OCC, 8, T + dt.timedelta(seconds=13))])
    assert judge("async", store, []).failures
