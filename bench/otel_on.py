"""The OpenTelemetry comparison's "on" system (``bench.run --only otel``), loaded through
``TENURE_JOB_MODULES`` in each of its processes (executors and the harness's agent that
enqueues): the SDK's tracer provider with a batch span processor, as an application sets it
up, whose exporter drops the spans instead of sending them, so the figure is Tenure's and the
SDK's cost, not a collector's."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class Dropped(SpanExporter):
    """Accepts every span and keeps none."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Dropped()))
trace.set_tracer_provider(provider)
