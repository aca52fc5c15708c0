"""``manage.py chaos``: the fault verifier (see ``docs/reliability.md``).

``manage.py chaos --seconds N --seed S [--negative-control[=fence|sticky]] [--report PATH]``
runs a seeded fault-injection run on a PostgreSQL cluster of its own and exits non-zero when an
invariant failed. ``--role`` is internal: the run's helper processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

try:
    from scheduler_core.chaos import plan as plans
    from scheduler_core.chaos import run
except ModuleNotFoundError as missing:
    # An installed wheel: the verifier ships with the repository only.
    if missing.name != "scheduler_core.chaos":
        raise
    VERIFIER = False
else:
    VERIFIER = True

NOT_SHIPPED = (
    "the fault verifier is not part of the installed package; run `make chaos` in a checkout "
    "of Tenure's repository"
)


class Command(BaseCommand):
    help = "Run the fault verifier: a seeded fault-injection run that checks the invariants."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        if not VERIFIER:
            return
        parser.add_argument("--seconds", type=float, default=1800.0, help="Fault phase length.")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument(
            "--negative-control",
            nargs="?",
            const="fence",
            default="",
            choices=plans.NEGATIVE_CONTROLS,
            help="Switch a guard off; the checker must report failures. fence (the default): "
            "the executors' fence check and synchronous commit; sticky: the ledger forgets an "
            "unknown outcome when a later attempt sends nothing (executors only).",
        )
        parser.add_argument(
            "--fallback-share",
            type=float,
            default=None,
            help=f"Share of the verifier's own jobs that fall back to a second provider "
            f"(default {plans.FALLBACK_SHARE}; {plans.STICKY_FALLBACK_SHARE} with "
            "--negative-control=sticky).",
        )
        parser.add_argument("--report", type=Path, default=None, help="Write the JSON here.")
        parser.add_argument("--executors", type=int, default=3)
        parser.add_argument("--rate", type=float, default=3.0, help="Jobs enqueued per second.")
        parser.add_argument(
            "--faults",
            default="",
            help=f"Comma-separated subset of: {', '.join(plans.FAULT_KINDS)}.",
        )
        parser.add_argument("--pg-port", type=int, default=55433, help="0 picks a free port.")
        parser.add_argument("--no-bad-input", action="store_true", help="Skip the input sweep.")
        parser.add_argument("--workdir", type=Path, default=None)
        parser.add_argument("--keep", action="store_true", help="Keep the run's folder.")
        parser.add_argument("--role", default="", help=argparse.SUPPRESS)
        parser.add_argument("--dir", type=Path, default=None, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **opts: Any) -> None:
        if not VERIFIER:
            raise CommandError(NOT_SHIPPED)
        if opts["role"]:
            code = run.run_role(
                opts["role"],
                opts["dir"],
                seed=opts["seed"],
                seconds=opts["seconds"],
                rate=opts["rate"],
            )
            sys.exit(code)
        faults = tuple(f.strip() for f in opts["faults"].split(",") if f.strip())
        unknown = set(faults) - set(plans.FAULT_KINDS)
        if unknown:
            raise CommandError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
        negative = opts["negative_control"]
        fence_off = negative == "fence"
        if not faults:
            # The sticky control changes only the ledger: every fault kind may still be dealt,
            # and every other invariant is expected to hold.
            faults = plans.NEGATIVE_FAULTS if fence_off else plans.FAULT_KINDS
        if opts["seconds"] <= 0 or not 1 <= opts["executors"] <= 16:
            raise CommandError("--seconds must be positive and --executors 1..16")
        share = opts["fallback_share"]
        if share is None:
            share = plans.STICKY_FALLBACK_SHARE if negative == "sticky" else plans.FALLBACK_SHARE
        if not 0.0 <= share <= 1.0:
            raise CommandError("--fallback-share must be between 0 and 1")
        plan = plans.Plan(
            seconds=opts["seconds"],
            seed=opts["seed"],
            negative_control=negative,
            executors=opts["executors"],
            rate=opts["rate"],
            # The fence's negative control runs more jobs longer than a lease, so a paused
            # owner resumes while its replacement still holds the job: what the fence is for.
            long_share=0.4 if fence_off else 0.12,
            fallback_share=share,
            faults=faults,
            pg_port=opts["pg_port"],
            bad_input=not opts["no_bad_input"],
            workdir=opts["workdir"],
            keep=opts["keep"],
        )
        code = run.run(plan, out=self.stdout, report_path=opts["report"])
        sys.exit(code)
