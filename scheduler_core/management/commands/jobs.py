"""``manage.py jobs retry|resolve|cancel JOB_ID --reason TEXT [--verified FACT] [--version N]
[--accept-in-flight FENCE ...]``:
the operator actions on one job from the command line, through the same guarded service
functions as the dashboard (:mod:`scheduler_core.services.operator`), audited with
``cli:<OS user>`` as the actor.

``cancel`` cancels a waiting, failed or indeterminate job at once and asks a running (leased)
one to stop (``cancel_running``). A refusal or a conflict changes nothing: its reason goes to
stderr and the command exits non-zero (1 refused, 3 the job changed since ``--version``).
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_core.domain import states
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import Job
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver

EXIT_REFUSED = 1
"""The action does not apply (state, mode, a missing or wrong verified fact, no reason)."""
EXIT_CONFLICT = 3
"""The job changed since the version the operator named: decide again."""


def actor() -> str:
    """Who the audit row names: ``cli:`` and the operating system's user."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (no login record, no variable)
        user = "unknown"
    return f"cli:{user}"


class Command(BaseCommand):
    help = (
        "Retry, resolve or cancel one job through the dashboard's guarded actions (audited, "
        "version-checked). Retrying or resolving a job whose effect outcome is unknown needs "
        "--verified: not_applied or same_key (idempotent jobs) to retry, applied to resolve."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # ``--version`` names the job version the operator decided on (as the dashboard's
        # form does); it replaces Django's option of that name, which prints Django's.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["retry", "resolve", "cancel"])
        parser.add_argument("job_id", type=int)
        parser.add_argument("--reason", required=True, help="Why (kept in the audit trail).")
        parser.add_argument(
            "--verified",
            "--fact",
            dest="verified",
            default="",
            # The facts a retry or a resolve states (operator.VERIFIED_FACTS, give_up aside).
            choices=["applied", "not_applied", "same_key"],
            help="The fact you verified at the destination.",
        )
        parser.add_argument(
            "--effect",
            dest="effects",
            action="append",
            default=[],
            help="An effect (by name) the verified fact is about; repeat for several.",
        )
        parser.add_argument(
            "--version",
            type=int,
            default=None,
            help="The job version you decided on (as shown by the dashboard); default: the "
            "current one.",
        )
        parser.add_argument(
            "--accept-in-flight",
            dest="accept_in_flight",
            metavar="FENCE",
            type=int,
            action="append",
            default=None,
            help="Retry not_applied even though the earlier owner with this fence may still be "
            "in flight (repeat for each; a refusal lists them). Refused when the owners that "
            "may be in flight are not exactly those named.",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        job_id: int = opts["job_id"]
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"job {job_id} does not exist", returncode=EXIT_REFUSED)
        version = job.version if opts["version"] is None else opts["version"]
        action = opts["action"]
        if action == "cancel" and job.state == states.State.LEASED:
            action = "cancel_running"
        accepted: list[int] | None = opts["accept_in_flight"]
        try:
            result = operator.operator_action(
                job_id,
                action=action,
                expected_version=version,
                actor=actor(),
                reason=opts["reason"],
                verified=opts["verified"],
                effects=opts["effects"],
                accept_in_flight=accepted is not None,
                seen_owners=accepted,
            )
        except ActionConflict as e:
            raise CommandError(f"conflict: {e}", returncode=EXIT_CONFLICT) from None
        except ActionRefused as e:
            hint = ""
            if not opts["verified"]:
                if action == "cancel":
                    if operator.ending_needs_fact(job):
                        hint = " (state the fact with --verified applied|not_applied)"
                elif operator.needs_fact(job):
                    hint = " (state the fact with --verified)"
            owners = driver().in_flight_owners(job_id)
            if owners and "in flight" in str(e):
                fences = " ".join(f"--accept-in-flight {o.fence}" for o in owners)
                hint += f" (to accept them: {fences})"
            raise CommandError(f"refused: {e}{hint}", returncode=EXIT_REFUSED) from None
        audit, after = result.audit, result.job
        line = (
            f"job {job_id}: {audit.state_before} -> {audit.state_after} ({action}, "
            f"version {audit.version_before} -> {after.version}, audit #{audit.pk}, "
            f"by {audit.actor})"
        )
        if action == "cancel_running" and after.cancel_requested_at is not None:
            line += (
                f"; cancel requested at {after.cancel_requested_at.isoformat()}: the running "
                "attempt learns it at its next heartbeat"
            )
        if audit.detail.get("effects"):
            line += f"; verified {audit.verified}: {', '.join(audit.detail['effects'])}"
        self.stdout.write(line)
