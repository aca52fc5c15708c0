"""The systems under test, each behind the same small interface.

"N workers" means the same thing for every system: N worker *processes*, each running one job
at a time (for the prefork pools, one parent with N pool processes). That is the unit a
deployment scales on a 2-core machine, and the one every system here can be given.

=================  ===========================================================================
tenure             ``manage.py run_executor --concurrency 1`` x N (broker-less, LISTEN/NOTIFY)
tenure-celery      ``celery -A config worker -c N`` (prefork): Tenure's Celery executor
celery             ``celery -A bench.peers.celery_alone worker -c N``: Celery alone, no database
procrastinate      ``procrastinate worker --concurrency 1`` x N
django-tasks-db    ``django-admin db_worker`` x N (its defaults: polls every 1 s when idle)
django-q2          ``django-admin qcluster`` with ``workers=N`` (ORM broker, its defaults)
pgqueuer           ``pgqueuer.run(main, batch_size=1, max_concurrent_tasks=2)`` x N (psycopg)
=================  ===========================================================================
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .common import BIN, PYTHON, REDIS_URL, ROOT, base_env, connect, dsn, recreate_database

BROKER_PREFIX = "bench-"


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

    def agent(self, action: str, *args: str) -> list[str]:
        """The command running ``bench.agent`` for this system."""
        return [PYTHON, "-m", "bench.agent", self.key, action, *args]

    def _run(self, cmd: list[str], **extra: str) -> None:
        subprocess.run(cmd, env=self.env(**extra), cwd=ROOT, check=True, capture_output=True)

    def _truncate(self, tables: str) -> None:
        assert self.db
        with connect(self.db) as conn:
            conn.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
            conn.execute(f"VACUUM ANALYZE {tables.split(',')[0].strip()}")

    def _count(self, conn: psycopg.Connection[Any] | None, sql: str) -> int:
        assert conn is not None
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def _clear_broker_queue(queue: str) -> None:
    r = _redis()
    r.delete(queue, "unacked", "unacked_index", f"_kombu.binding.{queue}")


def _celery_cmd(app: str, queue: str, n: int, name: str) -> list[str]:
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
        "1",
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

    def __init__(self, key: str = "tenure", db: str = "bench_tenure", **env: str) -> None:
        super().__init__(
            key=key,
            label="Tenure (broker-less)" if key == "tenure" else "Tenure (Celery executor)",
            db=db,
            is_tenure=True,
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

    def reset(self) -> None:
        self._truncate(
            "tenure_job, tenure_attempt, tenure_effect, tenure_effect_event, tenure_executor, "
            "tenure_stale_write, tenure_audit"
        )

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [self.executor_cmd(1)] * n

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


class TenureCelery(Tenure):
    """Tenure's Celery executor on Redis."""

    def __init__(self) -> None:
        super().__init__(
            key="tenure-celery",
            db="bench_tenure_celery",
            TENURE_TRANSPORT="celery",
            CELERY_BROKER_URL=REDIS_URL,
            TENURE_BROKER_QUEUE_PREFIX=BROKER_PREFIX,
        )
        self.broker = True

    def reset(self) -> None:
        super().reset()
        _clear_broker_queue(f"{BROKER_PREFIX}default")

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [_celery_cmd("config", f"{BROKER_PREFIX}default", n, "bench-tenure")]


class CeleryAlone(System):
    """Celery on the same Redis with a task that does nothing: the transport's ceiling."""

    QUEUE = f"{BROKER_PREFIX}alone"

    def __init__(self) -> None:
        super().__init__(
            key="celery",
            label="Celery alone (Redis, no database)",
            db=None,
            bulk=False,
            broker=True,
            extra_env={"CELERY_BROKER_URL": REDIS_URL},
        )

    def install(self) -> None:
        _redis().ping()

    def reset(self) -> None:
        _clear_broker_queue(self.QUEUE)

    def worker_cmds(self, n: int) -> list[list[str]]:
        return [_celery_cmd("bench.peers.celery_alone", self.QUEUE, n, "bench-alone")]

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        # Messages still queued or delivered but not yet acknowledged (late ack: after the
        # task ran) are the ones not done.
        r = _redis()
        return total - int(r.llen(self.QUEUE)) - int(r.hlen("unacked"))


class Procrastinate(System):
    """The asyncio worker queue with a PL/pgSQL claim."""

    def __init__(self) -> None:
        db = "bench_procrastinate"
        super().__init__(
            key="procrastinate", label="procrastinate", db=db, extra_env={"BENCH_DSN": dsn(db)}
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
            "bench.peers.procrastinate_app.app",
            "--log-level",
            "warning",
            "worker",
            "--concurrency",
            "1",
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

    def __init__(self) -> None:
        db = "bench_pgqueuer"
        super().__init__(
            key="pgqueuer",
            label="pgqueuer (psycopg)",
            db=db,
            extra_env={"BENCH_DSN": dsn(db), "PGDSN": dsn(db)},
        )

    def install(self) -> None:
        assert self.db
        recreate_database(self.db)
        self._run([str(BIN / "pgq"), "install"])

    def reset(self) -> None:
        self._truncate("pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def worker_cmds(self, n: int) -> list[list[str]]:
        # ``pgq run`` of this release cannot parse its own --log-level default with the
        # command-line library pip resolves, so the same entry point is called directly.
        return [[PYTHON, "-m", "bench.peers.pgqueuer_app"]] * n

    def done(self, conn: psycopg.Connection[Any] | None, total: int) -> int:
        # A finished job's row leaves the queue table (its record goes to the log table).
        return total - self._count(conn, "SELECT count(*) FROM pgqueuer")


def all_systems() -> dict[str, System]:
    """Every system, Tenure's first, in the order the report lists them."""
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
