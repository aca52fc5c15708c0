"""The systems under test, each behind the same small interface, in two shapes.

**At their best** (:data:`BEST`, the headline): every system that can run several jobs at once
in one process runs :data:`BEST_PROCESSES` worker processes of :data:`BEST_CONCURRENCY`
concurrent jobs each, configured as its own documentation recommends for throughput
(bench/README.md cites the pages):

=================  ===========================================================================
tenure             ``manage.py run_executor --concurrency 8`` x 2 (broker-less, LISTEN/NOTIFY)
tenure-celery      ``celery -A config worker -c 8 --prefetch-multiplier 64`` x 2 (prefork)
                   + ``manage.py run_scheduler`` (its hint dispatcher)
celery             ``celery -A bench.peers.celery_alone worker -c 8 --prefetch-multiplier 64`` x 2
procrastinate      ``procrastinate worker --concurrency 8`` x 2, async task, pool of 9
pgqueuer           ``pgqueuer.run(main, batch_size=4, max_concurrent_tasks=8)`` x 2 on asyncpg,
                   after ``pgq autovac`` (``bench/peers/pgqueuer_soak.py``)
=================  ===========================================================================

The two Django peers have no in-process concurrency (one task at a time per process), so they
appear in the same-shape table only.

**Same shape** (:data:`SAME`, not the headline): "N workers" means N worker *processes*, each
running one job at a time (for the prefork pools, one parent with N pool processes):

=================  ===========================================================================
tenure             ``manage.py run_executor --concurrency 1`` x N (broker-less, LISTEN/NOTIFY)
tenure-celery      ``celery -A config worker -c N`` (prefork) + ``manage.py run_scheduler``
celery             ``celery -A bench.peers.celery_alone worker -c N``: Celery alone, no database
procrastinate      ``procrastinate worker --concurrency 1`` x N
django-tasks-db    ``django-admin db_worker`` x N (its defaults: polls every 1 s when idle)
django-q2          ``django-admin qcluster`` with ``workers=N`` (ORM broker, its defaults)
pgqueuer           ``pgqueuer.run(main, batch_size=1, max_concurrent_tasks=2)`` x N (psycopg)
=================  ===========================================================================
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from . import untraced
from .common import (
    BIN,
    PYTHON,
    REDIS_URL,
    ROOT,
    VAR,
    base_env,
    compile_bytecode,
    connect,
    dsn,
    recreate_database,
)

BROKER_PREFIX = "bench-"

SAME = "same"
"""The same-shape configuration: N processes, one job at a time each (not the headline)."""
BEST = "best"
"""Each system at its best: :data:`BEST_PROCESSES` x :data:`BEST_CONCURRENCY` (the headline)."""
SHAPES = (BEST, SAME)

BEST_PROCESSES = 2
"""Worker processes of every system at its best."""
BEST_CONCURRENCY = 8
"""Jobs each of those processes may run at once."""
CELERY_SHORT_TASK_PREFETCH = 64
"""Celery's prefetch multiplier for many short tasks: its optimizing guide's "Say 64, or 128";
64 x 8 pool processes x 2 workers = 1,024 reserved messages, so both workers get a share of the
quick profile's drain."""


