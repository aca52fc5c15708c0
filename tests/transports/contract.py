"""The transport contract, written once; each ``test_<transport>.py`` runs it on one transport.

A transport only delivers wake-ups; the database decides ownership. So on every transport:
every job runs once, a duplicated delivery is absorbed by the claim, a lost one is re-sent by
the dispatcher, a SIGKILLed worker's job is claimed again after its lease, and SIGTERM drains
or releases without a full-lease wait. Where wake-ups are broker messages, a message for an
unknown job is also dropped with a log line, and a pickle-typed message is refused with
nothing executed.

The classes here are not collected themselves (their names do not start with ``Test``); a
test module subclasses one and names its transport with ``spec_id``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import signal
import uuid
from pathlib import Path
from typing import Any, ClassVar

from django.db.models import Count
from django.test import override_settings

from demo.models import LedgerEntry
from scheduler_core.models import Attempt, Executor, Job
from scheduler_core.storage.drivers import driver
from tests.conftest import broker_consumer, wait_until
from tests.transports import jobs
from tests.transports.conftest import BROKER_QUEUE, Harness, Spec, descendants, kombu_queue


def state(job_id: int) -> str:
    """The job's lifecycle state now."""
    return str(Job.objects.values_list("state", flat=True).get(pk=job_id))


def attempts(job_id: int) -> list[tuple[int, str]]:
    """(fence, outcome) of every attempt of the job, in order."""
    return list(
        Attempt.objects.filter(job_id=job_id).order_by("fence").values_list("fence", "outcome")
    )


def dropped_lines(h: Harness, job_id: int) -> int:
    """Drops the adapter logged for ``job_id`` (its logger's own lines, not the copies a
    worker's root handler may print)."""
    return h.log_text().count(
        f"tenure.transports.{h.spec.transport} dropped hint for job {job_id}:"
    )


