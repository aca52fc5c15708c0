"""Schedule computations with a frozen clock: fire times, DST, misfire plans, validation."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from scheduler_core import job
from scheduler_core.domain.schedules import ScheduleSpec, first_fire_at, occurrence_key, plan

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def fires(spec: ScheduleSpec, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    out, t = [], start
    while True:
        t = spec.next_after(t)
        if t > end:
            return out
        out.append(t)


def berlin(t: dt.datetime) -> str:
    return t.astimezone(BERLIN).strftime("%m-%d %H:%M%z")


# --- next fire times ---------------------------------------------------------------------------


def test_cron_next_is_strictly_after_and_read_in_the_timezone() -> None:
    spec = ScheduleSpec(cron="0 9 * * 1-5", timezone="Europe/Berlin")
    # Friday 2030-06-07 09:00 CEST is 07:00 UTC; from exactly then, the next is Monday.
    assert spec.next_after(utc(2030, 6, 7, 6, 59)) == utc(2030, 6, 7, 7, 0)
    assert spec.next_after(utc(2030, 6, 7, 7, 0)) == utc(2030, 6, 10, 7, 0)


def test_cron_aliases_are_accepted() -> None:
    assert ScheduleSpec(cron="@hourly").next_after(utc(2030, 1, 1, 10, 15)) == utc(2030, 1, 1, 11)


def test_first_fire_of_an_interval_is_one_interval_from_now_in_whole_seconds() -> None:
    spec = ScheduleSpec(interval_seconds=30)
    now = dt.datetime(2030, 1, 1, 0, 0, 5, 700_000, tzinfo=UTC)
    assert first_fire_at(spec, now) == utc(2030, 1, 1, 0, 0, 35)


def test_occurrence_identity_is_the_schedule_and_the_utc_fire_time() -> None:
    t = dt.datetime(2030, 3, 31, 3, 0, tzinfo=BERLIN)
    assert occurrence_key(7, t) == "schedule:7@2030-03-31T01:00:00Z"


# --- daylight saving time (Europe/Berlin: 2024-03-31 02:00 -> 03:00, 2024-10-27 03:00 -> 02:00)


def test_dst_spring_forward_fixed_time_fires_once_at_the_next_valid_wall_time() -> None:
    spec = ScheduleSpec(cron="30 2 * * *", timezone="Europe/Berlin")
    got = fires(spec, utc(2024, 3, 29, 12), utc(2024, 4, 2, 12))
    assert [berlin(t) for t in got] == [
        "03-30 02:30+0100",
        "03-31 03:00+0200",  # 02:30 does not exist that night: once, at 03:00
        "04-01 02:30+0200",
        "04-02 02:30+0200",
    ]


def test_dst_fall_back_fixed_time_fires_once_not_twice() -> None:
    spec = ScheduleSpec(cron="30 2 * * *", timezone="Europe/Berlin")
    got = fires(spec, utc(2024, 10, 25, 12), utc(2024, 10, 29, 12))
    assert [berlin(t) for t in got] == [
        "10-26 02:30+0200",
        "10-27 02:30+0200",  # 02:30 happens twice that night: the first one only
        "10-28 02:30+0100",
        "10-29 02:30+0100",
    ]


def test_dst_wildcard_hour_follows_elapsed_time_through_both_changes() -> None:
    spec = ScheduleSpec(cron="30 * * * *", timezone="Europe/Berlin")
    spring = fires(spec, utc(2024, 3, 30, 23), utc(2024, 3, 31, 3))
    assert [berlin(t) for t in spring] == [
        "03-31 00:30+0100",
        "03-31 01:30+0100",
        "03-31 03:30+0200",  # one real hour after 01:30: the missing 02:30 is not invented
        "03-31 04:30+0200",
    ]
    autumn = fires(spec, utc(2024, 10, 26, 22), utc(2024, 10, 27, 3))
    assert [berlin(t) for t in autumn] == [
        "10-27 00:30+0200",
        "10-27 01:30+0200",
        "10-27 02:30+0200",
        "10-27 02:30+0100",  # every real hour fires, including the repeated one
        "10-27 03:30+0100",
    ]
    for got in (spring, autumn):
        assert {b - a for a, b in itertools.pairwise(got)} == {dt.timedelta(hours=1)}


def test_intervals_ignore_dst() -> None:
    spec = ScheduleSpec(interval_seconds=3600, timezone="Europe/Berlin")
    t0 = utc(2024, 10, 26, 23)
    p = plan(spec, next_fire_at=t0, now=utc(2024, 10, 27, 3), grace=1e9)
    assert [b - a for a, b in zip(p.fire, p.fire[1:], strict=False)] == [dt.timedelta(hours=1)] * 4


# --- misfire plans -----------------------------------------------------------------------------

T0 = utc(2030, 1, 1, 0, 0)


def spec(misfire: str, n: int = 1, **kw: Any) -> ScheduleSpec:
    return ScheduleSpec(interval_seconds=600, misfire=misfire, catch_up_max=n, **kw)


def test_an_on_time_occurrence_fires_under_every_policy() -> None:
    for policy in ("skip", "run_once", "catch_up"):
        p = plan(spec(policy), next_fire_at=T0, now=T0 + dt.timedelta(seconds=2), grace=60)
        assert p.fire == (T0,)
        assert p.next_fire_at == T0 + dt.timedelta(minutes=10)


def test_nothing_is_due_before_the_fire_time() -> None:
    p = plan(spec("run_once"), next_fire_at=T0, now=T0 - dt.timedelta(seconds=1), grace=60)
    assert p.fire == () and p.next_fire_at == T0


# The scheduler was away from 00:00 until 01:05: 00:00 ... 01:00 (7 occurrences) are late.
AWAY = T0 + dt.timedelta(hours=1, minutes=5)


def test_misfire_skip_fires_none_of_the_late_occurrences() -> None:
    p = plan(spec("skip"), next_fire_at=T0, now=AWAY, grace=60)
    assert p.fire == ()
    assert (p.due, p.late, p.skipped) == (7, 7, 7)
    assert p.next_fire_at == T0 + dt.timedelta(hours=1, minutes=10)


def test_misfire_run_once_fires_the_latest_late_occurrence_once() -> None:
    p = plan(spec("run_once"), next_fire_at=T0, now=AWAY, grace=60)
    assert p.fire == (T0 + dt.timedelta(hours=1),)


def test_misfire_catch_up_fires_at_most_n_latest_oldest_first() -> None:
    p = plan(spec("catch_up", 3), next_fire_at=T0, now=AWAY, grace=60)
    assert p.fire == tuple(T0 + dt.timedelta(minutes=m) for m in (40, 50, 60))
    everything = plan(spec("catch_up", 100), next_fire_at=T0, now=AWAY, grace=60)
    assert len(everything.fire) == 7


def test_misfire_run_once_with_an_on_time_occurrence_fires_only_that_one() -> None:
    now = T0 + dt.timedelta(hours=1, seconds=3)  # 01:00 is on time, 00:00..00:50 late
    p = plan(spec("run_once"), next_fire_at=T0, now=now, grace=60)
    assert p.fire == (T0 + dt.timedelta(hours=1),)


def test_misfire_policies_apply_to_cron_schedules_too() -> None:
    cron = {"cron": "*/10 * * * *"}
    skip = plan(ScheduleSpec(**cron, misfire="skip"), next_fire_at=T0, now=AWAY, grace=60)
    once = plan(ScheduleSpec(**cron, misfire="run_once"), next_fire_at=T0, now=AWAY, grace=60)
    catch = plan(
        ScheduleSpec(**cron, misfire="catch_up", catch_up_max=2),
        next_fire_at=T0,
        now=AWAY,
        grace=60,
    )
    assert skip.fire == ()
    assert once.fire == (T0 + dt.timedelta(hours=1),)
    assert catch.fire == (T0 + dt.timedelta(minutes=50), T0 + dt.timedelta(hours=1))
    assert skip.next_fire_at == once.next_fire_at == T0 + dt.timedelta(hours=1, minutes=10)
    assert skip.late == 7


def test_catch_up_after_a_very_long_absence_scans_only_what_it_needs() -> None:
    cron = ScheduleSpec(cron="* * * * *", misfire="catch_up", catch_up_max=5)
    last = T0 + dt.timedelta(days=400)
    p = plan(cron, next_fire_at=T0, now=last + dt.timedelta(seconds=30), grace=0)
    assert p.fire == tuple(last - dt.timedelta(minutes=m) for m in (4, 3, 2, 1, 0))
    assert p.late == 1000  # counted for the log only, and only so far


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 \\* \\* \\* \\*'"),
        ({"cron": "* * * *"}, "expected five fields"),
        ({"cron": "0 0 * * * 0"}, "expected five fields"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"cron": "@reboot"}, "expected five fields"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({"cron": "* * * * *", "timezone": ""}, "IANA name"),
        ({"cron": "* * * * *", "interval_seconds": 5}, "exactly one"),
        ({}, "exactly one"),
        ({"interval_seconds": 0}, "whole number of seconds"),
        ({"interval_seconds": 1.5}, "whole number of seconds"),
        ({"interval_seconds": 5, "misfire": "later"}, "misfire policy 'later'"),
        ({"interval_seconds": 5, "misfire": "catch_up", "catch_up_max": 0}, "catch_up_max"),
        ({"interval_seconds": 5, "overlap": "queue"}, "overlap policy 'queue'"),
    ],
)
def test_invalid_schedules_are_refused_with_a_clear_message(
    kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduleSpec(**kw)


def test_job_registration_refuses_an_invalid_schedule_naming_the_job() -> None:
    def handler(ctx: Any) -> None: ...

    with pytest.raises(ValueError, match=r"job tests\.bad_cron: invalid cron expression"):
        job(name="tests.bad_cron", schedule="every five minutes")(handler)
    with pytest.raises(ValueError, match=r"job tests\.bad_tz: unknown timezone"):
        job(name="tests.bad_tz", schedule="*/5 * * * *", schedule_tz="Berlin")(handler)
    with pytest.raises(ValueError, match="whole number of seconds"):
        job(name="tests.bad_interval", schedule=dt.timedelta(milliseconds=1500))(handler)


def test_a_scheduled_job_must_run_without_a_payload() -> None:
    def needs_payload(ctx: Any, *, account: int) -> None: ...

    with pytest.raises(ValueError, match="needs a default"):
        job(name="tests.needs_payload", schedule="* * * * *")(needs_payload)