@dataclass
class System:
    """One system: how to install it, empty it, run N workers and count finished jobs."""

    key: str
    label: str
    db: str | None
    bulk: bool = True
    """Whether it has a bulk enqueue (one statement or one transaction for many jobs)."""
    is_tenure: bool = False
    broker: bool = False
    """Whether jobs travel as broker messages (published before the workers start)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    shape: str = SAME
    """:data:`SAME` or :data:`BEST`."""
    concurrency: int = 1
    """Jobs one worker process runs at once (the pool size, for Celery's prefork workers)."""
    settings: str = ""
    """What the report states besides the commands: the settings that shape the drain."""
    root: Path = ROOT
    """The checkout whose code the system's processes run (another revision's, for
    :class:`TenureBefore`)."""

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of this system's processes."""
        return base_env(**{**self.extra_env, **extra})

    def install(self) -> None:
        """Create the database and the system's schema."""
        raise NotImplementedError

    def reset(self) -> None:
        """Remove every job and result, so the next measurement starts empty."""
        raise NotImplementedError

    def worker_cmds(self, n: int) -> list[list[str]]:
        """Commands that together make ``n`` workers."""
        raise NotImplementedError

    def worker_env(self, n: int) -> dict[str, str]:
        """Extra environment of the workers for ``n`` workers."""
        return {}

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        """How many of the ``total`` enqueued jobs have finished."""
        raise NotImplementedError

    def describe(self, n: int) -> str:
        """The exact configuration of ``n`` workers, for the report: each distinct command
        with how many times it runs, the environment that differs between systems, and
        :attr:`settings`."""
        cmds = self.worker_cmds(n)
        parts = []
        for cmd in dict.fromkeys(tuple(c) for c in cmds):
            shown = [Path(cmd[0]).name if i == 0 else a for i, a in enumerate(cmd)]
            count = sum(1 for c in cmds if tuple(c) == cmd)
            parts.append(f"{count} x `{shlex.join(shown)}`")
        env = {**self.extra_env, **self.worker_env(n)}
        shown_env = {
            k: v
            for k, v in env.items()
            if k.startswith(("TENURE_", "BENCH_SHAPE", "BENCH_WORKERS", "DJANGO_SETTINGS"))
        }
        text = " + ".join(parts)
        if shown_env:
            text += " with " + ", ".join(f"`{k}={v}`" for k, v in sorted(shown_env.items()))
        return f"{text}; {self.settings}" if self.settings else text

    def agent(self, action: str, *args: str) -> list[str]:
        """The command running ``bench.agent`` for this system."""
        return [PYTHON, "-m", "bench.agent", self.key, action, *args]

    def _run(self, cmd: list[str], **extra: str) -> None:
        subprocess.run(cmd, env=self.env(**extra), cwd=self.root, check=True, capture_output=True)

    def _truncate(self, tables: str) -> None:
        assert self.db
        with connect(self.db) as conn:
            conn.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
            conn.execute(f"VACUUM ANALYZE {tables.split(',')[0].strip()}")

    def _count(self, conn: psycopg.Connection[Any] | None, sql: str) -> int:
        assert conn is not None
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def _celery_workers(
    app: str, queue: str, n: int, name: str, shape: str, concurrency: int
) -> list[list[str]]:
    """One prefork worker with ``n`` pool processes (same shape), or ``n`` workers of
    ``concurrency`` pool processes each with the short-task prefetch (at their best)."""
    if shape == SAME:
        return [_celery_cmd(app, queue, n, name)]
    return [
        _celery_cmd(app, queue, concurrency, f"{name}-{i + 1}", CELERY_SHORT_TASK_PREFETCH)
        for i in range(n)
    ]


CELERY_SETTINGS = (
    "JSON, late acknowledgement (a message is acknowledged after its task ran), no results; "
    "gossip, mingle and heartbeat off"
)


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def _clear_broker_queue(queue: str) -> None:
    r = _redis()
    r.delete(queue, "unacked", "unacked_index", f"_kombu.binding.{queue}")


def _celery_cmd(app: str, queue: str, n: int, name: str, prefetch: int = 1) -> list[str]:
    return [
        str(BIN / "celery"),
        "-A",
        app,
        "worker",
        "-Q",
        queue,
        "-c",
        str(n),
        "--pool",
        "prefork",
        "--prefetch-multiplier",
        str(prefetch),
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        "WARNING",
        "-n",
        f"{name}@%h",
    ]


class Tenure(System):
    """Tenure's broker-less executor."""

    def __init__(
        self, key: str = "tenure", db: str = "bench_tenure", shape: str = SAME, **env: str
    ) -> None:
        super().__init__(
            key=key,
            label="Tenure (broker-less)" if key == "tenure" else "Tenure (Celery executor)",
            db=db,
            is_tenure=True,
            shape=shape,
            concurrency=BEST_CONCURRENCY if shape == BEST else 1,
            settings=(
                "handlers on threads; every other setting at its default (finished jobs kept)"
                + (
                    "; the example project loads no broker client with this transport "
                    "(neither Celery's app nor django-rq, config/__init__.py)"
                    if env.get("TENURE_TRANSPORT", "polling") == "polling"
                    else ""
                )
            ),
            extra_env={
                "DATABASE_URL": dsn(db),
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "TENURE_JOB_MODULES": "bench.tenure_jobs",
                "TENURE_TRANSPORT": "polling",
                "TENURE_LOG_LEVEL": "WARNING",
                **env,
            },
        )

    def install(self) -> None:
        assert self.db
        recreate_database(self.db)
        self._run([PYTHON, "manage.py", "migrate", "-v0"])

    tables = (
        "tenure_job, tenure_job_spec, tenure_attempt, tenure_effect, tenure_effect_event, "
        "tenure_executor, tenure_stale_write, tenure_audit, tenure_open_attempt"
    )
    """What :meth:`reset` empties (the spec table has no foreign key to cascade from)."""

    def reset(self) -> None:
        self._truncate(self.tables)

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [self.executor_cmd(self.concurrency)] * n

    def executor_cmd(self, concurrency: int) -> list[str]:
        """One broker-less executor process running ``concurrency`` jobs at a time."""
        return [
            PYTHON,
            "manage.py",
            "run_executor",
            "--queues",
            "default",
            "--concurrency",
            str(concurrency),
        ]

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        return self._count(conn, "SELECT count(*) FROM tenure_job WHERE state = 'succeeded'")

    def scheduler_cmd(self) -> list[str]:
        """The maintenance loop (reaper) for the recovery workload."""
        return [PYTHON, "manage.py", "run_scheduler"]


class TenureAsync(Tenure):
    """Tenure's broker-less executor running an ``async def`` no-op (``bench.noop_async``),
    on a database of its own: what awaiting a coroutine costs a job against the plain no-op."""

    def __init__(self, shape: str = BEST) -> None:
        super().__init__(key="tenure-async", db="bench_tenure_async", shape=shape)
        self.label = "Tenure (broker-less), async def no-op"


BEFORE_LIMITS = "f307417"
"""The last revision before queue pause and limits entered the claim (``tenure_queue`` and
the claim's gate came with the next commit): what "an unlimited queue costs the same as
before" is measured against."""


class TenureBefore(Tenure):
    """Tenure's broker-less executor at :data:`BEFORE_LIMITS`, run from that revision's
    files (``git archive`` into ``var/bench-before/``), on a database of its own."""

    def __init__(
        self,
        shape: str = BEST,
        rev: str = BEFORE_LIMITS,
        *,
        key: str = "tenure-before",
        before: str = "queue limits",
        root: Path | None = None,
    ) -> None:
        super().__init__(key=key, db="bench_" + key.replace("-", "_"), shape=shape)
        self.label = f"Tenure (broker-less) at {rev}, before {before}"
        if root is None:
            # That revision's example project loads Celery's app and django-rq whatever the
            # transport: its start-up is not this checkout's.
            self.settings = (
                "handlers on threads; every other setting at its default (finished jobs "
                "kept); that revision's example project, which loads Celery's app and "
                "django-rq whatever the transport"
            )
        self.rev = rev
        self.root = root or VAR / "bench-before" / rev
        # That revision's modules, and only those: bench/hooks/sitecustomize.py takes this
        # checkout's editable install off the import machinery.
        self.extra_env["PYTHONPATH"] = f"{ROOT / 'bench' / 'hooks'}:{self.root}"
        self.extra_env["BENCH_PATH_ONLY"] = "1"

    def agent(self, action: str, *args: str) -> list[str]:
        # That revision's bench.agent knows Tenure's systems by the key "tenure".
        return [PYTHON, "-m", "bench.agent", "tenure", action, *args]

    def install(self) -> None:
        if not (self.root / "manage.py").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", self.rev], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(self.root)], input=archive, check=True)
        self.prepare()
        compile_bytecode(self.root)
        super().install()

    def prepare(self) -> None:
        """Change the revision's files before they are compiled (nothing here)."""

    # That revision's schema has no spec table (migration 0012 came after it), nor the table
    # of open attempts (0017).
    tables = Tenure.tables.replace("tenure_job_spec, ", "").replace(", tenure_open_attempt", "")


class TenureUntraced(TenureBefore):
    """Tenure's broker-less executor from this checkout's committed files (``git archive HEAD``
    into ``var/bench-untraced/<rev>/``) with every tracing and signal hook of the job path
    emptied (:mod:`bench.untraced`): what "tracing off costs nothing" is measured against, a
    baseline that differs from the checkout by those hooks alone."""

    def __init__(self, shape: str = BEST) -> None:
        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
            ).stdout.strip()

        # The checkout's own system runs its working files, the baseline its commit: with
        # changes not committed, the two would differ by more than the hooks.
        changed = git("status", "--porcelain", "--", "scheduler_core", "config")
        if changed:
            raise SystemExit(
                "bench: commit the changes to scheduler_core/ and config/ first; the "
                f"untraced baseline is built from HEAD:\n{changed}"
            )
        rev = git("rev-parse", "--short", "HEAD")
        # This checkout's files, so this checkout's settings (Tenure's, kept).
        super().__init__(
            shape=shape, rev=rev, key="tenure-untraced", root=VAR / "bench-untraced" / rev
        )
        self.label = f"Tenure (broker-less) at {rev}, its tracing and signal hooks emptied"

    def prepare(self) -> None:
        untraced.strip(self.root)

    tables = Tenure.tables


