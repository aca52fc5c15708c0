"""``manage.py queues list|pause|resume|limit``: an operator's queue actions without a browser,
through the same guarded service functions as the dashboard (:mod:`scheduler_core.services.queues`:
a reason, an optional version check, an audit row in the same transaction). The actor is the
OS user (``cli:<user>``). A refused action exits non-zero with the reason (1: refused; 3: the
queue changed since the version given; 2 stays argparse's, for arguments it cannot read) and
changes nothing."""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.read.queues import HELD_LABELS, queue_overview
from scheduler_core.services import queues

EXIT_REFUSED = 1
EXIT_CONFLICT = 3


def _none_or(kind: type) -> Any:
    """An argument type: ``none`` (clear the limit), or a value of ``kind``."""

    def parse(text: str) -> Any:
        if text.strip().lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {kind.__name__} or 'none'") from None

    parse.__name__ = f"{kind.__name__} or none"
    return parse


def actor() -> str:
    """Who acts from the command line: ``cli:<OS user>``."""
    return f"cli:{getpass.getuser()}"


class Command(BaseCommand):
    help = "List queues, pause or resume one, or set its limits across every executor."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        ls = sub.add_parser("list", help="Each queue's pause, limits and jobs.")
        ls.add_argument("--json", action="store_true")
        for name, text in (
            ("pause", "Stop every executor and transport claiming the queue's jobs."),
            ("resume", "Let executors claim the queue's jobs again."),
        ):
            p = sub.add_parser(name, help=text)
            p.add_argument("queue")
            p.add_argument("--reason", required=True)
            p.add_argument("--expected-version", type=int, default=None)
            if name == "pause":
                p.add_argument(
                    "--create",
                    action="store_true",
                    help="Configure a queue Tenure does not know yet (no job type routes to it, no "
                    "jobs, schedules or settings); without it such a name is refused as a typo.",
                )
        lim = sub.add_parser("limit", help="Set the queue's limits ('none' clears one).")
        lim.add_argument("queue")
        lim.add_argument("--max-leased", type=_none_or(int), default=...)
        lim.add_argument("--max-per-second", type=_none_or(float), default=...)
        lim.add_argument("--reason", required=True)
        lim.add_argument("--expected-version", type=int, default=None)
        lim.add_argument(
            "--create",
            action="store_true",
            help="Configure a queue Tenure does not know yet (no job type routes to it, no "
            "jobs, schedules or settings); without it such a name is refused as a typo.",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        if action == "list":
            self._list(as_json=opts["json"])
            return
        try:
            result = self._act(action, opts)
        except ActionConflict as e:
            raise CommandError(f"refused: {e}", returncode=EXIT_CONFLICT) from None
        except ActionRefused as e:
            raise CommandError(f"refused: {e}", returncode=EXIT_REFUSED) from None
        q = result.queue
        self.stdout.write(
            f"queue {q.name}: {'paused' if q.paused else 'running'}, "
            f"max_leased={_shown(q.max_leased)}, max_per_second={_shown(q.max_per_second)}, "
            f"version {q.version} (audit #{result.audit.pk}, by {result.audit.actor})"
        )

    def _act(self, action: str, opts: dict[str, Any]) -> queues.QueueActionResult:
        queue, reason, expected = opts["queue"], opts["reason"], opts["expected_version"]
        if action == "pause":
            return queues.pause(
                queue,
                actor=actor(),
                reason=reason,
                expected_version=expected,
                create=opts["create"],
            )
        if action == "resume":
            return queues.resume(queue, actor=actor(), reason=reason, expected_version=expected)
        max_leased, rate = opts["max_leased"], opts["max_per_second"]
        if max_leased is ... and rate is ...:
            raise ActionRefused("give --max-leased, --max-per-second or both")
        current = queues.queue_settings(queue)
        return queues.set_limits(
            queue,
            max_leased=current.max_leased if max_leased is ... else max_leased,
            max_per_second=current.max_per_second if rate is ... else rate,
            actor=actor(),
            reason=reason,
            expected_version=current.version if expected is None else expected,
            create=opts["create"],
        )

    def _list(self, *, as_json: bool) -> None:
        rows = queue_overview()
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2, sort_keys=True, default=str))
            return
        if not rows:
            self.stdout.write(
                "no queues: no job type routes to one, and none has jobs, schedules or settings"
            )
            return
        for r in rows:
            state = (
                f"PAUSED by {r['paused_by']} at {r['paused_at']:%Y-%m-%d %H:%M:%S} UTC: "
                + (r["paused_reason"])
                if r["paused"]
                else "running"
            )
            self.stdout.write(
                f"{r['name']}: {state}; max_leased={_shown(r['max_leased'])} "
                f"max_per_second={_shown(r['max_per_second'])}; due {r['due']}, "
                f"waiting {r['waiting']}, leased {r['leased']}; version {r['version']}"
                + (f"; held back: {r['held']} ({_held(r)})" if r["held"] else "")
            )


def _held(row: dict[str, Any]) -> str:
    """What holds a queue's due jobs back, by category, as the console counts them."""
    return ", ".join(
        f"{row['held_by'][h]} {label}" for h, label in HELD_LABELS.items() if row["held_by"][h]
    )


def _shown(value: object) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
