"""``manage.py jobs_guarantees [--json]``: each registered job type's effect mode and the
guarantee that mode gives (from :data:`scheduler_core.domain.modes.GUARANTEES`)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scheduler_core.api import registry
from scheduler_core.domain.modes import GUARANTEES


def guarantees() -> list[dict[str, Any]]:
    """One row per registered job type, sorted by name."""
    rows = []
    for name, jt in sorted(registry.all_types().items()):
        g = GUARANTEES[jt.effect]
        rows.append(
            {
                "job": name,
                "queue": jt.queue,
                "mode": jt.effect.value,
                "guarantee": g.promise,
                "mechanism": g.mechanism,
                "needs": g.needs,
                "on_ambiguity": g.on_ambiguity,
                "reconcile": bool(jt.reconcile),
                "fallback": jt.fallback is not None,
                "fallback_shares_key": jt.fallback_shares_key,
                "max_attempts": jt.max_attempts,
                "max_age_seconds": jt.retry_policy.max_age,
                "max_runtime_seconds": jt.max_runtime,
            }
        )
    return rows


class Command(BaseCommand):
    help = "Print each registered job type's effect mode and the guarantee it gives."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        rows = guarantees()
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no job types registered")
            return
        width = max(len(r["job"]) for r in rows)
        for r in rows:
            self.stdout.write(f"{r['job']:<{width}}  {r['mode']:<13}  {r['guarantee']}")
            pad = f"{'':<{width}}  {'':<13}"
            self.stdout.write(f"{pad}  needs: {r['needs']}")
            self.stdout.write(f"{pad}  on ambiguity: {r['on_ambiguity']}")
            self.stdout.write(f"{pad}  maximum runtime: {r['max_runtime_seconds']:g} s")
