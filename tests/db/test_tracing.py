"""OpenTelemetry spans (the ``tenure[otel]`` extra, ``scheduler_core.tracing``): one per
enqueue, per attempt and per effect; the trace context stored with the job at enqueue, so an
attempt's span descends from the request that enqueued it, in whatever process runs it;
attributes for queue, type, attempt, fence and outcome; nothing made or stored while tracing is
off. Read through the SDK's in-memory exporter."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from scheduler_core import job
from scheduler_core.models import Job, JobSpec
from scheduler_core.runtime import worker
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "tracing"
EXEC = "t:1:tracing"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@job(name="tests.tracing.charge", queue=Q, effect="idempotent", max_attempts=3)
def charge(ctx: Any, *, fail_first: bool = False) -> None:
    with ctx.effect("charge"):
        pass
    with trace.get_tracer("the-handler").start_as_current_span("handler's own work"):
        pass
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("provider busy")


def _reset_global_provider() -> None:
    # The API sets its global provider once per process; a test restores it as it found it.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _reset_global_provider()


def _run_one(job_id: int) -> str:
    [lease] = driver().claim(executor=EXEC, job_id=job_id)
    return run_lease(lease)


def _named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_an_attempt_s_span_descends_from_the_request_that_enqueued_the_job(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("the-web-app").start_as_current_span("POST /invoices") as request:
        j = charge.enqueue()
    stored = JobSpec.objects.get(pk=j.pk).trace_context
    assert stored is not None and stored["traceparent"].startswith("00-")
    assert _run_one(j.pk) == "succeeded"
    [enqueue] = _named(spans, "tenure.enqueue")
    [attempt] = _named(spans, "tenure.attempt")
    [effect] = _named(spans, "tenure.effect")
    [own] = _named(spans, "handler's own work")
    rctx = request.get_span_context()
    assert enqueue.parent is not None and enqueue.parent.span_id == rctx.span_id
    assert attempt.parent is not None and attempt.parent.span_id == enqueue.context.span_id
    assert effect.parent is not None and effect.parent.span_id == attempt.context.span_id
    assert own.parent is not None and own.parent.span_id == attempt.context.span_id
    assert {s.context.trace_id for s in (enqueue, attempt, effect, own)} == {rctx.trace_id}
    assert (enqueue.kind, attempt.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert f"{rctx.trace_id:032x}" in stored["traceparent"]
    fence = Job.objects.get(pk=j.pk).fence
    assert dict(attempt.attributes or {}) == {
        "tenure.job.id": j.pk,
        "tenure.job.name": "tests.tracing.charge",
        "tenure.queue": Q,
        "tenure.attempt": 1,
        "tenure.fence": fence,
        "tenure.attempt.kind": "run",
        "tenure.outcome": "succeeded",
    }
    assert (enqueue.attributes or {})["tenure.job.id"] == j.pk
    assert (enqueue.attributes or {})["tenure.queue"] == Q
    assert (effect.attributes or {})["tenure.effect.state"] == "applied"
    assert (effect.attributes or {})["tenure.effect.name"] == "charge"


def test_each_attempt_has_its_span_and_a_failed_one_records_its_error(
    spans: InMemorySpanExporter,
) -> None:
    j = charge.enqueue(fail_first=True)
    assert _run_one(j.pk) == "retried"
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=1))
    assert _run_one(j.pk) == "succeeded"
    [enqueue] = _named(spans, "tenure.enqueue")
    first, second = _named(spans, "tenure.attempt")
    for s in (first, second):
        assert s.parent is not None and s.parent.span_id == enqueue.context.span_id
    assert [(s.attributes or {})["tenure.attempt"] for s in (first, second)] == [1, 2]
    assert [(s.attributes or {})["tenure.outcome"] for s in (first, second)] == [
        "retried",
        "succeeded",
    ]
    assert first.status.status_code == StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code != StatusCode.ERROR


def test_completions_written_together_end_their_attempts_spans(
    spans: InMemorySpanExporter,
) -> None:
    ids = charge.enqueue_many([{}, {}, {}])
    worker.Worker(
        queues=[Q], concurrency=3, burst=True, poll_interval=0.05, group_commit=True
    ).run()
    attempts = _named(spans, "tenure.attempt")
    assert sorted((s.attributes or {})["tenure.job.id"] for s in attempts) == sorted(ids)
    assert {(s.attributes or {})["tenure.outcome"] for s in attempts} == {"succeeded"}
    [enqueue] = _named(spans, "tenure.enqueue")
    assert (enqueue.attributes or {})["tenure.jobs"] == 3
    assert {s.parent.span_id for s in attempts if s.parent} == {enqueue.context.span_id}


def test_a_workflow_s_steps_descend_from_its_one_enqueue_span(
    spans: InMemorySpanExporter,
) -> None:
    from scheduler_core import workflow

    wf = workflow("tests.tracing.flow")
    first = wf.step(charge, name="first")
    wf.step(charge, name="second", after=[first])
    jobs = wf.enqueue().jobs
    stored = list(
        JobSpec.objects.filter(pk__in=jobs.values()).values_list("trace_context", flat=True)
    )
    assert stored[0] is not None and stored == [stored[0]] * 2
    assert _run_one(jobs["first"]) == "succeeded"
    assert _run_one(jobs["second"]) == "succeeded"
    [enqueue] = _named(spans, "tenure.enqueue")
    assert (enqueue.attributes or {})["tenure.jobs"] == 2
    attempts = _named(spans, "tenure.attempt")
    assert len(attempts) == 2
    assert {s.parent.span_id for s in attempts if s.parent} == {enqueue.context.span_id}


def test_without_a_tracer_provider_nothing_is_made_or_stored() -> None:
    _reset_global_provider()
    j = charge.enqueue()
    assert JobSpec.objects.get(pk=j.pk).trace_context is None
    assert _run_one(j.pk) == "succeeded"


def test_tenure_otel_off_makes_no_span(spans: InMemorySpanExporter, settings: Any) -> None:
    settings.TENURE_OTEL = False
    j = charge.enqueue()
    assert _run_one(j.pk) == "succeeded"
    assert JobSpec.objects.get(pk=j.pk).trace_context is None
    assert [s.name for s in spans.get_finished_spans()] == ["handler's own work"]


WITHOUT_OTEL = """
import sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("opentelemetry is not installed here")
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from scheduler_core import job, tracing
from scheduler_core.models import Job, JobSpec
from scheduler_core.runtime.worker import Worker

assert tracing.trace is None and not tracing.active()

@job(name="tests.tracing.absent", queue="absent")
def absent(ctx):
    with ctx.effect("e"):
        pass

ids = absent.enqueue_many([{}, {}]) + [absent.enqueue().pk]
Worker(queues=["absent"], concurrency=2, burst=True, poll_interval=0.05).run()
assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"succeeded"}
assert set(JobSpec.objects.filter(pk__in=ids).values_list("trace_context", flat=True)) == {None}
assert not any(m.startswith("opentelemetry") for m in sys.modules)
print("ok")
"""


def test_without_the_extra_tracing_is_off_and_jobs_run(tmp_path: Any) -> None:
    """opentelemetry cannot be imported in the process: jobs enqueue and run as before."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]
