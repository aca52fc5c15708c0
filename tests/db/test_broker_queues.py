"""``TENURE_BROKER_QUEUES``: with a broker transport, only the named queues get broker
messages (on enqueue and from the dispatcher); the others are left to broker-less executors."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from scheduler_core import job
from scheduler_core.api import hints
from scheduler_core.models import Job
from scheduler_core.services import maintenance
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import new_executor_id
from tests.conftest import broker_consumer

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
    broker_consumer()
    sent: list[tuple[int, str]] = []

    def publish(job_id: int, queue: str) -> bool:
        sent.append((job_id, queue))
        return True

    monkeypatch.setattr(hints, "publish", publish)
    return sent


def test_only_named_queues_use_the_broker(settings: Any) -> None:
    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ("bq-broker",)
    broker_consumer()
    assert hints.uses_broker("bq-broker")
    assert not hints.uses_broker("bq-db")
    assert hints.uses_broker()  # some queue does
    settings.TENURE_BROKER_QUEUES = ()
    assert hints.uses_broker("bq-db")
    settings.TENURE_TRANSPORT = "polling"
    assert not hints.uses_broker("bq-broker")


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
    # Just hinted: not re-sent yet.
    assert driver().take_due_hints(queues=hints.hinted_queues()) == []


def test_hints_go_only_where_a_live_consumer_takes_them(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A broker transport configured but no worker consuming (only broker-less executors run):
    no enqueue publishes, no dispatcher round re-sends. A consumer of one queue gets that
    queue's hints only; a stopped one gets none."""
    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ()
    # The queue names below are the broker's: no prefix from the environment running this.
    settings.TENURE_BROKER_QUEUE_PREFIX = ""
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(
        hints, "publish", lambda job_id, queue: sent.append((job_id, queue)) or True
    )
    with transaction.atomic():
        on_broker.enqueue()
        on_db.enqueue_many([{}, {}])
    assert maintenance.dispatch_once() == 0
    assert sent == []
    assert Job.objects.filter(hinted_at__isnull=False).count() == 0
    consumer = broker_consumer(queues=("bq-broker",))
    assert maintenance.dispatch_once() == 1  # the unhinted due job of the consumed queue
    assert [q for _, q in sent] == ["bq-broker"]
    b = on_broker.enqueue()
    on_db.enqueue()
    assert sent[-1] == (b.pk, "bq-broker") and len(sent) == 2
    driver().executor_stopped(consumer)
    hints.CONSUMERS.forget()
    on_broker.enqueue()
    assert len(sent) == 2


def test_a_job_left_unclaimed_gets_hints_ever_further_apart(
    published: list[tuple[int, str]], settings: Any
) -> None:
    """Re-sends are bounded: after each hint the dispatcher waits at least as long as the job
    had then been due (10 s, 10 s, 20 s, 40 s ...), not one re-send per round."""
    from scheduler_core.storage.clock import DbNow

    settings.TENURE_REDISPATCH_AFTER_SECONDS = 10.0
    a = on_broker.enqueue()

    def state(due_ago: float, hinted_ago: float) -> bool:
        Job.objects.filter(pk=a.pk).update(run_at=DbNow(-due_ago), hinted_at=DbNow(-hinted_ago))
        picked = [j for j, _ in driver().take_due_hints()]
        return a.pk in picked

    assert not state(due_ago=5, hinted_ago=5)  # hinted when it came due, 5 s ago
    assert state(due_ago=11, hinted_ago=11)  # 10 s passed since
    assert not state(due_ago=25, hinted_ago=12)  # it had waited 13 s at that hint: wait 13
    assert state(due_ago=27, hinted_ago=14)
    assert not state(due_ago=600, hinted_ago=200)  # hinted when 400 s due: wait 400
    # Hinted when 440 s due, 460 s ago. (Not 450 and 450: the wait must be passed, and on
    # SQLite's millisecond clock a look within the same millisecond as the write found it
    # exactly reached, not passed.)
    assert state(due_ago=900, hinted_ago=460)