class TransportContract:
    """What every transport must do. ``spec_id`` names the transport (see ``conftest.SPECS``);
    ``kill_targets`` are the processes the SIGKILL case kills."""

    spec_id: ClassVar[str]
    kill_targets: ClassVar[tuple[str, ...]] = ("whole",)

    def test_every_job_runs_exactly_once(self, transport: Harness) -> None:
        n = 50
        # Enqueued before any worker consumes the queue: no hint is published for them (nobody
        # would take it); once the worker is registered, the dispatcher sends theirs.
        ids = [jobs.noop.enqueue(n=i).pk for i in range(n)]
        if transport.spec.carries_messages:
            assert transport.queue_length() == 0
        transport.start_worker()
        transport.start_scheduler()
        wait_until(
            lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == n, timeout=90
        )
        per_job = Attempt.objects.filter(job_id__in=ids).values("job_id").annotate(c=Count("id"))
        assert {row["c"] for row in per_job} == {1}
        assert Attempt.objects.filter(job_id__in=ids, outcome="succeeded").count() == n
        assert set(Job.objects.filter(pk__in=ids).values_list("fence", flat=True)) == {1}
        # Every attempt names a registered executor of this transport (an RQ worker is one
        # executor however many horses it forks; a Celery pool process is one each).
        owners = set(Attempt.objects.filter(job_id__in=ids).values_list("executor", flat=True))
        assert 1 <= len(owners) <= 2
        kinds = set(Executor.objects.filter(pk__in=owners).values_list("transport", flat=True))
        assert kinds == {transport.spec.transport}

    def test_a_django_task_runs_and_its_return_value_is_read_back(self, transport: Harness) -> None:
        result = jobs.multiply.enqueue(6, 7, plus=1)
        transport.start_worker()
        transport.start_scheduler()
        wait_until(lambda: state(int(result.id)) == "succeeded", timeout=90)
        got = jobs.multiply.get_result(result.id)
        assert str(got.status) == "SUCCESSFUL"
        assert got.return_value == {"product": 43}
        assert got.attempts == 1
        assert Executor.objects.filter(pk=got.worker_ids[0]).exists()

    def test_async_jobs_and_an_async_task_run_their_bodies(self, transport: Harness) -> None:
        # Each body writes a row through Django's async ORM in its transactional job; before
        # async handlers were awaited, each job "succeeded" and no row was ever written.
        ids = [jobs.async_write.enqueue(n=i).pk for i in range(5)]
        result = jobs.async_multiply.enqueue(6, 7)
        transport.start_worker()
        transport.start_scheduler()
        wait_until(
            lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == 5, timeout=90
        )
        rows = LedgerEntry.objects.filter(job_id__in=ids)
        assert sorted(rows.values_list("account", flat=True)) == [f"async-{i}" for i in range(5)]
        assert {attempts(pk)[0] for pk in ids} == {(1, "succeeded")}
        wait_until(lambda: state(int(result.id)) == "succeeded", timeout=60)
        assert jobs.async_multiply.get_result(result.id).return_value == {"product": 42}

    def test_an_async_job_past_its_maximum_runtime_is_cancelled(self, transport: Harness) -> None:
        j = jobs.async_overrun.enqueue()
        transport.start_worker()
        transport.start_scheduler()
        marks = LedgerEntry.objects.filter(job_id=j.pk)
        wait_until(lambda: marks.filter(account="finally").exists(), timeout=60)
        claimed = Attempt.objects.get(job_id=j.pk).claimed_at
        # Cancelled at its maximum runtime, not after its minute-long sleep.
        assert marks.get().created_at - claimed < dt.timedelta(seconds=20)
        assert not marks.filter(account="woke-up").exists()

    def test_duplicated_delivery_is_absorbed_by_the_claim(self, transport: Harness) -> None:
        # Two workers, and the job's hint delivered four times (enqueue + three copies): one
        # claim, one attempt, the other deliveries dropped with a log line. Without a broker,
        # the two executors are the duplicate wake-ups.
        transport.start_worker()
        transport.start_worker()
        j = jobs.noop.enqueue()
        for _ in range(3):
            transport.publish(j.pk)
        wait_until(lambda: state(j.pk) == "succeeded", timeout=60)
        if transport.spec.carries_messages:
            wait_until(lambda: dropped_lines(transport, j.pk) == 3, timeout=30)
        assert attempts(j.pk) == [(1, "succeeded")]
        assert Job.objects.get(pk=j.pk).fence == 1

    def test_lost_hint_is_resent_by_the_dispatcher(self, transport: Harness) -> None:
        # One hint never published (a crash between commit and publish), one published and
        # then lost on the broker: neither can run until the dispatcher re-sends its hint.
        # A consumer is registered meanwhile (a worker that then went away), so the second
        # enqueue does publish.
        consumer = broker_consumer(transport.spec.transport, (BROKER_QUEUE,))
        with override_settings(TENURE_TRANSPORT="polling"):
            unsent = jobs.noop.enqueue(n=1)
        lost = jobs.noop.enqueue(n=2)
        if transport.spec.carries_messages:
            wait_until(lambda: transport.queue_length() == 1, timeout=10)
            transport.purge()
            assert transport.queue_length() == 0
        driver().executor_stopped(consumer)
        assert Job.objects.get(pk=unsent.pk).hinted_at is None
        transport.start_worker()
        # Resend age 0: the purged hint is as "old" as it will ever need to be. A Celery pool
        # process also hints, once it has registered, the jobs that waited for a consumer
        # (with the worker's own resend age), so there the dispatcher may find fewer to send.
        out = transport.scheduler_once(TENURE_REDISPATCH_AFTER_SECONDS="0")
        if transport.spec.transport == "rq":
            assert "re-sent 2 hints" in out, out
        for j in (unsent, lost):
            wait_until(lambda j=j: state(j.pk) == "succeeded", timeout=60)
            assert attempts(j.pk) == [(1, "succeeded")]

    def test_sigkilled_worker_job_is_claimed_again_after_its_lease(
        self, transport: Harness, target: str
    ) -> None:
        # "child": the process running the job (Celery pool child, RQ work horse); "whole":
        # the worker and every process under it, as when its host dies.
        w = transport.start_worker()
        j = jobs.hold_first.enqueue(seconds=30)
        wait_until(lambda: state(j.pk) == "leased", timeout=30)
        owner = Job.objects.get(pk=j.pk).lease_owner
        if target == "child":
            if transport.spec.transport == "celery":
                victim = int(owner.split(":")[1])  # the pool process that claimed it
            else:
                horses = descendants(w.pid)
                assert len(horses) == 1, horses
                victim = horses[0]
            assert victim != w.pid
            os.kill(victim, signal.SIGKILL)
        else:
            for pid in [w.pid, *descendants(w.pid)]:
                os.kill(pid, signal.SIGKILL)
            w.wait(timeout=10)
            transport.start_worker()
        transport.start_scheduler()
        wait_until(lambda: state(j.pk) == "succeeded", timeout=60)
        assert attempts(j.pk) == [(1, "lease_expired"), (2, "succeeded")]
        assert Job.objects.get(pk=j.pk).fence == 2

    def test_sigterm_drains_or_releases_without_waiting_for_the_lease(
        self, transport: Harness
    ) -> None:
        # A 60 s lease and no reaper running: the job can only end through the worker's own
        # shutdown, finished within grace or released back to waiting.
        w = transport.start_worker()
        j = jobs.nap.enqueue(seconds=2)
        wait_until(lambda: state(j.pk) == "leased", timeout=30)
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) is not None
        final = state(j.pk)
        assert final in ("succeeded", "waiting"), final
        expected = "succeeded" if final == "succeeded" else "released"
        assert attempts(j.pk) == [(1, expected)]


