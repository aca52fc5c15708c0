"""The checker's results as a plain-text report (the JSON is written as is)."""

from __future__ import annotations

from typing import Any


def _kv(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def _fig(d: dict[str, Any]) -> str:
    return f"n={d.get('n', 0)} p50={d.get('p50', 0)}s p95={d.get('p95', 0)}s max={d.get('max', 0)}s"


def _share(d: dict[str, Any]) -> str:
    return f"n={d.get('n', 0)} p50={d.get('p50', 0)} p95={d.get('p95', 0)} max={d.get('max', 0)}"


def _ids(ids: list[Any]) -> str:
    return (
        (" [" + ", ".join(str(i) for i in ids[:12]) + (" ..." if len(ids) > 12 else "") + "]")
        if ids
        else ""
    )


NEGATIVE = {
    "fence": "fence off, synchronous_commit off",
    "sticky": "the ledger forgets an unknown outcome",
    "whole-job": "reconcile answered for the whole job",
    "max-age-fails": "max_age ends a job failed whatever its ledger holds",
}
"""What each negative control switches off, for the report's title."""


def _negative(kind: Any) -> str:
    if not kind:
        return ""
    return f" — NEGATIVE CONTROL ({NEGATIVE.get(str(kind), str(kind))})"


def render(r: dict[str, Any]) -> str:
    """The report: the run, each section's figures, then one verdict line per invariant."""
    p, run, jobs = r["plan"], r["run"], r["jobs"]
    lines = [
        "",
        "=" * 78,
        f"Tenure fault verifier — seed {p.get('seed')}, {p.get('seconds')}s of faults"
        + _negative(p.get("negative_control")),
        "=" * 78,
        f"system: {p.get('executors')} executors x{p.get('concurrency')}, {p.get('schedulers')} "
        f"schedulers, lease {p.get('lease_seconds')}s, grace {p.get('reap_grace')}s, sweep "
        f"{p.get('sweep_interval')}s, {p.get('rate')} jobs/s; offset clocks: "
        f"{', '.join(run.get('clocks', [])) or 'none (faketime missing)'}",
        f"faults injected: {_kv(run['faults'])} (could not inject: {run['fault_errors']})",
        f"phases (s): {_kv(run['phases'])}; processes started: {run['processes_started']}",
        "",
        "jobs",
        f"  enqueued {jobs['enqueued']}: acknowledged {jobs['acknowledged']}, outcome unknown "
        f"{jobs['outcome_unknown']} (found committed {jobs['outcome_unknown_found_committed']}), "
        f"rolled back on purpose {jobs['rolled_back_on_purpose']}, repeats {jobs['repeats']}",
        f"  lost {len(jobs['lost'])}{_ids(jobs['lost'])}; unexpected {len(jobs['unexpected'])}"
        f"{_ids(jobs['unexpected'])}; effects without a job {len(jobs['effects_without_job'])}",
        f"  completions seen by executors {jobs['completions_seen_by_executors']}, missing from "
        f"the database {len(jobs['completions_lost'])}{_ids(jobs['completions_lost'])}",
        f"  terminal: {_kv(r['terminal']['states'])}",
    ]
    for mode, states in r["terminal"]["by_mode"].items():
        lines.append(f"    {mode:14} {_kv(states)}")
    for reason, n in r["terminal"]["reasons"].items():
        lines.append(f"    {n:5}  {reason}")
    lines += ["", "effects at the destinations (ground truth) per mode"]
    for mode, m in r["effects"]["by_mode"].items():
        lines.append(
            f"  {mode:14} jobs {m['jobs']}, effects {m['effects']}, duplicated jobs "
            f"{m['duplicate_jobs']} (+{m['extra_effects']}), succeeded without effect "
            f"{m['succeeded_without_effect']}, failed with effect {m['failed_with_effect']}"
        )
        if m["causes"]:
            lines.append(f"  {'':14} duplicate causes: {_kv(m['causes'])}")
    s = r["stale_writes"]
    lines += ["", "stale writes (attempted / refused / accepted)"]
    for kind, v in s["by_kind"].items():
        lines.append(f"  {kind:22} {v['attempted']:5} / {v['refused']:5} / {v['accepted']:5}")
    lines.append(
        f"  overlapping lease grants (database clock): {s['overlapping_grants_total']}; "
        f"refusals in executors' event logs: {_kv(s['refusals_in_event_logs'])}"
    )
    a = r["attempts"]
    lines += [
        "",
        f"attempts per job: mean {a['mean']}, max {a['max']}, histogram {_kv(a['histogram'])}",
        f"  attempt outcomes: {_kv(a['outcomes'])}",
        "",
        f"ambiguous outcomes: {r['ambiguity']['ambiguous_attempts']} indeterminate attempts",
    ]
    for mode, res in r["ambiguity"]["resolutions"].items():
        for how, n in res.items():
            lines.append(f"  {mode:14} {n:5}  {how}")
    rec = r["recovery"]
    lines += [
        "",
        f"recovery (last renewal -> reaper, database clock): {_fig(rec['recovery_s'])}; "
        f"bound {rec['bound_s']}s (+{rec['tolerance_s']}s tolerance); over bound "
        f"{len(rec['over_bound'])}{_ids(rec['over_bound'])}",
        f"  {rec['reaped_after_db_outage']} more were due while the database was down; after it "
        f"returned: {_fig(rec['after_db_return_s'])} (bound {rec['after_db_return_bound_s']}s: "
        "the maintenance loop's reconnect backoff + sweep)",
        f"  next claim after last renewal: {_fig(rec['next_claim_after_last_renewal_s'])}",
        f"  false rescues after short pauses: {len(rec['false_rescues'])}; SIGTERM exit "
        f"{_fig(rec['sigterm_exit_s'])}, forced {rec['sigterm_forced']}, attempts released "
        f"{rec['released_on_sigterm']}; not drained {len(rec['not_drained'])}",
        f"  hung first attempts: {_kv(rec.get('hung_first_attempts', {}))}"
        + "".join(
            f"; {'timeout declared' if k == 'declared' else 'no timeout declared'}: "
            f"{h['jobs']} jobs, maximum runtime "
            + ", ".join(f"{t} s x{n}" for t, n in sorted(h["timeout_s"].items()))
            + f", first attempt "
            f"{_kv(h['first_attempt'])}, rescued {h['rescued']}"
            for k, h in sorted(rec.get("hung_by_timeout", {}).items())
        )
        + f"; completed by the hung attempt {len(rec.get('hung_completed', []))}",
        f"  renewals late {rec.get('late_renewals', 0)}, slow {rec.get('slow_renewals', 0)}"
        + "".join(
            f"; false rescue {d['job']}: last renewal {d['renewal_age_at_pause_s']}s before a "
            f"{d['pause_s']}s pause, {len(d['renewal_events'])} late/slow renewals logged"
            for d in rec.get("false_rescue_detail", [])
        ),
    ]
    b = r.get("broker") or {}
    if b:
        lines += [
            f"broker: {b['jobs']} jobs {_kv(b['states'])}; {b['restarts']} restarts lost "
            f"{b['messages_lost']} messages; waiting jobs claimed after its return "
            f"{_fig(b['claimed_after_broker_return_s'])} (bound {b['bound_s']}s); "
            f"{b['duplications']} duplications added {b['copies_added']} deliveries; "
            f"{b['hints_dropped_by_claim']} hints dropped by the claim; Celery worker exited "
            f"and was restarted {b.get('celery_worker_restarts', 0)} times",
        ]
    fb = r.get("fallback") or {}
    if fb:
        lines += [
            f"fallback to a second provider with its own keys: {fb['jobs']} jobs "
            f"({_kv(fb['planned_cases'])}); {_kv(fb['states'])}",
            f"  unknown outcome at the first provider, then an attempt that sent nothing: "
            f"{fb['unknown_then_turned_away']} jobs ({fb['scenario_fell_back']} fell back, "
            f"{fb['scenario_parked']} parked; unknown because "
            f"{_kv(fb.get('scenario_unknown_because', {}))}; their later attempts turned away "
            f"{_kv(fb.get('scenario_attempts_turned_away', {}))}); all attempts turned away "
            f"{_kv(fb['turned_away_attempts'])} (503s in the provider's log "
            f"{fb['turned_away_in_provider_log']})",
            f"  fell back {fb['fell_back']} (after an unknown outcome {fb['fell_back_after_unknown']}"
            f"), parked indeterminate {fb['parked_indeterminate']}; applied at the first "
            f"provider {fb['applied_at_first_provider']}, at the second "
            f"{fb['applied_at_second_provider']}, at both "
            f"{len(fb['applied_at_two_destinations'])}{_ids(fb['applied_at_two_destinations'])}",
        ]
    ep = r.get("end_paths") or {}
    if ep:
        lines += [
            "end paths: " + "; ".join(f"{t} {_kv(c)}" for t, c in ep["by_type"].items() if c),
            f"  chaos.multi: {ep['multi_jobs']} jobs (reply lost: {_kv(ep['multi_lost'])}), "
            f"{ep['multi_succeeded_with_receipt']} succeeded with charge and receipt once each; "
            f"succeeded jobs missing an effect {len(ep['succeeded_missing_an_effect'])}"
            f"{_ids(ep['succeeded_missing_an_effect'])}",
            f"  failed with an effect in the ledger {len(ep['failed_with_effect_in_ledger'])}"
            f"{_ids(ep['failed_with_effect_in_ledger'])}, at a destination "
            f"{len(ep['failed_with_effect_at_destination'])}"
            f"{_ids(ep['failed_with_effect_at_destination'])}",
            f"  cancel requests on running jobs {ep['cancel_requests']}: ended "
            f"{_kv(ep['cancel_ends'])}",
        ]
        for t, rs in ep["reasons"].items():
            for reason, n in rs.items():
                lines.append(f"    {t:15} {n:5}  {reason}")
    aw = r.get("async") or {}
    if aw.get("jobs"):
        lines += [f"async def handlers: {aw['jobs']} jobs {_kv(aw['by_state'])}"]
    lines += [
        f"classification: planned {_kv(r['classification']['planned'])}",
        f"  by error type: {_kv(r['classification']['by_error_type'])}",
        f"busy loop: {r['busy_loop'].get('outages_measured', 0)} database outages measured; "
        f"CPU share of a core per process while down: {_share(r['busy_loop'].get('cpu_share', {}))}"
        f"; busiest: {', '.join(r['busy_loop'].get('busiest', [])) or '-'}",
    ]
    sweep = r.get("bad_input") or {}
    if sweep:
        lines += ["", "hostile input"]
        for c in sweep.get("input", []) + sweep.get("operator", []):
            mark = "ok " if c.get("ok") else "BAD"
            lines.append(f"  {mark} {c['case']}: {c.get('observed', '')}"[:150])
    lines += ["", "verdicts"]
    for key, v in sorted(r["verdicts"].items(), key=lambda kv: int(kv[0][1:])):
        mark = {"pass": "PASS", "fail": "FAIL", "not run": "----"}[v["status"]]
        lines.append(f"  {mark} {key:4} {v['title']}")
        lines.append(f"       {v['detail']}{_ids(v['offenders'])}")
    lines += [
        "",
        "RESULT: " + ("every invariant held" if r["passed"] else "AN INVARIANT FAILED"),
        "",
    ]
    return "\n".join(lines)


def summary(r: dict[str, Any]) -> str:
    """A short Markdown summary of a run's JSON report (``manage.py chaos --summarize``): the
    seed and length, the faults injected, the jobs per state and every invariant with its
    count, then the printed report."""
    p, run = r["plan"], r["run"]
    verdicts = sorted(r["verdicts"].items(), key=lambda kv: int(kv[0][1:]))
    held = sum(1 for _, v in verdicts if v["status"] == "pass")
    failed = sum(1 for _, v in verdicts if v["status"] == "fail")
    lines = [
        f"- **Seed** {p.get('seed')}, **{p.get('seconds'):g} s of faults**"
        + (f", negative control `{p['negative_control']}`" if p.get("negative_control") else "")
        + f"; {p.get('executors')} executors x{p.get('concurrency')}, "
        f"{p.get('schedulers')} schedulers, {p.get('rate')} jobs/s; phases (s): "
        f"{_kv(run['phases'])}; processes started: {run['processes_started']}.",
        f"- **Faults injected ({sum(run['faults'].values())}):** {_kv(run['faults'])} "
        f"(could not inject: {run['fault_errors']}).",
        f"- **Jobs:** {r['jobs']['enqueued']} enqueued, {r['jobs']['acknowledged']} "
        f"acknowledged; per state: {_kv(r['terminal']['states'])}.",
        "",
        "| mode | " + " | ".join(s for s in STATES) + " |",
        "|---|" + "---|" * len(STATES),
    ]
    for mode, states in r["terminal"]["by_mode"].items():
        lines.append(f"| {mode} | " + " | ".join(str(states.get(s, 0)) for s in STATES) + " |")
    ep = r.get("end_paths") or {}
    if ep:
        lines += ["", "| end path | " + " | ".join(STATES) + " |", "|---|" + "---|" * len(STATES)]
        for t, states in ep["by_type"].items():
            lines.append(f"| `{t}` | " + " | ".join(str(states.get(s, 0)) for s in STATES) + " |")
    lines += [
        "",
        f"**Verdicts: {held} of {len(verdicts)} passed, {failed} failed, "
        f"{len(verdicts) - held - failed} not run"
        + (": every invariant held.**" if r["passed"] else ": AN INVARIANT FAILED.**"),
        "",
        "| | invariant | verdict | count |",
        "|---|---|---|---|",
    ]
    for key, v in verdicts:
        detail = (str(v["detail"]) + _ids(v["offenders"])).replace("|", "/")
        lines.append(f"| {key} | {v['title']} | {v['status']} | {detail} |")
    lines += ["", "The printed report:", "", "```", render(r).strip("\n"), "```", ""]
    return "\n".join(lines)


STATES = ("succeeded", "failed", "indeterminate", "cancelled", "waiting", "leased")
"""The job states, in the order the summary's tables show them."""
