"""``manage.py workflows list|show|cancel|retry [ID] [--reason TEXT]``: workflows from the
command line. ``list`` the newest workflows with their steps' states, ``show`` one workflow's
steps, ``cancel`` and ``retry`` through the same guarded, audited actions as the dashboard
(:mod:`scheduler_core.services.workflows`), with ``cli:<OS user>`` as the actor. A refusal or
a conflict changes nothing and exits non-zero (1 refused, 3 a step changed meanwhile).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import Workflow
from scheduler_core.services import workflows
from scheduler_core.storage.drivers import driver

from .jobs import EXIT_CONFLICT, EXIT_REFUSED, actor


class Command(BaseCommand):
    help = (
        "List, show, cancel or retry workflows. cancel ends waiting steps cancelled and asks "
        "running ones to stop; retry sends failed steps back to waiting (audited, guarded)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "show", "cancel", "retry"])
        parser.add_argument("workflow_id", type=int, nargs="?")
        parser.add_argument("--reason", default="", help="Why (kept in the audit trail).")
        parser.add_argument("--limit", type=int, default=20, help="How many to list.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **opts: Any) -> None:
        action, wid = opts["action"], opts["workflow_id"]
        if action == "list":
            self._list(max(1, min(opts["limit"], 1000)), as_json=opts["json"])
            return
        if wid is None:
            raise CommandError(f"{action} needs a workflow id", returncode=EXIT_REFUSED)
        if action == "show":
            self._show(wid, as_json=opts["json"])
            return
        if not opts["reason"].strip():
            raise CommandError(f"{action} needs --reason", returncode=EXIT_REFUSED)
        try:
            result = workflows.workflow_action(
                wid, action=action, actor=actor(), reason=opts["reason"]
            )
        except ActionConflict as e:
            raise CommandError(f"conflict: {e}", returncode=EXIT_CONFLICT) from None
        except ActionRefused as e:
            raise CommandError(f"refused: {e}", returncode=EXIT_REFUSED) from None
        line = (
            f"workflow {wid}: {action} moved {len(result.moved)} step(s) "
            f"(jobs {', '.join(map(str, result.moved))}), audit #{result.audit.pk if result.audit else '-'}"
        )
        for job_id, why in result.left.items():
            line += f"\n  left job {job_id}: {why}"
        self.stdout.write(line)

    def _list(self, limit: int, *, as_json: bool) -> None:
        d = driver()
        rows: list[dict[str, Any]] = []
        for wf in Workflow.objects.order_by("-created_at", "-id")[:limit]:
            steps = d.workflow_steps(wf.pk)
            counts = Counter(s.state for s in steps)
            held = sum(1 for s in steps if s.held)
            rows.append(
                {
                    "id": wf.pk,
                    "name": wf.name,
                    "unique_key": wf.unique_key,
                    "created_at": wf.created_at.isoformat(),
                    "steps": dict(sorted(counts.items())),
                    "held": held,
                }
            )
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for r in rows:
            states = ", ".join(f"{k} {v}" for k, v in r["steps"].items())
            held_text = f", {r['held']} held" if r["held"] else ""
            self.stdout.write(f"{r['id']:>6}  {r['name']}  [{states}{held_text}]")

    def _show(self, wid: int, *, as_json: bool) -> None:
        wf = Workflow.objects.filter(pk=wid).first()
        if wf is None:
            raise CommandError(f"workflow {wid} does not exist", returncode=EXIT_REFUSED)
        steps = driver().workflow_steps(wid)
        if as_json:
            self.stdout.write(
                json.dumps(
                    {
                        "id": wf.pk,
                        "name": wf.name,
                        "unique_key": wf.unique_key,
                        "on_failure": wf.on_failure,
                        "steps": [
                            {
                                "job": s.job_id,
                                "name": s.name,
                                "state": "held" if s.held else s.state,
                                "parents": list(s.parents),
                                "reason": s.reason,
                            }
                            for s in steps
                        ],
                    },
                    indent=2,
                )
            )
            return
        self.stdout.write(f"workflow {wf.pk} {wf.name} (on failure: {wf.on_failure})")
        for s in steps:
            state = "held" if s.held else ("blocked" if s.blocked else s.state)
            after = f" after {', '.join(map(str, s.parents))}" if s.parents else ""
            why = f" — {s.reason}" if s.reason else ""
            self.stdout.write(f"  job {s.job_id:>6}  {s.name}  {state}{after}{why}")