def test_a_pool_process_that_cannot_register_at_fork_registers_when_the_database_returns(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A Celery pool process forked while the database restarts cannot register; until it is
    registered nobody hints its queues, so it must keep trying on its own rather than wait for
    a message that never comes (a fault run's broker queue once waited forever so)."""
    import time

    from django.db import OperationalError

    from scheduler_core.models import Executor
    from scheduler_core.transports import celery as celery_transport

    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ()
    refusals = [OperationalError("the database system is starting up")] * 2
    real = driver().executor_started

    def starting_up(*args: Any, **kwargs: Any) -> None:
        if refusals:
            raise refusals.pop()
        real(*args, **kwargs)

    monkeypatch.setattr(driver(), "executor_started", starting_up)
    monkeypatch.setattr(celery_transport, "_state", {})
    celery_transport._process_started()  # the worker_process_init handler; must not raise
    assert not Executor.objects.filter(transport="celery").exists()
    consumed = frozenset(celery_transport._consumed_queues())
    assert not hints.CONSUMERS.queues("celery")
    deadline = time.monotonic() + 10
    while not Executor.objects.filter(transport="celery").exists():
        assert time.monotonic() < deadline, "the pool process never registered"
        time.sleep(0.1)
    try:
        hints.CONSUMERS.forget()
        assert hints.CONSUMERS.queues("celery") == consumed
        assert refusals == []
    finally:
        celery_transport._state["hb"].stop()


def test_a_pool_process_is_ready_for_messages_before_its_registration_is_written(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The worker_process_init receiver returns at once and registers from a thread: a pool
    process takes messages only once the receiver has returned, and 16 of them each opening a
    connection there delayed a worker's first message by seconds (bench.startup). A message
    that comes first waits for the registration under its lock."""
    import threading
    import time

    from scheduler_core.models import Executor
    from scheduler_core.transports import celery as celery_transport

    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ()
    release = threading.Event()
    real = driver().executor_started

    def slow_database(*args: Any, **kwargs: Any) -> None:
        assert release.wait(30)
        real(*args, **kwargs)

    monkeypatch.setattr(driver(), "executor_started", slow_database)
    monkeypatch.setattr(celery_transport, "_state", {})
    monkeypatch.setattr(celery_transport, "_announced", _fresh_flag())
    monkeypatch.setattr(hints, "publish", lambda job_id, queue: True)
    started = time.monotonic()
    celery_transport._process_started()  # the worker_process_init handler
    assert time.monotonic() - started < 1.0
    assert not Executor.objects.filter(transport="celery").exists()
    release.set()
    executor_id, hb = celery_transport._process_executor()  # a first message's task
    try:
        assert Executor.objects.filter(pk=executor_id, transport="celery").exists()
        for t in threading.enumerate():
            if t.name == "tenure-register":
                t.join(10)
        assert Executor.objects.filter(transport="celery").count() == 1
    finally:
        hb.stop()


def test_a_celery_worker_freezes_its_start_up_objects_before_the_pool_forks() -> None:
    """worker_init (sent before the pool is created) puts the objects loaded so far out of the
    collector's reach: Celery collects before each fork, 55 ms a fork with them walked."""
    import gc

    from celery.signals import worker_init

    from scheduler_core.transports import celery as celery_transport

    assert celery_transport._freeze_startup_objects in worker_init._live_receivers(None)
    gc.unfreeze()
    try:
        celery_transport._freeze_startup_objects()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_first_consumer_is_noticed_within_a_second(settings: Any) -> None:
    """A read that found no consumer is trusted for a second only (one that found some, for
    five): jobs enqueued before the first worker started wait about a second, not five."""
    import time

    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ()
    hints.CONSUMERS.forget()
    assert not hints.uses_broker("bq-broker")
    executor_id = new_executor_id("test-celery")
    driver().executor_started(executor_id, transport="celery", queues=["*"], concurrency=1)
    assert not hints.uses_broker("bq-broker")  # the empty answer, still trusted
    time.sleep(hints.NO_CONSUMER_REFRESH_SECONDS + 0.1)
    assert hints.uses_broker("bq-broker")
    driver().executor_stopped(executor_id)
    assert hints.uses_broker("bq-broker")  # a found consumer is trusted longer


def test_a_pool_process_that_registers_hints_the_jobs_that_waited_for_a_consumer(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs enqueued while no worker consumed their queue got no message; the first pool
    process to register hints them itself, without waiting for the dispatcher's round."""
    import time

    from scheduler_core.models import Job
    from scheduler_core.transports import celery as celery_transport

    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ()
    hints.CONSUMERS.forget()
    waiting = [on_broker.enqueue().pk for _ in range(3)]
    assert not Job.objects.filter(pk__in=waiting, hinted_at__isnull=False).exists()
    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(
        hints, "publish", lambda job_id, queue: sent.append((job_id, queue)) or True
    )
    monkeypatch.setattr(celery_transport, "_state", {})
    monkeypatch.setattr(celery_transport, "_announced", _fresh_flag())
    # As `celery worker -Q bq-broker` would consume.
    monkeypatch.setattr(
        celery_transport, "_consumed_queues", lambda: [hints.broker_queue("bq-broker")]
    )
    celery_transport._process_started()  # the worker_process_init handler
    try:
        deadline = time.monotonic() + 10
        while len(sent) < 3:
            assert time.monotonic() < deadline, f"hinted only {sent}"
            time.sleep(0.05)
        assert sorted(job_id for job_id, _ in sent) == sorted(waiting)
        assert Job.objects.filter(pk__in=waiting, hinted_at__isnull=False).count() == 3
    finally:
        celery_transport._state["hb"].stop()


def _fresh_flag() -> Any:
    import ctypes
    import multiprocessing

    return multiprocessing.RawValue(ctypes.c_bool, False)


def test_only_the_first_pool_process_of_a_worker_hints_the_backlog(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's processes share one flag: the first to register hints what waited, the
    others send nothing (16 of them publishing at once delayed the worker's start by 3 s);
    one whose hinting failed lets the next try. The hints are taken from the database by the
    real dispatcher; only the publish (the broker) and one database failure are stood in for."""
    from django.db import OperationalError

    from scheduler_core.transports import celery as celery_transport

    settings.TENURE_TRANSPORT = "celery"
    settings.TENURE_BROKER_QUEUES = ()
    hints.CONSUMERS.forget()
    executor_id = new_executor_id("test-celery")
    driver().executor_started(
        executor_id, transport="celery", queues=[hints.broker_queue("bq-broker")], concurrency=1
    )
    monkeypatch.setattr(celery_transport, "_announced", _fresh_flag())
    sent: list[int] = []
    monkeypatch.setattr(hints, "publish", lambda job_id, queue: sent.append(job_id) or True)
    first = [on_broker.enqueue().pk for _ in range(2)]
    Job.objects.filter(pk__in=first).update(hinted_at=None)  # as if no consumer was known
    sent.clear()

    real = driver().take_due_hints

    def database_restarting(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(driver(), "take_due_hints", database_restarting)
    celery_transport._announce_backlog()
    assert sent == [] and not celery_transport._announced.value  # the next process may try
    monkeypatch.setattr(driver(), "take_due_hints", real)
    celery_transport._announce_backlog()
    assert sorted(sent) == sorted(first)
    later = [on_broker.enqueue().pk for _ in range(2)]
    Job.objects.filter(pk__in=later).update(hinted_at=None)
    sent.clear()
    celery_transport._announce_backlog()  # a second pool process of the same worker
    assert sent == []
    assert not Job.objects.filter(pk__in=later, hinted_at__isnull=False).exists()
    driver().executor_stopped(executor_id)
