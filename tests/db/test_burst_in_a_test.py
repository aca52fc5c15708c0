"""What docs/howto/testing.md tells a host project: a test that commits can enqueue a job and
run it to its end with ``run_executor --burst``, on the real claim and completion path."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from scheduler_core import job
from scheduler_core.models import Attempt, Job

RAN: list[tuple[str, int]] = []


@job(name="howto.testing.note")
def note(ctx: object, *, text: str) -> None:
    RAN.append((text, ctx.attempt))  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_a_test_can_run_the_jobs_it_enqueued_with_run_executor_burst() -> None:
    RAN.clear()
    due = note.enqueue(text="hello")
    later = note.enqueue(text="later", run_at=timezone.now() + dt.timedelta(hours=1))

    call_command("run_executor", "--burst", "--queues", "default", "--concurrency", "1")

    assert RAN == [("hello", 1)]
    assert Job.objects.get(pk=due.pk).state == "succeeded"
    assert Attempt.objects.get(job_id=due.pk).outcome == "succeeded"
    assert Job.objects.get(pk=later.pk).state == "waiting"  # not due: left for later


@pytest.mark.django_db(transaction=True)
def test_with_celery_configured_the_test_needs_no_broker(settings: Any) -> None:
    RAN.clear()
    settings.TENURE_TRANSPORT = "celery"
    due = note.enqueue(text="no broker")
    # No live worker consumes the queue, so no message was published for it.
    assert Job.objects.get(pk=due.pk).hinted_at is None

    call_command("run_executor", "--burst", "--queues", "default", "--concurrency", "1")

    assert RAN == [("no broker", 1)]
    assert Job.objects.get(pk=due.pk).state == "succeeded"
