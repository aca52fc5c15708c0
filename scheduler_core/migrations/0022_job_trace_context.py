"""A job's spec row keeps the trace context of its enqueue (``scheduler_core.tracing``), so the
spans of its attempts descend from the request that enqueued it. Nullable, no default: adding
it rewrites no row on either database, and jobs enqueued before it carry none."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("scheduler_core", "0021_fence_epoch")]

    operations = [
        migrations.AddField(
            model_name="jobspec",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                help_text="The trace context of the enqueue (W3C traceparent and tracestate) "
                "its attempts' spans descend from; empty while tracing is off "
                "(scheduler_core.tracing).",
                null=True,
            ),
        ),
    ]
