"""Tenure's settings, read in one typed place with defaults.

Each value may be set in Django settings as ``TENURE_<NAME>`` (for example
``TENURE_DEFAULT_LEASE_SECONDS = 60``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed


@dataclass(frozen=True, kw_only=True)
class TenureSettings:
    """Every knob, with the default that ships."""

    DRIVER: str = ""
    """The storage driver class (a dotted path) to use instead of the one for the database's
    vendor (``scheduler_core.storage.drivers``); empty for that one."""
    TRANSPORT: str = "polling"
    """How executors learn about due work: ``polling`` (broker-less), ``celery`` or ``rq``."""
    DATABASE: str = "default"
    """The ``DATABASES`` alias that holds Tenure's tables; every read and write of Tenure's
    goes there (:mod:`scheduler_core.db`). Read once per process."""
    LOCK_TIMEOUT_MS: int = 10_000
    """PostgreSQL: ``lock_timeout`` of every connection to Tenure's database whose own is 0
    (none), so a write blocked behind another session's lock fails and is retried instead of
    hanging while its lease runs out (:mod:`scheduler_core.storage.connection_settings`)."""
    IDLE_IN_TRANSACTION_TIMEOUT_MS: int = 60_000
    """PostgreSQL: ``idle_in_transaction_session_timeout`` of every connection to Tenure's
    database whose own is 0 (none); executors set a shorter one for their own connections
    (``EXECUTOR_IDLE_TX_TIMEOUT_MS``)."""
    SQLITE_BUSY_TIMEOUT_MS: int = 30_000
    """SQLite: the least busy timeout of a connection to Tenure's database (raised to this
    when lower), so a writer waits for the write lock instead of failing at once."""
    METRICS_TOKEN: str = ""
    """A bearer token that may read ``/metrics`` (``Authorization: Bearer <token>``), for a
    Prometheus scraper. Empty: only logged-in users with ``scheduler_core.view_job`` may."""
    MAX_RETURN_VALUE_BYTES: int = 64 * 1024
    """The largest return value a job's handler (``@job`` or a ``django.tasks`` task) may have
    kept as its result, as JSON in bytes; a larger one fails the attempt with
    :class:`~scheduler_core.exceptions.InvalidResult` (:mod:`scheduler_core.api.results`)."""
    DEFAULT_QUEUE: str = "default"
    """The queue of a job type that names none (``@job(queue=...)``)."""
    DEFAULT_LEASE_SECONDS: int = 30
    """The lease of a job type that declares none (``@job(lease_seconds=...)``): how long a
    claim holds the job before it must be renewed, and so how long a dead executor's job waits
    for the reaper."""
    DEFAULT_MAX_ATTEMPTS: int = 5
    """The attempts of a job type that declares none (``@job(max_attempts=...)``)."""
    DEFAULT_TIMEOUT_SECONDS: float = 600.0
    """Maximum runtime of one attempt for job types that declare none (``@job(timeout=...)``).
    Past it the attempt may not renew its lease, complete or start an effect, shows as
    ``overrunning``, and the reaper moves the job on once its lease runs out: a hung handler
    is never renewed forever."""
    MAX_TIMEOUT_SECONDS: float = 7 * 24 * 3600.0
    """The longest maximum runtime a job type may declare."""
    MAX_LEASE_SECONDS: int = 24 * 3600
    """The longest lease a job type may declare."""
    MAX_ATTEMPTS_LIMIT: int = 1000
    """The most attempts a job type may declare."""
    MAX_PAYLOAD_BYTES: int = 256 * 1024
    """The largest payload an enqueue accepts, as JSON; a larger one is refused."""
    MAX_PAYLOAD_DEPTH: int = 32
    """The deepest nesting of lists and objects a payload may have."""
    MAX_RUN_AT_DAYS: int = 3660
    """How far ahead an enqueue's ``run_at`` may be, in days."""
    REAP_GRACE_SECONDS: float = 2.0
    """An expired lease is reaped only after this extra time, so a late heartbeat can land."""
    HEARTBEAT_FRACTION: float = 1 / 3
    """Heartbeats are sent every ``lease_seconds * HEARTBEAT_FRACTION``."""
    POLL_INTERVAL: float = 0.5
    """Broker-less executor: seconds between polls when no wake-up arrives."""
    CLAIM_FLOOR_MARGIN_SECONDS: float = 0.1
    """PostgreSQL: a process's claims of a queue seek to just below the oldest due time it last
    claimed there, less this margin (``storage/floors.py``). An enqueue that commits later than
    that lowers the floor through its wake-up; each claim walks the entries of the margin, which
    a held snapshot keeps (at 2 s and 300 jobs/s, about 600 of them and 4 ms per claim)."""
    CLAIM_FULL_SCAN_SECONDS: float = 5.0
    """PostgreSQL: however its floors stand, a process reads each queue's claim index from the
    start at least this often (a job below the floors, left by a claim rolled back elsewhere,
    waits at most this long)."""
    EXECUTOR_GROUP_COMMIT: bool = True
    """Broker-less executor: the successful completions of a process's threads (jobs that are
    not ``transactional``) are written together, with the claim of the threads' next jobs, in
    one statement and one commit. A completion then waits at most for the write under way; a
    process killed before the write commits loses it and the job runs again once its lease
    expires (``docs/guarantees.md``, "Completions written together"). False: each thread
    commits its own completion with its next claim."""
    SHUTDOWN_GRACE_SECONDS: float = 10.0
    """On SIGTERM an executor stops claiming and waits this long before releasing its jobs."""
    SWEEP_INTERVAL: float = 1.0
    """run_scheduler: seconds between maintenance rounds."""
    CELERY_CHAIN_SECONDS: float = 1.0
    """Celery executor: after a message's job succeeds, claim the next due jobs of the same queue
    in that completion's transaction and run them in the same task, for up to this many seconds
    per message (0: one job per message). The messages of jobs taken this way are dropped at
    the claim, as duplicates are (:mod:`scheduler_core.runtime.chain`)."""
    CELERY_COMMIT_WINDOW: float = 0.05
    """Celery executor: within a chain, a successful completion may wait up to this many seconds
    to commit with the next ones in one statement; once they have passed, the pool process's
    warden writes it even while a later handler runs (on SQLite a ``transactional`` handler
    delays it until it ends). 0 commits each on its own. A process killed meanwhile loses those
    completions: the jobs run again once their leases expire. ``transactional`` jobs always
    commit with their handler."""
    CELERY_QUEUED_HOLD_SECONDS: float = 2.0
    """Celery executor: jobs a chain claimed for its batch wait in the pool process while the
    job before them runs; once that handler has run this long they are given back (waiting
    again at once, no attempt spent), so a slow or hung handler never holds them."""
    REDISPATCH_AFTER_SECONDS: float = 10.0
    """The dispatcher re-sends a broker hint for a due job not claimed this long after the last."""
    BROKER_QUEUE_PREFIX: str = ""
    """Prefix of every queue's name on the broker (Celery and RQ): a worker serves
    ``<prefix><queue>``, so deployments or test runs sharing one broker never take each
    other's hints."""
    BROKER_QUEUES: tuple[str, ...] = ()
    """With a broker transport: the queues announced through the broker (empty: every queue).
    Queues left out get no broker message; broker-less executors (``run_executor``) serve
    them from the database, so one deployment can run some queues on Celery or RQ and the
    rest without a broker."""
    EXECUTOR_IDLE_TX_TIMEOUT_MS: int = 2000
    """PostgreSQL: an executor's own transactions (completion, next claim, renewal, ledger
    writes) are ended by the server once idle this long, so an executor frozen mid-transaction
    (stopped, cut off) frees the job rows it locked and the reaper can rescue them on time.
    Set on executor connections only; 0 leaves the server's setting."""
    PREPARED_STATEMENTS: bool = True
    """PostgreSQL: send the claim and the completion, the statements every job runs, as
    prepared statements (planned once per connection). Turn off behind a connection pooler
    that cannot carry prepared statements across the transactions of one client."""
    REPLAN_SECONDS: float = 30.0
    """PostgreSQL: each connection that claims makes every plan it keeps afresh at least this
    often (its prepared statements and the server's checks of the attempt's and the ledger's
    keys). A plan is otherwise kept until the server's statistics of the table change: one made
    while the table was nearly empty and not yet analysed (a new installation, a fresh start)
    scanned the whole table on every claim and completion (12 to 43 ms in a soak's first
    minute), and the key checks read it once per attempt and per effect. 0 plans every
    statement afresh."""
    HANDLER_IDLE_TX_TIMEOUT_MS: int = 60_000
    """The same limit inside a ``transactional`` job's own transaction, where the handler may
    work between statements (0: no limit). Such a transaction takes no lock on the job row."""
    RETAIN_SUCCEEDED_SECONDS: float = 7 * 24 * 3600.0
    """``run_scheduler`` deletes succeeded jobs (with their attempts and ledger rows) this long
    after they finished; 0 keeps them forever. A job's ``unique_key`` deduplicates enqueues
    only while the job is kept."""
    RETAIN_FAILED_SECONDS: float = 30 * 24 * 3600.0
    """The same for failed jobs; 0 keeps them forever. Jobs an operator acted on, and
    indeterminate jobs, are never deleted."""
    HISTORY_KEEP_SECONDS: float = 2 * 24 * 3600.0
    """How long the console's per-minute history (``MinuteStats``) is kept: its charts show the
    last hour and the last day."""
    PRUNE_BATCH: int = 1000
    """The most jobs of each state one maintenance round deletes."""
    COUNTS_REFRESH_SECONDS: float = 30.0
    """How often ``run_scheduler`` refreshes the count of succeeded and cancelled jobs the
    dashboard shows once the job table is too big to count on every page load."""
    INDEX_UPKEEP_SECONDS: float = 600.0
    """run_scheduler, PostgreSQL: how often to look for an index of Tenure's tables that vacuum
    has emptied but cannot shrink, and rebuild it (``REINDEX INDEX CONCURRENTLY``, in a thread
    of its own, never while a snapshot older than a minute is held), after compacting the
    tables (``TABLE_COMPACTION``); 0: never (:mod:`scheduler_core.services.indexes`)."""
    TABLE_COMPACTION: bool = True
    """run_scheduler, PostgreSQL, at each look of the index upkeep (``INDEX_UPKEEP_SECONDS``):
    move the rows of a table's last pages into the holes vacuum left before them, every value
    unchanged, so that vacuum gives the emptied pages back (:mod:`scheduler_core.services.tables`).
    Each moved row is an update a logical-replication or change-data consumer of Tenure's tables
    receives; False: never."""
    EXACT_COUNTS_BELOW: int = 200_000
    """Below this many jobs (the database's estimate) the dashboard counts succeeded jobs
    exactly on each load; above, it shows the last refreshed count and its age."""
    EXECUTOR_STALE_SECONDS: float = 30.0
    """An executor (or ``run_scheduler``) whose liveness row was not beaten for this long is
    not live: not a consumer of any queue, shown as "stopped responding". Never less than
    three beats (:func:`executor_stale_seconds`)."""
    EXECUTOR_BEAT_SECONDS: float = 2.0
    """How often an executor beats its liveness row (from its heartbeat thread)."""
    STUCK_AFTER_SECONDS: float = 60.0
    """A due job of a queue that is not paused, still waiting this long after its ``run_at``,
    shows as stuck (``scheduler_core.read.health``)."""
    FAILING_REPEATEDLY_ATTEMPTS: int = 3
    """An unfinished job with at least this many failed attempts shows as failing repeatedly."""
    SCHEDULE_MISFIRE_GRACE_SECONDS: float = 60.0
    """A schedule occurrence found later than this after its time is late (misfire policy)."""
    BACKOFF_BASE_SECONDS: float = 1.0
    """The backoff's base for a job type that declares no ``backoff_base``: the wait after
    attempt ``n`` is at most ``base * 2 ** (n - 1)``, jittered down, and at most the cap
    (:class:`scheduler_core.domain.retry.RetryPolicy`)."""
    BACKOFF_CAP_SECONDS: float = 3600.0
    """The longest retry delay of a job type that declares no ``backoff_cap``."""
    TRACEBACK_MAX_CHARS: int = 8000
    """How much of a failed attempt's traceback is kept (its end)."""
    INSTALLATION_ID: str = ""
    """This installation's name in new effect keys (``tenure2:<id>:<job>:<created>:<effect>``);
    1..40 letters, digits, ``.``, ``_`` or ``-``. Empty: the id made once for this database
    (``Installation``), which ``manage.py installation regenerate`` replaces for a copy of the
    database. Set, it is the operator's to keep unique: every copy of the database needs a
    value of its own, and ``installation regenerate`` is refused. The start-up check
    ``tenure.W024`` compares the database's identity with the one recorded either way, and with
    the setting in force says that the value must be this copy's own. An effect keeps the key it
    was first recorded with."""
    JOB_MODULES: tuple[str, ...] = ()
    """Extra modules defining jobs, imported at start-up besides every app's ``jobs.py``."""
    OTEL: bool = True
    """Make OpenTelemetry spans for enqueues, attempts and effects once the application has set
    a tracer provider (with the ``tenure[otel]`` extra installed; ``docs/reference/tracing.md``).
    False: none, and no trace context is stored with new jobs."""


