"""What tracing off adds to one attempt and one enqueue, in the process, without a database:
the calls Tenure makes on those paths for spans and signals when no tracer provider is set
and no receiver is connected (``scheduler_core.runtime.observe``, ``scheduler_core.tracing``).
The best of seven timings of 100,000 calls each, so other work on the machine inflates it
little. ``--without-otel`` runs it in a process that cannot import opentelemetry.

    PYTHONPATH=. var/bench-venv/bin/python -m bench.otel_off [--without-otel]
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import timeit
from typing import Any


class _NoOpenTelemetry:
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("opentelemetry is not installed here")


def main() -> None:
    if "--without-otel" in sys.argv:
        sys.meta_path.insert(0, _NoOpenTelemetry())  # type: ignore[arg-type]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DATABASE_URL", "sqlite:///var/tenure.sqlite3")
    import django

    django.setup()
    import scheduler_core.signals as signals
    import scheduler_core.tracing as tracing
    from scheduler_core.domain.options import JobOptions
    from scheduler_core.runtime import observe
    from scheduler_core.runtime.context import JobContext
    from scheduler_core.storage.records import Lease

    lease = Lease(
        job_id=1,
        fence=1,
        attempt=1,
        attempt_id=1,
        kind="run",
        created_at=dt.datetime.now(dt.UTC),
        executor="bench",
        options=JobOptions(
            name="bench.noop",
            queue="default",
            payload={},
            lease_seconds=30,
            effect="at_least_once",
            max_attempts=3,
            timeout_seconds=0.0,
        ),
    )
    ctx = JobContext(lease)

    def attempt() -> None:
        observe.started(ctx, None)
        with tracing.current(ctx.span):
            pass
        observe.finished(ctx, None, "succeeded")

    def enqueue() -> None:
        span, _ = tracing.start_enqueue("bench.noop", "default")
        tracing.end_enqueue(span, [1])
        if signals.job_enqueued.receivers:
            raise AssertionError("no receiver is connected here")

    print(f"opentelemetry importable: {tracing.trace is not None}; tracing on: {tracing.active()}")
    for name, fn in (("attempt", attempt), ("enqueue", enqueue)):
        n = 100_000
        best = min(timeit.repeat(fn, number=n, repeat=7)) / n
        print(f"tracing off, per {name}: {best * 1e6:.2f} us")


if __name__ == "__main__":
    main()
