"""PostgreSQL's driver: every statement Tenure sends to PostgreSQL that the ORM does not write,
and every PostgreSQL-only behaviour — claims that seek from per-process floors and lock
``SKIP LOCKED``, completions and claims in one prepared statement, transaction ids read back
after a lost ``COMMIT`` reply, ``NOTIFY``/``LISTEN`` wake-ups, the server's own view of old
snapshots and dead rows, executor connection settings; the index upkeep's statements are in
:mod:`.pg_indexes`.

The claim and the completion, the statements every job runs, are prepared on the server
(planned once per connection, again every ``TENURE_REPLAN_SECONDS``) and their rows are read
by column name.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
from django.db import DatabaseError, transaction
from django.db.models import Q
from psycopg.rows import dict_row

from ..conf import tenure_settings
from ..domain import states
from ..domain.payload_search import PayloadQuery
from ..models import Effect, Job, JobSpec
from . import floors
from .base import (
    Driver,
)
from .clock import to_datetime
from .floors import FLOORS, LIMITED_FLOORS, ClaimFloors
from .history import ROLLUP_MARGIN
from .pg_indexes import PgIndexUpkeep
from .pg_tables import PgTableUpkeep
from .queues import (
    LIMITED_QUEUE,
    open_queue,
)
from .records import (
    ATTEMPT_INSERT,
    CLAIM_SET,
    CLAIMED_JOB_COLUMNS,
    HEARTBEAT_SQL,
    PRUNABLE,
    SPEC_COLUMNS,
    STILL_OPEN_SQL,
    Lease,
    claimable,
    leases_from_rows,
    named_rows,
)

log = logging.getLogger("tenure.storage")

PG_NOW = "clock_timestamp()"

WAKEUP_CHANNEL = "tenure_wakeup"

CLAIM_BY_ID, CLAIM_ONE_QUEUE, CLAIM_QUEUES, CLAIM_FROM_FLOORS = "id", "queue", "queues", "floors"
"""The shapes of PostgreSQL's claim: the job a message names; a queue's due jobs read from the
start of the claim index; the same for several queues; and a seek from this process's floors
(:class:`ClaimFloors`)."""


def claim_shape(*, by_id: bool, nqueues: int, floors: bool) -> str:
    if by_id:
        return CLAIM_BY_ID
    if floors:
        return CLAIM_FROM_FLOORS
    return CLAIM_ONE_QUEUE if nqueues == 1 else CLAIM_QUEUES


def claim_ctes(shape: str, *, gate: bool = True) -> str:
    """PostgreSQL's claim as ``WITH`` parts: ``cand`` (the due rows, locked), ``claimed`` (the
    jobs leased), ``new_attempt`` (their Attempt rows) and ``got`` (each claimed row with its
    attempt's id). Placeholders: :func:`claim_params`.

    ``gate`` keeps out the jobs of queues that are paused or limited (:func:`open_queue`, a
    probe of ``tenure_queue``'s primary key per candidate, never a lock); only
    :meth:`PostgresDriver.claim_limited_queue` leaves it out, holding the queue's row. Every
    shape passes over a job without its spec or beside an open attempt (:func:`claimable`)."""
    now = PG_NOW

    def guards(queue: str) -> str:
        return f"AND {claimable('tenure_job', per_row='OFFSET 0')} " + (
            f"AND {open_queue(queue)}" if gate else ""
        )

    if shape in (CLAIM_BY_ID, CLAIM_ONE_QUEUE):
        # One queue: an ordered walk of the claim index (``tenure_job_claim``), stopping at
        # the first due rows, however long the backlog.
        cand = f"""
        SELECT id FROM tenure_job
        WHERE state = 'waiting' AND {"id" if shape == CLAIM_BY_ID else "queue"} = %s
            AND run_at <= {now} {guards("tenure_job.queue" if shape == CLAIM_BY_ID else "%s")}
        ORDER BY priority DESC, run_at, id
        LIMIT %s
        FOR UPDATE SKIP LOCKED"""
    elif shape == CLAIM_QUEUES:
        # Several queues: the same ordered walk per queue, then the best of those. A single
        # ``queue = ANY(...)`` cannot use the index's order and would sort every waiting job
        # of those queues on every claim. Rows locked here but not taken are released when the
        # claim's transaction ends; other claimers skip them meanwhile.
        cand = f"""
        SELECT c.id FROM unnest(%s::varchar[]) AS q(name)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM tenure_job
            WHERE state = 'waiting' AND queue = q.name AND run_at <= {now} {guards("q.name")}
            ORDER BY priority DESC, run_at, id
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT %s"""
    else:
        # From the floors: per (queue, priority), a seek into the claim index at the floor's
        # due time, then the best of those in the claim's one order. The entries below a
        # floor (mostly jobs claimed since vacuum last could run) are never read.
        cand = f"""
        SELECT c.id FROM unnest(%s::varchar[], %s::smallint[], %s::timestamptz[])
            AS f(queue, priority, floor)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM tenure_job
            WHERE state = 'waiting' AND queue = f.queue AND priority = f.priority
                AND run_at >= f.floor AND run_at <= {now} {guards("f.queue")}
            ORDER BY run_at, id
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT %s"""
    expiry = f"{now} + make_interval(secs => s.lease_seconds)"
    deadline = f"{now} + make_interval(secs => s.timeout_seconds)"
    # ``(state = …) IS TRUE`` keeps each guard out of the index conditions: a table filled
    # since its statistics were taken looks empty, and the planner then walked the state
    # index through every waiting job instead of looking the locked rows up by key (1.0 →
    # 2.5 ms per job on a 3,000-job backlog, tests/db/test_claim_plan.py).
    return f"""
    cand AS ({cand}
    ), claimed AS (
        UPDATE tenure_job AS j SET {
        CLAIM_SET.format(t="j.", now=now, expiry=expiry, deadline=deadline)
    }
        FROM cand JOIN tenure_job_spec AS s ON s.job_id = cand.id
        WHERE j.id = cand.id AND (j.state = 'waiting') IS TRUE
        RETURNING {", ".join("j." + c for c in CLAIMED_JOB_COLUMNS)},
            {", ".join("s." + c for c in SPEC_COLUMNS)}, j.lease_owner, j.lease_expires_at,
            j.deadline_at
    ), new_attempt AS (
        {ATTEMPT_INSERT} FROM claimed
        RETURNING id, job_id
    ), got AS (
        SELECT {", ".join("claimed." + c for c in CLAIMED_JOB_COLUMNS + SPEC_COLUMNS)},
            new_attempt.id AS attempt_id
        FROM claimed JOIN new_attempt ON new_attempt.job_id = claimed.id
    )"""


def claim_params(
    shape: str,
    *,
    executor: str,
    queues: Sequence[str],
    limit: int,
    job_id: int | None = None,
    seeks: Sequence[tuple[str, int, datetime]] = (),
    gate: bool = True,
) -> list[Any]:
    """The placeholders of :func:`claim_ctes` for ``shape`` (and ``gate``), in text order."""
    if shape == CLAIM_BY_ID:
        return [job_id, limit, executor]
    if shape == CLAIM_ONE_QUEUE:
        return [queues[0], *([queues[0]] if gate else []), limit, executor]
    if shape == CLAIM_QUEUES:
        return [list(queues), limit, limit, executor]
    return [
        [q for q, _, _ in seeks],
        [p for _, p, _ in seeks],
        [f for _, _, f in seeks],
        limit,
        limit,
        executor,
    ]


def limited_sql(shape: str) -> str:
    """The claim's answer to "which of the queues asked for are claimed within limits?", as
    one more column of its result (``limited``: their names, or NULL), so a claim of open
    queues needs no second statement. Placeholder: the job's id, or the queues."""
    if shape == CLAIM_BY_ID:
        which = "tq.name = (SELECT queue FROM tenure_job WHERE id = %s AND state = 'waiting')"
    else:
        which = "tq.name = ANY(%s::varchar[])"
    return f"(SELECT array_agg(tq.name) FROM tenure_queue AS tq WHERE {which} AND {LIMITED_QUEUE})"


def limited_params(shape: str, *, queues: Sequence[str], job_id: int | None) -> list[Any]:
    """The placeholder of :func:`limited_sql`."""
    return [job_id] if shape == CLAIM_BY_ID else [list(queues)]


def claim_sql(shape: str) -> str:
    """:meth:`PostgresDriver.claim`'s statement: the claim, one row per claimed job (at least
    one, for the ``limited`` column)."""
    return (
        f"WITH {claim_ctes(shape)} SELECT {limited_sql(shape)} AS limited, got.* "
        "FROM (SELECT 1) AS one LEFT JOIN got ON true"
    )


def complete_ctes(fence_match: str) -> str:
    """:meth:`PostgresDriver.complete` as ``WITH`` parts, for any number of leases (placeholders:
    :meth:`PostgresDriver._complete_params`): :meth:`Driver.finish`'s writes for ``COMPLETE``
    (``tests/db/test_bulk_and_fast_paths.py`` checks the two leave the same rows), each job
    fenced by its own lease (``fence_match``), refused past the attempt's deadline or while the
    ledger holds an effect that may or may not have happened (an index probe per job), and
    after an operator's cancel request unless an effect of the job was applied. Each attempt
    is found by its key (:func:`~scheduler_core.storage.records.still_open` says why)."""
    return f"""
        done AS (
            SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS d(jid, jfence, aid)
        ), job AS (
            UPDATE tenure_job SET state = '{states.COMPLETE.target.value}',
                updated_at = clock_timestamp(), version = version + 1, lease_owner = '',
                lease_expires_at = NULL, reason = '', next_kind = 'run',
                finished_at = clock_timestamp()
            FROM done
            WHERE tenure_job.id = ANY(%s::bigint[]) AND tenure_job.id = done.jid
                AND (state = ANY(%s)) IS TRUE AND ({fence_match})
                AND (deadline_at > clock_timestamp()) IS TRUE
                AND NOT EXISTS (
                    SELECT 1 FROM tenure_effect AS e WHERE e.job_id = tenure_job.id
                        AND e.state IN ('{Effect.INTENDED}', '{Effect.UNKNOWN}'))
                AND (tenure_job.cancel_requested_at IS NULL OR EXISTS (
                    SELECT 1 FROM tenure_effect AS e WHERE e.job_id = tenure_job.id
                        AND e.state = '{Effect.APPLIED}'))
            RETURNING tenure_job.id
        ), attempt AS (
            UPDATE tenure_attempt SET outcome = 'succeeded', finished_at = clock_timestamp()
            FROM done JOIN job ON job.id = done.jid
            WHERE tenure_attempt.id = ANY(%s::bigint[]) AND tenure_attempt.id = done.aid
                AND {STILL_OPEN_SQL}
        )"""


COMPLETE_RESULT = (
    "(SELECT coalesce(array_agg(id), '{}') FROM job) AS completed, txid_current() AS xid"
)
"""The ids of the jobs whose fenced completion matched, and the transaction's id."""

FENCE_MATCH = "fence = done.jfence"
"""The completion statement's fence guard: the job's fence is still the completing attempt's."""


def complete_many_sql(shape: str, fence_match: str = FENCE_MATCH) -> str:
    """:meth:`PostgresDriver.complete_many_and_claim`'s statement: the claim's and the
    completions' parts, one row per claimed job (at least one, for the completions' result)."""
    return (
        f"WITH {claim_ctes(shape)}, {complete_ctes(fence_match)} "
        f"SELECT {COMPLETE_RESULT}, {limited_sql(shape)} AS limited, got.* "
        "FROM (SELECT 1) AS one LEFT JOIN got ON true"
    )


"""The completion statement's fence guard: the job's fence is still the completing attempt's."""


_PRIORITY_MAX = 32_767
"""The largest ``priority`` (a ``smallint``)."""

_WAITING_PRIORITIES = """
    WITH RECURSIVE p(priority, run_at) AS (
        (SELECT priority, run_at FROM tenure_job
         WHERE state = 'waiting' AND queue = %s AND priority < %s
         ORDER BY priority DESC, run_at, id LIMIT 1)
        UNION ALL
        SELECT n.priority, n.run_at FROM p CROSS JOIN LATERAL (
            SELECT priority, run_at FROM tenure_job
            WHERE state = 'waiting' AND queue = %s AND priority < p.priority
            ORDER BY priority DESC, run_at, id LIMIT 1) AS n
    )
    SELECT priority, run_at FROM p LIMIT 1000
"""
""":meth:`PostgresDriver._waiting_priorities`: a skip scan of the claim index, one probe per priority."""


_DB_SET = ("id", "run_at", "created_at", "updated_at", "hinted_at")
"""The columns of a new job whose values the database sets (its clock, its sequence)."""


def _insert_job_sql(*, on_conflict: str) -> str:
    # The spec row is inserted from the job's: a job refused by ``ON CONFLICT`` gets none.
    return f"""
    WITH ins AS (
        INSERT INTO tenure_job (name, queue, priority, run_at, state, fence, lease_owner,
            attempts, max_attempts, unique_key, next_kind, version, schedule_id, created_at,
            updated_at, hinted_at, last_error, reason)
        VALUES (%(name)s, %(queue)s, %(priority)s,
            COALESCE(%(run_at)s::timestamptz, clock_timestamp()), 'waiting', 0, '', 0,
            %(max_attempts)s, %(unique_key)s, 'run', 1, %(schedule_id)s, clock_timestamp(),
            clock_timestamp(), CASE WHEN %(hint)s THEN clock_timestamp() END, '', '')
        {on_conflict}
        RETURNING {", ".join(_DB_SET)}
    ), spec AS (
        INSERT INTO tenure_job_spec (job_id, {", ".join(SPEC_COLUMNS)})
        SELECT id, %(payload)s::jsonb, %(lease_seconds)s, %(effect)s, %(timeout_seconds)s
        FROM ins
    )
    SELECT {", ".join("ins." + c for c in _DB_SET)} FROM ins
"""


_INSERT_JOB_PG = {
    False: _insert_job_sql(on_conflict=""),
    # The conflict target names the unique index's predicate: the index holds set keys only.
    True: _insert_job_sql(
        on_conflict="ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING"
    ),
}
""":func:`insert_job` on PostgreSQL, without and with a unique key: the insert and the values
the database sets, in one statement. Written out rather than compiled by the ORM on every
enqueue, which cost more (0.8 ms of the client's CPU) than the round trips it saves."""


_PRUNE_SQL = f"""
    WITH doomed AS (
        SELECT j.id FROM tenure_job j
        WHERE j.state = %s AND j.updated_at < statement_timestamp() - make_interval(secs => %s)
          AND NOT EXISTS (SELECT 1 FROM tenure_audit a WHERE a.job_id = j.id)
          AND NOT EXISTS (
            SELECT 1 FROM tenure_effect e WHERE e.job_id = j.id
                AND e.state IN ('{Effect.INTENDED}', '{Effect.UNKNOWN}'))
        ORDER BY j.updated_at, j.id
        LIMIT %s
        FOR UPDATE SKIP LOCKED
    ), events AS (
        DELETE FROM tenure_effect_event WHERE effect_id IN (
            SELECT e.id FROM tenure_effect e WHERE e.job_id IN (SELECT id FROM doomed))
    ), effects AS (
        DELETE FROM tenure_effect WHERE job_id IN (SELECT id FROM doomed)
    ), attempts AS (
        DELETE FROM tenure_attempt WHERE job_id IN (SELECT id FROM doomed)
    ), specs AS (
        DELETE FROM tenure_job_spec WHERE job_id IN (SELECT id FROM doomed)
    )
    DELETE FROM tenure_job WHERE id IN (SELECT id FROM doomed) AND state = %s RETURNING id
"""
""":meth:`PostgresDriver.prune_finished` on PostgreSQL: one statement; rows another transaction holds are
skipped (two schedulers pruning at once delete disjoint batches). The cut-off is the
statement's time, not ``clock_timestamp()``: a volatile bound is no index condition, and every
round then read the whole state's range of ``tenure_job_state`` (25,000 succeeded jobs, 25 ms,
in a soak's third minute) to delete nothing."""


def wakeup_payload(queue: str, priority: int, due_at: datetime) -> str:
    """A wake-up's text: ``"<priority> <due time, epoch seconds> <queue>"``."""
    return f"{priority} {due_at.timestamp():.6f} {queue}"


def read_wakeup(payload: str) -> tuple[str, int, datetime] | None:
    """``(queue, priority, due time)`` from a wake-up's text, or None if it is not one."""
    try:
        priority, epoch, queue = payload.split(" ", 2)
        return queue, int(priority), datetime.fromtimestamp(float(epoch), tz=dt.UTC)
    except ValueError:
        return None


_planned_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""When each connection last had its plans made again (monotonic seconds)."""


class PostgresDriver(PgTableUpkeep, PgIndexUpkeep, Driver):
    """Tenure's operations on a PostgreSQL database."""

    vendor = "postgresql"
    skips_locked_rows = True
    has_transaction_ids = True
    now_sql = PG_NOW
    fence_match = FENCE_MATCH
    """The completion statement's fence guard (:func:`complete_ctes`)."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self._complete_ctes = complete_ctes(self.fence_match)

    # -- connections and transactions ----------------------------------------------------

    @classmethod
    def read_identity(cls, connection: Any) -> dict[str, str]:
        """The cluster's ``system_identifier`` (made by ``initdb``: another cluster, such as
        one a dump was restored into, has another; a streaming standby shares it, so a
        failover keeps it), the database's oid (another database of the cluster, such as a
        restored or templated copy, has another) and its name. A server that refuses
        ``pg_control_system()`` gives the oid and the name only."""
        cluster: dict[str, str] = {}
        with connection.cursor() as cur:
            cur.execute(
                "SELECT oid::text AS oid, datname FROM pg_database "
                "WHERE datname = current_database()"
            )
            [db] = named_rows(cur)
            try:
                with transaction.atomic(using=connection.alias):
                    cur.execute(
                        "SELECT system_identifier::text AS system_identifier "
                        "FROM pg_control_system()"
                    )
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
            cur.execute("SELECT txid_current()")
            return int(cur.fetchone()[0])

    def transaction_status(self, xid: int) -> str | None:
        with self.connection.cursor() as cur:
            cur.execute("SELECT txid_status(%s)", [xid])
            status = cur.fetchone()[0]
        return str(status) if status is not None else None

    def configure_executor_connection(self, connection: Any) -> None:
        s = tenure_settings()
        with connection.cursor() as cur:
            if s.EXECUTOR_IDLE_TX_TIMEOUT_MS > 0:
                cur.execute(
                    "SET idle_in_transaction_session_timeout = "
                    f"{int(s.EXECUTOR_IDLE_TX_TIMEOUT_MS)}"
                )
            if s.PREPARED_STATEMENTS:
                # Only the claim and the completion are prepared on the server (_rows). Left
                # to choose, PostgreSQL kept planning them afresh on every call once the table
                # held 20,000 jobs (its generic plan looked dearer on paper), about 0.4 ms per
                # job of a 1.2-1.6 ms drain loop; their generic plans look rows up by key.
                cur.execute("SET plan_cache_mode = force_generic_plan")

    def limit_handler_idle(self, lease: Lease | None = None) -> None:
        s = tenure_settings()
        if s.EXECUTOR_IDLE_TX_TIMEOUT_MS <= 0:
            return
        ms = int(s.HANDLER_IDLE_TX_TIMEOUT_MS)
        with self.connection.cursor() as cur:
            cur.execute(f"SET LOCAL idle_in_transaction_session_timeout = {ms}")

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
        the start), after discovering the lower priorities a cut-off full read did not reach."""
        for queue, below in of.undiscovered(queues):
            of.discovered(queue, self._waiting_priorities(queue, below))
        return of.seeks(queues, now=now)

    def _waiting_priorities(self, queue: str, below: int | None) -> list[tuple[int, datetime]]:
        """Each priority of ``queue`` under ``below`` (None: any) that has a waiting job, with
        the due time of its oldest waiting job."""
        bound = _PRIORITY_MAX + 1 if below is None else below
        with self.connection.cursor() as cur:
            cur.execute(_WAITING_PRIORITIES, [queue, bound, queue])
            return [(int(p), to_datetime(at)) for p, at in cur.fetchall()]

    def complete(self, lease: Lease) -> int | None:
        """One statement writing the job's and the attempt's rows as :meth:`Driver.finish`
        does; returns the transaction's id."""
        with self.atomic():
            (row,) = self._rows(
                f"WITH {self._complete_ctes} SELECT {COMPLETE_RESULT}",
                self._complete_params([lease]),
            )
            if lease.job_id not in row["completed"]:
                raise self.refusal(lease, states.COMPLETE.name)
        return int(row["xid"])

    def complete_many_and_claim(
        self, leases: Sequence[Lease], *, executor: str, queues: Sequence[str], limit: int
    ) -> tuple[int | None, set[int], list[Lease]]:
        """The completions of ``leases`` and a claim of up to ``limit`` jobs: one prepared
        statement whatever the number of leases."""
        sent = time.monotonic()
        seeks = self._seeks(queues, now=sent) if limit > 0 else FLOORS.seeks(queues, now=sent)
        shape = claim_shape(by_id=False, nqueues=len(queues), floors=bool(seeks))
        params = [
            *claim_params(shape, executor=executor, queues=queues, limit=limit, seeks=seeks),
            *self._complete_params(leases),
            *limited_params(shape, queues=queues, job_id=None),
        ]
        rows = self._rows(complete_many_sql(shape, self.fence_match), params)
        matched, xid = set(rows[0]["completed"]), int(rows[0]["xid"])
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

    def _complete_params(self, leases: Sequence[Lease]) -> list[Any]:
        """The placeholders of :func:`complete_ctes`, in text order."""
        jobs = [lease.job_id for lease in leases]
        attempts = [lease.attempt_id for lease in leases]
        return [
            jobs,
            [lease.fence for lease in leases],
            attempts,
            # Again, as index conditions: the rows are looked up by primary key whatever the
            # planner guesses about the arrays' length or the table's size (see claim_ctes).
            jobs,
            [s.value for s in states.COMPLETE.sources],
            attempts,
        ]

    def renew_lease(self, lease: Lease) -> list[dict[str, Any]]:
        """:data:`~scheduler_core.storage.base.HEARTBEAT_SQL` with PostgreSQL's clock."""
        sql = HEARTBEAT_SQL.format(now=PG_NOW, expiry=f"({PG_NOW} + make_interval(secs => %s))")
        with self.connection.cursor() as cur:
            cur.execute(sql, [float(lease.lease_seconds), lease.job_id, lease.fence])
            return named_rows(cur)

    # -- wake-ups --------------------------------------------------------------------------

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        """Once the caller's transaction commits, send the wake-up (:meth:`send_wakeup`).

        The ``NOTIFY`` is not part of the enqueue's transaction: PostgreSQL serialises the
        commits of every transaction that notifies, each holding one database-wide lock through
        its commit's flush to disk, so enqueues committing at once queued behind each other
        (the soak's most common wait event, ``Lock:object``, and arrivals falling behind their
        schedule). Sent after the commit, in a transaction of its own that need not wait for
        the disk, it holds that lock for microseconds. A wake-up lost with a process that dies
        between the two is a job found by the next poll (``TENURE_POLL_INTERVAL``)."""
        self.on_commit(lambda: self.send_wakeup(queue, priority, due_at))

    def send_wakeup(self, queue: str, priority: int, due_at: datetime) -> None:
        """Send one wake-up now, in a transaction of its own (outside any of the caller's),
        and have this process's floors learn it. A failure is logged, never raised: the job it
        announces has committed already, and polling finds it."""
        floors.woken(queue, priority, due_at)
        try:
            with self.connection.cursor() as cur:
                # The transaction only notifies: nothing in it needs to reach the disk before
                # the wake-up is delivered (set_config(..., true) lasts until its end).
                cur.execute(
                    "SELECT pg_notify(%s, %s) FROM "
                    "(SELECT set_config('synchronous_commit', 'off', true)) AS local",
                    [WAKEUP_CHANNEL, wakeup_payload(queue, priority, due_at)],
                )
        except DatabaseError as e:
            log.warning(
                "could not send the wake-up for queue %s (%s); polling finds the job", queue, e
            )

    def listen(self, stop: Callable[[], bool]) -> Iterator[tuple[str, int, datetime] | None]:
        """``LISTEN`` on a connection of its own (reconnecting with backoff); every wake-up
        also lowers this process's floors, so the next claim's seek reaches its job."""
        params = self.connection.get_connection_params()
        delay = 0.5
        while not stop():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
                    delay = 0.5
                    while not stop():
                        heard = False
                        for n in conn.notifies(timeout=1.0):
                            woken = read_wakeup(n.payload)
                            if woken is not None:
                                heard = True
                                floors.woken(*woken)
                                yield woken
                        if not heard:
                            yield None
            except psycopg.Error as e:  # reconnect with backoff; polling still runs meanwhile
                log.debug("listener reconnecting after %s", e)
                yield None
                end = time.monotonic() + delay
                while time.monotonic() < end and not stop():
                    time.sleep(0.1)
                delay = min(10.0, delay * 2)

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        floors.woken(queue, priority, due_at)

    def forget_floors(self) -> None:
        floors.forget()

    # -- enqueue and retention -------------------------------------------------------------

    def insert_job(self, fields: dict[str, Any]) -> Job | None:
        """One statement and one round trip, atomic on its own or joining the caller's
        transaction (``ON CONFLICT`` for a unique key, no savepoint)."""
        run_at = fields["run_at"]
        params = {
            **{
                k: fields[k] for k in ("name", "queue", "priority", "max_attempts", "lease_seconds")
            },
            "timeout_seconds": fields["timeout_seconds"],
            "unique_key": fields["unique_key"],
            "effect": fields["effect"],
            "schedule_id": fields["schedule_id"],
            "payload": json.dumps(fields["payload"], ensure_ascii=False, allow_nan=False),
            "run_at": run_at,
            "hint": fields["hinted"],
        }
        with self.connection.cursor() as cur:
            cur.execute(_INSERT_JOB_PG[fields["unique_key"] is not None], params)
            cols = [c[0] for c in cur.description]
            row = cur.fetchone()
        if row is None:
            return None
        known = {
            k: v
            for k, v in fields.items()
            if k not in _DB_SET and k not in SPEC_COLUMNS and k != "hinted"
        }
        job = Job(**known, **dict(zip(cols, row, strict=True)), state=states.State.WAITING)
        job.spec = JobSpec(job=job, **{k: fields[k] for k in SPEC_COLUMNS})
        for row_obj in (job, job.spec):
            row_obj._state.adding = False
            row_obj._state.db = self.alias
        return job

    def insert_jobs(
        self, fields: dict[str, Any], payloads: Sequence[dict[str, Any]]
    ) -> list[tuple[int, datetime]]:
        hint = PG_NOW if fields["hinted"] else "NULL"
        # Each payload's job id is drawn first, in the payloads' order, so the job rows and
        # their spec rows pair up in one statement.
        sql = f"""
            WITH p AS (
                SELECT nextval(pg_get_serial_sequence('tenure_job', 'id')) AS id, payload
                FROM (
                    SELECT payload, n
                    FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(payload, n)
                    ORDER BY n
                ) AS e
            ), ins AS (
                INSERT INTO tenure_job (id, name, queue, priority, run_at, state, fence,
                    lease_owner, attempts, max_attempts, next_kind, version, created_at,
                    updated_at, hinted_at, last_error, reason)
                SELECT p.id, %s, %s, %s, COALESCE(%s::timestamptz, {PG_NOW}), 'waiting', 0,
                    '', 0, %s, 'run', 1, {PG_NOW}, {PG_NOW}, {hint}, '', ''
                FROM p
                RETURNING id, run_at
            ), spec AS (
                INSERT INTO tenure_job_spec (job_id, {", ".join(SPEC_COLUMNS)})
                SELECT p.id, p.payload, %s, %s, %s FROM p
            )
            SELECT id, run_at FROM ins
        """
        params = [
            json.dumps(list(payloads), ensure_ascii=False, allow_nan=False),
            fields["name"],
            fields["queue"],
            fields["priority"],
            fields["run_at"],
            fields["max_attempts"],
            fields["lease_seconds"],
            fields["effect"],
            fields["timeout_seconds"],
        ]
        with self.atomic(), self.connection.cursor() as cur:
            cur.execute(sql, params)
            return sorted((int(i), to_datetime(at)) for i, at in cur.fetchall())

    def prune_finished(self, state: str, older_than: float, *, limit: int = 1000) -> int:
        """One statement; rows another transaction holds are skipped (two schedulers pruning
        at once delete disjoint batches)."""
        if state not in PRUNABLE:
            raise ValueError(f"only finished jobs are pruned, not {state!r}")
        if older_than <= 0 or limit < 1:
            return 0
        with self.atomic(), self.connection.cursor() as cur:
            cur.execute(_PRUNE_SQL, [state, older_than, limit, state])
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
            # A round's bookkeeping on one core, compiled never: the planner costs each job's
            # attempt probe high, and past jit_above_cost the server compiles the statement,
            # which costs more than it saves (93 ms with it, 62 without, on 554,400 jobs).
            cur.execute("SET LOCAL jit = off")
            cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            cur.execute(
                _ROLLUP_SQL,
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
            cur.execute(
                """
                SELECT pid, application_name, state, xact_start,
                    extract(epoch FROM clock_timestamp() - xact_start) AS seconds
                FROM pg_stat_activity
                WHERE datname = current_database() AND backend_xmin IS NOT NULL
                    AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
                ORDER BY xact_start LIMIT 1
                """
            )
            oldest = cur.fetchone()
            cols = [c[0] for c in cur.description]
            session = dict(zip(cols, oldest, strict=True)) if oldest else None
            cur.execute(
                """
                SELECT n_dead_tup, n_live_tup, autovacuum_count, last_autovacuum,
                    pg_total_relation_size(relid) AS bytes
                FROM pg_stat_user_tables WHERE relname = 'tenure_job'
                """
            )
            row = cur.fetchone()
            cols = [c[0] for c in cur.description]
            table = dict(zip(cols, row, strict=True)) if row else {}
        return {"session": session, "table": table}

    def estimated_jobs(self) -> int:
        """The planner's estimate of the job table's rows (kept by autovacuum)."""
        with self.connection.cursor() as cur:
            cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'tenure_job'::regclass")
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
        cur.execute("DISCARD PLANS", prepare=False)
    _planned_at[raw] = now


# What an ended attempt counts as: base.rollup_outcome, in SQL.
_ROLLUP_KIND = """
    CASE
        WHEN a.outcome IN ('succeeded', 'failed', 'indeterminate', 'retried') THEN a.outcome
        WHEN a.outcome = 'lease_expired' OR left(a.outcome, 11) = 'reconciled_' THEN
            CASE
                WHEN a.fence = j.fence AND j.state IN ('succeeded', 'failed', 'indeterminate')
                    THEN j.state
                WHEN a.fence <> j.fence OR j.state = 'waiting' THEN 'retried'
            END
    END
"""

_ROLLUP_JOBS = " OR ".join(
    [
        "(j.state IN ({}) AND j.updated_at >= %(since)s)".format(
            ", ".join(f"'{st.value}'" for st in states.RESTING)
        ),
        # A waiting job has an attempt only if it was claimed before (its fence grew): the
        # retried index holds just those, by time. Without it this arm could only read every
        # waiting job, and with a backlog the planner read the whole attempt table instead
        # (155 ms a minute on 1,000,000 jobs with 40,000 waiting; 0.05 ms through the index).
        f"(j.state = '{states.State.WAITING.value}' AND j.fence > 0 AND j.updated_at >= %(since)s)",
        f"(j.state = '{states.State.LEASED.value}' AND j.updated_at >= %(since)s)",
    ]
)
"""The jobs an attempt of the rollup's range can belong to (written since it began): one arm
per index that holds them — the state index's range for jobs at rest, the retried index's for
waiting jobs claimed before, the leases index for leased jobs (``models.in_states``)."""

_ROLLUP_SQL = f"""
WITH j AS MATERIALIZED (
    SELECT j.id, j.queue, j.name, j.state, j.fence, j.run_at
    FROM tenure_job j
    WHERE {_ROLLUP_JOBS}
), pairs AS MATERIALIZED (
    SELECT j.queue, j.name, a.claimed_at, a.finished_at, {_ROLLUP_KIND} AS kind,
        a.fence = j.fence AND j.state NOT IN ('waiting', 'cancelled') AS wait_known,
        greatest(0, extract(epoch FROM a.claimed_at - j.run_at) * 1000) AS wait_ms
    FROM j CROSS JOIN LATERAL (
        -- Each job's attempts by the job-and-fence index: the cost follows the jobs of the
        -- minutes rolled up, never the attempts kept (OFFSET 0 keeps the planner from
        -- turning this into a hash join over a scan of every attempt).
        SELECT a.fence, a.outcome, a.claimed_at, a.finished_at
        FROM tenure_attempt a
        WHERE a.job_id = j.id
            AND ((a.finished_at >= %(start)s AND a.finished_at < %(end)s)
                OR (a.claimed_at >= %(start)s AND a.claimed_at < %(end)s))
        OFFSET 0
    ) a
), outcomes AS (
    SELECT date_trunc('minute', finished_at) AS minute, queue, name,
        count(*) FILTER (WHERE kind = 'succeeded') AS succeeded,
        count(*) FILTER (WHERE kind = 'failed') AS failed,
        count(*) FILTER (WHERE kind = 'indeterminate') AS indeterminate,
        count(*) FILTER (WHERE kind = 'retried') AS retried
    FROM pairs
    WHERE finished_at >= %(start)s AND finished_at < %(end)s AND kind IS NOT NULL
    GROUP BY 1, 2, 3
), claims AS (
    SELECT date_trunc('minute', claimed_at) AS minute, queue, name, count(*) AS claims,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_ms) FILTER (WHERE wait_known)
            AS wait_p50_ms,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_ms) FILTER (WHERE wait_known)
            AS wait_p95_ms
    FROM pairs
    WHERE claimed_at >= %(start)s AND claimed_at < %(end)s
    GROUP BY 1, 2, 3
)
SELECT minute, queue, name,
    coalesce(o.succeeded, 0) AS succeeded, coalesce(o.failed, 0) AS failed,
    coalesce(o.indeterminate, 0) AS indeterminate, coalesce(o.retried, 0) AS retried,
    coalesce(c.claims, 0) AS claims, c.wait_p50_ms, c.wait_p95_ms
FROM outcomes o FULL JOIN claims c USING (minute, queue, name)
ORDER BY minute, queue, name
"""