class TenureOtelOn(Tenure):
    """Tenure's broker-less executor with OpenTelemetry on: the SDK's tracer provider set in
    every process (:mod:`bench.otel_on`), so each enqueue, attempt and effect makes its span
    and each job carries its trace context, on a database of its own."""

    def __init__(self, shape: str = BEST) -> None:
        super().__init__(
            key="tenure-otel",
            db="bench_tenure_otel",
            shape=shape,
            TENURE_JOB_MODULES="bench.tenure_jobs,bench.otel_on",
        )
        self.label = "Tenure (broker-less), OpenTelemetry on"
        self.settings += (
            "; the OpenTelemetry SDK's tracer provider, a batch span processor and an exporter "
            "that drops the spans (bench/otel_on.py)"
        )

    def agent(self, action: str, *args: str) -> list[str]:
        # The agent enqueues as Tenure's does; its environment loads the provider too.
        return [PYTHON, "-m", "bench.agent", "tenure", action, *args]


class TenureBesideLimited(Tenure):
    """Tenure's broker-less executor draining ``default``, an unlimited queue, while the
    database holds a paused queue and a limited one (the claim's gate has rows to consult)."""

    def __init__(self, shape: str = BEST) -> None:
        super().__init__(key="tenure-beside-limited", db="bench_tenure_limited", shape=shape)
        self.label = "Tenure (broker-less), beside a paused and a limited queue"

    def reset(self) -> None:
        super().reset()
        with connect(self.db or "") as conn:
            conn.execute("DELETE FROM tenure_queue")
            conn.execute(
                "INSERT INTO tenure_queue (name, paused, paused_by, paused_reason, paused_at,"
                " max_leased, max_per_second, tokens, tokens_at, version, updated_at) VALUES"
                " ('billing', true, 'bench', 'bench', now(), NULL, NULL, 0, NULL, 1, now()),"
                " ('reports', false, '', '', NULL, 2, 5.0, 0, NULL, 1, now())"
            )


