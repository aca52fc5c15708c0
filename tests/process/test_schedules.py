"""Schedules fired by several real scheduler processes: each occurrence enqueued once."""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.models import Job, Schedule
from scheduler_core.services import scheduling
from scheduler_core.storage.drivers import driver
from tests.conftest import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

FAST = {"TENURE_SWEEP_INTERVAL": "0.1"}


def schedulers(
    spawn: Any, tmp_path: Path, n: int = 3, env: dict[str, str] | None = None
) -> list[Any]:
    procs = []
    for i in range(n):
        p = spawn(
            "run_scheduler", "--interval", "0.1", env={**FAST, **(env or {})}, log=f"sched-{i}.log"
        )
        p.log_path = tmp_path / f"sched-{i}.log"
        procs.append(p)
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    # A scheduler still starting up (slow on a loaded machine) has no SIGTERM handler yet and
    # would die of the signal: wait until each says it is ready.
    for p in procs:
        wait_until(lambda p=p: b" ready " in p.log_path.read_bytes(), timeout=60)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            code = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
            time.sleep(1.0)
            pytest.fail(
                "a scheduler did not stop within 60 s of SIGTERM; the end of its log:\n"
                + p.log_path.read_text(errors="replace")[-6000:]
            )
        assert code == 0


def fire_times(schedule: Schedule) -> list[dt.datetime]:
    return sorted(Job.objects.filter(schedule=schedule).values_list("run_at", flat=True))


@pytest.mark.postgres
def test_three_schedulers_enqueue_each_interval_occurrence_once_even_after_a_stop(
    spawn: Any, tmp_path: Path
) -> None:
    s = scheduling.create_schedule(name="every-second", job_name="demo.noop", interval_seconds=1)
    procs = schedulers(spawn, tmp_path)
    wait_until(lambda: Job.objects.filter(schedule=s).count() >= 3, timeout=90)
    # All schedulers stop answering for a while (shorter than the misfire grace) ...
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    time.sleep(3)
    for p in procs:
        p.send_signal(signal.SIGCONT)
    # ... and on return every missed occurrence is enqueued, once.
    before = Job.objects.filter(schedule=s).count()
    wait_until(lambda: Job.objects.filter(schedule=s).count() >= before + 4, timeout=90)
    stop(procs)
    times = fire_times(s)
    assert len(times) >= 7
    steps = {b - a for a, b in itertools.pairwise(times)}
    assert steps == {dt.timedelta(seconds=1)}, "an occurrence is missing or doubled"
    keys = list(Job.objects.filter(schedule=s).values_list("unique_key", flat=True))
    assert len(set(keys)) == len(keys)
    s.refresh_from_db()
    assert s.last_fire_at == times[-1]
    assert s.next_fire_at == times[-1] + dt.timedelta(seconds=1)


FIRE_SCRIPT = """
import datetime as dt, time
from scheduler_core.services import scheduling
t0 = dt.datetime.fromisoformat({t0!r})
start = {start!r}
while time.time() < start:
    time.sleep(0.005)
new = sum(scheduling.fire_due(now=t0 + dt.timedelta(minutes=i)) for i in range({n}))
print("NEW", new)
"""


@pytest.mark.postgres
def test_concurrent_fire_due_with_a_frozen_clock_enqueues_each_occurrence_once(
    spawn: Any, tmp_path: Path
) -> None:
    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    s = scheduling.create_schedule(
        name="each-minute",
        job_name="demo.noop",
        cron="* * * * *",
        misfire="catch_up",
        catch_up_max=1000,
        now=t0 - dt.timedelta(seconds=1),
    )
    n = 120
    start = time.time() + 4  # every process starts firing at the same moment
    code = FIRE_SCRIPT.format(t0=t0.isoformat(), start=start, n=n)
    procs = [spawn("shell", "-c", code, log=f"fire-{i}.log") for i in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    reported = [
        int(line.split()[1])
        for i in range(3)
        for line in (tmp_path / f"fire-{i}.log").read_text().splitlines()
        if line.startswith("NEW ")
    ]
    assert len(reported) == 3
    times = fire_times(s)
    assert times == [t0 + dt.timedelta(minutes=i) for i in range(n)]
    # Every insert a process counted as its own is a distinct job: no step was taken twice.
    assert sum(reported) == n


@pytest.mark.parametrize(
    ("policy", "n", "expected_minutes_ago"),
    [("skip", 1, []), ("run_once", 1, [5]), ("catch_up", 3, [25, 15, 5])],
)
def test_schedulers_returning_after_an_absence_apply_the_misfire_policy(
    spawn: Any, tmp_path: Path, policy: str, n: int, expected_minutes_ago: list[int]
) -> None:
    s = scheduling.create_schedule(
        name=f"misfire-{policy}",
        job_name="demo.noop",
        interval_seconds=600,
        misfire=policy,
        catch_up_max=n,
    )
    # What 105 minutes without any scheduler leave behind: the row's next occurrence is far in
    # the past (the occurrences at -105, -95, ... -5 minutes were all missed). The next one is
    # 5 minutes ahead, far beyond this test.
    now = driver().now().replace(microsecond=0)
    Schedule.objects.filter(pk=s.pk).update(next_fire_at=now - dt.timedelta(minutes=105))
    procs = schedulers(spawn, tmp_path, env={"TENURE_SCHEDULE_MISFIRE_GRACE_SECONDS": "5"})
    wait_until(lambda: Schedule.objects.get(pk=s.pk).next_fire_at > now, timeout=120)
    time.sleep(1.0)  # every scheduler has had further rounds to (wrongly) add more
    stop(procs)
    expected = [now - dt.timedelta(minutes=m) for m in expected_minutes_ago]
    assert fire_times(s) == expected
    assert Schedule.objects.get(pk=s.pk).next_fire_at == now + dt.timedelta(minutes=5)
