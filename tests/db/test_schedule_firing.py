"""Firing schedules against a real database with a frozen clock (``fire_due(now=...)``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler_core import ActionConflict, job
from scheduler_core.api import registry
from scheduler_core.models import AuditEntry, Job, Schedule
from scheduler_core.services import scheduling

pytestmark = pytest.mark.django_db(transaction=True)

T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


@job(name="tests.sched.report", max_attempts=2)
def report(ctx: Any, *, region: str = "all") -> None:
    """The scheduled work (never run here: these tests only enqueue)."""


def make(name: str = "every-minute", **kw: Any) -> Schedule:
    args: dict[str, Any] = {"name": name, "job_name": "tests.sched.report", "cron": "* * * * *"}
    args.update(kw)
    return scheduling.create_schedule(now=T0 - dt.timedelta(seconds=30), **args)


def keys() -> list[str]:
    return sorted(Job.objects.values_list("unique_key", flat=True))


def test_an_occurrence_becomes_one_job_named_by_its_identity() -> None:
    s = make(payload={"region": "eu"})
    assert s.next_fire_at == T0
    assert scheduling.fire_due(now=T0 + dt.timedelta(seconds=1)) == 1
    [j] = Job.objects.all()
    assert j.unique_key == f"schedule:{s.pk}@2030-01-01T12:00:00Z"
    assert (j.name, j.payload, j.run_at, j.schedule_id, j.state) == (
        "tests.sched.report",
        {"region": "eu"},
        T0,
        s.pk,
        "waiting",
    )
    s.refresh_from_db()
    assert (s.next_fire_at, s.last_fire_at) == (T0 + MIN, T0)


def test_firing_again_at_the_same_time_adds_nothing() -> None:
    make()
    assert scheduling.fire_due(now=T0) == 1
    assert scheduling.fire_due(now=T0) == 0
    assert scheduling.fire_due(now=T0 + dt.timedelta(seconds=59)) == 0
    assert scheduling.fire_due(now=T0 + MIN) == 1
    assert len(keys()) == 2


def test_a_scheduler_that_read_the_row_before_another_advanced_it_changes_nothing() -> None:
    make()
    stale = Schedule.objects.get()
    assert scheduling.fire_due(now=T0) == 1
    # The second scheduler still holds the row as it was: its conditional step matches nothing.
    assert scheduling._fire_one(stale, now=T0, grace=60) == 0
    assert Schedule.objects.get().next_fire_at == T0 + MIN
    assert len(keys()) == 1


def test_a_reset_row_cannot_enqueue_an_occurrence_twice() -> None:
    s = make()
    scheduling.fire_due(now=T0)
    Schedule.objects.filter(pk=s.pk).update(next_fire_at=T0)  # an operator rewinds it
    assert scheduling.fire_due(now=T0) == 0
    assert len(keys()) == 1


def test_paused_schedules_do_not_fire_and_resume_with_the_misfire_policy() -> None:
    s = make(misfire="run_once")
    s = scheduling.set_paused(
        s.pk, paused=True, expected_version=s.version, actor="ops", reason="maintenance"
    )
    assert scheduling.fire_due(now=T0 + 10 * MIN) == 0
    with pytest.raises(ActionConflict):
        scheduling.set_paused(s.pk, paused=False, expected_version=1, actor="ops", reason="x")
    scheduling.set_paused(
        s.pk, paused=False, expected_version=s.version, actor="ops", reason="done"
    )
    assert scheduling.fire_due(now=T0 + 10 * MIN + dt.timedelta(seconds=90)) == 1
    # Eleven occurrences were missed while paused; run_once enqueues the latest, once.
    assert keys() == [f"schedule:{s.pk}@2030-01-01T12:11:00Z"]
    assert list(AuditEntry.objects.values_list("action", flat=True).order_by("pk")) == [
        "pause_schedule",
        "resume_schedule",
    ]


def test_overlap_skip_fires_nothing_while_the_previous_occurrence_is_unfinished() -> None:
    s = make(overlap="skip")
    assert scheduling.fire_due(now=T0) == 1
    assert scheduling.fire_due(now=T0 + MIN) == 0  # the 12:00 job is still waiting
    Job.objects.filter(schedule=s).update(state="succeeded")  # (test setup, not a transition)
    assert scheduling.fire_due(now=T0 + 2 * MIN) == 1
    assert keys()[-1].endswith("12:02:00Z")


def test_overlap_allow_fires_every_occurrence() -> None:
    make(overlap="allow")
    for m in range(3):
        scheduling.fire_due(now=T0 + m * MIN)
    assert len(keys()) == 3


@pytest.mark.parametrize(
    ("policy", "n", "expected"),
    [
        ("skip", 1, []),
        ("run_once", 1, ["12:10"]),
        ("catch_up", 3, ["12:08", "12:09", "12:10"]),
    ],
)
def test_misfire_policy_after_ten_minutes_away(
    policy: str, n: int, expected: list[str], settings: Any
) -> None:
    settings.TENURE_SCHEDULE_MISFIRE_GRACE_SECONDS = 10
    make(misfire=policy, catch_up_max=n)
    # Away from 12:00 to 12:10:30: every occurrence, 12:10 included, is past the grace.
    scheduling.fire_due(now=T0 + 10 * MIN + dt.timedelta(seconds=30))
    assert [k.rsplit("T", 1)[1][:5] for k in keys()] == expected
    assert Schedule.objects.get().next_fire_at == T0 + 11 * MIN


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cron": "60 * * * *"}, "invalid cron expression"),
        ({"timezone": "Europe/Atlantis"}, "unknown timezone"),
        ({"job_name": "tests.sched.nope"}, "no job is registered"),
        ({"payload": {"unknown": 1}}, "payload does not fit"),
        ({"cron": "", "interval_seconds": -5}, "whole number of seconds"),
        ({"misfire": "whenever"}, "misfire policy"),
    ],
)
def test_invalid_database_schedules_are_refused_with_a_clear_message(
    kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kw)
    assert not Schedule.objects.exists()


def test_a_row_broken_behind_the_api_is_not_fired_and_not_advanced() -> None:
    s = make()
    Schedule.objects.filter(pk=s.pk).update(cron="not a cron")
    assert scheduling.fire_due(now=T0 + 5 * MIN) == 0
    assert Schedule.objects.get().next_fire_at == T0


@pytest.fixture
def code_schedule() -> Iterator[None]:
    def tick(ctx: Any) -> None: ...

    job(name="tests.sched.tick", schedule="*/5 * * * *", schedule_tz="Europe/Berlin")(tick)
    yield
    registry._REGISTRY.pop("tests.sched.tick", None)


def test_code_schedules_are_synced_idempotently_and_keep_the_operators_pause(
    code_schedule: None,
) -> None:
    assert scheduling.sync_code_schedules(now=T0) == 1
    assert scheduling.sync_code_schedules(now=T0) == 0
    row = Schedule.objects.get(name="tests.sched.tick")
    assert (row.source, row.cron, row.timezone, row.next_fire_at) == (
        "code",
        "*/5 * * * *",
        "Europe/Berlin",
        T0 + 5 * MIN,
    )
    scheduling.set_paused(row.pk, paused=True, expected_version=row.version, actor="o", reason="r")
    # The declaration changes (a deploy): the row follows it, the pause stays.
    registry._REGISTRY.pop("tests.sched.tick")

    def tick(ctx: Any) -> None: ...

    job(name="tests.sched.tick", schedule=dt.timedelta(minutes=1))(tick)
    assert scheduling.sync_code_schedules(now=T0) == 1
    row.refresh_from_db()
    assert (row.cron, row.interval_seconds, row.paused) == ("", 60, True)
    assert row.next_fire_at == T0 + MIN
