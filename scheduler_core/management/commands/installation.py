"""``manage.py installation show|regenerate|adopt``: the installation id new effect keys carry
and the database identity recorded with it, through :mod:`scheduler_core.services.installation`.

``show`` prints the id in force, the recorded and the current identity and how they differ
(``--json`` for a machine). ``regenerate --reason TEXT [--id NEW]`` gives a copy of the database
an id of its own (new effects get new keys; every ledger row keeps its key) and prints what
changed; ``adopt --reason TEXT`` records this database's identity under the same id (the same
installation, moved or restored in its place). Both are audited with ``cli:<OS user>`` as the
actor. A refusal or a conflict changes nothing and exits non-zero (1 refused, 3 changed
meanwhile) with its reason.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_core.domain.installation import describe_identity
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.services import installation

from .jobs import actor

EXIT_REFUSED = 1
EXIT_CONFLICT = 3


class Command(BaseCommand):
    help = (
        "Show the installation id effect keys carry and the database identity recorded with "
        "it; regenerate the id for a copy of the database, or adopt this database's identity."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        show = sub.add_parser("show", help="The id in force and both identities.")
        show.add_argument("--json", action="store_true")
        regen = sub.add_parser(
            "regenerate",
            help="A new id for this database (a copy beside the original): new effects get "
            "new keys, recorded effects keep theirs.",
        )
        regen.add_argument("--reason", required=True)
        regen.add_argument("--id", dest="new_id", default="", help="The new id (default: random).")
        adopt = sub.add_parser(
            "adopt",
            help="Record this database's identity under the same id (the same installation).",
        )
        adopt.add_argument("--reason", required=True)

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["action"] == "show":
            self._show(as_json=opts["json"])
            return
        try:
            if opts["action"] == "regenerate":
                change = installation.regenerate(
                    actor=actor(), reason=opts["reason"], new_id=opts["new_id"]
                )
            else:
                change = installation.adopt(actor=actor(), reason=opts["reason"])
        except ActionConflict as e:
            raise CommandError(f"refused: {e}", returncode=EXIT_CONFLICT) from None
        except ActionRefused as e:
            raise CommandError(f"refused: {e}", returncode=EXIT_REFUSED) from None
        if change.id_before != change.id_after:
            self.stdout.write(
                f"installation id: {change.id_before or '(none)'} -> {change.id_after}; "
                "new effects get keys with the new id"
            )
        else:
            self.stdout.write(f"installation id: {change.id_after} (unchanged)")
        self.stdout.write(
            f"identity: {describe_identity(change.identity_before)} -> "
            f"{describe_identity(change.identity_after)}"
        )
        self.stdout.write(
            f"{change.effects_keeping_keys} recorded effects keep their keys "
            f"(audit #{change.audit.pk}, by {change.audit.actor})"
        )

    def _show(self, *, as_json: bool) -> None:
        s = installation.status()
        if as_json:
            self.stdout.write(json.dumps(s.as_dict(), indent=2, sort_keys=True))
            return
        if s.configured:
            source = f"TENURE_INSTALLATION_ID (the database's own: {s.stored or 'none yet'})"
        else:
            source = "this database" if s.stored else "none yet: the first effect key makes it"
        self.stdout.write(f"installation id: {s.in_force or '-'} (from {source})")
        when = f" (at {s.recorded_at.isoformat(timespec='seconds')})" if s.recorded_at else ""
        self.stdout.write(f"recorded identity: {describe_identity(s.recorded_identity)}{when}")
        self.stdout.write(f"this database: {describe_identity(s.current_identity)}")
        if s.warning:
            self.stdout.write(f"DIFFERENT: {s.warning}")
        elif not s.recorded_identity or not s.current_identity:
            self.stdout.write("identity: cannot be compared")
        else:
            self.stdout.write("identity: the same")
        self.stdout.write(f"{s.effects} recorded effects (each keeps its key)")
