"""OpenTelemetry spans for enqueues, attempts and effects (the ``tenure[otel]`` extra), and the
trace context a job carries from the code that enqueued it to the attempts that run it.

OpenTelemetry is imported here once, at import; without it every function is a check of one
module global and returns at once. With it, spans are made only once the application has set a
tracer provider (the SDK's, or ``opentelemetry-instrument``'s) and ``TENURE_OTEL`` is on; until
then the job path does nothing more than without the extra, and a job enqueued then carries no
trace context.

The spans (``docs/reference/tracing.md``):

* ``tenure.enqueue <name>`` (kind ``PRODUCER``), a child of the span current when the job was
  enqueued (the request's, under Django's instrumentation). Its context, in the W3C
  ``traceparent`` form of the configured propagator, is stored with the job
  (``JobSpec.trace_context``).
* ``tenure.attempt <name>`` (kind ``CONSUMER``), one per attempt, a child of that enqueue span:
  every attempt of a job, retries included, sits in the trace of the request that enqueued it.
  It is current while the handler runs, so the handler's own spans are its children. It ends
  when the attempt's end is known, with its outcome.
* ``tenure.effect <effect>``, one per ``ctx.effect(...)`` scope, a child of its attempt's span.

Attributes: ``tenure.job.id``, ``tenure.job.name``, ``tenure.queue``, ``tenure.attempt``,
``tenure.fence``, ``tenure.attempt.kind``, ``tenure.outcome``; on effects ``tenure.effect.name``,
``tenure.effect.key`` and ``tenure.effect.state``. An attempt that failed records its exception
and the status ``ERROR``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from .conf import tenure_settings

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
except ImportError:  # the extra is not installed: tracing stays off
    trace = None  # type: ignore[assignment]

TRACER_NAME = "scheduler_core"
"""The instrumentation scope of every span Tenure makes."""

Span = Any
"""An OpenTelemetry span (typed loosely: the extra may be absent)."""


_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
"""The API then makes the provider on its first ``get_tracer_provider()`` call."""


def active() -> bool:
    """Whether spans are made now: the extra is installed, ``TENURE_OTEL`` is on and the
    application has set a tracer provider."""
    if trace is None:
        return False
    # The API's global, None until a provider is set: read first because
    # get_tracer_provider() looks the environment up on every call (3 us, per job).
    if getattr(trace, "_TRACER_PROVIDER", True) is None and not _PROVIDER_FROM_ENVIRONMENT:
        return False
    return tenure_settings().OTEL and not isinstance(
        trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider)
    )


def _tracer() -> Any:
    assert trace is not None
    return trace.get_tracer(TRACER_NAME)


def start_enqueue(name: str, queue: str) -> tuple[Span, dict[str, str] | None]:
    """Start the span of one enqueue (a child of the current span) and return it with the
    trace context to store with the job: ``(None, None)`` when tracing is off."""
    if not active():
        return None, None
    span = _tracer().start_span(
        f"tenure.enqueue {name}",
        kind=SpanKind.PRODUCER,
        attributes={"tenure.job.name": name, "tenure.queue": queue},
    )
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier or None


def end_enqueue(span: Span, job_ids: list[int], error: BaseException | None = None) -> None:
    """End an enqueue's span, naming the jobs it accepted."""
    if span is None:
        return
    if len(job_ids) == 1:
        span.set_attribute("tenure.job.id", job_ids[0])
    elif job_ids:
        span.set_attribute("tenure.jobs", len(job_ids))
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


def start_attempt(carrier: Mapping[str, str] | None, attributes: dict[str, Any], name: str) -> Span:
    """Start an attempt's span as a child of the enqueue whose context ``carrier`` holds (a
    root span when it holds none)."""
    parent = propagate.extract(carrier) if carrier else otel_context.Context()
    return _tracer().start_span(
        f"tenure.attempt {name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )


_NOTHING = nullcontext()


def current(span: Span) -> AbstractContextManager[None]:
    """Make ``span`` the current span inside the block (nothing when it is None)."""
    return _NOTHING if span is None else _current(span)


@contextmanager
def _current(span: Span) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def end_attempt(span: Span, outcome: str, error: BaseException | None = None) -> None:
    """End an attempt's span with its outcome (and the error that ended it)."""
    if span is None:
        return
    span.set_attribute("tenure.outcome", outcome)
    if error is not None:
        span.record_exception(error)
    if outcome in ("failed", "indeterminate") or (
        error is not None and outcome not in ("snoozed", "cancelled")
    ):
        span.set_status(Status(StatusCode.ERROR, str(error) if error else outcome))
    span.end()


def start_effect(name: str, attributes: dict[str, Any]) -> Span:
    """Start an effect's span, a child of the current span (its attempt's)."""
    if not active():
        return None
    return _tracer().start_span(
        f"tenure.effect {name}", attributes={**attributes, "tenure.effect.name": name}
    )


def end_effect(span: Span, key: str, state: str) -> None:
    """End an effect's span with the state its outcome was recorded as."""
    if span is None:
        return
    span.set_attribute("tenure.effect.key", key)
    span.set_attribute("tenure.effect.state", state)
    if state == "unknown":
        span.set_status(Status(StatusCode.ERROR, "outcome unknown"))
    span.end()
