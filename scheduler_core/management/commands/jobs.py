"""``manage.py jobs retry|resolve|cancel JOB_ID --reason TEXT [--verified FACT] [--version N]
[--accept-in-flight FENCE ...]``:
the operator actions on one job from the command line, through the same guarded service
functions as the dashboard (:mod:`scheduler_core.services.operator`), audited with
``cli:<OS user>`` as the actor.

``manage.py jobs list [--state S] [--health H] [--queue Q] [--name T] [--search TEXT]
[--limit N] [--before ID] [--json]`` lists jobs with the dashboard's filters, and ``manage.py
jobs show JOB_ID [--json]`` one job's record (attempts, ledger, audit, the actions it is
offered), both read through :mod:`scheduler_core.read.jobs` as the dashboard reads them.

``cancel`` cancels a waiting, failed or indeterminate job at once and asks a running (leased)
one to stop (``cancel_running``). A refusal or a conflict changes nothing: its reason goes to
stderr and the command exits non-zero (1 refused, 3 the job changed since ``--version``).
"""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_core.domain import payload_search, states
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import Job
from scheduler_core.read import jobs as job_reads
from scheduler_core.services import operator
from scheduler_core.services.offered import FACT_OUTCOMES, offered
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
        parser.add_argument("action", choices=["retry", "resolve", "cancel", "list", "show"])
        parser.add_argument("job_id", type=int, nargs="?")
        parser.add_argument("--reason", help="Why (kept in the audit trail); needed to act.")
        reads = parser.add_argument_group("list and show")
        reads.add_argument("--state", choices=[s.value for s in states.State], default="")
        reads.add_argument("--health", choices=list(job_reads.HEALTH_FILTERS), default="")
        reads.add_argument("--queue", default="")
        reads.add_argument("--name", default="", help="The job type.")
        reads.add_argument(
            "--search",
            default="",
            help="As the dashboard's search box: a number is a job id (and part of a unique "
            "key); key=value or {json} searches payloads; other text, unique keys.",
        )
        reads.add_argument("--limit", type=int, default=job_reads.PAGE_SIZE_DEFAULT)
        reads.add_argument("--before", type=int, default=None, help="List jobs older than this id.")
        reads.add_argument("--json", action="store_true")
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
            help="An effect (by name) the verified fact is about; repeat for several. Required "
            "with --verified applied|not_applied while the job has an effect of unknown outcome.",
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
        if opts["action"] == "list":
            self._list(opts)
            return
        if opts["job_id"] is None:
            raise CommandError(f"jobs {opts['action']} needs a JOB_ID", returncode=EXIT_REFUSED)
        if opts["action"] == "show":
            self._show(opts["job_id"], as_json=opts["json"])
            return
        if not (opts["reason"] or "").strip():
            raise CommandError("refused: a reason is required (--reason)", returncode=EXIT_REFUSED)
        job_id: int = opts["job_id"]
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"job {job_id} does not exist", returncode=EXIT_REFUSED)
        version = job.version if opts["version"] is None else opts["version"]
        action = opts["action"]
        if action == "cancel" and job.state == states.State.LEASED:
            action = "cancel_running"
        accepted: list[int] | None = opts["accept_in_flight"]
        # The store takes "none named" as the only effect in question; here, as in the
        # console's dialog, the operator names each effect they verified: none is implied.
        if opts["verified"] in FACT_OUTCOMES and not opts["effects"]:
            unknown = sorted(e.name for e in job_reads.unsettled_effects(job_id))
            if unknown:
                raise CommandError(
                    f"refused: name each effect you verified {opts['verified']} "
                    f"(--effect NAME): the outcome of {', '.join(unknown)} is unknown",
                    returncode=EXIT_REFUSED,
                )
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
        moved = (
            f"{audit.state_before} -> {audit.state_after}: "
            if audit.state_before != audit.state_after
            else ""
        )
        line = (
            f"job {job_id}: {moved}{states.OPERATOR_OUTCOMES.get(action, action)} ({action}, "
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

    def _list(self, opts: dict[str, Any]) -> None:
        search = opts["search"]
        if search and payload_search.looks_like_payload_query(search):
            try:
                payload_search.parse(search)
            except payload_search.PayloadQueryError as e:
                raise CommandError(f"payload search: {e}", returncode=EXIT_REFUSED) from None
        f = job_reads.JobFilter(
            state=opts["state"],
            health=opts["health"],
            queue=opts["queue"],
            name=opts["name"],
            q=search,
        )
        pg = job_reads.page(f.queryset(), before=opts["before"], limit=opts["limit"])
        rows = [_job_row(j) for j in pg.jobs]
        if opts["json"]:
            out = {"jobs": rows, "next_before": pg.next_before, "search": f.search_words()}
            self.stdout.write(json.dumps(out, indent=2, default=str))
            return
        if f.q:
            self.stdout.write(f.search_words())
        if not rows:
            self.stdout.write("no job matches")
        for r in rows:
            self.stdout.write(
                f"{r['id']}  {r['state']:<13} {r['name']}  queue {r['queue']}  "
                f"attempts {r['attempts']}/{r['max_attempts']}  run_at {r['run_at']}"
                + (f"  key {r['unique_key']}" if r["unique_key"] else "")
            )
        if pg.next_before:
            self.stdout.write(f"more: --before {pg.next_before}")

    def _show(self, job_id: int, *, as_json: bool) -> None:
        job = job_reads.get_job(job_id)
        if job is None:
            raise CommandError(f"job {job_id} does not exist", returncode=EXIT_REFUSED)
        record = job_reads.job_record(job)
        shown: dict[str, Any] = {
            "job": _job_row(job),
            "attempts": [
                {
                    "attempt": a.ordinal,
                    "fence": a.fence,
                    "try_of_budget": a.number,
                    "kind": a.kind,
                    "executor": a.executor,
                    "claimed_at": a.claimed_at,
                    "finished_at": a.finished_at,
                    "outcome": a.outcome or "in progress",
                    "error": f"{a.error_type}: {a.message}" if a.error_type else a.message,
                }
                for a in record["attempts"]
            ],
            "ledger": [
                {
                    "effect": row.effect.name,
                    "key": row.effect.key,
                    "state": row.effect.state,
                    "events": [
                        {"at": e["created_at"], "event": e["label"], "fence": e["fence"]}
                        for e in row.events
                    ],
                }
                for row in record["ledger"]
            ],
            "audit": [
                {
                    "at": a.created_at,
                    "actor": a.actor,
                    "action": a.action,
                    "reason": a.reason,
                    "from": a.state_before,
                    "to": a.state_after,
                }
                for a in record["audit"]
            ],
            "offered": [
                {"action": spec.label, "command": _command(spec.key, job.pk)}
                for spec in offered(job)
            ],
        }
        if as_json:
            self.stdout.write(json.dumps(shown, indent=2, default=str))
            return
        j = shown["job"]
        w = self.stdout.write
        w(f"job {j['id']} {j['name']}: {j['state']} (queue {j['queue']}, effect {j['effect']})")
        w(f"  version {j['version']}, attempts {j['attempts']}/{j['max_attempts']}")
        w(f"  run_at {j['run_at']}, reason: {j['reason'] or '-'}")
        w(f"attempts ({record['attempts_total']}):")
        for a in shown["attempts"]:
            w(
                f"  attempt {a['attempt']} fence {a['fence']} {a['kind']} on {a['executor']}: "
                f"{a['outcome']}" + (f" ({a['error']})" if a["error"] else "")
            )
        w("ledger:" if shown["ledger"] else "ledger: no effect recorded")
        for e in shown["ledger"]:
            w(f"  {e['effect']} {e['state']} key {e['key']}")
            for ev in e["events"]:
                w(f"    {ev['at']} fence {ev['fence']}: {ev['event']}")
        w("audit:" if shown["audit"] else "audit: no operator action")
        for a in shown["audit"]:
            w(f"  {a['at']} {a['actor']} {a['action']} {a['from']} -> {a['to']}: {a['reason']}")
        w("offered:" if shown["offered"] else "offered: no action in this state")
        for o in shown["offered"]:
            w(f"  {o['action']}: {o['command']}")


CLI_SPELLING: dict[str, str] = {
    "retry": "retry {id} --reason TEXT",
    "retry-not-applied": "retry {id} --fact not_applied --effect NAME --reason TEXT",
    "retry-same-key": "retry {id} --fact same_key --reason TEXT",
    "resolve-applied": "resolve {id} --fact applied --effect NAME --reason TEXT",
    "cancel": "cancel {id} --reason TEXT",
    "cancel-not-applied": "cancel {id} --fact not_applied --effect NAME --reason TEXT",
    "cancel-applied": "cancel {id} --fact applied --effect NAME --reason TEXT",
    "cancel-running": "cancel {id} --reason TEXT",
}
"""How each offered action is taken from the command line (the others: the dashboard)."""


def _command(key: str, job_id: int) -> str:
    spelled = CLI_SPELLING.get(key)
    return f"manage.py jobs {spelled.format(id=job_id)}" if spelled else "from the dashboard"


def _job_row(j: Job) -> dict[str, Any]:
    return {
        "id": j.pk,
        "name": j.name,
        "queue": j.queue,
        "state": j.state,
        "effect": j.effect,
        "attempts": j.attempts,
        "max_attempts": j.max_attempts,
        "run_at": j.run_at,
        "finished_at": j.finished_at,
        "unique_key": j.unique_key or "",
        "version": j.version,
        "reason": j.reason,
        "payload": j.payload,
    }
