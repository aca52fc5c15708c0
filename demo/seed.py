"""Seed a few demo jobs of every kind (idempotent: unique keys make a second run a no-op)."""

from __future__ import annotations

from typing import Any

from scheduler_core import registry

# (job name, payload, unique key); jobs not registered in this build are skipped.
SEED: list[tuple[str, dict[str, Any], str]] = [
    *[("demo.noop", {}, f"seed:noop:{i}") for i in range(5)],
    ("demo.flaky", {"fail_times": 2}, "seed:flaky"),
    ("demo.sleep", {"seconds": 3}, "seed:sleep"),
]


def seed() -> None:
    """Enqueue the demo jobs (plus any ``DEMO_SEED`` entries ``demo.jobs`` declares)."""
    from demo import jobs

    entries = SEED + list(getattr(jobs, "DEMO_SEED", []))
    created = 0
    for name, payload, key in entries:
        if registry.get(name) is None:
            continue
        job = registry.enqueue(name, payload, unique_key=key)
        created += job.unique_key == key
    print(f"seeded {created} demo jobs")
