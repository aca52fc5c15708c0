"""``manage.py chaos``: the fault verifier (see ``docs/reliability.md``).

``manage.py chaos --seconds N --seed S [--negative-control[=fence|sticky|whole-job|max-age-fails]]
[--report PATH]``
runs a seeded fault-injection run on a PostgreSQL cluster of its own and exits non-zero when an
invariant failed. ``--role`` is internal: the run's helper processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from verifier import plan as plans
from verifier import run


class Command(BaseCommand):
    help = "Run the fault verifier: a seeded fault-injection run that checks the invariants."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
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
            "unknown outcome when a later attempt sends nothing; whole-job: reconcile answered "
            "for the whole job; max-age-fails: a job at its max_age ends failed whatever its "
            "ledger holds.",
        )
        parser.add_argument(
            "--paths-share",
            type=float,
            default=None,
            help=f"Share of the verifier's own jobs that walk the end paths (default "
            f"{plans.PATHS_SHARE}; {plans.CONTROL_PATHS_SHARE} with --negative-control=whole-job "
            "or max-age-fails).",
        )
        parser.add_argument(
            "--fallback-share",
            type=float,
            default=None,
            help=f"Share of the verifier's own jobs that fall back to a second provider "
            f"(default {plans.FALLBACK_SHARE}; {plans.STICKY_FALLBACK_SHARE} with "
            "--negative-control=sticky).",
        )
        parser.add_argument(
            "--workflow-share",
            type=float,
            default=plans.WORKFLOW_SHARE,
            help=f"Share of the enqueues that are workflows (default {plans.WORKFLOW_SHARE}).",
        )
        parser.add_argument("--report", type=Path, default=None, help="Write the JSON here.")
        parser.add_argument(
            "--summarize",
            type=Path,
            default=None,
            metavar="REPORT",
            help="Print a Markdown summary of a run's JSON report (--report) and exit.",
        )
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
        if opts["summarize"] is not None:
            from verifier import report

            try:
                results = json.loads(opts["summarize"].read_text())
            except (OSError, ValueError) as e:
                raise CommandError(f"cannot read {opts['summarize']}: {e}") from e
            self.stdout.write(report.summary(results))
            return
        faults = tuple(f.strip() for f in opts["faults"].split(",") if f.strip())
        unknown = set(faults) - set(plans.FAULT_KINDS)
        if unknown:
            raise CommandError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
        negative = opts["negative_control"]
        fence_off = negative == "fence"
        if not faults:
            # The other controls change only the ledger: every fault kind may still be dealt,
            # and every other invariant is expected to hold.
            faults = plans.NEGATIVE_FAULTS if fence_off else plans.FAULT_KINDS
        if opts["seconds"] <= 0 or not 1 <= opts["executors"] <= 16:
            raise CommandError("--seconds must be positive and --executors 1..16")
        share = opts["fallback_share"]
        if share is None:
            share = plans.STICKY_FALLBACK_SHARE if negative == "sticky" else plans.FALLBACK_SHARE
        if not 0.0 <= share <= 1.0:
            raise CommandError("--fallback-share must be between 0 and 1")
        paths = opts["paths_share"]
        if paths is None:
            paths = (
                plans.CONTROL_PATHS_SHARE
                if negative in ("whole-job", "max-age-fails")
                else plans.PATHS_SHARE
            )
        if not 0.0 <= paths <= 1.0:
            raise CommandError("--paths-share must be between 0 and 1")
        if not 0.0 <= opts["workflow_share"] <= 1.0:
            raise CommandError("--workflow-share must be between 0 and 1")
        plan = plans.Plan(
            workflow_share=opts["workflow_share"],
            seconds=opts["seconds"],
            seed=opts["seed"],
            negative_control=negative,
            executors=opts["executors"],
            rate=opts["rate"],
            # The fence's negative control runs more jobs longer than a lease, so a paused
            # owner resumes while its replacement still holds the job: what the fence is for.
            long_share=0.4 if fence_off else 0.12,
            fallback_share=share,
            paths_share=paths,
            faults=faults,
            pg_port=opts["pg_port"],
            bad_input=not opts["no_bad_input"],
            workdir=opts["workdir"],
            keep=opts["keep"],
        )
        code = run.run(plan, out=self.stdout, report_path=opts["report"])
        sys.exit(code)
