"""The verdicts: each invariant of ``docs/reliability.md`` judged against the evidence.

:func:`check` loads the evidence (:mod:`.evidence`) and calls :func:`analyse`, which is pure:
it returns the figures of every section and one verdict per invariant (``pass``, ``fail``
with the offending job ids, or ``not run`` when the run did not exercise it). The run passes
when no verdict fails.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scheduler_core.domain.keys import is_effect_key
from scheduler_core.services.maintenance import BACKOFF_CAP_SECONDS

from .evidence import (
    ASYNC_SUFFIX,
    BROKER_SUFFIX,
    EFFECTS_OF_TYPE,
    FALLBACK_TYPE,
    MULTI_TYPE,
    PATH_TYPES,
    STUBBORN_TYPE,
    UNTIMED_TYPE,
    AttemptRow,
    Evidence,
    JobRow,
    LedgerEvent,
    load,
)

COMPLETIONS = frozenset({"succeeded", "reconciled_applied"})
"""Attempt outcomes that completed the job."""
TERMINAL_OUTCOMES = COMPLETIONS | {"failed"}
PLANNED_TRANSIENT = "planned transient failure"
PLANNED_PERMANENT = "planned permanent failure"
NO_ANSWER = ("sent, no answer", "no acknowledgement after sending")
"""What the demo clients say when a request was sent and its answer never came."""
NOTHING_SENT = ("nothing sent", "answered 503 unavailable")
"""What the demo clients say when the destination turned a request away unseen."""
MAINTENANCE_BACKOFF_CAP = BACKOFF_CAP_SECONDS
"""The longest a maintenance loop waits between rounds that fail because the database is
unreachable: ``Maintenance.run`` in ``scheduler_core/services/maintenance.py`` doubles its wait from
0.5 s up to this, its own constant, so the bound judged is the one the loop keeps."""
BROKER_RECONNECT = 20.0
"""Seconds a Celery worker may take to reconnect to a restarted broker, allowed on top of the
dispatcher's re-send bound. Its reconnect attempts come 2 s, then 4 s, 6 s ... apart, and
restarts close together lengthen it: a 30-second run with three restarts measured 14.4 s
from the broker's return (10 s had been allowed). Celery's backoff, not Tenure's."""
RECOVERY_TOLERANCE = 1.0
"""Seconds allowed past the bound for the maintenance round itself and process scheduling on a
loaded machine; reported next to every bound."""
CPU_BUSY_FRACTION = 0.2
"""An executor using more than this share of a core while the database is down is spinning."""
OFFENDERS_SHOWN = 25

TITLES = {
    "I1": "no acknowledged job lost",
    "I2": "no job or effect without a committed enqueue",
    "I3": "at most one accepted completion per job; terminal only by audited operator",
    "I4": "every attempt write fenced; stale writes accepted = 0",
    "I5": "no two lease grants of one job overlap (database clock)",
    "I6": "effects per key as the mode promises",
    "I7": "ambiguous outcomes resolved per mode, never blindly re-run",
    "I8": "recovery within lease + grace + sweep interval; everything drained",
    "I9": "faults classified correctly",
    "I10": "bad input refused or quarantined, nothing executed",
    "I11": "operator actions authorised, CSRF-checked, version-checked, audited",
    "I12": "no busy loop during outages",
    "I13": "no job's effect applied at two destinations (fallback without the primary's key)",
    "I14": "no terminal failed job with an unknown/intended/applied effect",
    "I15": "every effect of a succeeded job applied exactly once at its destination",
    "I16": "an unanswered cancel request ends its job cancelled, never retried or failed",
    "I17": "no workflow step runs before all its parents succeeded; every workflow ends",
}


