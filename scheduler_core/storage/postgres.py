"""PostgreSQL's driver: every PostgreSQL-only behaviour — claims that seek from per-process
floors and lock ``SKIP LOCKED``, completions and claims in one prepared statement, transaction
ids read back after a lost ``COMMIT`` reply, the server's own view of old snapshots and dead
rows, executor connection settings. Its parts: the wake-ups (``NOTIFY``/``LISTEN``,
:mod:`.pg_wakeups`), the enqueue writes and a step's release (:mod:`.pg_enqueue`), table and
index upkeep (:mod:`.pg_tables`, :mod:`.pg_indexes`). The statements it sends are named in
:mod:`.pg_statements`; what every driver offers is stated in :mod:`.contract`.

The claim and the completion, the statements every job runs, are prepared on the server
(planned once per connection, again every ``TENURE_REPLAN_SECONDS``) and their rows are read
by column name.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from django.db import DatabaseError, transaction
from django.db.models import Q
from psycopg.rows import dict_row

from ..conf import tenure_settings
from ..domain import states
from ..domain.payload_search import PayloadQuery
from ..domain.workflows import BLOCKED_AT
from .base import Driver
from .clock import to_datetime
from .floors import FLOORS, LIMITED_FLOORS, ClaimFloors
from .history import ROLLUP_MARGIN
from .pg_enqueue import PgEnqueue
from .pg_indexes import PgIndexUpkeep
from .pg_statements import (
    CLUSTER_IDENTITY,
    DATABASE_IDENTITY,
    DISCARD_PLANS,
    ESTIMATED_JOBS,
    FENCE_MATCH,
    GENERIC_PLANS,
    JOB_TABLE_ROWS,
    MINUTE_ROLLUP,
    MINUTE_ROLLUP_SETTINGS,
    NOW,
    OLDEST_SNAPSHOT,
    PG_NOW,
    PRIORITY_MAX,
    PRUNE_FINISHED,
    RECORD_TIMELINE,
    RENEW_LEASE,
    TIMELINE,
    TRANSACTION_ID,
    TRANSACTION_STATUS,
    WAITING_PRIORITIES,
    claim_ctes,
    claim_params,
    claim_shape,
    claim_sql,
    complete_many_sql,
    complete_sql,
    idle_timeout_sql,
    limited_params,
)
from .pg_tables import PgTableUpkeep
from .pg_wakeups import PgWakeups
from .records import (
    PRUNABLE,
    Lease,
    leases_from_rows,
    named_rows,
)

log = logging.getLogger("tenure.storage")


_planned_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""When each connection last had its plans made again (monotonic seconds)."""


