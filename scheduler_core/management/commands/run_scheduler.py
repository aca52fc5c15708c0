"""``manage.py run_scheduler``: reaper, hint dispatcher, schedules. Safe to run many."""

from __future__ import annotations

import logging
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scheduler_core.db import alias
from scheduler_core.services.maintenance import Maintenance

log = logging.getLogger("tenure.maintenance")


class Command(BaseCommand):
    help = "Run maintenance: reap expired leases, re-send lost hints, fire schedules."

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's checks, with the database checks of Tenure's database among them: one of
        them (``tenure.W024``) warns when this database is not the one its installation id was
        made for."""
        kwargs.setdefault("databases", [alias()])
        super().check(*args, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=None)
        parser.add_argument("--once", action="store_true", help="One round, then exit.")

    def handle(self, *args: Any, **opts: Any) -> None:
        m = Maintenance(interval=opts["interval"])
        m.install_signal_handlers()
        # Said once its signal handlers are in place: from here SIGTERM stops it cleanly.
        log.info("run_scheduler %d ready (a round every %.1fs)", os.getpid(), m.interval)
        m.run(rounds=1 if opts["once"] else None)
