"""Per-call options of an enqueue: ``queue=``, ``priority=``, ``run_at=``, ``delay=`` and the
``using()`` form (docs/reference/jobs.md, "Per-call options")."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from scheduler_core import job
from scheduler_core.exceptions import EnqueueError
from scheduler_core.models import Job
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="options.mail")
def mail(ctx: Any, *, to: str) -> None:
    pass


@job(name="options.urgent_mail", queue="urgent")
def urgent_mail(ctx: Any, *, to: str) -> None:
    pass


def test_queue_and_priority_are_set_for_one_call_only() -> None:
    a = mail.enqueue(to="a", queue="urgent", priority=9)
    b = mail.enqueue(to="b")
    assert (a.queue, a.priority) == ("urgent", 9)
    assert (b.queue, b.priority) == ("default", 0)
    assert Job.objects.get(pk=a.pk).queue == "urgent"


def test_an_unknown_queue_is_refused_and_nothing_is_written() -> None:
    with pytest.raises(EnqueueError, match=r"queue 'urgnet' is unknown") as refused:
        mail.enqueue(to="a", queue="urgnet")
    assert "urgent" in str(refused.value)  # the known queues are named
    assert not Job.objects.exists()


def test_a_queue_with_settings_of_its_own_is_known() -> None:
    assert driver().write_queue("bulk", expected_version=0, fields={"max_leased": 3})
    assert mail.enqueue(to="a", queue="bulk").queue == "bulk"


def test_the_broker_queues_setting_names_known_queues(settings: Any) -> None:
    settings.TENURE_BROKER_QUEUES = ("reports",)
    assert mail.enqueue(to="a", queue="reports").queue == "reports"


def test_delay_in_seconds_or_as_a_timedelta_sets_the_due_time() -> None:
    before = timezone.now()
    a = mail.enqueue(to="a", delay=60)
    b = mail.enqueue(to="b", delay=dt.timedelta(minutes=2))
    after = timezone.now()
    assert before + dt.timedelta(seconds=60) <= a.run_at <= after + dt.timedelta(seconds=60)
    assert before + dt.timedelta(minutes=2) <= b.run_at <= after + dt.timedelta(minutes=2)
    assert Job.objects.get(pk=a.pk).state == "waiting"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delay": 5, "run_at": timezone.now()}, "run_at and delay are exclusive"),
        ({"delay": -1}, "delay must be at least 0 and at most"),
        ({"delay": float("inf")}, "delay must be at least 0 and at most"),
        ({"delay": 10**9}, "delay must be at least 0 and at most"),
        ({"delay": True}, "delay must be a number of seconds or a timedelta"),
        ({"delay": "5"}, "delay must be a number of seconds or a timedelta"),
        ({"priority": 5000}, "priority must be an integer"),
        ({"priority": "high"}, "priority must be an integer"),
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"queue": 7}, "queue must be a non-empty string"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at must be timezone-aware"),
    ],
)
def test_bad_options_are_refused_with_a_clear_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(EnqueueError, match=message):
        mail.enqueue(to="a", **options)
    with pytest.raises(EnqueueError, match=message):
        mail.using(**options).enqueue(to="a")
    assert not Job.objects.exists()


def test_using_sets_options_for_the_enqueues_made_through_it() -> None:
    urgent = mail.using(queue="urgent", priority=5)
    one = urgent.enqueue(to="a", unique_key="mail-a")
    again = urgent.enqueue(to="a", unique_key="mail-a")
    ids = urgent.enqueue_many([{"to": "b"}, {"to": "c"}])
    assert again.pk == one.pk
    rows = Job.objects.filter(pk__in=[one.pk, *ids])
    assert {(r.queue, r.priority) for r in rows} == {("urgent", 5)}
    assert mail.using(delay=30).enqueue(to="d").run_at > timezone.now()


def test_enqueue_many_takes_the_same_options() -> None:
    ids = mail.enqueue_many([{"to": "a"}], queue="urgent", priority=2, delay=60)
    row = Job.objects.get(pk=ids[0])
    assert (row.queue, row.priority) == ("urgent", 2)
    assert row.run_at > timezone.now() + dt.timedelta(seconds=50)
    with pytest.raises(EnqueueError, match="unknown"):
        mail.enqueue_many([{"to": "a"}], queue="nowhere")


def test_an_enqueue_with_options_joins_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        mail.using(queue="urgent", priority=3).enqueue(to="a")
        mail.enqueue(to="b", delay=10)
        raise RuntimeError("the caller rolls back")
    assert not Job.objects.exists()


@pytest.mark.parametrize("name", ["queue", "delay", "priority", "run_at", "unique_key"])
def test_a_handler_may_not_name_a_payload_argument_after_an_option(name: str) -> None:
    ns: dict[str, Any] = {}
    exec(f"def handler(ctx, *, {name}=None):\n    pass", ns)
    with pytest.raises(ValueError, match=rf"payload names \['{name}'\] are reserved"):
        job(name=f"options.clash_{name}")(ns["handler"])