class TenureCelery(Tenure):
    """Tenure's Celery executor on Redis."""

    def __init__(self, shape: str = SAME) -> None:
        super().__init__(
            key="tenure-celery",
            db="bench_tenure_celery",
            shape=shape,
            TENURE_TRANSPORT="celery",
            CELERY_BROKER_URL=REDIS_URL,
            TENURE_BROKER_QUEUE_PREFIX=BROKER_PREFIX,
        )
        self.broker = True
        self.settings = (
            f"Redis broker; Tenure's Celery app ({CELERY_SETTINGS}); the chain and commit "
            "window at their defaults (`TENURE_CELERY_CHAIN_SECONDS=1`, "
            "`TENURE_CELERY_COMMIT_WINDOW=0.05`); `run_scheduler` (reaper and hint "
            "dispatcher, required with Celery) with its defaults"
        )

    def reset(self) -> None:
        super().reset()
        _clear_broker_queue(f"{BROKER_PREFIX}default")

    def worker_cmds(self, n: int) -> list[list[str]]:
        # ``run_scheduler`` is part of a Celery deployment (docs/transports.md: "with Celery or
        # RQ it is required"): jobs enqueued before any worker has registered its queue get
        # no message at enqueue, and its dispatcher hints them once one has.
        workers = _celery_workers(
            "config", f"{BROKER_PREFIX}default", n, "bench-tenure", self.shape, self.concurrency
        )
        return [*workers, self.scheduler_cmd()]