def _verdict(ok: bool | None, detail: str, offenders: Iterable[Any] = ()) -> dict[str, Any]:
    off = sorted(set(offenders), key=str)
    status = "not run" if ok is None else "pass" if ok else "fail"
    return {"status": status, "detail": detail, "offenders": off[:OFFENDERS_SHOWN], "n": len(off)}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _kv(c: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def _figures(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(_pct(values, 0.5), 3),
        "p95": round(_pct(values, 0.95), 3),
        "max": round(max(values), 3) if values else 0.0,
    }


# ---------------------------------------------------------------------------------------------
# Jobs: acknowledged, lost, unexpected (I1, I2)
# ---------------------------------------------------------------------------------------------


def jobs_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Enqueue outcomes against the database; verdicts I1 and I2."""
    by_key = {j.key: j for j in ev.jobs.values()}
    first = [e for e in ev.enqueues if not e.get("repeat")]
    status = Counter(e["status"] for e in first)
    acked = {e["key"] for e in first if e["status"] == "ack"}
    unknown = {e["key"] for e in first if e["status"] == "unknown"}
    rolled_back = {e["key"] for e in first if e["status"] == "rolled_back"}
    lost = sorted(acked - by_key.keys())
    unknown_committed = sorted(k for k in unknown if k in by_key)
    unexpected = sorted(by_key[k].id for k in by_key.keys() - acked - unknown)
    # A repeat whose connection failed was answered with nothing: only an acknowledged one
    # can name another job.
    repeat_mismatch = [
        e["key"]
        for e in ev.enqueues
        if e.get("repeat")
        and e.get("status") == "ack"
        and by_key.get(e["key"])
        and e.get("job") != by_key[e["key"]].id
    ]
    # Completions an executor saw commit must still be in the database.
    db_done = {
        (a.job, a.fence) for rows in ev.attempts.values() for a in rows if a.outcome in COMPLETIONS
    }
    seen_done = {
        (e["job"], e["fence"])
        for e in ev.events
        if e.get("event") == "end" and e.get("outcome") == "succeeded" and e.get("job") in ev.jobs
    }
    completions_lost = sorted({job for job, fence in seen_done - db_done})
    # Effects at a destination must belong to a job whose enqueue committed: their keys are
    # those of the committed jobs' ledger rows (an enqueue rolled back leaves none).
    known_keys = {e.key for job_id in ev.jobs for e in ev.effects.get(job_id, [])}
    foreign = sorted(k for k in ev.applied if k not in known_keys and is_effect_key(k))
    section = {
        "enqueued": len(first),
        "acknowledged": len(acked),
        "outcome_unknown": len(unknown),
        "outcome_unknown_found_committed": len(unknown_committed),
        "rolled_back_on_purpose": len(rolled_back),
        "repeats": sum(1 for e in ev.enqueues if e.get("repeat")),
        "lost": lost,
        "unexpected": unexpected,
        "completions_seen_by_executors": len(seen_done),
        "completions_lost": completions_lost,
        "effects_without_job": foreign,
        "other_jobs": len(ev.other_jobs),
        "by_status": dict(status),
    }
    i1 = _verdict(
        not lost and not completions_lost,
        f"{len(acked)} acknowledged, {len(lost)} lost; {len(seen_done)} completions seen by "
        f"executors, {len(completions_lost)} missing from the database",
        [*lost, *completions_lost],
    )
    i2 = _verdict(
        not unexpected and not foreign and not repeat_mismatch,
        f"{len(unexpected)} jobs without a committed enqueue ({len(rolled_back)} rolled back on "
        f"purpose), {len(foreign)} effects without a job, {len(repeat_mismatch)} repeated "
        f"enqueues answered with another job",
        [*unexpected, *foreign, *repeat_mismatch],
    )
    return section, i1, i2


# ---------------------------------------------------------------------------------------------
# Completions and terminal states (I3)
# ---------------------------------------------------------------------------------------------


def completions_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """At most one accepted completion per job; nothing leaves a terminal state except through
    an audited operator action."""
    double: list[int] = []
    unaudited: list[int] = []
    phantom: list[int] = []
    seen: dict[int, set[int]] = defaultdict(set)
    for e in ev.events:
        if e.get("event") == "end" and e.get("outcome") == "succeeded" and e.get("job") in ev.jobs:
            seen[e["job"]].add(e["fence"])
    for job in ev.jobs.values():
        rows = ev.attempts_of(job.id)
        done = [a for a in rows if a.outcome in COMPLETIONS]
        if len(done) > 1 or len(seen.get(job.id, ())) > 1:
            double.append(job.id)
        audits = [au for au in ev.audits.get(job.id, []) if au.action in ("retry", "resolve")]
        for a in rows:
            if a.outcome not in TERMINAL_OUTCOMES or a.finished is None:
                continue
            later = [b for b in rows if b.claimed > a.finished]
            if later and not any(a.finished <= au.created <= later[0].claimed for au in audits):
                unaudited.append(job.id)
        resolved = any(au.action == "resolve" for au in audits)
        if job.state == "succeeded" and not done and not resolved:
            phantom.append(job.id)
    section = {
        "jobs_with_two_completions": sorted(double),
        "left_terminal_without_audit": sorted(set(unaudited)),
        "succeeded_without_completion": sorted(phantom),
        "audited_operator_actions": sum(len(v) for v in ev.audits.values()),
    }
    ok = not double and not unaudited and not phantom
    return section, _verdict(
        ok,
        f"{len(double)} jobs with two accepted completions, {len(set(unaudited))} left a "
        f"terminal state without an audited action, {len(phantom)} succeeded without one",
        [*double, *unaudited, *phantom],
    )


# ---------------------------------------------------------------------------------------------
# Stale writes (I4) and overlapping grants (I5)
# ---------------------------------------------------------------------------------------------


def _grant_end(a: AttemptRow) -> float:
    """When ``a``'s right to act ended by the database: its finish, unless a renewal was
    accepted after it (then the renewal's expiry), else its last expiry."""
    expires = a.expires if a.expires is not None else a.claimed
    if a.finished is None or (a.heartbeat is not None and a.heartbeat > a.finished):
        return expires
    return min(a.finished, expires)


def stale_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Stale writes attempted / refused / accepted per kind; overlapping lease grants."""
    refused: Counter[str] = Counter(s["write"] for s in ev.stale if s["job_id"] in ev.jobs)
    accepted: Counter[str] = Counter()
    accepted_jobs: set[int] = set()
    overlaps: list[dict[str, Any]] = []
    for job_id, rows in ev.attempts.items():
        if job_id not in ev.jobs:
            continue
        for i, a in enumerate(rows):
            later = rows[i + 1 :]
            if not later:
                continue
            nxt = min(b.claimed for b in later)
            if a.heartbeat is not None and a.heartbeat > nxt:
                accepted["heartbeat"] += 1
                accepted_jobs.add(job_id)
            if a.finished is not None and a.finished > nxt:
                accepted[f"finish:{a.outcome or '?'}"] += 1
                accepted_jobs.add(job_id)
            end = _grant_end(a)
            if nxt < end:
                overlaps.append({"job": job_id, "fence": a.fence, "overlap_s": round(end - nxt, 3)})
        for event in ev.ledger_history.get(job_id, []):
            # Every ledger write made for an attempt carries its fence: one made after a newer
            # fence was claimed was made by a superseded attempt. (An operator's fact carries
            # none; a reconcile answer carries the reconcile attempt's own fence; the reaper
            # marks an abandoned intent unknown before the next claim.)
            if event.fence is None:
                continue
            newer = [b.claimed for b in rows if b.fence > event.fence]
            if newer and min(newer) < event.at:
                accepted["effect"] += 1
                accepted_jobs.add(job_id)
    seen_refused: Counter[str] = Counter(
        e.get("write", "?") for e in ev.events if e.get("event") == "refused"
    )
    kinds = sorted(set(refused) | set(accepted))
    section = {
        "by_kind": {
            k: {
                "attempted": refused[k] + accepted[k],
                "refused": refused[k],
                "accepted": accepted[k],
            }
            for k in kinds
        },
        "refused_total": sum(refused.values()),
        "accepted_total": sum(accepted.values()),
        "refusals_in_event_logs": dict(seen_refused),
        "refused_by_destination_fence": refused.get("destination_fence", 0),
        "overlapping_grants": overlaps[:OFFENDERS_SHOWN],
        "overlapping_grants_total": len(overlaps),
    }
    i4 = _verdict(
        not accepted,
        f"{sum(refused.values())} stale writes refused, {sum(accepted.values())} accepted",
        accepted_jobs,
    )
    i5 = _verdict(
        not overlaps,
        f"{len(overlaps)} overlapping lease grants across "
        f"{sum(len(r) for r in ev.attempts.values())} attempts",
        [o["job"] for o in overlaps],
    )
    return section, i4, i5


# ---------------------------------------------------------------------------------------------
# Effects (I6) and ambiguous outcomes (I7)
# ---------------------------------------------------------------------------------------------


def _causes(ev: Evidence, job: JobRow, touched: dict[int, list[str]]) -> list[str]:
    out = []
    if job.payload.get("slow") or job.payload.get("slow_reply_attempts"):
        out.append("destination applied, reply timed out")
    out.extend(sorted(set(touched.get(job.id, []))))
    return out or ["unattributed"]


def _touched(ev: Evidence) -> dict[int, list[str]]:
    """Fault kinds that hit each job while it was in flight."""
    out: dict[int, list[str]] = defaultdict(list)
    for f in ev.faults:
        for job_id in f.get("jobs", []):
            out[job_id].append(f["kind"])
    return out


def effects_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ground-truth effects per key against each mode's promise."""
    touched = _touched(ev)
    per_mode: dict[str, dict[str, Any]] = {}
    bad: list[int] = []
    problems: Counter[str] = Counter()
    for job in ev.jobs.values():
        if not job.effect_name:
            continue
        # A job that never recorded its effect's intent has no key: nothing of it can be at a
        # destination, and a succeeded job without one lacks its effect.
        n = ev.applied.get(job.effect_key, 0) if job.effect_key else 0
        m = per_mode.setdefault(
            job.mode,
            {
                "jobs": 0,
                "effects": 0,
                "duplicate_jobs": 0,
                "extra_effects": 0,
                "causes": Counter(),
                "succeeded_without_effect": 0,
                "failed_with_effect": 0,
            },
        )
        m["jobs"] += 1
        m["effects"] += n
        if n > 1:
            m["duplicate_jobs"] += 1
            m["extra_effects"] += n - 1
            for c in _causes(ev, job, touched):
                m["causes"][c] += 1
        if job.state == "succeeded" and n == 0:
            m["succeeded_without_effect"] += 1
        if job.state in ("failed", "cancelled") and n > 0:
            m["failed_with_effect"] += 1
        problem = _mode_problem(ev, job, n)
        if problem:
            problems[problem] += 1
            bad.append(job.id)
    for m in per_mode.values():
        m["causes"] = dict(m["causes"])
    section = {"by_mode": per_mode, "problems": dict(problems)}
    return section, _verdict(
        not bad,
        "; ".join(f"{k}: {v}" for k, v in problems.items())
        or "every key within its mode's promise",
        bad,
    )


def _mode_problem(ev: Evidence, job: JobRow, n: int) -> str:
    """Why ``n`` effects break ``job``'s mode promise, or "" when they do not."""
    if job.state == "succeeded" and n == 0:
        return f"{job.mode}: succeeded without its effect"
    if job.mode == "transactional" and job.state != "succeeded" and n:
        return "transactional: effect committed without the completion"
    if job.mode == "at_least_once":
        if n > 1:
            rows = ev.effects.get(job.id, [])
            if not any(r.duplicate_possible or r.intents > 1 for r in rows):
                return "at_least_once: duplicate not recorded in the ledger"
        return ""
    if n > 1:
        return f"{job.mode}: {n} effects for one key"
    return ""


def ambiguity_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """How each ambiguous outcome was resolved; blind re-runs are violations."""
    ops = {o["job"]: f"{o['result']}, having found {o['found']} effect(s)" for o in ev.operator}
    resolutions: dict[str, Counter[str]] = defaultdict(Counter)
    blind: list[int] = []
    ambiguous_attempts = 0
    for job in ev.jobs.values():
        rows = ev.attempts_of(job.id)
        amb = [a for a in rows if a.error_class == "indeterminate"]
        effects = ev.effects.get(job.id, [])
        reconciles = [a for a in rows if a.kind == "reconcile"]
        signal = (
            amb
            or reconciles
            or job.id in ops
            or any(e.intents > 1 or e.duplicate_possible for e in effects)
        )
        if not signal:
            continue
        ambiguous_attempts += len(amb)
        resolutions[job.mode][_resolution(ev, job, rows, ops.get(job.id))] += 1
        if job.mode in ("reconcilable", "at_most_once"):
            audits = ev.audits.get(job.id, [])
            for i, a in enumerate(rows[:-1]):
                nxt = rows[i + 1]
                if a.error_class != "indeterminate" or nxt.kind != "run":
                    continue
                if not any(a.claimed <= au.created <= nxt.claimed for au in audits):
                    blind.append(job.id)
    section = {
        "ambiguous_attempts": ambiguous_attempts,
        "resolutions": {m: dict(c) for m, c in resolutions.items()},
        "still_indeterminate": sorted(j.id for j in ev.jobs.values() if j.state == "indeterminate"),
        "operator_decisions": dict(Counter(o["result"] for o in ev.operator)),
    }
    return section, _verdict(
        not blind,
        f"{sum(sum(c.values()) for c in resolutions.values())} jobs had an ambiguous outcome; "
        f"{len(set(blind))} re-run blindly",
        blind,
    )


def _resolution(ev: Evidence, job: JobRow, rows: list[AttemptRow], op: str | None) -> str:
    n = ev.applied.get(job.effect_key, 0)
    if op:
        return f"parked, operator {op}"
    if job.state == "indeterminate":
        return "still indeterminate (for an operator)"
    if job.mode == "transactional":
        return "rolled back with its attempt, run again"
    if job.mode == "idempotent":
        if job.effect_key in ev.replayed:
            return "retried under the same key, destination replayed"
        return "retried under the same key"
    if job.mode == "reconcilable":
        answers = sorted({a.outcome for a in rows if a.kind == "reconcile"})
        return "reconciled: " + (", ".join(answers) or "no answer")
    if job.mode == "at_least_once":
        return "run again, duplicate recorded" if n > 1 else "run again, no duplicate arose"
    return f"{job.state}"


# ---------------------------------------------------------------------------------------------
# A fallback to a destination that keeps its own keys (I13)
# ---------------------------------------------------------------------------------------------


def _turned_away(a: AttemptRow) -> bool:
    """Whether attempt ``a`` ended because its destination turned the request away unseen."""
    return a.error_class == "transient" and any(s in a.message for s in NOTHING_SENT)


UNKNOWN_EVENTS = frozenset({"unknown", "left_unsettled"})
"""Ledger events that leave an effect's outcome unknown: an attempt that sent and heard
nothing, or an attempt that ended (killed, paused, cut off) between its intent and its
outcome."""


def _unknown_then_nothing_sent(history: list[LedgerEvent], primary: set[int]) -> LedgerEvent | None:
    """The event that left the effect's outcome unknown in a primary attempt (fences
    ``primary``) when the ledger later recorded an attempt that sent nothing, else None: the
    case where forgetting the unknown would let an unshared fallback run."""
    for i, e in enumerate(history):
        if e.event in UNKNOWN_EVENTS and e.fence is not None and e.fence in primary:
            if any(later.event == "not_sent" for later in history[i + 1 :]):
                return e
            return None
    return None


UNKNOWN_CAUSES = {
    "unknown": "applied, then the reply timed out",
    "left_unsettled": "attempt ended between intent and answer",
}
"""How the figures name what left an outcome unknown (:data:`UNKNOWN_EVENTS`)."""


def fallback_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """Jobs whose fallback charges at a second provider that keeps its own keys: at how many
    destinations each one's effect was applied, by the destinations' own records.

    The case that presses it: the first provider applies a charge and the caller's timeout
    leaves its outcome unknown, then the next attempt is turned away with nothing sent. The
    ledger must keep the outcome unknown, so the job never hands over to the fallback, whose
    provider would charge again under keys of its own. Which jobs met that case is read from
    the ledger's history (an ``unknown`` or ``left_unsettled`` event, then a ``not_sent``);
    where their effects landed, from the destinations' records only.
    """
    fallback_jobs = [j for j in ev.jobs.values() if j.base_type == FALLBACK_TYPE]
    if not fallback_jobs:
        return {}, _verdict(None, "no job of this run falls back to a second destination")
    ops = {o["job"] for o in ev.operator}
    cases: Counter[str] = Counter()
    scenario: list[int] = []
    fell_back: list[int] = []
    fell_back_after_unknown: list[int] = []
    parked: list[int] = []
    at: Counter[str] = Counter()
    both: list[int] = []
    turned_away_by: Counter[str] = Counter()
    scenario_causes: Counter[str] = Counter()
    scenario_away: Counter[str] = Counter()
    for job in fallback_jobs:
        cases[str(job.payload.get("case", "?"))] += 1
        rows = ev.attempts_of(job.id)
        for a in rows:
            if a.kind == "run" and _turned_away(a):
                turned_away_by["503" if "503" in a.message else "connection refused"] += 1
        history = ev.ledger_history.get(job.id, [])
        opened = _unknown_then_nothing_sent(history, {a.fence for a in rows if a.kind == "run"})
        if opened is not None:
            scenario.append(job.id)
            scenario_causes[UNKNOWN_CAUSES[opened.event]] += 1
            for a in rows:
                if a.kind == "run" and a.fence > (opened.fence or 0) and _turned_away(a):
                    scenario_away["503" if "503" in a.message else "connection refused"] += 1
        fallbacks = [a.fence for a in rows if a.kind == "fallback"]
        if fallbacks:
            fell_back.append(job.id)
            # An outcome left unknown by an attempt before the first fallback attempt.
            if any(e.event in UNKNOWN_EVENTS and (e.fence or 0) < min(fallbacks) for e in history):
                fell_back_after_unknown.append(job.id)
        if job.id in ops or job.state == "indeterminate":
            parked.append(job.id)
        where = [
            d for d, counts in ev.applied_at.items() if job.effect_key and counts[job.effect_key]
        ]
        for d in where:
            at[d] += 1
        if len(where) > 1:
            both.append(job.id)
    section: dict[str, Any] = {
        "jobs": len(fallback_jobs),
        "planned_cases": dict(cases),
        "unknown_then_turned_away": len(scenario),
        "scenario_unknown_because": dict(scenario_causes),
        "scenario_attempts_turned_away": dict(scenario_away),
        "turned_away_attempts": dict(turned_away_by),
        "turned_away_in_provider_log": sum(
            n for k, n in ev.turned_away.items() if k in {j.effect_key for j in fallback_jobs}
        ),
        "fell_back": len(fell_back),
        "fell_back_after_unknown": len(fell_back_after_unknown),
        "parked_indeterminate": len(parked),
        "scenario_parked": len(set(scenario) & set(parked)),
        "scenario_fell_back": len(set(scenario) & set(fell_back)),
        "applied_at_first_provider": at["pay"],
        "applied_at_second_provider": at["pay2"],
        "applied_at_two_destinations": sorted(both),
        "states": dict(Counter(j.state for j in fallback_jobs)),
    }
    return section, _verdict(
        not both,
        f"{len(fallback_jobs)} jobs; {len(scenario)} had an unknown outcome at the first "
        f"provider, then an attempt that sent nothing ({len(set(scenario) & set(fell_back))} of "
        f"them fell back, {len(set(scenario) & set(parked))} parked); {len(fell_back)} fell "
        f"back, {len(parked)} parked indeterminate; applied at the first provider "
        f"{at['pay']}, at the second {at['pay2']}, at both {len(both)} (must be 0)",
        both,
    )


# ---------------------------------------------------------------------------------------------
# How jobs end (I14), every effect of a succeeded job (I15), unanswered cancels (I16)
# ---------------------------------------------------------------------------------------------

MAY_HAVE_HAPPENED = frozenset({"intended", "unknown", "applied"})
"""Ledger states that say an effect may have happened, or did: ``failed`` would deny it."""


def end_paths_section(
    ev: Evidence,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The jobs that walk the end paths by state; verdicts I14, I15 and I16.

    I14: no job ends ``failed`` while its ledger holds an effect intended, unknown or applied,
    nor while a destination holds one of its effects (nor ``cancelled`` with one intended or
    unknown). I15: every effect of a ``succeeded`` job's type is applied at its destination,
    exactly once (at least once for ``at_least_once``), the second effect of ``chaos.multi``
    (its receipt) included. I16: a job whose running attempt an operator asked to stop (the
    audited ``cancel_running``) ends ``cancelled``, and no attempt of it is claimed after the
    request.
    """
    failed_ledger: list[int] = []
    failed_truth: list[int] = []
    cancelled_unknown: list[int] = []
    missing: list[int] = []
    doubled: list[int] = []
    missing_by_effect: Counter[str] = Counter()
    succeeded_checked = 0
    for job in ev.jobs.values():
        rows = ev.effects.get(job.id, [])
        if job.state == "failed":
            if any(r.state in MAY_HAVE_HAPPENED or r.in_doubt for r in rows):
                failed_ledger.append(job.id)
            if any(ev.applied.get(r.key, 0) for r in rows):
                failed_truth.append(job.id)
        if job.state == "cancelled" and any(r.state in ("intended", "unknown") for r in rows):
            cancelled_unknown.append(job.id)
        names = EFFECTS_OF_TYPE.get(job.base_type, ())
        if job.state != "succeeded" or not names:
            continue
        succeeded_checked += 1
        for name in names:
            n = sum(ev.applied.get(k, 0) for k in job.effect_keys.get(name, ()))
            if n == 0:
                missing.append(job.id)
                missing_by_effect[f"{job.base_type}:{name}"] += 1
            elif n > 1 and job.mode != "at_least_once":
                doubled.append(job.id)
    paths = {
        t: dict(Counter(j.state for j in ev.jobs.values() if j.base_type == t)) for t in PATH_TYPES
    }
    reasons: dict[str, dict[str, int]] = {}
    for t in PATH_TYPES:
        c: Counter[str] = Counter(
            j.reason.split(";", 1)[0].split(":", 1)[0][:50]
            for j in ev.jobs.values()
            if j.base_type == t and j.state in ("failed", "indeterminate", "cancelled")
        )
        reasons[t] = dict(c.most_common(5))
    multi = [j for j in ev.jobs.values() if j.base_type == MULTI_TYPE]
    receipts = sum(
        1
        for j in multi
        if j.state == "succeeded"
        and sum(ev.applied.get(k, 0) for k in j.effect_keys.get("receipt", ())) == 1
    )
    requests: dict[int, float] = {}
    for job_id, audits in ev.audits.items():
        for au in audits:
            if au.action == "cancel_running" and job_id in ev.jobs:
                requests.setdefault(job_id, au.created)
    not_cancelled: list[int] = []
    ran_after: list[int] = []
    cancel_ends: Counter[str] = Counter()
    for job_id, at in requests.items():
        job = ev.jobs[job_id]
        rows_a = ev.attempts_of(job_id)
        last = rows_a[-1].outcome if rows_a else ""
        cancel_ends[f"{job.state} ({last or 'no attempt'})"] += 1
        if job.state != "cancelled":
            not_cancelled.append(job_id)
        if any(a.claimed > at for a in rows_a):
            ran_after.append(job_id)
    stubborn = [j for j in ev.jobs.values() if j.base_type == STUBBORN_TYPE]
    section: dict[str, Any] = {
        "by_type": paths,
        "reasons": reasons,
        "failed_with_effect_in_ledger": sorted(failed_ledger),
        "failed_with_effect_at_destination": sorted(failed_truth),
        "cancelled_with_unknown_effect": sorted(cancelled_unknown),
        "succeeded_checked": succeeded_checked,
        "succeeded_missing_an_effect": sorted(missing),
        "missing_by_effect": dict(missing_by_effect),
        "succeeded_effect_doubled": sorted(doubled),
        "multi_jobs": len(multi),
        "multi_lost": dict(Counter(str(j.payload.get("lost") or "none") for j in multi)),
        "multi_succeeded_with_receipt": receipts,
        "cancel_requests": len(requests),
        "cancel_requests_of_stubborn_jobs": sum(1 for j in stubborn if j.id in requests),
        "cancel_ends": dict(cancel_ends),
        "cancel_not_cancelled": sorted(not_cancelled),
        "cancel_ran_after_request": sorted(ran_after),
    }
    failed = sum(1 for j in ev.jobs.values() if j.state == "failed")
    i14 = _verdict(
        not failed_ledger and not failed_truth and not cancelled_unknown,
        f"{failed} failed jobs: {len(failed_ledger)} with an effect intended, unknown or applied "
        f"in the ledger, {len(failed_truth)} with an effect at a destination; "
        f"{len(cancelled_unknown)} cancelled with an effect of unknown outcome; end paths: "
        + "; ".join(f"{t} {_kv(c)}" for t, c in paths.items()),
        [*failed_ledger, *failed_truth, *cancelled_unknown],
    )
    i15 = _verdict(
        not missing and not doubled,
        f"{succeeded_checked} succeeded jobs checked effect by effect: {len(missing)} missing an "
        f"effect ({_kv(missing_by_effect)}), {len(doubled)} with one applied twice; "
        f"{MULTI_TYPE}: {len(multi)} jobs, {receipts} succeeded with charge and receipt once each",
        [*missing, *doubled],
    )
    if not requests:
        i16 = _verdict(None, "no running job was asked to stop in this run")
    else:
        i16 = _verdict(
            not not_cancelled and not ran_after,
            f"{len(requests)} cancel requests on running jobs: ended {_kv(cancel_ends)}; "
            f"{len(not_cancelled)} not cancelled, {len(ran_after)} claimed again after the "
            "request",
            [*not_cancelled, *ran_after],
        )
    return section, i14, i15, i16


# ---------------------------------------------------------------------------------------------
# Attempts, recovery (I8), classification (I9), busy loops (I12)
# ---------------------------------------------------------------------------------------------


def attempts_section(ev: Evidence) -> dict[str, Any]:
    """Attempts per job, overall and by mode."""
    counts = [len(ev.attempts_of(j.id)) for j in ev.jobs.values()]
    hist = Counter(min(c, 10) for c in counts)
    by_mode: dict[str, list[int]] = defaultdict(list)
    for j in ev.jobs.values():
        by_mode[j.mode].append(len(ev.attempts_of(j.id)))
    return {
        "histogram": {("10+" if k == 10 else str(k)): v for k, v in sorted(hist.items())},
        "mean": round(statistics.mean(counts), 3) if counts else 0.0,
        "max": max(counts) if counts else 0,
        "mean_by_mode": {m: round(statistics.mean(v), 3) for m, v in sorted(by_mode.items())},
        "outcomes": dict(
            Counter(a.outcome or "(open)" for j in ev.jobs for a in ev.attempts_of(j))
        ),
    }


def _outages(ev: Evidence) -> list[tuple[float, float]]:
    return [(float(f["outage"][0]), float(f["outage"][1])) for f in ev.faults if f.get("outage")]


def recovery_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """How fast abandoned jobs are rescued, by the database's clock.

    A rescue is the reaper moving on a job whose owner stopped renewing. Measured from the
    owner's last renewal, it must come within lease + grace + sweep interval. When the
    database was down after the lease expired the reaper could not act; those rescues are
    measured from the database's return instead and judged against the maintenance loop's
    reconnect backoff (:data:`MAINTENANCE_BACKOFF_CAP`) + sweep interval.
    """
    grace = float(ev.plan.get("reap_grace", 0.0))
    sweep = float(ev.plan.get("sweep_interval", 0.0))
    outages = _outages(ev)
    times: list[float] = []
    after_return: list[float] = []
    next_claim: list[float] = []
    over: list[int] = []
    bounds: set[float] = set()
    for job_id, rows in ev.attempts.items():
        if job_id not in ev.jobs:
            continue
        audits = [au.created for au in ev.audits.get(job_id, [])]
        for i, a in enumerate(rows):
            if a.outcome != "lease_expired" or None in (a.heartbeat, a.finished, a.expires):
                continue
            assert a.heartbeat is not None and a.finished is not None and a.expires is not None
            due = a.expires + grace
            hit = [o for o in outages if o[0] <= a.finished and o[1] >= a.expires]
            if hit:
                back = max(o[1] for o in hit)
                delay = a.finished - max(back, due)
                after_return.append(delay)
                if delay > MAINTENANCE_BACKOFF_CAP + sweep + RECOVERY_TOLERANCE:
                    over.append(job_id)
            else:
                took = a.finished - a.heartbeat
                bound = (a.expires - a.heartbeat) + grace + sweep
                bounds.add(round(bound, 3))
                times.append(took)
                if took > bound + RECOVERY_TOLERANCE:
                    over.append(job_id)
            if i + 1 < len(rows):
                nxt = rows[i + 1].claimed
                if not any(a.finished <= t <= nxt for t in audits):
                    next_claim.append(nxt - a.heartbeat)
    found = _false_rescues(ev)
    false_rescues = sorted({a.job for _, a in found})
    # Hung first attempts (catalogue 8): only the maximum runtime can end them, so each must
    # end by its lease running out (or a fault on its executor), never by completing, and
    # the job must be rescued: a later attempt claims it. ``chaos.untimed`` declares no
    # maximum runtime: the installation's default must end its hung attempts the same way.
    hung = [j for j in ev.jobs.values() if j.payload.get("hang") and ev.attempts_of(j.id)]
    hung_ends = Counter(ev.attempts_of(j.id)[0].outcome or "running" for j in hung)
    hung_completed = [j.id for j in hung if ev.attempts_of(j.id)[0].outcome in COMPLETIONS]
    hung_by_timeout: dict[str, dict[str, Any]] = {}
    hung_not_rescued: list[int] = []
    for j in hung:
        source = "default" if j.base_type == UNTIMED_TYPE else "declared"
        h = hung_by_timeout.setdefault(
            source, {"jobs": 0, "timeout_s": Counter(), "first_attempt": Counter(), "rescued": 0}
        )
        first = ev.attempts_of(j.id)[0]
        h["jobs"] += 1
        h["timeout_s"][f"{j.timeout:g}"] += 1
        h["first_attempt"][first.outcome or "running"] += 1
        if len(ev.attempts_of(j.id)) > 1:
            h["rescued"] += 1
        else:
            hung_not_rescued.append(j.id)
    for h in hung_by_timeout.values():
        h["timeout_s"] = dict(h["timeout_s"])
        h["first_attempt"] = dict(h["first_attempt"])
    held = held_behind_unknown(ev)
    unfinished = sorted(
        j.id for j in ev.jobs.values() if j.state in ("waiting", "leased") and j.id not in held
    )
    terms = [f for f in ev.faults if f["kind"] == "term" and "exit_after" in f]
    section: dict[str, Any] = {
        "reaped": len(times) + len(after_return),
        "recovery_s": _figures(times),
        "bound_s": sorted(bounds),
        "tolerance_s": RECOVERY_TOLERANCE,
        "reaped_after_db_outage": len(after_return),
        "after_db_return_s": _figures(after_return),
        "after_db_return_bound_s": MAINTENANCE_BACKOFF_CAP + sweep,
        "over_bound": sorted(set(over)),
        "next_claim_after_last_renewal_s": _figures(next_claim),
        "false_rescues": false_rescues,
        "false_rescue_detail": _false_rescue_detail(ev, found),
        "late_renewals": sum(1 for e in ev.events if e.get("event") == "heartbeat_late"),
        "slow_renewals": sum(1 for e in ev.events if e.get("event") == "heartbeat_slow"),
        "sigterm_exit_s": _figures([f["exit_after"] for f in terms]),
        "sigterm_forced": sum(1 for f in terms if f.get("forced")),
        "released_on_sigterm": sum(
            1 for j in ev.jobs for a in ev.attempts_of(j) if a.outcome == "released"
        ),
        "hung_first_attempts": dict(hung_ends),
        "hung_completed": hung_completed,
        "hung_by_timeout": hung_by_timeout,
        "hung_not_rescued": hung_not_rescued,
        "default_timeout_s": ev.plan.get("default_timeout"),
        "not_drained": unfinished,
        "drained": bool(ev.meta.get("drained", not unfinished)),
    }
    ok = (
        not over
        and not unfinished
        and not false_rescues
        and not hung_completed
        and not hung_not_rescued
    )
    rec, back = section["recovery_s"], section["after_db_return_s"]
    return section, _verdict(
        ok,
        f"{len(times)} rescues p50 {rec['p50']}s p95 {rec['p95']}s max {rec['max']}s (bound "
        f"{', '.join(str(b) for b in sorted(bounds)) or '-'}s); {len(after_return)} after a "
        f"database outage, {back['max']}s at most after its return (bound "
        f"{section['after_db_return_bound_s']}s); {len(set(over))} over; "
        f"{len(false_rescues)} false rescues; {len(hung)} hung first attempts ended "
        f"{_kv(hung_ends)} ({_hung_summary(hung_by_timeout)}); {len(unfinished)} jobs not "
        f"drained ({len(held)} workflow steps held behind an unknown outcome: I17)",
        [*over, *unfinished, *false_rescues, *hung_completed, *hung_not_rescued],
    )


def _seconds(counts: dict[str, int]) -> str:
    """``{"16": 2}`` as ``16 s x2``."""
    return ", ".join(f"{t} s x{n}" for t, n in sorted(counts.items())) or "-"


def _hung_summary(by_timeout: dict[str, dict[str, Any]]) -> str:
    names = {"declared": "declared timeout", "default": "installation's default timeout"}
    return (
        "; ".join(
            f"{names[k]}: {h['jobs']} (maximum runtime {_seconds(h['timeout_s'])}), "
            f"{h['rescued']} rescued"
            for k, h in sorted(by_timeout.items())
        )
        or "none"
    )


def _false_rescues(ev: Evidence) -> list[tuple[dict[str, Any], AttemptRow]]:
    """Attempts rescued from an executor that was only paused briefly (for less than its
    lease) while nothing else disturbed its renewals, each with its pause.

    A rescue is false when the short pause is the only fault between the owner's last
    renewal and the rescue (a planned hung first attempt, ended by its maximum runtime, is
    not a fault of the executor): a database outage or a cut link in that window makes the
    owner's renewals fail, and it then stops claiming ownership itself (self-fencing), so the
    rescue is due. Faults on other executors do not count.
    """
    out: list[tuple[dict[str, Any], AttemptRow]] = []
    for f in ev.faults:
        if f["kind"] != "pause_short":
            continue
        for job_id in f.get("jobs", []):
            rows = ev.attempts_of(job_id)
            job = ev.jobs.get(job_id)
            for a in rows:
                if a.pid != f.get("pid") or a.outcome != "lease_expired" or a.finished is None:
                    continue
                if job is not None and job.payload.get("hang") and a is rows[0]:
                    continue  # a hung first attempt: its maximum runtime ended the lease
                if not f["start"] <= a.finished <= f["end"] + 1.0:
                    continue
                since = a.heartbeat if a.heartbeat is not None else a.claimed
                others = [
                    g
                    for g in ev.faults
                    if g is not f
                    and (g.get("outage") or g.get("pid") == f.get("pid"))
                    and g["start"] <= a.finished
                    and g["end"] >= since
                ]
                if not others:
                    out.append((f, a))
    return out


def _false_rescue_detail(
    ev: Evidence, found: list[tuple[dict[str, Any], AttemptRow]]
) -> list[dict[str, Any]]:
    """For each false rescue: how old the owner's last renewal was when the pause began, and
    the late or slow renewals its executor logged for that job (the evidence of the cause)."""
    out: list[dict[str, Any]] = []
    for f, a in found:
        since = a.heartbeat if a.heartbeat is not None else a.claimed
        out.append(
            {
                "job": a.job,
                "pid": a.pid,
                "pause_s": round(f["end"] - f["start"], 3),
                "renewal_age_at_pause_s": round(f["start"] - since, 3),
                "renewal_events": [
                    e
                    for e in ev.events
                    if e.get("job") == a.job
                    and e.get("event") in ("heartbeat_late", "heartbeat_slow")
                ],
            }
        )
    return out


def broker_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """Jobs announced through the broker: how long those whose hint a broker restart lost
    waited after the broker came back, and what the duplicated deliveries came to."""
    twins = [j for j in ev.jobs.values() if j.name.endswith(BROKER_SUFFIX)]
    if not twins:
        return {}, _verdict(None, "this run had no broker")
    restarts = [f for f in ev.faults if f["kind"] == "broker_restart" and "broker_outage" in f]
    dups = [f for f in ev.faults if f["kind"] == "broker_duplicate" and "copies_added" in f]
    due = {
        e["key"]: e["t"] + e.get("took", 0.0) + e.get("delay", 0.0)
        for e in ev.enqueues
        if not e.get("repeat") and e.get("status") == "ack"
    }
    db_outages = [f["outage"] for f in ev.faults if f.get("outage")]
    bound = float(ev.plan.get("hint_bound", 11.0)) + BROKER_RECONNECT
    waits: list[float] = []
    over: list[int] = []
    for f in restarts:
        b0, b1 = f["broker_outage"]
        for j in twins:
            rows = ev.attempts_of(j.id)
            d = due.get(j.key)
            if d is None or not rows:
                continue
            first_claim = rows[0].claimed
            # Due before the broker came back and not yet claimed when it went down: its
            # hint was lost with the broker (or could not be published while it was down).
            if not (d < b1 and first_claim > b0):
                continue
            start = max(b1, d)
            if any(o0 <= first_claim and o1 >= start for o0, o1 in db_outages):
                continue  # the database was down meanwhile: the bound does not apply
            waits.append(first_claim - start)
            if first_claim - start > bound + RECOVERY_TOLERANCE:
                over.append(j.id)
    dropped = sum(1 for e in ev.events if e.get("event") == "hint_dropped")
    workers = [p for p in ev.meta.get("processes", {}).values() if p.get("kind") == "celery"]
    section: dict[str, Any] = {
        "jobs": len(twins),
        "states": dict(Counter(j.state for j in twins)),
        "restarts": len(restarts),
        "messages_lost": sum(max(0, int(f.get("lost_messages", 0))) for f in restarts),
        "duplications": len(dups),
        "copies_added": sum(int(f["copies_added"]) for f in dups),
        "hints_dropped_by_claim": dropped,
        "celery_worker_restarts": max(0, len(workers) - int(ev.plan.get("celery_workers", 0))),
        "claimed_after_broker_return_s": _figures(waits),
        "bound_s": bound,
        "over_bound": sorted(set(over)),
    }
    w = section["claimed_after_broker_return_s"]
    return section, _verdict(
        not over,
        f"{len(twins)} jobs through the broker; {len(restarts)} broker restarts lost "
        f"{section['messages_lost']} messages, {w['n']} waiting jobs claimed p50 {w['p50']}s "
        f"max {w['max']}s after its return (bound {bound}s); {section['copies_added']} "
        f"duplicate deliveries, {dropped} hints dropped by the claim",
        over,
    )


def classification_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """Planned failures against the class each was given."""
    wrong: list[int] = []
    table: Counter[str] = Counter()
    planned: Counter[str] = Counter()
    for job_id in ev.jobs:
        for a in ev.attempts_of(job_id):
            if not a.error_class:
                continue
            short = a.error_type.rsplit(".", 1)[-1]
            table[f"{short} -> {a.error_class}"] += 1
            expected = ""
            if PLANNED_PERMANENT in a.message:
                expected = "permanent"
            elif PLANNED_TRANSIENT in a.message:
                expected = "transient"
            elif any(s in a.message for s in NO_ANSWER):
                expected = "indeterminate"
            elif any(s in a.message for s in NOTHING_SENT):
                expected = "transient"
            if expected:
                planned[f"{expected}: {'ok' if a.error_class == expected else 'wrong'}"] += 1
                if a.error_class != expected:
                    wrong.append(job_id)
    for job in ev.jobs.values():
        # A job planned to fail for good must end failed once it has run: a workflow step
        # called off before it ran (``cancelled``, naming the step that failed) or still held
        # behind a parent never met its planned failure and is not judged here.
        if not job.payload.get("permanent") or job.state == "failed":
            continue
        if ev.attempts_of(job.id):
            wrong.append(job.id)
    section = {"planned": dict(planned), "by_error_type": dict(table.most_common(20))}
    return section, _verdict(
        not wrong,
        f"{sum(planned.values())} planned failures checked, {len(set(wrong))} jobs misclassified",
        wrong,
    )


def busy_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """CPU each executor and scheduler used while the database was down."""
    top: list[tuple[float, str]] = []
    rows = []
    bad = []
    for f in ev.faults:
        if f["kind"] != "pg_down" or "cpu" not in f:
            continue
        seconds = float(f.get("measured", 0.0)) or 1.0
        for name, cpu in f["cpu"].items():
            share = cpu / seconds
            rows.append(share)
            top.append((round(share, 3), name))
            if share > CPU_BUSY_FRACTION:
                bad.append(f"{name}@{int(f['start'])}")
    section: dict[str, Any] = {
        "outages_measured": sum(1 for f in ev.faults if f["kind"] == "pg_down"),
        "cpu_share": _figures(rows),
        "busiest": [f"{name} {share}" for share, name in sorted(top, reverse=True)[:3]],
        "threshold": CPU_BUSY_FRACTION,
    }
    if not rows:
        return section, _verdict(None, "no database outage was measured in this run")
    return section, _verdict(
        not bad,
        f"CPU share of a core while the database was down: p50 {section['cpu_share']['p50']}, "
        f"max {section['cpu_share']['max']} (limit {CPU_BUSY_FRACTION})",
        bad,
    )


def sweep_verdicts(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The hostile-input sweep's findings (I10 input, I11 operator surface)."""
    s = ev.sweep
    if not s:
        none = _verdict(None, "the hostile-input sweep was not run")
        return {}, none, dict(none)
    bad_input = [c for c in s.get("input", []) if not c.get("ok")]
    bad_ops = [c for c in s.get("operator", []) if not c.get("ok")]
    i10 = _verdict(
        not bad_input and not s.get("pickle_file_exists") and s.get("input"),
        f"{len(s.get('input', []))} hostile inputs, {len(bad_input)} not refused; pickle file "
        f"{'APPEARED' if s.get('pickle_file_exists') else 'never appeared'}",
        [c["case"] for c in bad_input],
    )
    if not s.get("operator"):
        i11 = _verdict(None, s.get("operator_note", "dashboard not checked"))
    else:
        i11 = _verdict(
            not bad_ops,
            f"{len(s['operator'])} forged or stale operator requests, {len(bad_ops)} not refused",
            [c["case"] for c in bad_ops],
        )
    return s, i10, i11


# ---------------------------------------------------------------------------------------------
# The whole check
# ---------------------------------------------------------------------------------------------


def async_section(ev: Evidence) -> dict[str, Any]:
    """The jobs whose handler was an ``async def`` twin, by the state they ended in (every
    invariant judges them with the others)."""
    twins = [j for j in ev.jobs.values() if j.name.endswith(ASYNC_SUFFIX)]
    return {"jobs": len(twins), "by_state": dict(Counter(j.state for j in twins))}


def terminal_section(ev: Evidence) -> dict[str, Any]:
    """Final states overall and by mode, and why jobs failed."""
    by_mode: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    for j in ev.jobs.values():
        by_mode[j.mode][j.state] += 1
        if j.state in ("failed", "indeterminate"):
            reasons[f"{j.state}: {j.reason.split(':', 1)[0][:60]}"] += 1
    return {
        "states": dict(Counter(j.state for j in ev.jobs.values())),
        "by_mode": {m: dict(c) for m, c in sorted(by_mode.items())},
        "reasons": dict(reasons.most_common(12)),
    }


def held_behind_unknown(ev: Evidence) -> set[int]:
    """Workflow steps waiting behind a parent whose outcome is unknown (``indeterminate``): the
    hold is the workflow's rule (no dependent runs until an operator settles that parent), not
    work left behind by the fleet."""
    parents_of: dict[int, list[int]] = {}
    for parent, child in ev.edges:
        parents_of.setdefault(child, []).append(parent)
    return {
        job_id
        for job_id, parents in parents_of.items()
        if job_id in ev.jobs
        and ev.jobs[job_id].state == "waiting"
        and any(p in ev.jobs and ev.jobs[p].state == "indeterminate" for p in parents)
    }


def workflows_section(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """Workflow steps: each step's first attempt was claimed after every parent's accepted
    completion (or its audited resolve), so none ran before its parents succeeded and no
    dependent of a failed, cancelled or indeterminate step ran; and every workflow ended (no
    step left waiting or leased), but for steps held behind a parent left ``indeterminate``
    (counted apart: they wait for an operator, as the workflow's rule says)."""
    if not ev.workflow_of:
        return {}, _verdict(None, "no workflow in this run")
    done_at: dict[int, float] = {}
    for job_id in ev.workflow_of:
        ends = [a.finished for a in ev.attempts_of(job_id) if a.outcome in COMPLETIONS]
        resolves = [au.created for au in ev.audits.get(job_id, []) if au.action == "resolve"]
        when = [t for t in [*ends, *resolves] if t is not None]
        if when:
            done_at[job_id] = min(when)
    early: list[int] = []
    for parent, child in ev.edges:
        rows = ev.attempts_of(child)
        if not rows:
            continue
        first = min(a.claimed for a in rows)
        p = ev.jobs.get(parent)
        if p is None or p.state != "succeeded" or parent not in done_at or first < done_at[parent]:
            early.append(child)
    open_steps = [
        j for j in ev.workflow_of if j in ev.jobs and ev.jobs[j].state in ("waiting", "leased")
    ]
    held = held_behind_unknown(ev)
    held_steps = sorted(j for j in open_steps if j in held)
    unended = sorted({ev.workflow_of[j] for j in open_steps if j not in held})
    states = Counter(ev.jobs[j].state for j in ev.workflow_of if j in ev.jobs)
    upstream = sum(
        1 for j in ev.workflow_of if j in ev.jobs and ev.jobs[j].reason.startswith("upstream ")
    )
    section = {
        "workflows": len(set(ev.workflow_of.values())),
        "steps": len(ev.workflow_of),
        "edges": len(ev.edges),
        "step_states": dict(states),
        "called_off_upstream": upstream,
        "ran_before_parents": sorted(set(early)),
        "not_ended": unended,
        "held_behind_unknown": held_steps,
    }
    return section, _verdict(
        not early and not unended,
        f"{section['workflows']} workflows, {len(ev.workflow_of)} steps, {len(ev.edges)} "
        f"edges: {len(set(early))} steps ran before a parent succeeded, {len(unended)} "
        f"workflows not ended, {len(held_steps)} steps held behind a parent left "
        f"indeterminate, {upstream} steps called off upstream",
        [*early, *unended],
    )


def analyse(ev: Evidence) -> dict[str, Any]:
    """Every section's figures and every invariant's verdict (pure)."""
    jobs, i1, i2 = jobs_section(ev)
    completions, i3 = completions_section(ev)
    stale, i4, i5 = stale_section(ev)
    effects, i6 = effects_section(ev)
    ambiguity, i7 = ambiguity_section(ev)
    recovery, i8 = recovery_section(ev)
    broker, broker_verdict = broker_section(ev)
    if broker:
        # Recovery after a broker restart is part of I8: work waits no longer than its bound.
        i8 = _verdict(
            i8["status"] != "fail" and broker_verdict["status"] != "fail",
            f"{i8['detail']}; {broker_verdict['detail']}",
            [*i8["offenders"], *broker_verdict["offenders"]],
        )
    classification, i9 = classification_section(ev)
    sweep, i10, i11 = sweep_verdicts(ev)
    busy, i12 = busy_section(ev)
    fallback, i13 = fallback_section(ev)
    paths, i14, i15, i16 = end_paths_section(ev)
    workflows, i17 = workflows_section(ev)
    verdicts = {
        "I1": i1,
        "I2": i2,
        "I3": i3,
        "I4": i4,
        "I5": i5,
        "I6": i6,
        "I7": i7,
        "I8": i8,
        "I9": i9,
        "I10": i10,
        "I11": i11,
        "I12": i12,
        "I13": i13,
        "I14": i14,
        "I15": i15,
        "I16": i16,
        "I17": i17,
    }
    for k, v in verdicts.items():
        v["title"] = TITLES[k]
    return {
        "plan": ev.plan,
        "run": {
            "faults": ev.meta.get("faults", {}),
            "fault_window": ev.meta.get("fault_window"),
            "phases": ev.meta.get("phases", {}),
            "fault_errors": sum(1 for f in ev.faults if "error" in f),
            "processes_started": len(ev.meta.get("processes", {})),
            "clocks": sorted(
                {
                    f"{p['name']} {p['clock']}"
                    for p in ev.meta.get("processes", {}).values()
                    if p.get("clock")
                }
            ),
        },
        "jobs": jobs,
        "terminal": terminal_section(ev),
        "completions": completions,
        "effects": effects,
        "stale_writes": stale,
        "attempts": attempts_section(ev),
        "ambiguity": ambiguity,
        "recovery": recovery,
        "broker": broker,
        "classification": classification,
        "busy_loop": busy,
        "fallback": fallback,
        "end_paths": paths,
        "workflows": workflows,
        "async": async_section(ev),
        "bad_input": sweep,
        "verdicts": verdicts,
        "passed": all(v["status"] != "fail" for v in verdicts.values()),
    }


def check(workdir: Path) -> dict[str, Any]:
    """Load the run's evidence and judge it."""
    return analyse(load(workdir))