def _from_env(raw: str, default: Any) -> Any:
    """Coerce an environment string to the type of the field's default."""
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, tuple):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    return raw


_cached: TenureSettings | None = None


def tenure_settings() -> TenureSettings:
    """The current settings.

    Django settings win; a ``TENURE_<NAME>`` environment variable is used when the settings
    module does not set that name, so child processes can be tuned without a settings file.

    Read once and cached, because executors ask on every claim and write; the cache is dropped
    whenever Django reports a changed setting (``override_settings``, the test ``settings``
    fixture) and by :func:`reload`, which code that changes ``TENURE_*`` environment variables
    at run time must call.
    """
    global _cached
    cached = _cached
    if cached is None:
        cached = _cached = _read()
    return cached


def reload() -> TenureSettings:
    """Drop the cache and read settings and environment again."""
    global _cached
    _cached = None
    return tenure_settings()


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    global _cached
    if setting.startswith("TENURE_"):
        _cached = None


setting_changed.connect(_on_setting_changed, dispatch_uid="tenure.conf.cache")


def _read() -> TenureSettings:
    """Build the settings from Django settings and the environment (uncached)."""
    values: dict[str, Any] = {}
    for f in fields(TenureSettings):
        name = f"TENURE_{f.name}"
        if hasattr(django_settings, name):
            values[f.name] = getattr(django_settings, name)
        elif name in os.environ:
            try:
                values[f.name] = _from_env(os.environ[name], f.default)
            except ValueError:
                raise ValueError(
                    f"environment variable {name}={os.environ[name]!r} is invalid"
                ) from None
    return TenureSettings(**values)


def executor_stale_seconds() -> float:
    """Seconds after its last beat that an executor stops being live: ``EXECUTOR_STALE_SECONDS``,
    and never less than three beats of ``EXECUTOR_BEAT_SECONDS`` (a slow beat is not a death)."""
    s = tenure_settings()
    return max(s.EXECUTOR_STALE_SECONDS, 3 * s.EXECUTOR_BEAT_SECONDS)