class CeleryAlone(System):
    """Celery on the same Redis with a task that does nothing: the transport's ceiling."""

    QUEUE = f"{BROKER_PREFIX}alone"

    def __init__(self, shape: str = SAME) -> None:
        super().__init__(
            key="celery",
            label="Celery alone (Redis, no database)",
            db=None,
            bulk=False,
            broker=True,
            shape=shape,
            concurrency=BEST_CONCURRENCY if shape == BEST else 1,
            settings=f"Redis broker; {CELERY_SETTINGS}; a task that does nothing",
            extra_env={"CELERY_BROKER_URL": REDIS_URL},
        )

    def install(self) -> None:
        _redis().ping()

    def reset(self) -> None:
        _clear_broker_queue(self.QUEUE)

    def worker_cmds(self, n: int) -> list[list[str]]:
        return _celery_workers(
            "bench.peers.celery_alone", self.QUEUE, n, "bench-alone", self.shape, self.concurrency
        )

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        # Messages still queued or delivered but not yet acknowledged (late ack: after the
        # task ran) are the ones not done.
        r = _redis()
        return total - int(r.llen(self.QUEUE)) - int(r.hlen("unacked"))


class Procrastinate(System):
    """The asyncio worker queue with a PL/pgSQL claim."""

    def __init__(self, shape: str = SAME) -> None:
        db = "bench_procrastinate"
        best = shape == BEST
        super().__init__(
            key="procrastinate",
            label="procrastinate",
            db=db,
            shape=shape,
            concurrency=BEST_CONCURRENCY if best else 1,
            settings=(
                "an async task; the psycopg pool sized to the concurrency plus one "
                f"(`min_size=max_size={BEST_CONCURRENCY + 1}`, its pool-size guidance for "
                "short jobs); every other worker option at its default (LISTEN/NOTIFY, "
                "finished jobs kept)"
                if best
                else "a sync task; every worker option at its default (psycopg pool of 4, "
                "LISTEN/NOTIFY, finished jobs kept)"
            ),
            extra_env={"BENCH_DSN": dsn(db), **({"BENCH_SHAPE": BEST} if best else {})},
        )
        self.app = (
            "bench.peers.procrastinate_best.app" if best else "bench.peers.procrastinate_app.app"
        )

    def install(self) -> None:
        assert self.db
        recreate_database(self.db)
        self._run(
            [
                str(BIN / "procrastinate"),
                "--app",
                "bench.peers.procrastinate_app.app",
                "schema",
                "--apply",
            ]
        )

    def reset(self) -> None:
        self._truncate(
            "procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers, "
            "procrastinate_workers"
        )

    def worker_cmds(self, n: int) -> list[list[str]]:
        cmd = [
            str(BIN / "procrastinate"),
            "--app",
            self.app,
            "--log-level",
            "warning",
            "worker",
            "--concurrency",
            str(self.concurrency),
        ]
        return [cmd] * n

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        return self._count(
            conn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )


class DjangoPeer(System):
    """Base of the two Django-based peers (own settings module, own database)."""

    def __init__(self, key: str, label: str, db: str, bulk: bool) -> None:
        super().__init__(
            key=key,
            label=label,
            db=db,
            bulk=bulk,
            extra_env={"DJANGO_SETTINGS_MODULE": "bench.peers.django_settings", "BENCH_DB": db},
        )

    def install(self) -> None:
        assert self.db
        recreate_database(self.db)
        self._run([PYTHON, "-m", "django", "migrate", "-v0"])


