"""``manage.py chaos_failover``: the failover nemesis (``verifier.failover``,
docs/reliability.md): a primary crashed and its standby promoted mid-run, in synchronous and
asynchronous replication, with every invariant checked; exits non-zero when one failed.

``manage.py chaos_failover [--modes sync,async] [--jobs N] [--transport polling|celery|rq]
[--negative-control] [--report PATH]``. ``--role`` is internal: the run's enqueuer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from verifier import failover


class Command(BaseCommand):
    help = "Crash a primary mid-run, promote its standby, check that no fence repeats."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--modes", default=",".join(failover.MODES))
        parser.add_argument("--jobs", type=int, default=1200)
        parser.add_argument("--rate", type=float, default=150.0, help="Enqueues per second.")
        parser.add_argument("--gap", type=float, default=2.0, help="Seconds the link is held.")
        parser.add_argument("--repeat", type=int, default=1, help="Runs of every mode.")
        parser.add_argument(
            "--negative-control",
            action="store_true",
            help="Claims without the epoch: the run must find a fence given twice.",
        )
        parser.add_argument("--report", type=Path, default=None)
        parser.add_argument("--workdir", type=Path, default=None)
        parser.add_argument("--keep", action="store_true", help="Keep the clusters' folders.")
        parser.add_argument("--role", default="", help=argparse.SUPPRESS)
        parser.add_argument("--dir", type=Path, default=None, help=argparse.SUPPRESS)
        parser.add_argument(
            "--transport",
            choices=failover.TRANSPORTS,
            default="polling",
            help="Broker-less executors, or Celery or RQ workers on Redis (--redis-url).",
        )
        parser.add_argument("--redis-url", default=failover.Options.redis_url)
        parser.add_argument(
            "--schedule-every",
            type=int,
            default=1,
            help="Seconds between the occurrences of the run's schedule.",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["role"] == "enqueue":
            sys.exit(
                failover.enqueue_role(
                    opts["dir"],
                    jobs=opts["jobs"],
                    rate=opts["rate"],
                    every=opts["schedule_every"],
                )
            )
        if opts["role"]:
            raise CommandError(f"unknown role {opts['role']!r}")
        modes = tuple(m.strip() for m in opts["modes"].split(",") if m.strip())
        if not modes or set(modes) - set(failover.MODES):
            raise CommandError(f"--modes: a comma-separated subset of {', '.join(failover.MODES)}")
        if (
            opts["jobs"] < 10
            or opts["rate"] <= 0
            or opts["gap"] < 0
            or opts["repeat"] < 1
            or opts["schedule_every"] < 1
        ):
            raise CommandError(
                "--jobs must be at least 10, --rate above 0, --gap at least 0, --repeat and "
                "--schedule-every at least 1"
            )
        status, reports = 0, []
        for i in range(opts["repeat"]):
            workdir = opts["workdir"] / f"run-{i}" if opts["workdir"] else None
            code, report = failover.run(
                failover.Options(
                    modes=modes,
                    jobs=opts["jobs"],
                    rate=opts["rate"],
                    gap_seconds=opts["gap"],
                    negative_control=opts["negative_control"],
                    schedule_every=opts["schedule_every"],
                    transport=opts["transport"],
                    redis_url=opts["redis_url"],
                    workdir=workdir,
                    keep=opts["keep"],
                )
            )
            status = max(status, code)
            reports.append(report)
            self.stdout.write(json.dumps(report, indent=1, sort_keys=True, default=str))
        if opts["report"]:
            opts["report"].parent.mkdir(parents=True, exist_ok=True)
            body = reports[0] if len(reports) == 1 else {"runs": reports}
            opts["report"].write_text(json.dumps(body, indent=1, sort_keys=True, default=str))
        sys.exit(status)
