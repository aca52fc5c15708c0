"""Seed a few demo jobs of every kind (idempotent: unique keys make a second run a no-op)."""

from __future__ import annotations

from typing import Any

from scheduler_core.api import registry

# (job name, payload, unique key); jobs not registered in this build are skipped.
SEED: list[tuple[str, dict[str, Any], str]] = [
    *[("demo.noop", {}, f"seed:noop:{i}") for i in range(5)],
    ("demo.flaky", {"fail_times": 2}, "seed:flaky"),
    ("demo.sleep", {"seconds": 3}, "seed:sleep"),
    # One job per effect mode, against the demo destinations; the first attempt of each
    # charge and email meets a reply that comes after the caller's timeout, so the dashboard
    # shows what each mode does with an ambiguous outcome.
    (
        "demo.charge",
        {"invoice_id": 1, "cents": 500, "timeout": 1.0, "slow_reply_attempts": 1},
        "seed:charge",
    ),
    (
        "demo.charge_reconcilable",
        {"invoice_id": 2, "cents": 700, "timeout": 1.0, "slow_reply_attempts": 1},
        "seed:charge-reconcilable",
    ),
    (
        "demo.email",
        {"to": "ada@example.test", "timeout": 1.0, "slow_reply_attempts": 1},
        "seed:email",
    ),
    (
        "demo.email_at_most_once",
        {"to": "grace@example.test", "timeout": 1.0, "slow_reply_attempts": 1},
        "seed:email-at-most-once",
    ),
    ("demo.ledger_credit", {"account": "acme", "cents": 1200}, "seed:ledger"),
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
