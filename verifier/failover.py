"""The failover nemesis (``manage.py chaos_failover``, ``make chaos-failover``): a primary and
its streaming standby on spare ports, a fleet on a two-host connection string, the primary
crashed mid-run and the standby promoted, the fleet left to drain without a restart.

Per mode (``sync``: ``synchronous_standby_names = '*'``; ``async``: as ``pg_basebackup -R``
leaves it), on clusters of its own:

1. ``initdb`` a primary, migrate, ``pg_basebackup -R`` a standby that streams through a proxy
   link of the verifier's (:mod:`.proxy`);
2. two broker-less executors (``--transport celery``: two Celery workers, ``rq``: eight RQ
   workers, on Redis), a scheduler and an enqueuer, all on
   ``postgres://…@127.0.0.1:P1,127.0.0.1:P2/chaos?target_session_attrs=read-write``, run the
   occurrences of a database schedule the enqueuer declares (``failover.tick`` every
   ``--schedule-every`` seconds) and the enqueuer's ``failover.deliver`` jobs
   (:mod:`.failover_jobs`: one effect each, recorded by key and fence);
3. once a share of the jobs has succeeded, the replication link is held (the standby falls
   behind, as a loaded or distant asynchronous standby does; a synchronous primary's commits
   wait), the primary is crashed (``pg_ctl stop -m immediate``), the held bytes are dropped and
   the standby promoted (``pg_ctl promote``);
4. the run waits until every enqueue is settled and no enqueued job waits or is leased (the
   drain), stops the scheduler, has the enqueuer enqueue again the unique keys lost in the
   gap, waits until every job has ended, then checks.

Invariants: no (job, fence) given to two attempts, nor (job, attempt number); no effect
delivered twice under one (key, fence); in ``sync`` mode no acknowledged enqueue lost; in ``async`` mode the acknowledged
enqueues lost in the gap are counted and listed, and each key is accepted again as a new job
that succeeds; every surviving job terminal; the console's status names the failover; each
schedule occurrence has one job, and ran under two only in ``async`` mode when the first job
ran before the crash and was lost with the gap. ``--negative-control`` runs the claim without the epoch
(``tenure_fence_epoch()`` answers 0 on both servers): the ``async`` run must then fail, with
fences given twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .cluster import DB_NAME, PG_BIN, PgCluster, free_port
from .proxy import ProxyServer

ROOT = Path(__file__).resolve().parents[1]
MANAGE = str(ROOT / "manage.py")
MODES = ("sync", "async")
TRANSPORTS = ("polling", "celery", "rq")
TERMINAL = ("succeeded", "failed", "indeterminate", "cancelled")
NO_EPOCH_SQL = (
    "CREATE OR REPLACE FUNCTION tenure_fence_epoch() RETURNS bigint LANGUAGE sql VOLATILE "
    "AS $$ SELECT 0::bigint $$"
)
"""The negative control: every timeline's fences start at the same place, as before the epoch."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """One run's settings."""

    modes: tuple[str, ...] = MODES
    jobs: int = 1200
    rate: float = 150.0
    crash_after: float = 0.6
    """Share of the jobs enqueued when the nemesis starts."""
    gap_seconds: float = 2.0
    """How long the replication link is held before the crash."""
    concurrency: int = 4
    drain_timeout: float = 600.0
    schedule_every: int = 1
    transport: str = "polling"
    """``polling`` (broker-less executors), ``celery`` or ``rq`` (workers on Redis)."""
    redis_url: str = "redis://127.0.0.1:6379/15"
    """The broker of a ``celery`` or ``rq`` run; its keys carry the run's own prefix."""
    """Seconds between the occurrences of the run's schedule."""
    negative_control: bool = False
    workdir: Path | None = None
    keep: bool = False


