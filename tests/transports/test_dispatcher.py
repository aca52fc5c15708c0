"""Which due jobs the dispatcher re-hints (database only; publishing is the contract's part)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.models import Job
from scheduler_core.storage.clock import DbNow
from scheduler_core.storage.drivers import driver
from tests.transports import jobs

pytestmark = pytest.mark.django_db


def waiting_job(*, run_at: float, hinted_at: float | None) -> int:
    """A waiting job due ``run_at`` seconds from the database's now, last hinted at
    ``hinted_at`` seconds from now (None: never)."""
    j = jobs.noop.enqueue()
    Job.objects.filter(pk=j.pk).update(
        run_at=DbNow(run_at), hinted_at=None if hinted_at is None else DbNow(hinted_at)
    )
    return j.pk


def test_dispatcher_hints_exactly_the_jobs_whose_last_hint_cannot_wake_them(settings: Any) -> None:
    settings.TENURE_REDISPATCH_AFTER_SECONDS = 60.0
    never = waiting_job(run_at=-1, hinted_at=None)
    old = waiting_job(run_at=-120, hinted_at=-90)
    # Hinted, then retried: the hint went out for an earlier due time and was spent on it.
    before_retry = waiting_job(run_at=-1, hinted_at=-5)
    # Hinted after it became due, recently: that message is still on its way.
    fresh = waiting_job(run_at=-5, hinted_at=-1)
    not_due = waiting_job(run_at=+30, hinted_at=None)
    picked = {job_id for job_id, _ in driver().take_due_hints()}
    assert picked == {never, old, before_retry}
    assert fresh not in picked and not_due not in picked
    # Marked hinted now: a second round in the same instant sends nothing again.
    assert driver().take_due_hints() == []
