"""Seed a few demo jobs of every kind and the demo's database schedule (idempotent: unique keys
and the schedule's name make a second run a no-op). The steady traffic afterwards comes from
``demo.traffic``, a schedule declared in code (demo/jobs.py)."""

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
    # Invoices to search for by payload (invoice 1005 among them), a report on the pausable
    # queue, one job that fails for good, one whose reply is lost, one that runs for minutes.
    *[
        ("demo.invoice", {"invoice_id": 1000 + i, "cents": 1000 + 25 * i}, f"seed:invoice:{i}")
        for i in range(1, 11)
    ],
    ("demo.report", {"kind": "daily"}, "seed:report"),
    ("demo.poison", {"note": "seeded"}, "seed:poison"),
    ("demo.lost_reply", {}, "seed:lost-reply"),
    ("demo.long", {"seconds": 150.0}, "seed:long"),
]

SCHEDULE_NAME = "demo.report-every-minute"
"""A schedule kept in the database (the operator's kind): a report every minute."""


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
    seed_schedule()


def seed_schedule() -> bool:
    """Create the demo's database schedule unless it exists; whether it was created."""
    from scheduler_core.models import Schedule
    from scheduler_core.services import scheduling

    if registry.get("demo.report") is None:
        return False
    if Schedule.objects.filter(name=SCHEDULE_NAME).exists():
        return False
    scheduling.create_schedule(
        name=SCHEDULE_NAME, job_name="demo.report", payload={"kind": "scheduled"}, cron="* * * * *"
    )
    return True