class PostgresDriver(PgWakeups, PgEnqueue, PgTableUpkeep, PgIndexUpkeep, Driver):
    """Tenure's operations on a PostgreSQL database."""

    vendor = "postgresql"
    skips_locked_rows = True
    has_transaction_ids = True
    now_sql = PG_NOW
    fence_match = FENCE_MATCH
    """The completion statement's fence guard (:func:`.pg_statements.complete_ctes`)."""

    # -- connections and transactions ----------------------------------------------------

    def now(self) -> datetime:
        with self.connection.cursor() as cur:
            cur.execute(NOW, [])
            return to_datetime(cur.fetchone()[0])  # type: ignore[no-any-return]

    def timeline(self) -> int | None:
        """From the name of the WAL file the server writes (``tenure_fence_epoch()``, the
        function the claim reads): a promotion shows at once, where ``pg_control_checkpoint()``
        shows the old timeline until the next checkpoint ends."""
        with self.connection.cursor() as cur:
            cur.execute(TIMELINE)
            return int(cur.fetchone()[0])

    def record_timeline(self) -> int | None:
        """One statement, a probe of a one-row-per-timeline table when nothing is new."""
        with self.connection.cursor() as cur:
            cur.execute(RECORD_TIMELINE)
        return self.timeline()

    @classmethod
    def read_identity(cls, connection: Any) -> dict[str, str]:
        """The cluster's ``system_identifier`` (made by ``initdb``: another cluster, such as
        one a dump was restored into, has another; a streaming standby shares it, so a
        failover keeps it), the database's oid (another database of the cluster, such as a
        restored or templated copy, has another) and its name. A server that refuses
        ``pg_control_system()`` gives the oid and the name only."""
        cluster: dict[str, str] = {}
        with connection.cursor() as cur:
            cur.execute(DATABASE_IDENTITY)
            [db] = named_rows(cur)
            try:
                with transaction.atomic(using=connection.alias):
                    cur.execute(CLUSTER_IDENTITY)
                    cluster["system_identifier"] = str(named_rows(cur)[0]["system_identifier"])
            except DatabaseError as e:
                log.info("pg_control_system() unreadable (%s): the cluster is not compared", e)
        return {
            "vendor": "postgresql",
            **cluster,
            "database_oid": str(db["oid"]),
            "database": str(db["datname"]),
        }

    def transaction_id(self) -> int | None:
        with self.connection.cursor() as cur:
            cur.execute(TRANSACTION_ID)
            return int(cur.fetchone()[0])

    def transaction_status(self, xid: int) -> str | None:
        with self.connection.cursor() as cur:
            cur.execute(TRANSACTION_STATUS, [xid])
            status = cur.fetchone()[0]
        return str(status) if status is not None else None

    def configure_executor_connection(self, connection: Any) -> None:
        s = tenure_settings()
        with connection.cursor() as cur:
            if s.EXECUTOR_IDLE_TX_TIMEOUT_MS > 0:
                cur.execute(idle_timeout_sql(int(s.EXECUTOR_IDLE_TX_TIMEOUT_MS)))
            if s.PREPARED_STATEMENTS:
                # Only the claim and the completion are prepared on the server (_rows); their
                # generic plans look rows up by key, and left to choose the server re-plans
                # them on every call (docs/architecture.md, "Why some statements look as they do").
                cur.execute(GENERIC_PLANS)

    def limit_handler_idle(self, lease: Lease | None = None) -> None:
        s = tenure_settings()
        if s.EXECUTOR_IDLE_TX_TIMEOUT_MS <= 0:
            return
        ms = int(s.HANDLER_IDLE_TX_TIMEOUT_MS)
        with self.connection.cursor() as cur:
            cur.execute(idle_timeout_sql(ms, local=True))

    def _rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Run one hot-path statement as a prepared statement (planned once per connection,
        not on every call) and return its rows by column name; errors are Django's, as for
        any query."""
        conn = self.connection
        conn.ensure_connection()
        raw = conn.connection
        prepare = tenure_settings().PREPARED_STATEMENTS
        if prepare and raw.prepare_threshold is None:
            # Django turns automatic preparation off (None), which also ignores prepare=True. A
            # threshold never reached prepares only what asks for it: Django's own cursors bind
            # on the client and are never prepared either way.
            raw.prepare_threshold = 1 << 30
        with conn.wrap_database_errors, psycopg.Cursor(raw, row_factory=dict_row) as cur:
            _replan_if_due(cur, raw)
            cur.execute(sql, params, prepare=prepare)
            return cur.fetchall()

    # -- claims and completions ------------------------------------------------------------

    def claim(
        self,
        *,
        executor: str,
        queues: Sequence[str] = ("default",),
        limit: int = 1,
        job_id: int | None = None,
    ) -> list[Lease]:
        """Claim up to ``limit`` due waiting jobs (or exactly ``job_id``) in one statement,
        skipping rows another claimer holds (``FOR UPDATE SKIP LOCKED``), seeking from this
        process's floors (:mod:`scheduler_core.storage.floors`)."""
        if limit < 1:
            return []
        sent = time.monotonic()
        seeks = [] if job_id is not None else self._seeks(queues, now=sent)
        shape = claim_shape(by_id=job_id is not None, nqueues=len(queues), floors=bool(seeks))
        params = claim_params(
            shape, executor=executor, queues=queues, limit=limit, job_id=job_id, seeks=seeks
        )
        params += limited_params(shape, queues=queues, job_id=job_id)
        rows = self._rows(claim_sql(shape), params)
        claimed = [r for r in rows if r["id"] is not None]
        leases = leases_from_rows(claimed, executor=executor, sent=sent)
        if job_id is None:
            took = time.monotonic() - sent
            FLOORS.learn(queues, leases, limit=limit, full=not seeks, now=sent, elapsed=took)
        limited = rows[0]["limited"]
        if limited and len(leases) < limit:
            leases += self.claim_within_limits(
                limited, executor=executor, limit=limit - len(leases), job_id=job_id
            )
        return leases

    def claim_limited_queue(
        self, queue: str, *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """The claim of one queue (or one job of it) without the gate, seeking from this
        process's floors for limited queues (:data:`.floors.LIMITED_FLOORS`): read from the
        start of the claim index, each claim of a limited queue walked the entries that its
        jobs claimed while a snapshot was held left there."""
        if limit < 1:
            return []
        sent = time.monotonic()
        seeks = [] if job_id is not None else self._seeks([queue], now=sent, of=LIMITED_FLOORS)
        shape = claim_shape(by_id=job_id is not None, nqueues=1, floors=bool(seeks))
        params = claim_params(
            shape,
            executor=executor,
            queues=[queue],
            limit=limit,
            job_id=job_id,
            seeks=seeks,
            gate=False,
        )
        rows = self._rows(f"WITH {claim_ctes(shape, gate=False)} SELECT * FROM got", params)
        leases = leases_from_rows(rows, executor=executor, sent=sent)
        if job_id is None:
            took = time.monotonic() - sent
            LIMITED_FLOORS.learn(
                [queue], leases, limit=limit, full=not seeks, now=sent, elapsed=took
            )
        return leases

    def _seeks(
        self, queues: Sequence[str], *, now: float, of: ClaimFloors = FLOORS
    ) -> list[tuple[str, int, datetime]]:
        """The floors (``of`` this process's) a claim of ``queues`` seeks from (none: read from
        the start), after discovering the lower priorities a cut-off full read did not reach.
        The connection is opened first: a new one drops the floors (``connection_settings``),
        and a claim must not seek from floors learned on a server it no longer reaches."""
        self.connection.ensure_connection()
        for queue, below in of.undiscovered(queues):
            of.discovered(queue, self._waiting_priorities(queue, below))
        return of.seeks(queues, now=now)

    def _waiting_priorities(self, queue: str, below: int | None) -> list[tuple[int, datetime]]:
        """Each priority of ``queue`` under ``below`` (None: any) that has a waiting job, with
        the due time of its oldest waiting job."""
        bound = PRIORITY_MAX + 1 if below is None else below
        with self.connection.cursor() as cur:
            cur.execute(WAITING_PRIORITIES, [queue, bound, queue])
            return [(int(p), to_datetime(at)) for p, at in cur.fetchall()]

    def complete(self, lease: Lease, *, result: Any = None) -> int | None:
        """One statement writing the job's and the attempt's rows as :meth:`Driver.finish`
        does; returns the transaction's id."""
        step = lease.workflow_id is not None
        with self.atomic():
            (row,) = self._rows(
                complete_sql(self.fence_match, steps=step),
                [
                    *self._complete_params(
                        [lease], None if result is None else {lease.attempt_id: result}
                    ),
                    *(self._release_params([lease]) if step else []),
                ],
            )
            if lease.job_id not in row["completed"]:
                raise self.refusal(lease, states.COMPLETE.name)
            if step:
                self._announce_released(row)
        return int(row["xid"])

    def complete_many_and_claim(
        self,
        leases: Sequence[Lease],
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        results: Mapping[int, Any] | None = None,
    ) -> tuple[int | None, set[int], list[Lease]]:
        """The completions of ``leases`` and a claim of up to ``limit`` jobs: one prepared
        statement whatever the number of leases."""
        sent = time.monotonic()
        seeks = self._seeks(queues, now=sent) if limit > 0 else FLOORS.seeks(queues, now=sent)
        shape = claim_shape(by_id=False, nqueues=len(queues), floors=bool(seeks))
        # Workflow steps among the leases: the statement releases their children too.
        steps = any(x.workflow_id is not None for x in leases)
        params = [
            *claim_params(shape, executor=executor, queues=queues, limit=limit, seeks=seeks),
            *self._complete_params(leases, results),
            *(self._release_params(leases) if steps else []),
            *limited_params(shape, queues=queues, job_id=None),
        ]
        rows = self._rows(complete_many_sql(shape, self.fence_match, steps=steps), params)
        matched, xid = set(rows[0]["completed"]), int(rows[0]["xid"])
        if steps:
            self._announce_released(rows[0])
        claimed = [r for r in rows if r["id"] is not None]
        got = leases_from_rows(claimed, executor=executor, sent=sent)
        if limit > 0:
            took = time.monotonic() - sent
            FLOORS.learn(queues, got, limit=limit, full=not seeks, now=sent, elapsed=took)
        limited = rows[0]["limited"]
        if limited and len(got) < limit:
            # In the caller's transaction, after the completions: they count as finished.
            got += self.claim_within_limits(limited, executor=executor, limit=limit - len(got))
        return xid, matched, got

    def _release_params(self, leases: Sequence[Lease]) -> list[Any]:
        """The placeholders of :data:`.pg_statements.RELEASE_CTES`: the leases' jobs that are
        workflow steps, and the blocked steps' due time."""
        return [
            [x.job_id for x in leases if x.workflow_id is not None],
            self.connection.ops.adapt_datetimefield_value(BLOCKED_AT),
        ]

    def _announce_released(self, row: Mapping[str, Any]) -> list[int]:
        """Announce the steps a completion statement's release made due (its ``due_*``
        columns), once the transaction commits (:meth:`_announce_due`)."""
        ids = row["due_ids"]
        if not ids:
            return []
        due_at = row["due_at"]
        return self._announce_due(
            [
                (i, q, p, due_at)
                for i, q, p in zip(ids, row["due_queues"], row["due_priorities"], strict=True)
            ]
        )

    def _complete_params(
        self, leases: Sequence[Lease], results: Mapping[int, Any] | None = None
    ) -> list[Any]:
        """The placeholders of :func:`complete_ctes`, in text order; ``results`` by attempt
        id (JSON the caller checked), sent as text and cast by the statement."""
        jobs = [lease.job_id for lease in leases]
        attempts = [lease.attempt_id for lease in leases]
        kept = results or {}
        return [
            jobs,
            [lease.fence for lease in leases],
            attempts,
            [
                None if kept.get(a) is None else json.dumps(kept[a], ensure_ascii=False)
                for a in attempts
            ],
            # Again, as index conditions: the rows are looked up by primary key whatever the
            # planner guesses about the arrays' length or the table's size (see claim_ctes).
            jobs,
            [s.value for s in states.COMPLETE.sources],
            attempts,
        ]

    def renew_lease(self, lease: Lease) -> list[dict[str, Any]]:
        """:data:`.pg_statements.RENEW_LEASE`, the renewal with PostgreSQL's clock."""
        with self.connection.cursor() as cur:
            cur.execute(RENEW_LEASE, [float(lease.lease_seconds), lease.job_id, lease.fence])
            return named_rows(cur)

    # -- retention -------------------------------------------------------------------------

    def prune_finished(self, state: str, older_than: float, *, limit: int = 1000) -> int:
        """One statement; rows another transaction holds are skipped (two schedulers pruning
        at once delete disjoint batches)."""
        if state not in PRUNABLE:
            raise ValueError(f"only finished jobs are pruned, not {state!r}")
        if older_than <= 0 or limit < 1:
            return 0
        with self.atomic(), self.connection.cursor() as cur:
            cur.execute(PRUNE_FINISHED, [state, older_than, limit, state])
            return len(cur.fetchall())

    # -- history ------------------------------------------------------------------------------

    def minute_rollup(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """One statement: counts by outcome and ``percentile_cont`` of the queue wait, per
        minute, queue and type (the contract is the base driver's). It reads the jobs the
        minutes can hold (by the state-and-time index) and each one's attempts by key, so a
        round costs what the minutes hold, whatever the history kept; it read every attempt
        once (a scan of the whole table each minute, growing with retention:
        tests/db/test_history.py::test_the_rollup_reads_no_attempt_outside_its_minutes)."""
        with self.atomic(), self.connection.cursor() as cur:
            # A round's bookkeeping on one core, never compiled: the planner overcosts each
            # job's attempt probe, and compiling costs more than it saves (docs/architecture.md).
            for setting in MINUTE_ROLLUP_SETTINGS:
                cur.execute(setting)
            cur.execute(
                MINUTE_ROLLUP,
                {
                    "start": start,
                    "end": end,
                    "since": start - ROLLUP_MARGIN,
                },
            )
            cols = [c[0] for c in cur.description]
            rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        for r in rows:
            r["minute"] = to_datetime(r["minute"])
            for k in ("wait_p50_ms", "wait_p95_ms"):
                r[k] = None if r[k] is None else float(r[k])
        return rows

    # -- what the server says ----------------------------------------------------------------

    def database_pressure(self) -> dict[str, Any]:
        """The oldest snapshot this database's vacuum must respect (the session holding it)
        and the job table's dead rows, from ``pg_stat_activity`` and ``pg_stat_user_tables``."""
        with self.connection.cursor() as cur:
            cur.execute(OLDEST_SNAPSHOT)
            oldest = cur.fetchone()
            cols = [c[0] for c in cur.description]
            session = dict(zip(cols, oldest, strict=True)) if oldest else None
            cur.execute(JOB_TABLE_ROWS)
            row = cur.fetchone()
            cols = [c[0] for c in cur.description]
            table = dict(zip(cols, row, strict=True)) if row else {}
        return {"session": session, "table": table}

    def estimated_jobs(self) -> int:
        """The planner's estimate of the job table's rows (kept by autovacuum)."""
        with self.connection.cursor() as cur:
            cur.execute(ESTIMATED_JOBS)
            row = cur.fetchone()
        return int(row[0]) if row else -1

    def payload_contains(self, query: PayloadQuery) -> Q:
        """``payload @> %s::jsonb``: JSON containment, which the GIN index over payloads
        (``jsonb_path_ops``, migrations 0008 and 0012) answers (tests/db/test_payload_search.py)."""
        return Q(spec__payload__contains=query.fragment)


def _replan_if_due(cur: Any, raw: Any) -> None:
    """Have this connection plan every statement afresh (``DISCARD PLANS``) every
    ``REPLAN_SECONDS``, from the tables as they now are. A plan is otherwise kept until the
    server's statistics of its table change, and one made while the job table was nearly empty
    and not yet analysed reads it whole: the prepared claim and completion read it on every
    call, and so did the server's own checks of the attempt's and the ledger's keys to their
    job (plans it caches per connection, which dropping the prepared statements left in
    place), once per attempt and per effect (tests/db/test_claim_plan.py). Prepared
    statements keep their names; each is planned again at its next call."""
    now = time.monotonic()
    at = _planned_at.get(raw)
    if at is not None and now - at < tenure_settings().REPLAN_SECONDS:
        return
    if at is not None:
        cur.execute(DISCARD_PLANS, prepare=False)
    _planned_at[raw] = now
