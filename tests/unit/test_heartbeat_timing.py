"""Lease renewals count from when their statement was sent (the claim's from when the claim
was sent), never from the reply; late and slow renewals are recorded."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import DatabaseError

from scheduler_core.runtime import heartbeat

FRACTION = 1 / 3


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeLease:
    granted_at: float
    lease_seconds: int = 10
    attempt_id: int = 1
    fence: int = 1
    timeout_seconds: float = 600.0


class FakeCtx:
    def __init__(self, lease: FakeLease) -> None:
        self.lease = lease
        self.job_id = 7
        self.lost = False
        self.reason = ""

    def mark_lost(self, reason: str) -> None:
        self.lost, self.reason = True, reason


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    clock = Clock(102.0)
    events: list[dict[str, Any]] = []
    state: dict[str, Any] = {"clock": clock, "events": events, "took": 0.0, "fail": False}

    class Driver:
        """The renewals' storage: answers after ``took`` seconds, or fails."""

        connection = types.SimpleNamespace(close=lambda: None)

        def heartbeat(self, lease: Any) -> bool:
            if state["fail"]:
                raise DatabaseError("the database cannot be reached (test)")
            clock.t += state["took"]  # the reply comes back this much later
            return False  # renewed; no cancel requested

    fake = Driver()
    monkeypatch.setattr(heartbeat.time, "monotonic", clock)
    monkeypatch.setattr(heartbeat, "driver", lambda: fake)
    monkeypatch.setattr(heartbeat.hooks, "event", lambda kind, **f: events.append({kind: f}))
    return state


def test_the_first_renewal_counts_from_when_the_claim_was_sent(rig: dict[str, Any]) -> None:
    hb = heartbeat.Heartbeater("t:1:hb", beat_executor=False)
    ctx = FakeCtx(FakeLease(granted_at=100.0))  # claimed at 100, attempt started at 102
    hb.add(ctx)  # type: ignore[arg-type]
    rig["clock"].t = 103.4  # 3.4 s after the claim: a renewal is due (every 3.33 s)
    hb.tick(FRACTION)
    assert rig["events"] == []  # sent on time, answered at once
    assert hb._active[1].last_renewed == 103.4


def test_a_slow_reply_does_not_extend_the_self_fence(rig: dict[str, Any]) -> None:
    hb = heartbeat.Heartbeater("t:1:hb", beat_executor=False)
    ctx = FakeCtx(FakeLease(granted_at=100.0))
    hb.add(ctx)  # type: ignore[arg-type]
    rig["clock"].t, rig["took"] = 103.4, 4.0
    hb.tick(FRACTION)  # sent at 103.4, answered at 107.4
    assert hb._active[1].last_renewed == 103.4
    assert rig["events"] == [{"heartbeat_slow": {"job": 7, "fence": 1, "took": 4.0}}]
    # The next renewal cannot reach the database. 8.1 s after the send (80 % of the lease is
    # 8 s) the attempt fences itself, although only 4.1 s passed since the reply.
    rig["fail"], rig["took"] = True, 0.0
    rig["clock"].t = 111.5
    hb.tick(FRACTION)
    assert ctx.lost and "in time" in ctx.reason


def test_a_late_renewal_is_recorded_once_until_one_lands(rig: dict[str, Any]) -> None:
    hb = heartbeat.Heartbeater("t:1:hb", beat_executor=False)
    ctx = FakeCtx(FakeLease(granted_at=100.0))
    hb.add(ctx)  # type: ignore[arg-type]
    rig["fail"] = True
    rig["clock"].t = 106.0  # 6 s after the claim: 2.67 s past due, more than a quarter lease
    hb.tick(FRACTION)
    rig["clock"].t = 106.2
    hb.tick(FRACTION)
    assert [list(e) for e in rig["events"]] == [["heartbeat_late"]]
    assert not ctx.lost  # 6.2 s < 8 s since the claim was sent
    rig["fail"] = False
    rig["clock"].t = 106.4
    hb.tick(FRACTION)
    assert hb._active[1].last_renewed == 106.4 and not hb._active[1].late_logged
