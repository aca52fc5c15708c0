"""``TENURE_BROKER_QUEUES``: with a broker transport, only the named queues get broker
messages (on enqueue and from the dispatcher); the others are left to broker-less executors."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from scheduler_core import job, maintenance, store, transports
from scheduler_core.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="tests.bq.on_broker", queue="bq-broker")
def on_broker(ctx: Any) -> None:
    """Nothing."""


@job(name="tests.bq.on_db", queue="bq-db")
def on_db(ctx: Any) -> None:
    """Nothing."""


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[tuple[int, str]]:
    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ("bq-broker",)
    sent: list[tuple[int, str]] = []

    def publish(job_id: int, queue: str) -> bool:
        sent.append((job_id, queue))
        return True

    monkeypatch.setattr(transports, "publish", publish)
    return sent


def test_only_named_queues_use_the_broker(settings: Any) -> None:
    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ("bq-broker",)
    assert transports.uses_broker("bq-broker")
    assert not transports.uses_broker("bq-db")
    assert transports.uses_broker()  # some queue does
    settings.TENURE_BROKER_QUEUES = ()
    assert transports.uses_broker("bq-db")
    settings.TENURE_TRANSPORT = "polling"
    assert not transports.uses_broker("bq-broker")


def test_enqueue_announces_only_broker_queues(published: list[tuple[int, str]]) -> None:
    with transaction.atomic():
        a = on_broker.enqueue()
        on_db.enqueue()
        many = on_broker.enqueue_many([{}, {}])
        on_db.enqueue_many([{}, {}])
    assert sorted(published) == sorted([(a.pk, "bq-broker")] + [(i, "bq-broker") for i in many])


def test_dispatcher_resends_only_broker_queues(published: list[tuple[int, str]]) -> None:
    a = on_broker.enqueue()
    b = on_db.enqueue()
    # As if both hints were lost before being recorded: both jobs are due and unhinted.
    Job.objects.filter(pk__in=[a.pk, b.pk]).update(hinted_at=None)
    published.clear()
    assert maintenance.dispatch_once() == 1
    assert published == [(a.pk, "bq-broker")]
    assert store.take_due_hints() == []  # just hinted: not re-sent yet
