"""Turn a run's figures into ``bench/results/<stem>.md`` and ``<stem>.png``.

Every figure is the median over rounds; every ratio is the median over rounds of the ratio of
Tenure's figure to the peer's figure *in the same round*. For throughput a ratio above 1 means
Tenure did more; for latency and response time a ratio below 1 means Tenure was faster.

The drain has two tables: every system at its best (2 processes x 8 concurrent jobs, each as
its documentation recommends: the headline) and the same shape for all (N processes of one job
at a time: not the headline). Both give the whole run (enqueue returned to last job done,
start-up included) beside the 10-90 % window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import median

TENURE = "tenure"
TENURE_CELERY = "tenure-celery"
BEST_SHAPE, SAME_SHAPE = "best", "same"
"""The drain's two shapes, as ``bench.systems`` names them."""


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
    if data.get("command"):
        add(f"Produced by `{data['command']}`.")
        add("")
    add(_server_line(data))
    add("")
    if data.get("bytecode_compiled_ahead"):
        add(
            "Bytecode: the checkout's Python modules (Tenure, the example project, the "
            "harness's job modules and the peers' entry points) were compiled before the first "
            "round, as installing a package compiles its modules (`bench/common.py`, "
            "`compile_bytecode`); every process then starts as it would from an installation, "
            "whatever `PYTHONDONTWRITEBYTECODE` says."
        )
        add("")
    # The plot draws the drains and the latency; a run of the async comparison alone has none.
    plotted = bool(data.get("best_systems") or systems)
    if plotted:
        add(f"![throughput and latency]({stem}.png)")
        add("")

    # ---- targets -------------------------------------------------------------------------
    add("## Targets")
    add("")
    add(
        "The drain targets are read from the headline table (each system at its best) where "
        "the peer is in it, and judged on the 10-90 % rate, as they were set; the whole-run "
        "figure is shown beside it."
    )
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

    # ---- drain at their best ---------------------------------------------------------------
    best_systems: dict[str, str] = data.get("best_systems", {})
    if best_systems:
        _best_section(data, add)

    if data.get("limits_systems"):
        _limits_section(data, add)

    if data.get("async_systems"):
        _async_section(data, add)

    if data.get("otel_systems"):
        _otel_section(data, add)

    if data.get("workflow_systems"):
        _workflows_section(data, add)

    # ---- drain, same shape ---------------------------------------------------------------
    if systems and workers:
        _same_section(data, add)

    if systems:
        _workload_sections(data, add)

    # ---- setup ---------------------------------------------------------------------------
    add("## Setup")
    add("")
    add(f"- Command: `{data.get('command', 'not recorded')}`")
    add(f"- Machine: {data['machine']}")
    srv = data["server"]
    add(f"- {_server_line(data)}")
    add(
        f"- PostgreSQL {srv.get('server_version')}: autovacuum={srv.get('autovacuum', 'n/a')}, "
        f"fsync={srv.get('fsync')}, synchronous_commit={srv.get('synchronous_commit')}, "
        f"full_page_writes={srv.get('full_page_writes')}, wal_level={srv.get('wal_level')}, "
        f"shared_buffers={srv.get('shared_buffers')}, max_connections="
        f"{srv.get('max_connections')} (read with SHOW at the start of the run)"
    )
    not_default = data.get("cluster", {}).get("not_default", {})
    if not_default:
        add(
            "- Settings the server reports as not at their built-in default: "
            + ", ".join(f"`{k}` = {v}" for k, v in not_default.items())
        )
    add(
        f"- pgbench: {_f(_med(rounds, 'pgbench', 'tps'))} TPS median (`pgbench -N -c 2 -j 2`, "
        "same server)"
    )
    add("- Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()))
    add(f"- Profile: {prof}")
    add("- Each system's exact configuration is listed under its drain table (`bench/systems.py`).")
    add("")

    md = out_dir / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n")
    if plotted:
        _plot(data, out_dir / f"{stem}.png")
    return md


def _server_line(data: dict[str, Any]) -> str:
    """Which PostgreSQL cluster the run used, and whether autovacuum was on."""
    cluster = data.get("cluster", {})
    srv = data["server"]
    autovac = srv.get("autovacuum", "not recorded")
    if cluster.get("kind") == "own":
        changed = ", ".join(f"`{k}={v}`" for k, v in cluster.get("changed_by_run", {}).items())
        return (
            f"Server: a PostgreSQL {srv.get('server_version')} cluster of the run's own, "
            f"`initdb`'d into `{cluster.get('folder')}` and listening on "
            f"{cluster.get('address')} (the soak's cluster class), with PostgreSQL's defaults "
            f"(production defaults) except {changed or 'nothing'}, its port and its socket "
            f"folder; **autovacuum {autovac}**; removed after the run."
        )
    if cluster.get("kind") == "shared":
        return (
            f"Server: the machine's shared PostgreSQL {srv.get('server_version')} cluster at "
            f"{cluster.get('address')}, as configured (its configuration file keeps "
            f"autovacuum off for CI): **autovacuum {autovac}**."
        )
    return f"Server: PostgreSQL {srv.get('server_version')}; autovacuum {autovac}."


def _all_complete(rounds: list[dict[str, Any]], *path: str) -> tuple[int, int]:
    """How many rounds ran the drain at ``path`` to the last job, out of how many ran it."""
    ran = [r for r in rounds if not math.isnan(_get(r, *path, "jobs"))]
    done = [r for r in ran if _get(r, *path, "done") >= _get(r, *path, "jobs")]
    return len(done), len(ran)


def _whole_cells(rounds: list[dict[str, Any]], *path: str) -> tuple[str, str]:
    """The whole-run time and rate of a drain, marked when a round was time-boxed."""
    complete, ran = _all_complete(rounds, *path)
    rate = _f(_med(rounds, *path, "whole_per_second"))
    if ran and complete == ran:
        return f"{_med(rounds, *path, 'whole_seconds'):,.2f}", rate
    done = _med(rounds, *path, "done")
    box = _med(rounds, *path, "timeout")
    return (
        f"time-boxed at {_f(box)} s in {ran - complete} of {ran} rounds ({_f(done)} done)",
        f"{rate} (over the box)",
    )


DRAIN_METHOD = (
    "The jobs are enqueued first (one bulk call where the system has one; Celery alone one "
    "message at a time), and the worker processes are started the moment the enqueue "
    "returned. **Whole run** = from the enqueue's return to the last job done, the workers' "
    "start-up included (the finished count is polled every 0.05 s); its jobs/s = jobs / whole "
    "run. **10-90 %** = the rate between 10 % and 90 % done, which leaves out most of the "
    "start-up and the tail. **First job** = seconds from the enqueue's return to the first job "
    "done (mostly start-up)."
)


def _best_section(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """The headline: every system at its best, whole run beside the 10-90 % window."""
    rounds: list[dict[str, Any]] = data["rounds"]
    prof = data["profile"]
    best: dict[str, str] = data["best_systems"]
    add("## Drain at their best (the headline): 2 processes x 8 concurrent jobs each")
    add("")
    add(
        f"{prof['best_jobs']:,} no-op jobs, each system in the configuration its own "
        "documentation recommends for throughput (listed below, with the pages in "
        "[bench/README.md](../README.md)); 2 worker processes of 8 concurrent jobs each. "
        f"{DRAIN_METHOD} Time-box {prof['best_timeout']:.0f} s."
    )
    add("")
    add(
        "| system | whole run (s) | jobs/s, whole run | 10-90 % window (s) | jobs/s, 10-90 % "
        "| first job (s) |"
    )
    add("|---|---|---|---|---|---|")
    for key, label in best.items():
        whole_s, whole_rate = _whole_cells(rounds, "best", key)
        add(
            f"| {label} | {whole_s} | {whole_rate} | "
            f"{_f(_med(rounds, 'best', key, 'window_seconds'), 2)} | "
            f"{_f(_med(rounds, 'best', key, 'per_second'))} | "
            f"{_f(_med(rounds, 'best', key, 'first_done_seconds'), 2)} |"
        )
    tps = _med(rounds, "pgbench", "tps")
    if not math.isnan(tps):
        add(f"| pgbench `-N -c 2 -j 2`, same server (ceiling reference) | | | | {_f(tps)} TPS | |")
    add("")
    add(
        "Tenure (broker-less) / peer, and Tenure (Celery executor) / Celery alone, both at "
        "their best, same round:"
    )
    add("")
    add("| peer | whole run | 10-90 % |")
    add("|---|---|---|")
    for key, label in best.items():
        if key == TENURE:
            continue
        mine = TENURE_CELERY if key == "celery" else TENURE
        if mine not in best:
            continue
        who = "Tenure (Celery executor) / " if key == "celery" else ""
        whole = _ratio(
            rounds, ("best", mine, "whole_per_second"), ("best", key, "whole_per_second")
        )
        steady = _ratio(rounds, ("best", mine, "per_second"), ("best", key, "per_second"))
        add(f"| {who}{label} | {_r(whole)} | {_r(steady)} |")
    if TENURE in best and not math.isnan(tps):
        whole = _med(rounds, "best", TENURE, "whole_per_second") / tps
        steady = _med(rounds, "best", TENURE, "per_second") / tps
        add(f"| pgbench write TPS (Tenure broker-less / TPS) | {whole:.0%} | {steady:.0%} |")
    add("")
    if TENURE_CELERY in best:
        add(CELERY_NOTE)
        add("")
        add(CELERY_WHOLE_RUN_NOTE)
        add("")
    add("Configurations (exact commands; `bench/systems.py`):")
    add("")
    add("| system | configuration |")
    add("|---|---|")
    for key, label in best.items():
        add(f"| {label} | {data.get('configs', {}).get('best', {}).get(key, 'not recorded')} |")
    add("")
    add(
        "django-tasks-db and django-q2 are not in this table: neither runs more than one job "
        "at a time in a worker process (django-tasks-db's `db_worker` has no concurrency "
        "option; django-q2's concurrency is its number of worker processes), so they cannot "
        "be given this shape. They are in the same-shape table."
    )
    add("")


LIMITS_NOW, LIMITS_BEFORE, LIMITS_BESIDE = "tenure", "tenure-before", "tenure-beside-limited"
LIMITS_SAME_RATE = 0.9
"""The least now / before ratio of the 10-90 % rate that counts as "costs the same": the
rounds of one drain move by more than a tenth on this machine."""
LIMITS_SAME_STATEMENTS = 0.05
"""The most statements per job an unlimited queue may cost above the revision before."""


def _limits_round(r: dict[str, Any], key: str, field: str) -> float:
    """The median of one round's drains of ``key`` in the queue-limits comparison."""
    runs = r.get("limits", {}).get("drains", {}).get(key, [])
    return median([_get(x, field) for x in runs])


def _limits_ratio(rounds: list[dict[str, Any]], mine: str, theirs: str, field: str) -> float:
    out = []
    for r in rounds:
        a, b = _limits_round(r, mine, field), _limits_round(r, theirs, field)
        if b and not math.isnan(a) and not math.isnan(b):
            out.append(a / b)
    return median(out)


def _limits_section(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """An unlimited queue's drain and cost per job now, before queue limits existed, and
    beside a paused and a limited queue: each round takes the three in turn."""
    rounds = data["rounds"]
    labels: dict[str, str] = data["limits_systems"]
    cost = rounds[0].get("limits", {}).get("cost", {})
    add("## An unlimited queue, before and after queue limits")
    add("")
    add(
        "The claim consults each queue's pause and limits (a probe of `tenure_queue`'s primary "
        "key per candidate row, and one read of the queues asked for). These drains show "
        "what that costs a queue with no limit: Tenure's broker-less executor at its best "
        f"(2 x 8) draining {_f(data['profile']['best_jobs'])} no-op jobs from `default`, "
        "this checkout; the same at the last revision before queue limits (its files from "
        "`git archive`, a database of its own); and this checkout with a paused queue and a "
        "limited one in `tenure_queue` (neither drained). Each round drains the three in "
        "turn, twice; a round's figure is the median of its two, a ratio the median of "
        "per-round ratios. Cost per job: one worker, "
        f"{_f(data['profile']['cost_jobs'])} jobs, as in the cost table."
    )
    add("")
    add(
        "| system | 10-90 % jobs/s | whole run jobs/s | vs before (10-90 %) | commits / job | statements / job |"
    )
    add("|---|---|---|---|---|---|")
    for key, label in labels.items():
        rate = median([_limits_round(r, key, "per_second") for r in rounds])
        whole = median([_limits_round(r, key, "whole_per_second") for r in rounds])
        vs = (
            "—"
            if key == LIMITS_BEFORE
            else _r(_limits_ratio(rounds, key, LIMITS_BEFORE, "per_second"))
        )
        c = cost.get(key, {})
        add(
            f"| {label} | {_f(rate)} | {_f(whole)} | {vs} | "
            f"{_f(_get(c, 'commits_per_job'), 2)} | {_f(_get(c, 'statements_per_job'), 2)} |"
        )
    add("")


ASYNC_PLAIN, ASYNC = "tenure", "tenure-async"
ASYNC_MOST_COST = 1.2
"""The most an ``async def`` no-op may cost per job against the plain one (time per job)."""


def _async_round(r: dict[str, Any], shape: str, key: str, field: str) -> float:
    """The median of one round's drains of ``key`` in ``shape`` in the async comparison."""
    return median([_get(x, field) for x in r.get("async", {}).get(shape, {}).get(key, [])])


def _async_cost(rounds: list[dict[str, Any]], shape: str, field: str, *, rate: bool) -> float:
    """Median over rounds of the async no-op's cost per job over the plain one's: from a
    rate (``rate``: plain / async) or from a per-job figure (async / plain)."""
    out = []
    for r in rounds:
        plain = _async_round(r, shape, ASYNC_PLAIN, field)
        coro = _async_round(r, shape, ASYNC, field)
        a, b = (plain, coro) if rate else (coro, plain)
        if b and not math.isnan(a) and not math.isnan(b):
            out.append(a / b)
    return median(out)


def _async_section(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """The plain no-op against the ``async def`` one on the broker-less executor."""
    rounds = data["rounds"]
    prof = data["profile"]
    add("## `async def` handlers: what awaiting a coroutine costs a job")
    add("")
    add(
        "Tenure's broker-less executor drains no-op jobs whose handler is a plain function "
        "(`bench.noop`), then the same no-op written `async def` (`bench.noop_async`, a "
        "database of its own), in turn, twice a round (the second time in the reverse order): "
        "at their best (2 x 8, "
        f"{_f(prof['best_jobs'])} jobs) and one process running one job at a time "
        f"({_f(prof['drain_jobs'])} jobs). An async handler runs on its executor thread's own "
        "event loop, kept from one job to the next (`scheduler_core/runtime/invoke.py`). A "
        "round's figure is the median of its two drains; the cost per job is the median of "
        "per-round ratios: from the 10-90 % rate (plain / async), and from the worker "
        "processes' CPU time per job over the same window (async / plain)."
    )
    add("")
    add(
        "| shape | plain jobs/s (10-90 %) | async def jobs/s (10-90 %) | cost per job, async / "
        "plain | worker CPU ms / job, plain | async def | CPU per job, async / plain |"
    )
    add("|---|---|---|---|---|---|---|")
    for shape, name in ((BEST_SHAPE, "at their best (2 x 8)"), (SAME_SHAPE, "1 process x 1")):
        plain = median([_async_round(r, shape, ASYNC_PLAIN, "per_second") for r in rounds])
        coro = median([_async_round(r, shape, ASYNC, "per_second") for r in rounds])
        cpu = "worker_cpu_ms_per_job"
        cpu_plain = median([_async_round(r, shape, ASYNC_PLAIN, cpu) for r in rounds])
        cpu_coro = median([_async_round(r, shape, ASYNC, cpu) for r in rounds])
        add(
            f"| {name} | {_f(plain)} | {_f(coro)} | "
            f"{_r(_async_cost(rounds, shape, 'per_second', rate=True))} | {_f(cpu_plain, 3)} | "
            f"{_f(cpu_coro, 3)} | {_r(_async_cost(rounds, shape, cpu, rate=False))} |"
        )
    add("")


OTEL_BASE, OTEL_OFF, OTEL_ON = "tenure-untraced", "tenure", "tenure-otel"
OTEL_OFF_MOST_COST = 1.02
"""The most tracing off may cost per job against the same files with the hooks emptied."""


def _otel_round(r: dict[str, Any], shape: str, key: str, field: str) -> float:
    """The median of one round's drains of ``key`` in ``shape`` in the OpenTelemetry
    comparison."""
    return median([_get(x, field) for x in r.get("otel", {}).get(shape, {}).get(key, [])])


def _otel_cost(
    rounds: list[dict[str, Any]], shape: str, field: str, key: str, *, rate: bool
) -> float:
    """Median over rounds of ``key``'s cost per job over the untraced baseline: from a rate
    (``rate``: before / key) or from a per-job figure (key / before)."""
    out = []
    for r in rounds:
        before = _otel_round(r, shape, OTEL_BASE, field)
        this = _otel_round(r, shape, key, field)
        a, b = (before, this) if rate else (this, before)
        if b and not math.isnan(a) and not math.isnan(b):
            out.append(a / b)
    return median(out)


def _otel_section(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """Tracing hooks emptied, tracing off and on, on the broker-less executor."""
    rounds = data["rounds"]
    prof = data["profile"]
    add("## OpenTelemetry: what tracing costs a job, off and on")
    add("")
    add(
        "Tenure's broker-less executor drains no-op jobs (`bench.noop`) three ways, in turn, "
        "twice a round (the second time in the reverse order), each on a database of its "
        "own: this checkout's committed files with every tracing and signal hook of the job "
        "path emptied (`bench/untraced.py`, the baseline: it differs from the checkout by those "
        "hooks alone), with tracing off (the "
        "`otel` extra installed and no tracer provider set, the default), and on (the SDK's "
        "tracer provider, a batch span processor and an exporter that drops the spans, "
        "`bench/otel_on.py`: every enqueue, attempt and effect makes its span, and every "
        f"job carries its trace context from the enqueue to its attempts). At their best (2 x 8, {_f(prof['best_jobs'])} "
        f"jobs) and one process running one job at a time ({_f(prof['drain_jobs'])} jobs). A "
        "round's figure is the median of its two drains; a cost per job is the median of "
        "per-round ratios against the baseline: from the 10-90 % rate, and from the "
        "worker processes' CPU time per job over the same window."
    )
    add("")
    add(
        "| shape | hooks emptied jobs/s | off jobs/s | on jobs/s | cost per job, off / emptied | "
        "on / emptied | worker CPU ms / job, emptied | off | on | CPU per job, off / emptied | "
        "on / emptied |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|---|")
    cpu = "worker_cpu_ms_per_job"
    for shape, name in ((BEST_SHAPE, "at their best (2 x 8)"), (SAME_SHAPE, "1 process x 1")):
        rates = [
            median([_otel_round(r, shape, k, "per_second") for r in rounds])
            for k in (OTEL_BASE, OTEL_OFF, OTEL_ON)
        ]
        cpus = [
            median([_otel_round(r, shape, k, cpu) for r in rounds])
            for k in (OTEL_BASE, OTEL_OFF, OTEL_ON)
        ]
        add(
            f"| {name} | {' | '.join(_f(x) for x in rates)} | "
            f"{_r(_otel_cost(rounds, shape, 'per_second', OTEL_OFF, rate=True))} | "
            f"{_r(_otel_cost(rounds, shape, 'per_second', OTEL_ON, rate=True))} | "
            f"{' | '.join(_f(x, 3) for x in cpus)} | "
            f"{_r(_otel_cost(rounds, shape, cpu, OTEL_OFF, rate=False))} | "
            f"{_r(_otel_cost(rounds, shape, cpu, OTEL_ON, rate=False))} |"
        )
    add("")


WORKFLOW_MOST_COST = 1.3
"""The most a workflow step may cost against an independent job (issue 49, point 9)."""


def _flow(r: dict[str, Any], who: str, load: str, field: str) -> float:
    return _get(r.get("workflows", {}).get(who, {}).get(load, {}), field)


def _flow_total(r: dict[str, Any], who: str, load: str) -> float:
    return _flow(r, who, load, "enqueue_seconds") + _flow(r, who, load, "drain_seconds")


def _flow_cost(rounds: list[dict[str, Any]], who: str, what: str) -> float:
    """Median over rounds of a workflow job's cost over an independent job's, by ``what``:
    ``drain`` (drain seconds), ``enqueue`` (enqueue seconds), ``both`` (their sum),
    ``window`` (the 10-90 % rates, independent / workflows)."""
    out = []
    for r in rounds:
        if what == "window":
            a, b = (
                _flow(r, who, "independent", "per_second"),
                _flow(r, who, "workflows", "per_second"),
            )
        elif what == "both":
            a, b = _flow_total(r, who, "workflows"), _flow_total(r, who, "independent")
        else:
            a = _flow(r, who, "workflows", f"{what}_seconds")
            b = _flow(r, who, "independent", f"{what}_seconds")
        if b and not math.isnan(a) and not math.isnan(b):
            out.append(a / b)
    return median(out)


def _workflows_section(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """Workflows against as many independent jobs, Tenure and Celery's canvas."""
    rounds = data["rounds"]
    n = data["profile"].get("workflows", 1000)
    add("## Workflows: what a step costs against an independent job")
    add("")
    add(
        f"{_f(n)} workflows of 14 no-op steps each (a chain of 3, whose last fans out to 10 "
        f"steps joined by one fan-in: {_f(n * 14)} jobs), against as many independent no-op "
        "jobs, each load enqueued into an empty system and drained by 2 worker processes x 8 "
        "started the moment the enqueue returned, in turn in each round (`bench/workflows.py`, "
        "`bench/peers/celery_canvas.py`). Tenure: one transaction per workflow "
        "(`workflow(...).enqueue()`), the independent jobs by `enqueue_many` 1,000 a call; "
        "2 x `manage.py run_executor --concurrency 8`. Celery: "
        "`chain(a, b, c, chord(group(part x 10), join))` published once per workflow, the "
        "independent tasks one `apply_async` each; 2 x `celery worker -c 8 "
        "--prefetch-multiplier 64` (prefork, late acknowledgement, JSON) on Redis as broker "
        "**and result backend** (database 14: a chord needs a result backend, so Celery's "
        "figures here include storing every task's result, the independent tasks' too). "
        "Drain: from the workers' start to the last job done; cost per job: workflow "
        "seconds over independent seconds, median of per-round ratios."
    )
    add("")
    add(
        "| system | load | enqueue (s) | drain (s) | jobs/s (drain) | jobs/s (10-90 %) | "
        "jobs/s (enqueue + drain) | worker CPU ms / job |"
    )
    add("|---|---|---|---|---|---|---|---|")
    for who, name in (("tenure", "Tenure"), ("celery", "Celery canvas")):
        for load in ("workflows", "independent"):
            enq = median([_flow(r, who, load, "enqueue_seconds") for r in rounds])
            drn = median([_flow(r, who, load, "drain_seconds") for r in rounds])
            tot = median([_flow_total(r, who, load) for r in rounds])
            jobs = n * 14
            add(
                f"| {name} | {load} | {_f(enq, 1)} | {_f(drn, 1)} | {_f(jobs / drn)} | "
                f"{_f(median([_flow(r, who, load, 'per_second') for r in rounds]))} | "
                f"{_f(jobs / tot)} | "
                f"{_f(median([_flow(r, who, load, 'worker_cpu_ms_per_job') for r in rounds]), 2)} |"
            )
    add("")
    add(
        "| system | cost per job, workflows / independent: drain | 10-90 % | enqueue | "
        "enqueue + drain |"
    )
    add("|---|---|---|---|---|")
    for who, name in (("tenure", "Tenure"), ("celery", "Celery canvas")):
        add(
            f"| {name} | {_r(_flow_cost(rounds, who, 'drain'))} | "
            f"{_r(_flow_cost(rounds, who, 'window'))} | {_r(_flow_cost(rounds, who, 'enqueue'))} "
            f"| {_r(_flow_cost(rounds, who, 'both'))} |"
        )
    add("")
    per_round = [
        _flow_total(r, "tenure", "workflows") / _flow_total(r, "celery", "workflows")
        for r in rounds
    ]
    add(
        "Tenure's workflows against Celery's canvas, enqueue + drain seconds (Tenure / "
        f"Celery, median of rounds): {_r(median(per_round))}."
    )
    add("")


def _same_section(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """Every system in one shape, one job at a time per process: not the headline."""
    rounds: list[dict[str, Any]] = data["rounds"]
    prof = data["profile"]
    systems: dict[str, str] = data["systems"]
    workers = [str(w) for w in prof["drain_workers"]]
    plural = {w: f"{w} worker{'s' if w != '1' else ''}" for w in workers}
    add("## Drain, same shape (not the headline): N processes, one job at a time each")
    add("")
    add(
        f"{prof['drain_jobs']:,} no-op jobs; N worker processes of every system, each running "
        "one job at a time (for the prefork pools, one parent with N pool processes), every "
        "other option at the system's default. This is not how any of them is deployed for "
        f"throughput; the headline is the table above. {DRAIN_METHOD} "
        f"Time-box {prof['drain_timeout']:.0f} s per drain."
    )
    add("")
    head = "| system | " + " | ".join(
        f"{plural[w]}: whole run (s) | {plural[w]}: jobs/s, whole run | "
        f"{plural[w]}: jobs/s, 10-90 %"
        for w in workers
    )
    add(head + " |")
    add("|---|" + "---|---|---|" * len(workers))
    for key, label in systems.items():
        cells = []
        for w in workers:
            whole_s, whole_rate = _whole_cells(rounds, "drain", w, key)
            cells += [whole_s, whole_rate, _f(_med(rounds, "drain", w, key, "per_second"))]
        add(f"| {label} | " + " | ".join(cells) + " |")
    add("")
    add("Tenure (broker-less) / peer, same shape, same round (whole run; 10-90 %):")
    add("")
    add("| peer | " + " | ".join(plural[w] for w in workers) + " |")
    add("|---|" + "---|" * len(workers))
    for key, label in systems.items():
        if key == TENURE:
            continue
        mine = TENURE_CELERY if key == "celery" else TENURE
        cells = []
        for w in workers:
            whole = _ratio(
                rounds,
                ("drain", w, mine, "whole_per_second"),
                ("drain", w, key, "whole_per_second"),
            )
            steady = _ratio(
                rounds, ("drain", w, mine, "per_second"), ("drain", w, key, "per_second")
            )
            cells.append(f"{_r(whole)}; {_r(steady)}")
        who = "Tenure (Celery executor) / " if key == "celery" else ""
        add(f"| {who}{label} | " + " | ".join(cells) + " |")
    add("")
    if TENURE_CELERY in systems:
        add(CELERY_WHOLE_RUN_NOTE)
        add("")
    add("Configurations (exact commands; `bench/systems.py`):")
    add("")
    add("| system | " + " | ".join(plural[w] for w in workers) + " |")
    add("|---|" + "---|" * len(workers))
    configs = data.get("configs", {}).get("same", {})
    for key, label in systems.items():
        cells = [configs.get(key, {}).get(w, "not recorded") for w in workers]
        add(f"| {label} | " + " | ".join(cells) + " |")
    add("")


def _workload_sections(data: dict[str, Any], add: Callable[[str], None]) -> None:
    """Cost, enqueue, latency, recovery and dashboard (the same-shape systems)."""
    rounds: list[dict[str, Any]] = data["rounds"]
    systems: dict[str, str] = data["systems"]
    prof = data["profile"]

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
    for page in ("overview", "job_list", "payload_search", "health_counts"):
        if page in d0:
            add(
                f"| {page} | {_f(_med(rounds, 'dashboard', page, 'p50_ms'), 1)} | "
                f"{_f(_med(rounds, 'dashboard', page, 'p95_ms'), 1)} |"
            )
    add("")


CELERY_WHOLE_RUN_NOTE = (
    "The Celery executor's whole run includes a wait of its own: jobs enqueued before any "
    "worker has registered its queue get no message at enqueue (hints go only where a live "
    "consumer takes them); each pool process hints them once it has registered (and "
    "`run_scheduler`'s dispatcher would in its next round) "
    '(docs/transports.md, "Hints go only where a consumer is known"). Its first job '
    "column shows that wait and the pool's start-up."
)

CELERY_NOTE = (
    "Tenure's Celery executor claims the job a message names, then claims and runs the "
    "queue's next due jobs in the same task for up to `TENURE_CELERY_CHAIN_SECONDS`, writing "
    "their successful completions together, one commit per batch "
    "(`TENURE_CELERY_COMMIT_WINDOW`, `scheduler_core/runtime/chain.py`); a message whose job "
    "was taken that way claims the queue's next due job instead and chains from it (dropped "
    "only when the queue has none due). Rates "
    "count jobs finished in the database, so over a short drain this executor can pass "
    "Celery's own per-message rate; over a long one every message still costs Celery's "
    "per-message work and the rate settles near Celery alone's. Celery alone runs a task "
    "that does nothing and touches no database."
)

WHY = {
    "a workflow step costs": (
        "A workflow's enqueue is a commit of its own (the independent jobs commit 1,000 at a "
        "time). In the drain a completion that releases steps writes each child's step row "
        "and job row once more in its statement, and one that counts off a fan-in waits for "
        "the row the fan-in's other parents count off, held until their commit: without the "
        "fan-in a step costs about 1.2x (docs/workflows.md, Speed)."
    ),
    "tracing off costs": (
        "Off, an attempt asks one module global and the tracer provider's type, and the "
        "signals' receiver lists; the baseline's emptied hooks do none of that, and "
        "`bench/otel_off.py` times it at about 1 us per attempt in the process. A difference "
        "larger than a few microseconds of CPU per job is noise between adjacent drains: "
        "compare the rounds in the JSON, and drain more jobs (`BENCH_SCALE`)."
    ),
    "an async def no-op costs": (
        "In one process an async def handler costs an attempt about 25-35 us of CPU more than "
        "a plain one (its thread's event loop, a task, the coroutine's supervision); at 2 x 8 "
        "on 2 cores the executor writes its threads' completions together, and how many "
        "each commit carries moves with the threads' timing, so the per-job cost moves by "
        "more than that between adjacent drains. Compare the rounds of the two systems in "
        "the JSON before reading a ratio as the handler's cost."
    ),
    "an unlimited queue": (
        "Compare the statements per job first: equal counts mean the claim did the same work, "
        "and a rate below 0.9x on the same statements is the machine's noise between adjacent "
        "drains (each version is drained twice a round, in turn)."
    ),
    "broker-less drain >= 3.0x procrastinate": (
        "Per job the broker-less executor makes one commit in three round trips: `BEGIN`, "
        "one prepared statement (the fenced completion, the attempt's end, the claim of the "
        "thread's next job with its attempt row, and the transaction id), `COMMIT`. The "
        "explicit transaction is what lets an executor whose connection breaks during "
        "`COMMIT` read the outcome back by transaction id (`txid_status`) instead of "
        "guessing, and what makes the next claim stand or fall with the completion. "
        "procrastinate makes two round trips (two procedure calls in autocommit) from an "
        "asyncio loop. With one job at a time the drain is bound by those round trips, the "
        "commit's flush and Tenure's Python path (Django's connection and transaction "
        "handling, one thread per running job); with more jobs in flight on 2 cores it is "
        "bound by CPU shared with the server. Going further would mean claiming ahead of free slots (jobs leased "
        "while they wait in memory) or completing outside a transaction, which would give up "
        "the lease and read-back guarantees."
    ),
    "broker-less drain >= 1.2x pgqueuer": (
        "pgqueuer claims several jobs per statement (at its best 4 per dequeue) and writes "
        "their ends together from an asyncio loop (a log insert and a delete), keeping no "
        "attempt history or fenced lease; Tenure's broker-less executor commits each "
        "completion on its own, with the next claim, in three round trips (`BEGIN`, one "
        "prepared statement, `COMMIT`)."
    ),
    "broker-less drain >= 1.5x django-tasks-db": (
        "django-tasks-db opens a new connection per task (its worker closes old connections "
        "around each one) and claims with a read then a separate write."
    ),
    ">= 40 % of pgbench": (
        "A pgbench `-N` transaction is one commit from a C client; a Tenure job is one commit "
        "(the completion with the next claim, three round trips) plus Python on "
        "the same 2 cores as the server, so the workers and the server compete for the CPU "
        "pgbench's C client hardly uses."
    ),
    "Celery executor >= 0.8x celery": (
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
        "The overview (`scheduler_core/read/jobs.py::overview`, `scheduler_core/read/health.py`) reads "
        "succeeded and cancelled counts from the snapshot `run_scheduler` refreshes on a "
        "table this big, and counts everything else live in one scan through the state "
        "index: grouped by queue and type, with the health categories as filters of the "
        "same scan. In the generated store that is 80,000 live rows (waiting, leased, failed, "
        "indeterminate), about 110 ms of the page (the queues section reads its per-queue "
        "counts from the same scan); the rest is the other small reads and rendering. The "
        "generator spreads those rows evenly over the table, so the scan visits most of its "
        "pages, where a live queue's waiting and leased rows sit near its end. Its time grows with live work, not with history. Counting live jobs from "
        "a snapshot too would make operators act on stale numbers; a covering index for the "
        "scan would cost every job write another index entry."
    ),
    "dashboard job_list": "The job list pages by keyset on an index; see the overview row.",
    "dashboard payload_search": (
        'A payload search (`{"customer": {"email": ...}}`, `invoice_id=...`) is '
        "`payload @> ...` on PostgreSQL, answered by the GIN index over payloads "
        "(`jsonb_path_ops`, migration 0008); the newest page of matches is then sorted by id. "
        "A fragment that matches a large share of the table reads all those index entries."
    ),
}
"""Why a target can be missed, by the target's name prefix (shown only when it is missed)."""


def _targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Each target with the measured figure and whether it was met: the drain's and the
    workloads' (:func:`_drain_targets`) where they ran, then the async comparison's."""
    out = _drain_targets(data) if data.get("best_systems") or data["systems"] else []
    if data.get("async_systems"):
        rounds = data["rounds"]
        costs = [
            _async_cost(rounds, shape, "per_second", rate=True)
            for shape in (BEST_SHAPE, SAME_SHAPE)
        ]
        out.append(
            (
                f"an async def no-op costs <= {ASYNC_MOST_COST}x a plain one per job "
                "(broker-less executor)",
                f"at their best {_r(costs[0])}, 1 process x 1 {_r(costs[1])}",
                all(not math.isnan(c) and c <= ASYNC_MOST_COST for c in costs),
            )
        )
    if data.get("workflow_systems"):
        rounds = data["rounds"]
        drain = _flow_cost(rounds, "tenure", "drain")
        both = _flow_cost(rounds, "tenure", "both")
        for what, cost in (("drain", drain), ("enqueue + drain", both)):
            out.append(
                (
                    f"a workflow step costs <= {WORKFLOW_MOST_COST}x an independent job "
                    f"({what}; broker-less executor, 2 x 8)",
                    _r(cost),
                    not math.isnan(cost) and cost <= WORKFLOW_MOST_COST,
                )
            )
    if data.get("otel_systems"):
        rounds = data["rounds"]
        costs = [
            _otel_cost(rounds, shape, "worker_cpu_ms_per_job", OTEL_OFF, rate=False)
            for shape in (BEST_SHAPE, SAME_SHAPE)
        ]
        out.append(
            (
                f"tracing off costs <= {OTEL_OFF_MOST_COST}x the same files with the tracing "
                "hooks emptied, per job (worker CPU, broker-less executor)",
                f"at their best {_r(costs[0])}, 1 process x 1 {_r(costs[1])}",
                all(not math.isnan(c) and c <= OTEL_OFF_MOST_COST for c in costs),
            )
        )
    return out


def _drain_targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Each target of the drains and workloads with the measured figure and whether it was met.

    Drain targets read the headline table (both at their best) when the peer is in it, else
    the same-shape table per worker count; they are judged on the 10-90 % rate and show the
    whole-run figure beside it.
    """
    rounds = data["rounds"]
    workers = [str(w) for w in data["profile"]["drain_workers"]]
    best = data.get("best_systems", {})
    same = data["systems"]
    out: list[tuple[str, str, bool]] = []

    def ratio_row(mine: str, peer: str, need: float, name: str) -> None:
        if peer in best and mine in best:
            steady = _ratio(rounds, ("best", mine, "per_second"), ("best", peer, "per_second"))
            whole = _ratio(
                rounds, ("best", mine, "whole_per_second"), ("best", peer, "whole_per_second")
            )
            out.append(
                (
                    f"{name} >= {need}x {peer}, both at their best",
                    f"10-90 %: {_r(steady)} (whole run: {_r(whole)})",
                    not math.isnan(steady) and steady >= need,
                )
            )
            return
        if peer not in same or mine not in same:
            return
        rs = [
            _ratio(rounds, ("drain", w, mine, "per_second"), ("drain", w, peer, "per_second"))
            for w in workers
        ]
        ws = [
            _ratio(
                rounds,
                ("drain", w, mine, "whole_per_second"),
                ("drain", w, peer, "whole_per_second"),
            )
            for w in workers
        ]
        cells = ", ".join(
            f"{w}: {_r(r)} (whole run {_r(x)})" for w, r, x in zip(workers, rs, ws, strict=True)
        )
        ok = all(r >= need for r in rs if not math.isnan(r))
        out.append((f"{name} >= {need}x {peer}, same shape (per worker count)", cells, ok))

    ratio_row(TENURE, "procrastinate", 3.0, "broker-less drain")
    ratio_row(TENURE, "django-tasks-db", 1.5, "broker-less drain")
    ratio_row(TENURE, "pgqueuer", 1.2, "broker-less drain")
    tps = _med(rounds, "pgbench", "tps")
    if TENURE in best:
        best_rate = _med(rounds, "best", TENURE, "per_second")
        whole = _med(rounds, "best", TENURE, "whole_per_second")
        where = "at its best"
    else:
        best_rate = max(
            (_med(rounds, "drain", w, TENURE, "per_second") for w in workers),
            default=float("nan"),
        )
        whole = float("nan")
        where = "best same-shape worker count"
    frac = best_rate / tps if tps else float("nan")
    out.append(
        (
            ">= 40 % of pgbench write TPS",
            f"{_f(best_rate)} jobs/s 10-90 % ({where}; whole run {_f(whole)}) / {_f(tps)} TPS "
            f"= {frac:.0%}",
            frac >= 0.4,
        )
    )
    ratio_row(TENURE_CELERY, "celery", 0.8, "Celery executor")
    if data.get("limits_systems"):
        cost = rounds[0].get("limits", {}).get("cost", {})
        extra = _get(cost, LIMITS_NOW, "statements_per_job") - _get(
            cost, LIMITS_BEFORE, "statements_per_job"
        )
        for key, what in (
            (LIMITS_NOW, "now"),
            (LIMITS_BESIDE, "beside a paused and a limited queue"),
        ):
            vs = _limits_ratio(rounds, key, LIMITS_BEFORE, "per_second")
            out.append(
                (
                    f"an unlimited queue ({what}) drains >= {LIMITS_SAME_RATE}x the revision "
                    "before queue limits",
                    f"10-90 %: {_r(vs)}",
                    not math.isnan(vs) and vs >= LIMITS_SAME_RATE,
                )
            )
        out.append(
            (
                f"an unlimited queue's statements per job <= the revision before + "
                f"{LIMITS_SAME_STATEMENTS}",
                f"{extra:+.2f}",
                not math.isnan(extra) and extra <= LIMITS_SAME_STATEMENTS,
            )
        )
    if TENURE not in same:
        # Only the headline drain ran (``--shapes best``): no other workload.
        return out
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
    for page in ("overview", "job_list", "payload_search", "health_counts"):
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
    best: dict[str, str] = data.get("best_systems", {})
    workers = list(data["profile"]["drain_workers"])
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(19, 5.5))

    # The headline: each system at its best, whole run beside the 10-90 % window.
    keys = list(best)
    xs = range(len(keys))
    width = 0.38
    whole = [_med(rounds, "best", k, "whole_per_second") for k in keys]
    steady = [_med(rounds, "best", k, "per_second") for k in keys]
    ax0.bar([x - width / 2 for x in xs], whole, width, label="whole run (start-up included)")
    ax0.bar([x + width / 2 for x in xs], steady, width, label="10-90 % window")
    tps = _med(rounds, "pgbench", "tps")
    if not math.isnan(tps):
        ax0.axhline(tps, color="grey", linestyle=":", linewidth=1, label="pgbench -N TPS")
    ax0.set_xticks(list(xs))
    ax0.set_xticklabels([best[k] for k in keys], rotation=30, ha="right", fontsize=8)
    ax0.set_ylabel("jobs finished per second")
    ax0.set_title("Drain at their best (2 processes x 8 jobs)")
    ax0.grid(alpha=0.3, axis="y")
    ax0.legend(fontsize=8)

    for key, label in systems.items():
        ys = [_med(rounds, "drain", str(w), key, "per_second") for w in workers]
        ws = [_med(rounds, "drain", str(w), key, "whole_per_second") for w in workers]
        style = "-o" if key.startswith("tenure") else "--s"
        (line,) = ax1.plot(workers, ys, style, label=label, linewidth=2.2 if key == TENURE else 1.2)
        ax1.plot(workers, ws, ":", color=line.get_color(), linewidth=1)
    ax1.set_xlabel("worker processes, one job at a time each")
    ax1.set_ylabel("jobs/s: 10-90 % (marked), whole run (dotted)")
    ax1.set_xticks(workers)
    ax1.set_title("Drain, same shape (not the headline)")
    ax1.grid(alpha=0.3)
    if systems:
        ax1.legend(fontsize=7)

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