class BrokerContract(TransportContract):
    """What a transport that carries wake-ups as broker messages must do as well."""

    kill_targets = ("child", "whole")

    def test_message_for_unknown_job_is_dropped_with_a_log_line(self, transport: Harness) -> None:
        unknown = 10**12
        transport.publish(unknown)
        transport.start_worker()
        wait_until(lambda: dropped_lines(transport, unknown) == 1, timeout=30)
        # The worker goes on working.
        j = jobs.noop.enqueue()
        wait_until(lambda: state(j.pk) == "succeeded", timeout=30)
        assert not Attempt.objects.filter(job_id=unknown).exists()


# ---------------------------------------------------------------------------------------------
# Messages that must never run
# ---------------------------------------------------------------------------------------------


class _CreatesFile:
    """A payload whose unpickling creates ``path``: it shows whether anything unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _live_payload(tmp_path: Path, name: str) -> tuple[Path, bytes]:
    """A pickle that creates ``tmp_path/name``, after checking on a twin that it really would."""
    twin = tmp_path / f"{name}-control"
    pickle.loads(pickle.dumps(_CreatesFile(twin)))
    assert twin.exists(), "the control payload must create its file when unpickled"
    target = tmp_path / name
    return target, pickle.dumps(_CreatesFile(target))


def _publish_pickled_celery_message(spec: Spec, payload_obj: Any) -> None:
    """Put a pickle-typed ``tenure.run`` message straight onto the test queue with kombu."""
    task_id = str(uuid.uuid4())
    with kombu_queue(spec) as (conn, queue):
        conn.Producer().publish(
            ((payload_obj,), {}, {"callbacks": None, "errbacks": None, "chain": None}),
            exchange=queue.exchange,
            routing_key=BROKER_QUEUE,
            declare=[queue],
            serializer="pickle",
            headers={"lang": "py", "task": "tenure.run", "id": task_id, "root_id": task_id},
        )


def _push_raw_rq_message(url: str, fields: dict[str, Any]) -> str:
    """Write an RQ job hash by hand and queue its id, as anyone with Redis access could."""
    import redis

    conn = redis.Redis.from_url(url)
    rq_id = uuid.uuid4().hex
    conn.hset(f"rq:job:{rq_id}", mapping={"origin": BROKER_QUEUE, "status": "queued", **fields})
    conn.rpush(f"rq:queue:{BROKER_QUEUE}", rq_id)
    return rq_id


class CeleryContract(BrokerContract):
    """Celery on any broker."""

    def test_pickled_message_is_refused_and_runs_nothing(
        self, transport: Harness, tmp_path: Path
    ) -> None:
        target, _ = _live_payload(tmp_path, "celery-pickle")
        _publish_pickled_celery_message(transport.spec, _CreatesFile(target))
        transport.start_worker()
        j = jobs.noop.enqueue()  # queued behind the pickled message
        wait_until(lambda: state(j.pk) == "succeeded", timeout=30)
        wait_until(lambda: transport.queue_length() == 0, timeout=30)
        refusal = "Refusing to deserialize untrusted content of type pickle"
        wait_until(lambda: refusal in transport.log_text(), timeout=30)
        assert not target.exists()
        assert attempts(j.pk) == [(1, "succeeded")]


class RqContract(BrokerContract):
    """RQ on Redis, run by ``manage.py rqworker`` (whose own default serializer is pickle)."""

    def test_pickled_and_foreign_messages_are_refused_and_run_nothing(
        self, transport: Harness, tmp_path: Path
    ) -> None:
        data_file, data_pickle = _live_payload(tmp_path, "rq-data")
        meta_file, meta_pickle = _live_payload(tmp_path, "rq-meta")
        shell_file = tmp_path / "rq-shell"
        url = transport.spec.url
        pickled = _push_raw_rq_message(url, {"data": data_pickle, "description": "pickled data"})
        _push_raw_rq_message(
            url,
            {
                "data": json.dumps(["scheduler_core.transports.rq.run_job", None, [10**12], {}]),
                "meta": meta_pickle,
                "description": "pickled meta",
            },
        )
        foreign = _push_raw_rq_message(
            url,
            {
                "data": json.dumps(["os.system", None, [f"touch {shell_file}"], {}]),
                "description": "another function",
            },
        )
        transport.start_worker()
        j = jobs.noop.enqueue()  # queued behind the three
        wait_until(lambda: state(j.pk) == "succeeded", timeout=30)
        wait_until(lambda: transport.queue_length() == 0, timeout=30)
        logs = transport.log_text()
        assert f"refused message {pickled}" in logs and "payload is not JSON" in logs
        assert f"refused message {foreign}" in logs and "'os.system'" in logs
        assert dropped_lines(transport, 10**12) == 1  # read as JSON; its pickled meta unread
        assert not data_file.exists() and not meta_file.exists() and not shell_file.exists()
        assert attempts(j.pk) == [(1, "succeeded")]
