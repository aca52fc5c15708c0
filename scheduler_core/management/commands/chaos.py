"""``manage.py chaos``: the fault verifier (see ``docs/reliability.md``).

``manage.py chaos --seconds N --seed S [--negative-control] [--report PATH]`` runs a seeded
fault-injection run on a PostgreSQL cluster of its own and exits non-zero when an invariant
failed. ``--role`` is internal: the run's helper processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_core.chaos import plan as plans
from scheduler_core.chaos import run


class Command(BaseCommand):
    help = "Run the fault verifier: a seeded fault-injection run that checks the invariants."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=1800.0, help="Fault phase length.")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument(
            "--negative-control",
            action="store_true",
            help="Disable the fence and synchronous commit: the checker must report failures.",
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
        if not faults:
            faults = plans.NEGATIVE_FAULTS if opts["negative_control"] else plans.FAULT_KINDS
        if opts["seconds"] <= 0 or not 1 <= opts["executors"] <= 16:
            raise CommandError("--seconds must be positive and --executors 1..16")
        plan = plans.Plan(
            seconds=opts["seconds"],
            seed=opts["seed"],
            negative_control=opts["negative_control"],
            executors=opts["executors"],
            rate=opts["rate"],
            # The negative control runs more jobs longer than a lease, so a paused owner
            # resumes while its replacement still holds the job: what the fence is for.
            long_share=0.4 if opts["negative_control"] else 0.12,
            faults=faults,
            pg_port=opts["pg_port"],
            bad_input=not opts["no_bad_input"],
            workdir=opts["workdir"],
            keep=opts["keep"],
        )
        code = run.run(plan, out=self.stdout, report_path=opts["report"])
        sys.exit(code)
