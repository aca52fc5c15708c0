"""The storage layer's contract: :class:`StorageDriver`, every operation a database's driver
offers the layers above it (the runtime, the services, the read layer, the api and the admin),
typed and grouped by concern. ``PostgresDriver`` (``storage/postgres.py``) and ``SqliteDriver``
(``storage/sqlite.py``) implement it; ``tests/storage/test_contract.py`` fails when either lacks
a member or names its parameters otherwise, and :mod:`.drivers` has the type checker hold both
classes to it.

What a driver must do: run every operation on its database alias, in the caller's transaction
where one is open; take every time that bounds a lease from the database's clock; write the
SQL its database needs in its own module of named statements (``pg_statements.py``,
``sqlite_statements.py``: no statement text is shared between two databases), the operations
the ORM writes alike on every database being assembled once (:mod:`.base`); and decide no
policy: what follows an attempt (retry, park, fail) arrives as a
:class:`~scheduler_core.domain.outcomes.Decision` made above, by the runtime and the services.

Fencing rules. A driver is the one place that writes a job's state, fence and lease. Each write
names a transition from :mod:`scheduler_core.domain.states`; the transition's source states
become the write's ``WHERE state IN (...)`` guard, and every write made on behalf of an attempt
also carries ``fence = <the attempt's fence>``. A write that matches no row raises
:class:`~scheduler_core.exceptions.StaleAttempt` (the caller stops and records the refusal with
:meth:`StorageDriver.record_stale`); nothing is ever read and then written unconditionally.
Lease times come from the database's clock (:mod:`scheduler_core.storage.clock`), never a
worker's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from django.db.models import Q

    from ..domain import outcomes, states
    from ..domain.options import JobOptions
    from ..domain.outcomes import Decision
    from ..domain.payload_search import PayloadQuery
    from ..exceptions import EffectsUnsettled, JobCancelled, StaleAttempt
    from ..models import AuditEntry, Effect, Job, Queue, Workflow
    from .records import (
        Compaction,
        Failure,
        IndexSize,
        InFlightOwner,
        InstallationRecord,
        Lease,
        PageUse,
        TableSpace,
    )
    from .workflows import NewStep, StepRow


class StorageDriver(Protocol):
    """The named operations on one database alias, for one vendor. Those that take a
    ``lease`` are fenced writes on behalf of that attempt; the others name what they touch."""

    # -- connection, transactions and capabilities ---------------------------------------------

    alias: str
    """The Django database alias every operation runs on."""
    vendor: str
    """The Django vendor this driver speaks to (``connection.vendor``)."""
    skips_locked_rows: bool
    """Candidate rows can be locked ``SKIP LOCKED`` (claimers and reapers take disjoint rows)."""
    one_writer: bool
    """The database has one write lock, held by a write transaction from its first statement."""
    has_transaction_ids: bool
    """A transaction's id can be read before ``COMMIT`` and its outcome asked afterwards."""
    now_sql: str
    """The database-clock expression for this vendor's raw SQL (``%`` escaped)."""

    @property
    def connection(self) -> Any:
        """This thread's Django connection to :attr:`alias`."""

    def atomic(self, *, savepoint: bool = True) -> AbstractContextManager[Any]:
        """A transaction (or savepoint) on :attr:`alias`; with ``savepoint`` False, inside
        another it adds nothing."""

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current transaction commits (at once outside one)."""

    def now(self) -> datetime:
        """The database's clock (an aware datetime)."""

    def transaction_id(self) -> int | None:
        """This transaction's id, assigned now (None without the capability)."""

    def transaction_status(self, xid: int) -> str | None:
        """``committed``, ``aborted`` or ``in progress`` for transaction ``xid`` (None: too old
        to tell, or no such capability)."""

    def timeline(self) -> int | None:
        """The timeline the server writes on now (None: the database has no timelines)."""

    def record_timeline(self) -> int | None:
        """Record the current timeline with the database's now if it is new; returns it."""

    def configure_executor_connection(self, connection: Any) -> None:
        """Apply the settings an executor's connection needs, as it opens."""

    def limit_handler_idle(self, lease: Lease | None = None) -> None:
        """Inside a ``transactional`` handler's transaction: bound how the handler may hold
        it (idle time on PostgreSQL, the one write lock on SQLite)."""

    # -- claim ---------------------------------------------------------------------------------

    def claim(
        self,
        *,
        executor: str,
        queues: Sequence[str] = ("default",),
        limit: int = 1,
        job_id: int | None = None,
    ) -> list[Lease]:
        """Claim up to ``limit`` due waiting jobs of ``queues`` (or exactly ``job_id``): each
        fence grows by one, each lease runs from the database's clock, each gets its Attempt
        row in the same transaction."""

    def claim_limited_queue(
        self, queue: str, *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """:meth:`claim` of one queue without the gate of paused and limited queues (only
        :meth:`claim_within_limits` calls it, holding the queue's row)."""

    # -- complete and finish -------------------------------------------------------------------

    def complete(self, lease: Lease, *, result: Any = None) -> int | None:
        """Mark ``lease``'s job succeeded (fenced), keeping ``result`` on its attempt; returns
        the transaction's id where the database has one."""

    def complete_and_claim(
        self,
        lease: Lease,
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        result: Any = None,
    ) -> tuple[int | None, list[Lease]]:
        """:meth:`complete` ``lease`` and :meth:`claim` up to ``limit`` more in the caller's
        transaction; a refused completion raises."""

    def complete_many_and_claim(
        self,
        leases: Sequence[Lease],
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        results: Mapping[int, Any] | None = None,
    ) -> tuple[int | None, set[int], list[Lease]]:
        """:meth:`complete` each of ``leases`` and :meth:`claim` up to ``limit`` more in one
        commit; returns the transaction's id, the ids of the jobs completed, the new leases."""

    def finish(
        self,
        lease: Lease,
        decision: Decision,
        *,
        outcome: str,
        failure: Failure | None = None,
        expired_for: float | None = None,
        result: Any = None,
    ) -> None:
        """End ``lease``'s attempt with ``decision``'s transition, fenced (``expired_for``:
        the reaper's, "and the lease expired that long ago")."""

    def refusal(self, lease: Lease, write: str) -> StaleAttempt | EffectsUnsettled | JobCancelled:
        """Why a fenced write on behalf of ``lease`` matched no row, as the exception to
        raise."""

    def record_stale(self, err: StaleAttempt, executor: str = "") -> None:
        """Record a refused write as evidence (``jobs_status`` counts these)."""

    # -- leases and heartbeat ------------------------------------------------------------------

    def renew_lease(self, lease: Lease) -> list[dict[str, Any]]:
        """The lease renewal's statement for ``lease``: its rows (one, or none when
        refused)."""

    def heartbeat(self, lease: Lease) -> bool:
        """Extend the lease from the database's now; whether an operator asked the attempt to
        stop. Raises when the lease is lost or the attempt is past its maximum runtime."""

    def assert_current(
        self,
        lease: Lease,
        write: str,
        *,
        lease_valid: bool = True,
        not_cancelled: bool = False,
    ) -> None:
        """Lock the job row and check ``lease`` still owns it (by default unexpired and
        within its runtime; with ``not_cancelled``, not asked to stop)."""

    def lease_of(self, job: Job) -> Lease:
        """The lease a leased ``job`` row was claimed under (for the reaper's writes)."""

    def leased_job(self, lease: Lease) -> Job | None:
        """``lease``'s job while it is still leased under that fence (else None)."""

    def queue_of(self, job_id: int) -> str | None:
        """The queue of job ``job_id`` (None: no such job)."""

    # -- ledger --------------------------------------------------------------------------------

    def effect_intend(self, lease: Lease, name: str) -> Effect:
        """Record the intent to perform effect ``name`` before the external call (fenced)."""

    def effect_settle(
        self,
        lease: Lease,
        key: str,
        state: str,
        *,
        destination_ref: str = "",
        note: str = "",
        name: str = "",
    ) -> str:
        """Record what this attempt learned of an effect (fenced, sticky once unknown);
        returns the row's state afterwards."""

    def reconciled(self, lease: Lease, answer: outcomes.Reconciliation, *, name: str) -> bool:
        """Record a reconcile attempt's answer about effect ``name`` (fenced); whether it
        settled the row."""

    def has_unsettled_effect(self, job_id: int) -> bool:
        """Whether an effect of the job may or may not have happened."""

    def ledger_summary(self, job_id: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The names of the job's unsettled effects and of those applied, in one read."""

    def unsettled_effects(self, job_id: int) -> list[Effect]:
        """The job's ledger rows that may or may not have happened, by name."""

    def unsettled_of_job(self, job: Any) -> Any:
        """The ledger rows of ``job`` (a value or ``OuterRef``) whose effect may or may not
        have happened: the one definition of "unsettled"."""

    def applied_of_job(self, job: Any) -> Any:
        """The ledger rows of ``job`` (a value or ``OuterRef``) recorded applied."""

    def effect_key(self, job_id: int, name: str) -> str:
        """The effect's key (installation, work identity, name), kept once recorded."""

    # -- queues --------------------------------------------------------------------------------

    def limited_queues(self, queues: Sequence[str], *, job_id: int | None = None) -> list[str]:
        """Of ``queues`` (or ``job_id``'s queue), those claimed within limits, by name."""

    def claim_within_limits(
        self, names: Sequence[str], *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """Claim up to ``limit`` jobs of the limited queues ``names``, each within its limits,
        the queues' rows locked first."""

    def queue_row(self, name: str, *, lock: bool = False) -> Queue | None:
        """Queue ``name``'s settings row (None: no pause, no limits); ``lock`` holds it."""

    def queue_rows(self) -> list[Queue]:
        """Every queue's settings row, by name."""

    def write_queue(
        self, name: str, *, expected_version: int | None, fields: dict[str, Any]
    ) -> bool:
        """Write an operator's change of queue ``name`` while its row still has
        ``expected_version``; whether it was written."""

    # -- enqueue and wake-ups ------------------------------------------------------------------

    def insert_job(
        self,
        options: JobOptions,
        *,
        unique_key: str | None = None,
        schedule_id: int | None = None,
        hinted: bool = False,
    ) -> Job | None:
        """Insert one waiting job of the spec ``options`` with its spec row; None when its
        ``unique_key`` is taken. ``hinted``: its broker hint is marked sent now."""

    def insert_jobs(
        self, options: JobOptions, payloads: Sequence[dict[str, Any]], *, hinted: bool = False
    ) -> list[tuple[int, datetime]]:
        """Insert one waiting job per payload, each of the spec ``options`` with its payload;
        ``(id, run_at)`` of each, in payload order."""

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        """Once the caller's transaction commits, tell listening executors a job of ``queue``
        waits (nothing where the database has no notifications)."""

    def listen(self, stop: Callable[[], bool]) -> Iterator[tuple[str, int, datetime] | None]:
        """Wake-ups as ``(queue, priority, due time)``, None at least every second; ends at
        once where the database has no notifications."""

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        """This process learned a job of ``queue`` waits: lower the claim floors to it."""

    def start_wakeup_sender(self, on_wakeup: Callable[[str], None] | None = None) -> None:
        """From now on, send this process's wake-ups from a thread of its own."""

    def stop_wakeup_sender(self) -> None:
        """Send the wake-ups not yet sent, then send again from the committing thread."""

    def forget_floors(self) -> None:
        """Drop what this process learned about where claims start."""

    # -- bookkeeping: reaper, hints, executors, operators --------------------------------------

    def expired_leases(self, grace: float, *, since: datetime | None = None) -> Any:
        """The leased jobs whose lease expired more than ``grace`` seconds ago, oldest first,
        locked ``SKIP LOCKED`` where the database can."""

    def close_stray_attempts(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Close as ``superseded`` open attempts that are not their job's current one; each
        one closed."""

    def release_unstarted(self, lease: Lease, *, why: str) -> None:
        """Give back a claimed attempt whose handler never started, fenced."""

    def in_flight_owners(self, job_id: int, *, limit: int = 20) -> list[InFlightOwner]:
        """The job's earlier owners that may still be in flight, newest first."""

    def take_due_hints(
        self, *, limit: int = 500, queues: frozenset[str] | None = None
    ) -> list[tuple[int, str]]:
        """Pick due waiting jobs whose hint is missing, stale or old, and mark them hinted."""

    def executor_started(
        self, executor_id: str, *, transport: str, queues: Sequence[str], concurrency: int
    ) -> None:
        """Register a live executor."""

    def executor_beat(self, executor_id: str, *, active: int) -> None:
        """Refresh an executor's liveness row."""

    def executor_stopped(self, executor_id: str) -> None:
        """Mark an executor stopped."""

    def live_consumer_queues(self, transport: str) -> frozenset[str]:
        """The broker queues that live executors of ``transport`` consume."""

    def operator_transition(
        self,
        job_id: int,
        *,
        expected_version: int,
        transition: states.Transition,
        fields: dict[str, Any],
    ) -> bool:
        """An operator's transition of one job, written only at ``expected_version``; whether
        it was."""

    def record_operator_fact(
        self, effect: Effect, *, effect_state: str, actor: str, reason: str
    ) -> None:
        """Settle one ledger row with a fact an operator verified, with its history entry."""

    def audit(self, **fields: Any) -> AuditEntry:
        """Append one entry to the operators' audit trail (in the caller's transaction)."""

    def prune_finished(self, state: str, older_than: float, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` finished jobs in ``state`` older than ``older_than`` seconds
        with their rows, keeping those an operator acted on or with unsettled effects."""

    # -- workflows -----------------------------------------------------------------------------

    def insert_workflow(
        self, *, name: str, unique_key: str | None, on_failure: str
    ) -> tuple[Workflow, bool]:
        """Insert a workflow row; with a ``unique_key`` taken, the holder and False."""

    def insert_workflow_jobs(
        self,
        workflow_id: int,
        steps: Sequence[NewStep],
        *,
        trace_context: dict[str, str] | None = None,
    ) -> list[int]:
        """One job per step, the step rows and the edges of a workflow; the job ids in step
        order."""

    def insert_steps(
        self,
        workflow_id: int,
        steps: Sequence[tuple[int, str, int]],
        edges: Iterable[tuple[int, int]],
    ) -> None:
        """The step rows and edges of jobs just inserted, in the caller's transaction."""

    def workflow_jobs(self, workflow_id: int) -> dict[str, int]:
        """``{step name: job id}`` of a workflow."""

    def steps_succeeded(self, job_ids: Sequence[int]) -> list[int]:
        """Steps ``job_ids`` just succeeded: their children count them off, and those brought
        to zero become due; the ids made due."""

    def step_ended(self, job_id: int, state: str) -> list[int]:
        """Step ``job_id`` just entered ``state``: move the others as its workflow says."""

    def operator_moved_step(self, job_id: int, state: str) -> list[int]:
        """An operator's action moved step ``job_id`` to ``state``: move the others."""

    def descendants(self, job_id: int) -> list[int]:
        """Every step that comes after ``job_id``, directly or not."""

    def unfinished_children(self, job: Any) -> Any:
        """The edges from ``job`` to a child still waiting or leased."""

    def forget_steps(self, job_ids: Sequence[int]) -> None:
        """Retention deletes jobs ``job_ids``: their step rows and edges go with them."""

    def parent_results(self, job_id: int) -> dict[str, Any]:
        """``{parent step name: its return value}`` for step ``job_id``."""

    def workflow_steps(self, workflow_id: int) -> list[StepRow]:
        """Every step of a workflow with its state and parents, in insert order."""

    def held_steps(self) -> int:
        """Blocked steps with a parent whose outcome is unknown (indeterminate)."""

    # -- history and reads for the console -----------------------------------------------------

    def minute_rollup(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Per (minute, queue, job type) of ``[start, end)``: attempts ended by meaning,
        claims, and the queue wait's p50 and p95."""

    def save_minute_stats(self, rows: Sequence[dict[str, Any]], *, through: datetime) -> None:
        """Write rolled-up ``rows`` (a minute twice counts once) and move the watermark."""

    def history_watermark(self) -> datetime | None:
        """The end of the last range rolled up (None: none yet)."""

    def prune_minute_stats(self, before: datetime) -> int:
        """Delete the history rows of minutes before ``before``; how many."""

    def refresh_count_snapshot(self, *, older_than: float) -> bool:
        """Recount finished jobs per (queue, type) if the last count is older than
        ``older_than`` seconds; whether it recounted."""

    def payload_contains(self, query: PayloadQuery) -> Q:
        """The condition on ``Job`` that its payload contains ``query``'s fragment."""

    def database_pressure(self) -> dict[str, Any]:
        """The oldest snapshot vacuum must respect and the job table's dead rows."""

    def estimated_jobs(self) -> int:
        """The database's estimate of the job table's rows (-1: none kept)."""

    # -- installation --------------------------------------------------------------------------

    @classmethod
    def read_identity(cls, connection: Any) -> dict[str, str]:
        """What identifies the database behind ``connection`` as this one and no copy."""

    def database_identity(self) -> dict[str, str]:
        """This database's identity now (:meth:`read_identity`)."""

    def installation(self) -> InstallationRecord | None:
        """The id made for this database and the identity recorded with it."""

    def record_installation(
        self, *, expected: str | None, key: str, identity: dict[str, str]
    ) -> bool:
        """Set the installation's id and identity while its id is still ``expected``;
        whether it was written."""

    def installation_id(self) -> str:
        """This installation's name in new effect keys (made now if missing)."""

    # -- upkeep: indexes and tables ------------------------------------------------------------

    def index_sizes(self, tables: Sequence[str], *, counted: bool = False) -> list[IndexSize]:
        """The B-tree indexes of ``tables`` that vacuum can empty but not shrink, with what
        their entries need (empty where the database reuses freed pages)."""

    def drop_unfinished_rebuilds(self, tables: Sequence[str]) -> list[str]:
        """Drop the invalid copies failed rebuilds left on ``tables``; their names."""

    def rebuild_index(self, name: str) -> int:
        """Rebuild index ``name`` without blocking writes; its size after, in bytes."""

    def try_upkeep_lock(self) -> bool:
        """Take the lock one upkeep holds at a time, if free."""

    def release_upkeep_lock(self) -> None:
        """Release the lock :meth:`try_upkeep_lock` took."""

    def table_space(self, table: str) -> TableSpace | None:
        """The bytes ``table``'s heap takes and what its rows need (None: unknown, or the
        database reuses freed pages)."""

    def page_use(self, table: str) -> PageUse | None:
        """Vacuum ``table``, then read where its rows are, page by page."""

    def compact_table(self, table: str, cut_page: int) -> Compaction:
        """Move ``table``'s rows past page ``cut_page`` into free space before it, then
        vacuum it."""
