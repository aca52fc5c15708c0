"""``manage.py run_executor``: the broker-less executor (LISTEN/NOTIFY or polling)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scheduler_core.db import alias
from scheduler_core.runtime.worker import Worker


class Command(BaseCommand):
    help = "Claim and run due jobs from the database (no broker needed)."

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's checks, with the database checks of Tenure's database among them: one of
        them (``tenure.W024``) warns when this database is not the one its installation id was
        made for."""
        kwargs.setdefault("databases", [alias()])
        super().check(*args, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="default", help="Comma-separated queue names.")
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--poll-interval", type=float, default=None)
        parser.add_argument(
            "--grace", type=float, default=None, help="Seconds to finish on SIGTERM."
        )
        parser.add_argument("--burst", action="store_true", help="Exit when nothing is due.")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["concurrency"] < 1 or opts["concurrency"] > 256:
            raise SystemExit("--concurrency must be 1..256")
        worker = Worker(
            queues=[q.strip() for q in opts["queues"].split(",") if q.strip()],
            concurrency=opts["concurrency"],
            poll_interval=opts["poll_interval"],
            grace=opts["grace"],
            burst=opts["burst"],
        )
        worker.install_signal_handlers()
        stats = worker.run()
        self.stdout.write(f"claimed {stats.claimed}: {stats.outcomes}")