class _Server(PgCluster):
    """A cluster of the pair: the base cluster's options plus replication's."""

    def __init__(self, root: Path, *, port: int, extra: dict[str, str]) -> None:
        super().__init__(root, port=port)
        self.extra = extra

    def configure(self, settings: dict[str, str], *, auto: bool = False) -> None:
        """Append settings to the cluster's configuration file (before it starts)."""
        name = "postgresql.auto.conf" if auto else "postgresql.conf"
        with open(self.data / name, "a") as f:
            for k, v in settings.items():
                f.write(f"{k} = '{v}'\n")

    def basebackup_from(self, port: int) -> None:
        """``pg_basebackup -R`` of the server at ``port`` into this cluster's folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run(
            str(PG_BIN / "pg_basebackup"),
            "-D",
            str(self.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-d",
            f"host=127.0.0.1 port={port} user=postgres application_name=standby",
        )

    def promote(self) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "promote")


@dataclass
class _Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]


@dataclass
class ModeResult:
    """What one mode's run measured and found."""

    mode: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "ok": not self.failures,
            **self.figures,
            "failures": self.failures,
        }


def _say(msg: str) -> None:
    sys.stdout.write(f"[failover {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stdout.flush()


def _transport_env(opts: Options, prefix: str) -> dict[str, str]:
    """What a run on a brokered transport adds to every process's environment: the transport,
    its broker, the run's own broker queue names, and (RQ) a queue its settings declare."""
    if opts.transport == "polling":
        return {}
    env = {"TENURE_TRANSPORT": opts.transport, "TENURE_BROKER_QUEUE_PREFIX": prefix}
    if opts.transport == "celery":
        env["CELERY_BROKER_URL"] = opts.redis_url
    else:
        env["RQ_REDIS_URL"] = opts.redis_url
        env["TENURE_FAILOVER_QUEUE"] = "default"  # config/settings.py's RQ_QUEUES has it
    return env


def _worker_argv(opts: Options, slot: int, prefix: str) -> list[str]:
    """One worker of the run's transport (after ``python``), as the transport's docs start it."""
    queue = "default" if opts.transport == "rq" else "failover"
    if opts.transport == "celery":
        return [
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-Q",
            prefix + queue,
            "--pool",
            "prefork",
            "-c",
            str(opts.concurrency),
            "--loglevel",
            "INFO",
            "-n",
            f"failover{slot}-{prefix}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    if opts.transport == "rq":
        return [MANAGE, "rqworker", prefix + queue, "--name", f"failover{slot}-{prefix}"]
    return [MANAGE, "run_executor", "--queues", queue, "--concurrency", str(opts.concurrency)]


def _clear_broker(opts: Options, prefix: str) -> None:
    """Delete the run's keys from the broker's database (hints left for finished jobs)."""
    if opts.transport == "polling":
        return
    import redis

    with contextlib.suppress(Exception):
        conn = redis.Redis.from_url(opts.redis_url)
        for key in conn.scan_iter(f"*{prefix}*"):
            conn.delete(key)
        # RQ's message and result records are named by message id; the origin names the queue.
        for key in conn.scan_iter("rq:job:*"):
            name = key.decode() if isinstance(key, bytes) else str(key)
            origin = conn.hget(name, "origin")
            text = origin.decode(errors="replace") if isinstance(origin, bytes) else str(origin)
            if text.startswith(prefix):
                conn.delete(name, "rq:results:" + name.removeprefix("rq:job:"))
        for member in conn.smembers("rq:queues"):
            if prefix.encode() in member:
                conn.srem("rq:queues", member)


def _env(workdir: Path, url: str, app: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PG"))}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        PGAPPNAME=app,
        TENURE_VAR_DIR=str(workdir / "var"),
        TENURE_TRANSPORT="polling",
        TENURE_JOB_MODULES="verifier.failover_jobs",
        TENURE_FAILOVER_DIR=str(workdir),
        TENURE_POLL_INTERVAL="0.25",
        TENURE_SWEEP_INTERVAL="1",
        TENURE_REAP_GRACE_SECONDS="1",
        TENURE_SHUTDOWN_GRACE_SECONDS="3",
        TENURE_LOG_LEVEL="INFO",
    )
    env.update(extra or {})
    return env


def _spawn(
    workdir: Path, name: str, args: list[str], env: dict[str, str], *, manage: bool = True
) -> _Proc:
    log = open(workdir / "logs" / f"{name}.log", "ab")
    argv = [sys.executable, MANAGE, *args] if manage else [sys.executable, *args]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return _Proc(name, proc, log)


def _stop(procs: list[_Proc]) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
        p.log.close()


def _count(server: PgCluster, sql: str) -> int | None:
    try:
        return int(server.query(sql)[0][0])
    except Exception:
        return None


def _wait_streaming(primary: PgCluster, *, sync: bool, timeout: float = 60.0) -> None:
    want = "sync" if sync else "async"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            rows = primary.query("SELECT state, sync_state FROM pg_stat_replication")
            if rows and rows[0][0] == "streaming" and rows[0][1] == want:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the standby did not start streaming ({want})")


def run_mode(mode: str, opts: Options, workdir: Path) -> ModeResult:
    """One mode's run on clusters of its own; the result holds figures and failures."""
    result = ModeResult(mode)
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    (workdir / "logs").mkdir(exist_ok=True)
    primary = _Server(workdir / "primary", port=free_port(), extra={})
    standby = _Server(workdir / "standby", port=free_port(), extra={})
    proxy = ProxyServer()
    procs: list[_Proc] = []
    prefix = f"tenure-failover-{uuid.uuid4().hex[:8]}-"
    extra = _transport_env(opts, prefix)
    try:
        primary.init()
        primary.configure(
            {"wal_level": "replica", "max_wal_senders": "5", "wal_keep_size": "256MB"}
        )
        primary.start()
        primary.create_database()
        url_primary = primary.url()
        subprocess.run(
            [sys.executable, MANAGE, "migrate", "-v", "0"],
            env=_env(workdir, url_primary, "failover-migrate", extra),
            cwd=ROOT,
            check=True,
        )
        if opts.negative_control:
            primary.query(NO_EPOCH_SQL)
        proxy.start()
        link = proxy.add_link("replication", ("127.0.0.1", primary.port))
        standby.basebackup_from(link)
        # Promoted, the standby must not wait for a standby of its own.
        standby.configure({"synchronous_standby_names": ""}, auto=True)
        standby.start()
        if mode == "sync":
            # Only once the standby is there: until then every commit would wait for it.
            primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.query("SELECT pg_reload_conf()")
        _wait_streaming(primary, sync=mode == "sync")
        _say(f"{mode}: primary :{primary.port}, standby :{standby.port} (streaming via :{link})")

        url = (
            f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{DB_NAME}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )
        # RQ runs one job at a time per worker: as many workers as the others' job slots.
        workers = 2 * opts.concurrency if opts.transport == "rq" else 2
        for slot in range(workers):
            procs.append(
                _spawn(
                    workdir,
                    f"exec-{slot}",
                    _worker_argv(opts, slot, prefix),
                    _env(workdir, url, f"failover-exec-{slot}", extra),
                    manage=False,
                )
            )
        procs.append(
            _spawn(
                workdir,
                "scheduler",
                ["run_scheduler", "--interval", "1"],
                _env(workdir, url, "failover-sched", extra),
            )
        )
        scheduler = procs[-1]
        enqueuer = _spawn(
            workdir,
            "enqueuer",
            [
                "chaos_failover",
                "--role",
                "enqueue",
                "--dir",
                str(workdir),
                "--jobs",
                str(opts.jobs),
                "--rate",
                str(opts.rate),
                "--schedule-every",
                str(opts.schedule_every),
            ],
            _env(workdir, url, "failover-enqueue", extra),
        )
        procs.append(enqueuer)

        t_start = time.monotonic()
        threshold = int(opts.jobs * opts.crash_after)
        while True:
            enqueued = _count(primary, "SELECT count(*) FROM tenure_job WHERE schedule_id IS NULL")
            if enqueued is not None and enqueued >= threshold:
                break
            if enqueuer.proc.poll() is not None:
                raise RuntimeError(f"the enqueuer exited ({enqueuer.proc.returncode})")
            if time.monotonic() - t_start > opts.drain_timeout:
                raise TimeoutError(f"{threshold} jobs did not succeed in time")
            time.sleep(0.1)
        done = _count(
            primary,
            "SELECT count(*) FROM tenure_job WHERE state = 'succeeded' AND schedule_id IS NULL",
        )
        in_flight = _count(primary, "SELECT count(*) FROM tenure_job WHERE state = 'leased'")
        _say(
            f"{mode}: {enqueued} enqueued, {done} succeeded, {in_flight} leased: "
            "holding the replication link"
        )
        proxy.set_mode("replication", "hold")
        time.sleep(opts.gap_seconds)
        t_crash = time.monotonic()
        crash_wall = time.time()
        primary.stop("immediate")
        proxy.reset("replication")
        standby.promote()
        t_promoted = time.monotonic()
        _say(f"{mode}: primary crashed, standby promoted in {t_promoted - t_crash:.2f} s")

        drained_at = None
        while time.monotonic() - t_promoted < opts.drain_timeout:
            open_jobs = _count(
                standby,
                "SELECT count(*) FROM tenure_job "
                "WHERE state IN ('waiting', 'leased') AND schedule_id IS NULL",
            )
            settled = (workdir / "enqueue" / "done").exists() or enqueuer.proc.poll() is not None
            if settled and open_jobs == 0:
                drained_at = time.monotonic()
                break
            time.sleep(0.25)
        if drained_at is None:
            result.failures.append(f"not drained {opts.drain_timeout:.0f} s after the promotion")
        result.figures.update(
            jobs=opts.jobs,
            enqueued_at_crash=enqueued,
            succeeded_at_crash=done,
            leased_at_crash=in_flight,
            gap_seconds=opts.gap_seconds,
            promotion_seconds=round(t_promoted - t_crash, 2),
            drain_after_promotion_seconds=(
                round(drained_at - t_promoted, 2) if drained_at is not None else None
            ),
        )
        # Reconnected, not restarted: every worker is still the process the run started.
        exited = [p.name for p in procs if p.name.startswith("exec-") and p.proc.poll() is not None]
        result.figures.update(workers=workers, workers_exited=len(exited))
        if exited:
            result.failures.append(f"workers exited during the run: {exited}")
        # No more occurrences: the schedule's last ones and the re-enqueues drain next.
        _stop([scheduler])
        procs.remove(scheduler)
        lost = _lost_acknowledged(workdir, standby)
        # The enqueuer, waiting since its last enqueue, enqueues these keys again and exits.
        keys_file = workdir / "enqueue" / "again"
        keys_file.with_suffix(".tmp").write_text("\n".join(lost))
        keys_file.with_suffix(".tmp").rename(keys_file)
        try:
            enqueuer.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            result.failures.append("the enqueuer did not enqueue the lost keys again in 120 s")
        result.figures["enqueuer_exit"] = enqueuer.proc.poll()
        t_settle = time.monotonic()
        while _count(
            standby, "SELECT count(*) FROM tenure_job WHERE state IN ('waiting', 'leased')"
        ):
            if time.monotonic() - t_settle > 120:
                result.failures.append("the schedule's occurrences and re-enqueues did not drain")
                break
            time.sleep(0.25)
        status = subprocess.run(
            [sys.executable, MANAGE, "jobs_status", "--json"],
            env=_env(workdir, url, "failover-status", extra),
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        _stop(procs)
        procs = []
        _check(mode, standby, workdir, status.stdout, opts, result, lost=lost, crash=crash_wall)
    except Exception as e:  # the run itself broke: reported, never a pass
        result.failures.append(f"run error: {type(e).__name__}: {e}")
    finally:
        _stop(procs)
        proxy.close()
        _clear_broker(opts, prefix)
        for server in (primary, standby):
            if server.data.exists():
                server.stop("immediate")
        if not opts.keep:
            for server in (primary, standby):
                shutil.rmtree(server.root, ignore_errors=True)
    return result


def _lines(workdir: Path, folder: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted((workdir / folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _acknowledged(workdir: Path) -> dict[str, dict[str, Any]]:
    """The enqueuer's acknowledged enqueues, by unique key."""
    return {r["unique_key"]: r for r in _lines(workdir, "enqueue") if r["outcome"] == "ack"}


def _lost_acknowledged(workdir: Path, store: PgCluster) -> list[str]:
    """The unique keys the enqueuer saw acknowledged that the store no longer holds."""
    acked = _acknowledged(workdir)
    rows = store.query(
        "SELECT unique_key FROM tenure_job WHERE unique_key = ANY(%s)", [list(acked)]
    )
    present = {r[0] for r in rows}
    return sorted((k for k in acked if k not in present), key=lambda k: int(k.split("-")[-1]))


def _check_schedule(
    mode: str,
    store: PgCluster,
    seen: list[dict[str, Any]],
    crash: float,
    result: ModeResult,
) -> None:
    """Each occurrence (schedule, scheduled time) has one job. The store's unique key says so
    for the survivors; the destination's lines say whether an occurrence ran under two jobs,
    which is allowed once, in ``async`` mode only, when the first job ran before the crash and
    is absent from the promoted store (it was lost with the gap and the schedule's step with it).
    """
    from .failover_jobs import micros

    rows = store.query(
        "SELECT unique_key, id, created_at, state FROM tenure_job WHERE schedule_id IS NOT NULL"
    )
    stored = {r[0]: (int(r[1]), micros(r[2])) for r in rows}
    in_store = set(stored.values())
    two_jobs = store.query(
        "SELECT unique_key FROM tenure_job WHERE schedule_id IS NOT NULL "
        "GROUP BY unique_key HAVING count(*) > 1"
    )
    runs: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in seen:
        if r["kind"] == "tick" and r.get("occurrence"):
            runs[r["occurrence"]][(r["job"], r["created"])].append(r["at"])
    again: list[dict[str, Any]] = []
    wrong: list[str] = []
    for occurrence, jobs in sorted(runs.items()):
        survivor = stored.get(occurrence)
        if survivor is None:
            wrong.append(f"{occurrence} ran but has no job in the promoted store")
            continue
        others = {j: at for j, at in jobs.items() if j != survivor}
        if not others:
            continue
        first, first_at = next(iter(others.items()))
        again.append(
            {
                "occurrence": occurrence,
                "lost_job": first[0],
                "lost_job_ran_before_crash": max(first_at) < crash,
                "job": survivor[0],
            }
        )
        if mode != "async":
            wrong.append(f"{occurrence} ran under two jobs in {mode} mode")
        elif len(others) > 1:
            wrong.append(f"{occurrence} ran under {len(others) + 1} jobs")
        elif first in in_store or max(first_at) >= crash:
            wrong.append(f"{occurrence} fired again though its first job was not lost in the gap")
    result.figures.update(
        schedule_occurrences_fired=len(stored),
        schedule_occurrences_run_at_destination=len(runs),
        schedule_occurrences_with_two_jobs=len(two_jobs),
        schedule_occurrences_fired_again=len(again),
        schedule_occurrences_fired_again_detail=again[:20],
    )
    if two_jobs:
        result.failures.append(f"{len(two_jobs)} occurrences have two jobs: {two_jobs[:5]}")
    if wrong:
        result.failures.append(f"schedule: {len(wrong)} occurrences fired wrongly: {wrong[:5]}")


def _check_reenqueued(store: PgCluster, workdir: Path, lost: list[str], result: ModeResult) -> None:
    """Every unique key lost in the gap was accepted again as a new job that then succeeded."""
    said = {r["unique_key"]: r for r in _lines(workdir, "reenqueue")}
    rows = store.query(
        "SELECT unique_key, id, state FROM tenure_job WHERE unique_key = ANY(%s)", [lost]
    )
    state = {r[0]: r[2] for r in rows}
    refused = sorted(k for k in lost if not said.get(k, {}).get("new"))
    unfinished = sorted(k for k in lost if state.get(k) != "succeeded")
    result.figures.update(
        lost_keys_enqueued_again=len(lost),
        lost_keys_accepted_as_new_job=len(lost) - len(refused),
        lost_keys_new_job_succeeded=len(lost) - len(unfinished),
    )
    if refused:
        result.failures.append(f"{len(refused)} lost keys not accepted as new jobs: {refused[:5]}")
    if unfinished:
        result.failures.append(
            f"{len(unfinished)} lost keys' new jobs did not succeed: "
            f"{[(k, state.get(k)) for k in unfinished[:5]]}"
        )


def _check(
    mode: str,
    store: PgCluster,
    workdir: Path,
    status_json: str,
    opts: Options,
    result: ModeResult,
    *,
    lost: list[str],
    crash: float,
) -> None:
    """The invariants, from the destination's lines, the enqueuer's log and the surviving
    store; the figures go into ``result``. ``lost``: the acknowledged keys the store did not
    hold after the drain (since enqueued again)."""
    seen = _lines(workdir, "destination")
    runs = Counter((r["job"], r["fence"]) for r in seen if r["kind"] in ("run", "tick"))
    sent = Counter((r["key"], r["fence"]) for r in seen if r["kind"] == "sent")
    given_twice = sorted(k for k, n in runs.items() if n > 1)
    # A job is its id and creation instant: the new primary's sequence may hand out again the
    # ids of jobs lost in the gap (the enqueues it never received), to other jobs.
    numbers = Counter(
        (r["job"], r["created"], r["attempt"]) for r in seen if r["kind"] in ("run", "tick")
    )
    numbered_twice = sorted(k for k, n in numbers.items() if n > 1)
    sent_twice = sorted(k for k, n in sent.items() if n > 1)
    fences_by_key: dict[str, set[int]] = defaultdict(set)
    for key, fence in sent:
        fences_by_key[key].add(fence)
    rerun = {k: sorted(f) for k, f in fences_by_key.items() if len(f) > 1}

    acked = _acknowledged(workdir)
    rows = store.query("SELECT unique_key, state, fence, id FROM tenure_job")
    not_terminal = sorted(r[3] for r in rows if r[1] not in TERMINAL)
    states = Counter(r[1] for r in rows)
    epochs = Counter(int(r[2]) >> 32 for r in rows if r[1] == "succeeded")

    status: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        status = json.loads(status_json)
    failover = status.get("failover") or {}

    result.figures.update(
        acknowledged=len(acked),
        surviving_jobs=len(rows),
        states=dict(states),
        fences_given_twice=len(given_twice),
        attempt_numbers_given_twice=len(numbered_twice),
        effects_sent_twice_under_one_fence=len(sent_twice),
        jobs_rerun_under_two_fences=len(rerun),
        lost_acknowledged=len(lost),
        lost_acknowledged_keys=lost[:50],
        succeeded_by_epoch={str(k): v for k, v in sorted(epochs.items())},
        status_failover=failover,
    )
    if given_twice:
        result.failures.append(
            f"{len(given_twice)} (job, fence) pairs given to two attempts, e.g. {given_twice[:5]}"
        )
    if numbered_twice:
        result.failures.append(
            f"{len(numbered_twice)} (job, created, attempt number) given to two executions, "
            f"e.g. {numbered_twice[:5]}"
        )
    if sent_twice:
        result.failures.append(
            f"{len(sent_twice)} effects delivered twice under one (key, fence), "
            f"e.g. {sent_twice[:5]}"
        )
    if mode == "sync" and lost:
        result.failures.append(f"{len(lost)} acknowledged enqueues lost: {lost[:10]}")
    if not_terminal:
        result.failures.append(f"{len(not_terminal)} surviving jobs not terminal")
    if len(acked) < opts.jobs:
        result.failures.append(f"the enqueuer settled {len(acked)} of {opts.jobs} enqueues")
    if not opts.negative_control and not failover.get("timeline_changed"):
        result.failures.append("jobs_status --json does not report the failover")
    _check_schedule(mode, store, seen, crash, result)
    _check_reenqueued(store, workdir, lost, result)


def run(opts: Options) -> tuple[int, dict[str, Any]]:
    """Every mode of ``opts`` in turn; returns (exit status, report)."""
    base = opts.workdir or Path(tempfile.mkdtemp(prefix="tenure-failover-"))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    results = [run_mode(m, opts, base / m) for m in opts.modes]
    report: dict[str, Any] = {
        "command": "manage.py chaos_failover",
        "transport": opts.transport,
        "negative_control": opts.negative_control,
        "modes": {r.mode: r.as_dict() for r in results},
        "workdir": str(base),
    }
    drains = {r.mode: r.figures.get("drain_after_promotion_seconds") for r in results}
    sync_s, async_s = drains.get("sync"), drains.get("async")
    if sync_s and async_s:
        report["async_over_sync_drain"] = round(async_s / sync_s, 2)
    if opts.negative_control:
        # What the epoch prevents, found: the run fails as the fence's failures show.
        report["negative_control_caught"] = any(
            r.figures.get("fences_given_twice")
            or r.figures.get("effects_sent_twice_under_one_fence")
            for r in results
        )
    return (0 if all(not r.failures for r in results) else 1), report


def enqueue_role(workdir: Path, *, jobs: int, rate: float, every: int) -> int:
    """The run's client. Declares the run's schedule (``failover.tick`` every ``every``
    seconds, through the scheduling service, as an operator's database schedule) and waits
    until an occurrence has run (the workers are up), so the occurrences straddle the switch.
    Then enqueues ``jobs`` jobs, each under its own unique key, at ``rate`` a second; an enqueue
    whose outcome the client could not learn is tried again under the same key until acked.
    Each outcome is logged to ``enqueue/<pid>.jsonl``, and ``enqueue/done`` written at the end.
    Last, it waits for ``enqueue/again`` (the acknowledged keys lost in the gap, one a line,
    from the run) and enqueues those again (:func:`_enqueue_again`)."""
    from django.db import DatabaseError, connection

    from scheduler_core.models import Job
    from scheduler_core.services import scheduling

    from .failover_jobs import deliver

    folder = workdir / "enqueue"
    folder.mkdir(parents=True, exist_ok=True)
    scheduling.create_schedule(
        name="failover-tick", job_name="failover.tick", interval_seconds=every
    )
    deadline = time.monotonic() + 90
    while not Job.objects.filter(schedule__isnull=False, state="succeeded").exists():
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.1)
    log = open(folder / f"{os.getpid()}.jsonl", "a", buffering=1)
    start = time.monotonic()
    for n in range(jobs):
        key = f"failover-{n}"
        wait = start + n / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        while True:
            try:
                job = deliver.enqueue(n=n, unique_key=key)
                log.write(json.dumps({"unique_key": key, "outcome": "ack", "job": job.pk}) + "\n")
                break
            except DatabaseError as e:
                log.write(
                    json.dumps({"unique_key": key, "outcome": "unknown", "error": str(e)[:200]})
                    + "\n"
                )
                with contextlib.suppress(Exception):
                    connection.close()
                time.sleep(0.2)
    log.close()
    (folder / "done").touch()
    again = folder / "again"
    while not again.exists():
        time.sleep(0.1)
    keys = [k for k in again.read_text().splitlines() if k]
    with contextlib.suppress(Exception):
        connection.close()  # opened before the switch: start the re-enqueues afresh
    _enqueue_again(workdir, keys)
    return 0


def _enqueue_again(workdir: Path, keys: list[str]) -> None:
    """Enqueue again the acknowledged enqueues lost in the gap, under their own unique keys;
    each outcome (whether the key was free and the enqueue made a new job) is logged to
    ``reenqueue/<pid>.jsonl``."""
    from scheduler_core.models import Job

    from .failover_jobs import deliver

    folder = workdir / "reenqueue"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{os.getpid()}.jsonl", "a", buffering=1) as log:
        for key in keys:
            free = not Job.objects.filter(unique_key=key).exists()
            job = deliver.enqueue(n=int(key.split("-")[-1]), unique_key=key)
            line = {"unique_key": key, "job": job.pk, "new": free and job.state == "waiting"}
            log.write(json.dumps(line) + "\n")
