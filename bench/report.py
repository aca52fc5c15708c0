"""Turn a run's figures into ``bench/results/<stem>.md`` and ``<stem>.png``.

Every figure is the median over rounds; every ratio is the median over rounds of the ratio of
Tenure's figure to the peer's figure *in the same round*. For throughput a ratio above 1 means
Tenure did more; for latency and response time a ratio below 1 means Tenure was faster.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .common import median

TENURE = "tenure"
TENURE_CELERY = "tenure-celery"


def _f(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _r(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}x"


def _get(d: dict[str, Any], *path: str) -> float:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return float("nan")
        d = d[p]
    try:
        return float(d)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def _med(rounds: list[dict[str, Any]], *path: str) -> float:
    return median([_get(r, *path) for r in rounds])


def _ratio(rounds: list[dict[str, Any]], mine: tuple[str, ...], theirs: tuple[str, ...]) -> float:
    """Median over rounds of mine/theirs, each pair from the same round."""
    out = []
    for r in rounds:
        a, b = _get(r, *mine), _get(r, *theirs)
        if b and not math.isnan(a) and not math.isnan(b):
            out.append(a / b)
    return median(out)


def write(data: dict[str, Any], out_dir: Path, stem: str) -> Path:
    """Write the markdown report and the plot; return the report's path."""
    rounds: list[dict[str, Any]] = data["rounds"]
    systems: dict[str, str] = data["systems"]
    prof = data["profile"]
    workers = [str(w) for w in prof["drain_workers"]]
    lines: list[str] = []
    add = lines.append
    n_rounds = len(rounds)

    add(f"# Tenure benchmarks, {data['date']} ({prof['name']} profile)")
    add("")
    add(
        f"{n_rounds} rounds; every figure is the median over rounds, every ratio the median of "
        "per-round ratios (Tenure's figure over the peer's, measured in the same round). "
        f"Run time {data['elapsed_seconds'] / 60:.1f} min. How to run and what each workload "
        "measures: [bench/README.md](../README.md)."
    )
    add("")
    add(f"![throughput and latency]({stem}.png)")
    add("")

    # ---- targets -------------------------------------------------------------------------
    add("## Targets")
    add("")
    add("| target | measured | met |")
    add("|---|---|---|")
    targets = _targets(data)
    for name, measured, ok in targets:
        add(f"| {name} | {measured} | {'yes' if ok else '**no**'} |")
    add("")
    missed = [(name, measured) for name, measured, ok in targets if not ok]
    if missed:
        add("### Why the missed targets are missed")
        add("")
        for name, measured in missed:
            why = next((text for key, text in WHY.items() if name.startswith(key)), "")
            add(f"- **{name}** (measured {measured}). {why}")
        add("")

    # ---- drain ---------------------------------------------------------------------------
    add("## Drain: no-op jobs finished per second")
    add("")
    add(
        f"{prof['drain_jobs']:,} jobs pre-loaded, then N worker processes started; rate taken "
        "between 10 % and 90 % done (start-up excluded; 'wall' includes it). "
        f"Time-box {prof['drain_timeout']:.0f} s per drain."
    )
    add("")
    head = "| system | " + " | ".join(f"{w} worker{'s' if w != '1' else ''}" for w in workers)
    add(head + " |")
    add("|---|" + "---|" * len(workers))
    for key, label in systems.items():
        cells = []
        for w in workers:
            v = _med(rounds, "drain", w, key, "per_second")
            wall = _med(rounds, "drain", w, key, "wall_per_second")
            cells.append(f"{_f(v)} (wall {_f(wall)})")
        add(f"| {label} | " + " | ".join(cells) + " |")
    add("")
    add("Tenure (broker-less) / peer, same round:")
    add("")
    add("| peer | " + " | ".join(workers) + " |")
    add("|---|" + "---|" * len(workers))
    for key, label in systems.items():
        if key == TENURE:
            continue
        mine = TENURE_CELERY if key == "celery" else TENURE
        cells = [
            _r(_ratio(rounds, ("drain", w, mine, "per_second"), ("drain", w, key, "per_second")))
            for w in workers
        ]
        who = "Tenure (Celery executor) / " if key == "celery" else ""
        add(f"| {who}{label} | " + " | ".join(cells) + " |")
    add("")
    if TENURE_CELERY in systems:
        add(CELERY_NOTE)
        add("")

    # ---- cost ----------------------------------------------------------------------------
    add(f"## What one job costs the database (1 worker draining {prof['cost_jobs']:,} jobs)")
    add("")
    add(
        "Commits are `pg_stat_database.xact_commit` deltas (read-only transactions included, "
        "the harness's own reads subtracted); row writes are `pg_stat_user_tables` deltas; "
        "statements and connections are counted in every worker process at the driver "
        "(`bench/hooks/sitecustomize.py`), so `BEGIN`/`COMMIT` are not statements here."
    )
    add("")
    add(
        "| system | commits | rows inserted | rows updated | rows deleted | statements | connections |"
    )
    add("|---|---|---|---|---|---|---|")
    for key, label in systems.items():
        base = ("cost", key)
        vals = [
            _med(rounds, *base, m)
            for m in (
                "commits_per_job",
                "rows_inserted_per_job",
                "rows_updated_per_job",
                "rows_deleted_per_job",
                "statements_per_job",
                "connections_per_job",
            )
        ]
        add(f"| {label} | " + " | ".join(_f(v, 2) for v in vals) + " |")
    add("")

    # ---- enqueue -------------------------------------------------------------------------
    add("## Enqueue: jobs accepted per second")
    add("")
    add(
        f"One transaction each ({prof['enqueue_single']:,} jobs) and in bulk "
        f"({prof['enqueue_bulk']:,} jobs in one call: one statement where the system has a "
        "bulk call, else every enqueue in one transaction)."
    )
    add("")
    add("| system | one each | Tenure / peer | bulk | Tenure / peer |")
    add("|---|---|---|---|---|")
    for key, label in systems.items():
        mine = TENURE_CELERY if key == "celery" else TENURE
        s = _med(rounds, "enqueue_single", key, "per_second")
        b = _med(rounds, "enqueue_bulk", key, "per_second")
        rs = _ratio(
            rounds, ("enqueue_single", mine, "per_second"), ("enqueue_single", key, "per_second")
        )
        rb = _ratio(
            rounds, ("enqueue_bulk", mine, "per_second"), ("enqueue_bulk", key, "per_second")
        )
        add(f"| {label} | {_f(s)} | {_r(rs)} | {_f(b)} | {_r(rb)} |")
    add("")

    # ---- latency -------------------------------------------------------------------------
    add("## Idle pickup latency: enqueue returned to handler started (ms)")
    add("")
    add(
        f"One worker, idle; {prof['latency_rate']:.0f} jobs/s for {prof['latency_seconds']:.0f} s "
        "on a fixed schedule (open loop). Each system with its default wake-up: Tenure "
        "LISTEN/NOTIFY (poll 0.5 s as a fallback), procrastinate LISTEN/NOTIFY, pgqueuer "
        "LISTEN/NOTIFY, django-tasks-db polls every 1 s, django-q2 polls every 0.2 s, Celery "
        "blocks on the broker."
    )
    add("")
    add("| system | p50 | p95 | p99 | max | Tenure p99 / peer p99 |")
    add("|---|---|---|---|---|---|")
    for key, label in systems.items():
        mine = TENURE_CELERY if key == "celery" else TENURE
        v = [_med(rounds, "latency", key, p) for p in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
        rr = _ratio(rounds, ("latency", mine, "p99_ms"), ("latency", key, "p99_ms"))
        miss = _med(rounds, "latency", key, "missing")
        note = f" ({_f(miss)} not started)" if miss and not math.isnan(miss) else ""
        add(f"| {label}{note} | " + " | ".join(_f(x, 1) for x in v) + f" | {_r(rr)} |")
    add("")

    # ---- recovery ------------------------------------------------------------------------
    add("## Recovery after SIGKILL (Tenure)")
    add("")
    rec = [r.get("recovery", {}) for r in rounds]
    lease = next((x.get("lease") for x in rec if x.get("lease")), 10.0)
    add(
        f"An executor holding 4 leased jobs (lease {lease:.0f} s, renewed every third of it) is "
        "killed; a second executor and `run_scheduler` (reaper, default grace 2 s) are running. "
        "Time from the kill until every job is claimed again by the second executor."
    )
    add("")
    add(
        "| round | seconds | limit (1.5 x lease) |\n|---|---|---|\n"
        + "\n".join(
            f"| {i + 1} | {_f(x.get('seconds', float('nan')), 1)} | {_f(x.get('limit', 1.5 * lease), 1)} |"
            for i, x in enumerate(rec)
        )
    )
    add("")

    # ---- dashboard -----------------------------------------------------------------------
    d0 = rounds[0].get("dashboard", {})
    add(
        f"## Dashboard response time ({_f(d0.get('jobs', float('nan')))} jobs, "
        f"{_f(d0.get('attempts', float('nan')))} attempts)"
    )
    add("")
    add(
        "Rows generated in SQL (90 % succeeded, the rest waiting, leased, failed, indeterminate, "
        "cancelled), then each page requested through Django's test client as a logged-in "
        f"operator ({prof['dashboard_requests']} requests per page per round, after one warm-up)."
    )
    add("")
    add("| page | p50 ms | p95 ms |")
    add("|---|---|---|")
    for page in ("overview", "job_list", "health_counts"):
        if page in d0:
            add(
                f"| {page} | {_f(_med(rounds, 'dashboard', page, 'p50_ms'), 1)} | "
                f"{_f(_med(rounds, 'dashboard', page, 'p95_ms'), 1)} |"
            )
    add("")

    # ---- setup ---------------------------------------------------------------------------
    add("## Setup")
    add("")
    add(f"- Machine: {data['machine']}")
    srv = data["server"]
    add(
        f"- PostgreSQL {srv.get('server_version')} on 127.0.0.1: fsync={srv.get('fsync')}, "
        f"synchronous_commit={srv.get('synchronous_commit')}, "
        f"full_page_writes={srv.get('full_page_writes')}, wal_level={srv.get('wal_level')}, "
        f"shared_buffers={srv.get('shared_buffers')} (read with SHOW at the start of the run)"
    )
    add(f"- pgbench: {_f(_med(rounds, 'pgbench', 'tps'))} TPS median (`pgbench -N -c 2 -j 2`)")
    add("- Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()))
    add(f"- Profile: {prof}")
    add(
        "- Workers: N worker processes, each running one job at a time (see "
        "`bench/systems.py` for each system's command)."
    )
    add("")

    md = out_dir / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n")
    _plot(data, out_dir / f"{stem}.png")
    return md


CELERY_NOTE = (
    "Tenure's Celery executor claims the job a message names, then claims and runs the "
    "queue's next due jobs in the same task for up to `TENURE_CELERY_CHAIN_SECONDS`, writing "
    "their successful completions together, one commit per batch "
    "(`TENURE_CELERY_COMMIT_WINDOW`, `scheduler_core/chain.py`); the messages of jobs taken "
    "that way are dropped, without a query when the same process completed the job. Rates "
    "count jobs finished in the database, so over a short drain this executor can pass "
    "Celery's own per-message rate; over a long one every message still costs Celery's "
    "per-message work and the rate settles near Celery alone's. Celery alone runs a task "
    "that does nothing and touches no database."
)

WHY = {
    "broker-less drain >= 1.5x procrastinate": (
        "Per job the broker-less executor makes one commit in three round trips: `BEGIN`, "
        "one prepared statement (the fenced completion, the attempt's end, the claim of the "
        "thread's next job with its attempt row, and the transaction id), `COMMIT`. The "
        "explicit transaction is what lets an executor whose connection breaks during "
        "`COMMIT` read the outcome back by transaction id (`txid_status`) instead of "
        "guessing, and what makes the next claim stand or fall with the completion. "
        "procrastinate makes two round trips (two procedure calls in autocommit) from an "
        "asyncio loop. With one worker the drain is bound by those round trips, the commit's "
        "flush and Tenure's Python path (Django's connection and transaction handling, one "
        "thread per running job); with more workers on 2 cores it is bound by CPU shared "
        "with the server. Going further would mean claiming ahead of free slots (jobs leased "
        "while they wait in memory) or completing outside a transaction, which would give up "
        "the lease and read-back guarantees."
    ),
    "broker-less drain >= 1.0x pgqueuer": (
        "pgqueuer finishes a job in two autocommit statements from asyncio (dequeue, then a "
        "log insert and delete) and keeps no attempt history or fenced lease; Tenure's three "
        "round trips per job are the completion's transaction (see the row above)."
    ),
    "broker-less drain >= 1.5x django-tasks-db": (
        "django-tasks-db opens a new connection per task (its worker closes old connections "
        "around each one) and claims with a read then a separate write."
    ),
    ">= 50 % of pgbench": (
        "A pgbench `-N` transaction is one commit from a C client; a Tenure job is one commit "
        "(the completion with the next claim, three round trips) plus Python on "
        "the same 2 cores as the server, so the workers and the server compete for the CPU "
        "pgbench's C client hardly uses."
    ),
    "Celery executor >= 0.7x Celery alone": (
        "Every message still goes through Celery's own per-message work, and each batch of "
        "chained jobs adds a durable commit in the same process; the chain is bounded by "
        "`TENURE_CELERY_CHAIN_SECONDS` per message (see the note under the drain table)."
    ),
    "bulk enqueue": "One statement per batch; the rate is bound by payload validation in Python.",
    "idle pickup p99": (
        "The executor wakes on `NOTIFY`; a miss here means the worker was not idle (a backlog "
        "formed because the machine was busy)."
    ),
    "recovery after SIGKILL": (
        "Recovery waits for the lease to expire by the database's clock, plus the reaper's "
        "grace (2 s) and its sweep interval (1 s)."
    ),
    "dashboard overview": (
        "The overview (`admin_ui/queries.py::overview`, `scheduler_core/health.py`) reads "
        "succeeded and cancelled counts from the snapshot `run_scheduler` refreshes on a "
        "table this big, and counts everything else live in one scan through the state "
        "index: grouped by queue and type, with the health categories as filters of the "
        "same scan. In the generated store that is 80,000 live rows (waiting, leased, failed, "
        "indeterminate), about 110 ms of the page; the rest is the other small reads and "
        "rendering. Its time grows with live work, not with history. Counting live jobs from "
        "a snapshot too would make operators act on stale numbers; a covering index for the "
        "scan would cost every job write another index entry."
    ),
    "dashboard job_list": "The job list pages by keyset on an index; see the overview row.",
}
"""Why a target can be missed, by the target's name prefix (shown only when it is missed)."""


def _targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Each target with the measured figure and whether it was met."""
    rounds = data["rounds"]
    workers = [str(w) for w in data["profile"]["drain_workers"]]
    out: list[tuple[str, str, bool]] = []

    def ratio_row(peer: str, need: float) -> None:
        if peer not in data["systems"]:
            return
        rs = [
            _ratio(rounds, ("drain", w, TENURE, "per_second"), ("drain", w, peer, "per_second"))
            for w in workers
        ]
        cells = ", ".join(f"{w}: {_r(r)}" for w, r in zip(workers, rs, strict=True))
        ok = all(r >= need for r in rs if not math.isnan(r))
        out.append((f"broker-less drain >= {need}x {peer} (per worker count)", cells, ok))

    ratio_row("procrastinate", 1.5)
    ratio_row("django-tasks-db", 1.5)
    ratio_row("pgqueuer", 1.0)
    best = max(
        (_med(rounds, "drain", w, TENURE, "per_second") for w in workers),
        default=float("nan"),
    )
    tps = _med(rounds, "pgbench", "tps")
    frac = best / tps if tps else float("nan")
    out.append(
        (
            ">= 50 % of pgbench write TPS",
            f"{_f(best)} jobs/s best / {_f(tps)} TPS = {frac:.0%}",
            frac >= 0.5,
        )
    )
    if "celery" in data["systems"]:
        rs = [
            _ratio(
                rounds,
                ("drain", w, TENURE_CELERY, "per_second"),
                ("drain", w, "celery", "per_second"),
            )
            for w in workers
        ]
        out.append(
            (
                "Celery executor >= 0.7x Celery alone",
                ", ".join(f"{w}: {_r(r)}" for w, r in zip(workers, rs, strict=True)),
                all(r >= 0.7 for r in rs if not math.isnan(r)),
            )
        )
    bulk = _med(rounds, "enqueue_bulk", TENURE, "per_second")
    out.append(("bulk enqueue >= 20,000 jobs/s", f"{_f(bulk)} jobs/s", bulk >= 20_000))
    p99 = _med(rounds, "latency", TENURE, "p99_ms")
    out.append(("idle pickup p99 < 50 ms (broker-less)", f"{_f(p99, 1)} ms", p99 < 50))
    rec = [r.get("recovery", {}) for r in rounds]
    secs = [x.get("seconds", float("nan")) for x in rec]
    limit = next((x.get("limit") for x in rec if x.get("limit")), 15.0)
    worst = max((s for s in secs if not math.isnan(s)), default=float("nan"))
    out.append(
        (
            "recovery after SIGKILL <= 1.5 x lease",
            f"worst {_f(worst, 1)} s, median {_f(median(secs), 1)} s, limit {_f(limit, 1)} s",
            not math.isnan(worst) and worst <= limit,
        )
    )
    d0 = rounds[0].get("dashboard", {})
    for page in ("overview", "job_list", "health_counts"):
        if page in d0:
            p95 = _med(rounds, "dashboard", page, "p95_ms")
            out.append(
                (
                    f"dashboard {page} p95 < 200 ms at {_f(d0.get('jobs', 0))} jobs",
                    f"{_f(p95, 1)} ms",
                    p95 < 200,
                )
            )
    return out


def _plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = data["rounds"]
    systems: dict[str, str] = data["systems"]
    workers = list(data["profile"]["drain_workers"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for key, label in systems.items():
        ys = [_med(rounds, "drain", str(w), key, "per_second") for w in workers]
        style = "-o" if key.startswith("tenure") else "--s"
        ax1.plot(workers, ys, style, label=label, linewidth=2.2 if key == TENURE else 1.2)
    ax1.set_xlabel("worker processes")
    ax1.set_ylabel("jobs finished per second (10-90 %)")
    ax1.set_xticks(workers)
    ax1.set_title("Drain throughput")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    keys = list(systems)
    xs = range(len(keys))
    width = 0.27
    for i, (p, name) in enumerate((("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"))):
        vals = [_med(rounds, "latency", k, p) for k in keys]
        ax2.bar([x + (i - 1) * width for x in xs], vals, width, label=name)
    ax2.set_yscale("log")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels([systems[k] for k in keys], rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("ms (log scale)")
    ax2.set_title("Idle pickup latency (enqueue -> handler start)")
    ax2.axhline(50, color="grey", linestyle=":", linewidth=1)
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