class DjangoTasksDb(DjangoPeer):
    """The database backend of the task framework backport."""

    def __init__(self) -> None:
        super().__init__("django-tasks-db", "django-tasks-db", "bench_djtasks", bulk=True)
        self.settings = "one task at a time per process; every option at its default"

    def reset(self) -> None:
        self._truncate("django_tasks_database_dbtaskresult")

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [[PYTHON, "-m", "django", "db_worker", "--queue-name", "default", "-v0"]] * n

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        return self._count(
            conn,
            "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'",
        )


class DjangoQ2(DjangoPeer):
    """The multiprocessing cluster on its ORM broker."""

    def __init__(self) -> None:
        super().__init__("django-q2", "django-q2 (ORM broker)", "bench_djq", bulk=True)
        self.settings = (
            "one cluster of `workers=N` processes on its ORM broker (`bench/peers/"
            "django_settings.py`), every other option at its default"
        )

    def reset(self) -> None:
        self._truncate("django_q_ormq, django_q_task")

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [[PYTHON, "-m", "django", "qcluster"]]

    def worker_env(self, n: int) -> dict[str, str]:
        return {"BENCH_WORKERS": str(n)}

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        # The broker's row is deleted when the cluster acknowledges the finished task.
        return total - self._count(conn, "SELECT count(*) FROM django_q_ormq")


class PgQueuer(System):
    """The asyncio queue with batched claims and buffered completion."""

    def __init__(self, shape: str = SAME) -> None:
        best = shape == BEST
        # At its best it runs on a database of its own: its table settings differ.
        db = "bench_pgqueuer_best" if best else "bench_pgqueuer"
        super().__init__(
            key="pgqueuer",
            label="pgqueuer (asyncpg)" if best else "pgqueuer (psycopg)",
            db=db,
            shape=shape,
            concurrency=BEST_CONCURRENCY if best else 2,
            settings=(
                "each process `pgqueuer.run(main, batch_size=4, max_concurrent_tasks=8, "
                "dequeue_timeout=30 s)` (what `pgq run ... --batch-size 4 "
                "--max-concurrent-tasks 8` does) on the asyncpg driver, one dedicated "
                "connection per worker, an async entrypoint; `pgq install` then `pgq autovac` "
                "(its per-table autovacuum settings and fillfactor 70 on its queue table); "
                "durability `durable` (its default)"
                if best
                else "each process `pgqueuer.run(main, batch_size=1, max_concurrent_tasks=2, "
                "dequeue_timeout=30 s)` on the psycopg driver: one job per dequeue (at most "
                "two held: it refuses a cap below twice the batch); `pgq install` only, every "
                "other option at its default"
            ),
            extra_env={"BENCH_DSN": dsn(db), "PGDSN": dsn(db)},
        )

    def install(self) -> None:
        assert self.db
        recreate_database(self.db)
        self._run([str(BIN / "pgq"), "install"])
        if self.shape == BEST:
            # Its performance guide's checklist: "Run `pgq autovac` after installation".
            self._run([str(BIN / "pgq"), "autovac"])

    def reset(self) -> None:
        self._truncate("pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def worker_cmds(self, n: int) -> list[list[str]]:
        # ``pgq run`` of this release cannot parse its own --log-level default with the
        # command-line library pip resolves, so the same entry point is called directly.
        if self.shape == BEST:
            return [[PYTHON, "-m", "bench.peers.pgqueuer_soak"]] * n
        return [[PYTHON, "-m", "bench.peers.pgqueuer_app"]] * n

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        # A finished job's row leaves the queue table (its record goes to the log table).
        return total - self._count(conn, "SELECT count(*) FROM pgqueuer")


def all_systems(shape: str = SAME) -> dict[str, System]:
    """Every system of ``shape``, Tenure's first, in the order the report lists them (at their
    best: only those that run several jobs at once in one process)."""
    if shape == BEST:
        best: list[System] = [
            Tenure(shape=BEST),
            TenureCelery(shape=BEST),
            CeleryAlone(shape=BEST),
            Procrastinate(shape=BEST),
            PgQueuer(shape=BEST),
        ]
        return {s.key: s for s in best}
    systems: list[System] = [
        Tenure(),
        TenureCelery(),
        CeleryAlone(),
        Procrastinate(),
        DjangoTasksDb(),
        DjangoQ2(),
        PgQueuer(),
    ]
    return {s.key: s for s in systems}
