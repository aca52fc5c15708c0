"""PostgreSQL's named statements: the text of every statement PostgreSQL's driver sends that the
ORM does not write, outside table and index upkeep (:mod:`.pg_tables`, :mod:`.pg_indexes`) and
the settings every new connection gets (:mod:`.connection_settings`).
:class:`~scheduler_core.storage.postgres.PostgresDriver` sends them; SQLite has its own
(:mod:`.sqlite_statements`), and no text is shared between the two.

A statement is named after the driver operation that sends it, in capitals
(``PostgresDriver.prune_finished`` sends :data:`PRUNE_FINISHED`); a statement put together per
call is built by a function ending in ``_sql`` (:func:`claim_sql`), and its placeholders, in
text order, by the function ending in ``_params`` beside it. Each says what the statement does
and what its placeholders are. One module over 500 lines on purpose: it is the one place to
find any of PostgreSQL's statements by name, and most of its length is their text and the
reasons kept with it (the claim and the completion are also built from parts they share,
:func:`claim_ctes` and :func:`complete_ctes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..domain import states
from ..models import Effect
from .records import (
    CLAIMED_JOB_COLUMNS,
    EPOCH_BITS,
    JOB_OPTION_COLUMNS,
    OPTION_COLUMNS,
    SPEC_COLUMNS,
)

PG_NOW = "clock_timestamp()"
"""The database's clock in PostgreSQL's statements: the time of the call, not of the
transaction's start."""

NOW = f"SELECT {PG_NOW}"
"""``PostgresDriver.now``: the database's clock."""

WAKEUP_CHANNEL = "tenure_wakeup"
"""The ``NOTIFY`` channel of wake-ups (:data:`SEND_WAKEUP`, :data:`LISTEN`)."""

# -- the claim ------------------------------------------------------------------------------

CLAIM_SET = """
    state = 'leased', fence = {fence}, attempts = {t}attempts + 1, lease_owner = %s,
    attempt_base = {t}attempt_base + {base},
    lease_expires_at = {expiry}, deadline_at = {deadline}, heartbeat_at = {now},
    updated_at = {now}, version = {t}version + 1
"""
"""The claim's ``SET`` list: ``{t}`` the table's alias with its dot, ``{fence}`` the new fence
(:data:`NEXT_FENCE`), ``{base}`` what the attempt numbers skip (:data:`NUMBER_SKIP`), ``{now}``,
``{expiry}`` and ``{deadline}`` the clock's expressions (from the spec's ``lease_seconds`` and
``timeout_seconds``); its one placeholder is the new owner."""

NEXT_FENCE = f"greatest({{t}}fence + 1, tenure_fence_epoch() << {EPOCH_BITS})"
"""PostgreSQL's new fence: one more than the job's, and at least the first fence of the epoch
of the timeline the server writes now (``tenure_fence_epoch()``, migration 0021), so a fence
handed out after a promotion is above every fence of an earlier timeline, those the promoted
standby never received included."""

NUMBER_SKIP = f"""CASE
        WHEN {{t}}fence >= tenure_fence_epoch() << {EPOCH_BITS} THEN 0
        WHEN {{t}}created_at >= coalesce(
            (SELECT tl.first_seen_at FROM tenure_timeline AS tl
             WHERE tl.timeline = (SELECT tenure_fence_epoch() + 1)), 'infinity') THEN 0
        ELSE greatest({{t}}max_attempts - {{t}}attempts, 0) END"""
"""How far the first claim on a new timeline moves a job's attempt numbers
(``Job.attempt_base``): for a job claimed last on an earlier timeline (its fence is below the
epoch's first) and older than the timeline (created before Tenure first wrote on it; a
timeline without its row counts as new to every job), past the job's budget. The timeline
the primary wrote before the promotion may have claimed the job again, in commits the standby
never received, and numbered those attempts at most ``max_attempts``; the first number given
now is ``max_attempts + 1``. On a cluster never promoted (epoch 0) the first test is true for
every job and nothing is read; the timeline's row is an uncorrelated subquery, read once per
statement, by its key (the epoch in a sub-select of its own: the function is volatile, and a
volatile comparison cannot be an index condition). SQLite has one timeline: nothing to skip."""


def claimable(job: str, *, per_row: str = "") -> str:
    """The claim's guards on each candidate (``job``: the job table's name or alias in the
    candidate read): the job has its spec row and no open attempt. Tenure's own
    writes never break either (the enqueue writes the spec in the job's statement; an attempt
    is closed in the transaction that ends its lease). Rows written by hand or a defect can,
    and such a job took the claim down with it: without a spec the claim leased nothing on
    PostgreSQL (a claim of one job came back empty with work due) and failed on SQLite; beside
    an open attempt the database's one-open-attempt rule (migrations 0015, 0017) refused the
    claim's new attempt. Either way every claim that reached the job came back empty or failed,
    and the queue stopped. The claim passes over such a job instead: the reaper's sweep closes a stray
    attempt (:meth:`~scheduler_core.storage.bookkeeping.Bookkeeping.close_stray_attempts`), and
    a job without a spec stays due, which the console's verdict reports as stuck. Two probes by
    key per candidate read. ``per_row`` ends the open-attempt probe's subquery: PostgreSQL's
    ``OFFSET 0`` keeps it a probe per candidate — pulled up into an anti-join, the planner
    read every open attempt for each claim, and a Celery executor's drain, one claim a message,
    took twice as long (``python -m bench.startup --systems tenure-celery``: 8.4-10.8 s against
    4.1-4.9 s without the probe or with it kept)."""
    return (
        f"EXISTS (SELECT 1 FROM tenure_job_spec AS cs WHERE cs.job_id = {job}.id) "
        "AND NOT EXISTS (SELECT 1 FROM tenure_attempt AS oa "
        f"WHERE oa.job_id = {job}.id AND oa.finished_at IS NULL {per_row})"
    )


ATTEMPT_INSERT = """
    INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at,
        lease_expires_at, heartbeat_at, deadline_at, outcome, error_class, error_type, message,
        traceback)
    SELECT id, attempts + attempt_base, fence, next_kind, lease_owner, heartbeat_at, lease_expires_at,
        heartbeat_at, deadline_at, '', '', '', '', ''
"""
"""The Attempt row of each claimed job, read from the job as the claim left it (the claim adds
its ``FROM``)."""


RESTRICTED_QUEUE = "(tq.paused OR tq.max_leased IS NOT NULL OR tq.max_per_second IS NOT NULL)"
"""A ``tenure_queue`` row (alias ``tq``) that stops the plain claim: paused, or limited."""


LIMITED_QUEUE = "(NOT tq.paused AND (tq.max_leased IS NOT NULL OR tq.max_per_second IS NOT NULL))"
"""A ``tenure_queue`` row (alias ``tq``) whose jobs are claimed within its limits
(:meth:`Driver.claim_within_limits`)."""


def open_queue(queue: str) -> str:
    """The claim's gate: the job's queue (``queue``: a placeholder, or the column of the queue
    being read) has no ``tenure_queue`` row that pauses or limits it. A
    primary-key probe of a table that holds only the queues an operator configured, once per
    queue read where ``queue`` is not the job's own column (a filter evaluated once, which
    keeps the claim index's ordered walk); a queue without a row has no limits."""
    return (
        f"NOT EXISTS (SELECT 1 FROM tenure_queue AS tq WHERE tq.name = {queue} "
        f"AND {RESTRICTED_QUEUE})"
    )


CLAIM_BY_ID, CLAIM_ONE_QUEUE, CLAIM_QUEUES, CLAIM_FROM_FLOORS = "id", "queue", "queues", "floors"
"""The shapes of PostgreSQL's claim: the job a message names; a queue's due jobs read from the
start of the claim index; the same for several queues; and a seek from this process's floors
(:class:`~.floors.ClaimFloors`)."""


def claim_shape(*, by_id: bool, nqueues: int, floors: bool) -> str:
    """Which shape a claim takes: of the job ``by_id``, of ``nqueues`` queues, or from this
    process's floors (``floors``: there are seeks to make)."""
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
    # ``(state = …) IS TRUE`` keeps each guard out of the index conditions, so stale
    # statistics cannot turn the key lookup into a walk of the state index
    # (docs/architecture.md, "Why some statements look as they do"; tests/db/test_claim_plan.py).
    return f"""
    cand AS ({cand}
    ), claimed AS (
        UPDATE tenure_job AS j SET {
        CLAIM_SET.format(
            t="j.",
            fence=NEXT_FENCE.format(t="j."),
            base=NUMBER_SKIP.format(t="j."),
            now=now,
            expiry=expiry,
            deadline=deadline,
        )
    }
        FROM cand JOIN tenure_job_spec AS s ON s.job_id = cand.id
        WHERE j.id = cand.id AND (j.state = 'waiting') IS TRUE
        RETURNING {", ".join("j." + c for c in CLAIMED_JOB_COLUMNS)},
            {", ".join("s." + c for c in SPEC_COLUMNS)}, j.lease_owner,
            j.lease_expires_at, j.deadline_at
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


# -- the completion ----------------------------------------------------------------------

STILL_OPEN = "(tenure_attempt.finished_at IS NULL) IS TRUE"
"""The guard "this attempt has not ended" in PostgreSQL's statements: written as
:func:`~scheduler_core.storage.records.still_open` writes it for the ORM, which says why."""


def complete_ctes(fence_match: str) -> str:
    """:meth:`PostgresDriver.complete` as ``WITH`` parts, for any number of leases (placeholders:
    :meth:`PostgresDriver._complete_params`): :meth:`Driver.finish`'s writes for ``COMPLETE``
    (``tests/db/test_bulk_and_fast_paths.py`` checks the two leave the same rows), each job
    fenced by its own lease (``fence_match``), refused past the attempt's deadline or while the
    ledger holds an effect that may or may not have happened (an index probe per job), and
    after an operator's cancel request unless an effect of the job was applied. Each attempt
    is found by its key (:func:`~scheduler_core.storage.records.still_open` says why). An
    attempt's result, when it has one, is written by the same fenced update."""
    return f"""
        done AS (
            SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::text[])
                AS d(jid, jfence, aid, result)
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
            UPDATE tenure_attempt SET outcome = 'succeeded', finished_at = clock_timestamp(),
                return_value = done.result::jsonb
            FROM done JOIN job ON job.id = done.jid
            WHERE tenure_attempt.id = ANY(%s::bigint[]) AND tenure_attempt.id = done.aid
                AND {STILL_OPEN}
        )"""


COMPLETE_RESULT = (
    "(SELECT coalesce(array_agg(id), '{}') FROM job) AS completed, txid_current() AS xid"
)
"""The ids of the jobs whose fenced completion matched, and the transaction's id."""

FENCE_MATCH = "fence = done.jfence"
"""The completion statement's fence guard: the job's fence is still the completing attempt's."""


def release_ctes(parents: str) -> str:
    """A step's release as ``WITH`` parts, ``released`` and ``due``: the children of the
    steps ``parents`` (an expression of their ids) count them off, and those brought to zero
    become due if they are still blocked. Placeholder: the blocked steps' due time
    (:data:`~scheduler_core.domain.workflows.BLOCKED_AT`). :data:`STEPS_SUCCEEDED` says why
    its rows are named by key."""
    return f"""
        released AS (
            UPDATE tenure_workflow_step SET pending = pending - (
                SELECT count(*) FROM tenure_workflow_edge AS e
                WHERE e.child_id = tenure_workflow_step.job_id AND e.parent_id = ANY({parents}))
            WHERE job_id = ANY(ARRAY(
                SELECT child_id FROM tenure_workflow_edge WHERE parent_id = ANY({parents})))
            RETURNING job_id, pending
        ), due AS (
            UPDATE tenure_job SET run_at = {PG_NOW}, updated_at = {PG_NOW}, hinted_at = NULL,
                reason = ''
            WHERE id = ANY(ARRAY(SELECT job_id FROM released WHERE pending <= 0))
                AND (state = '{states.State.WAITING.value}' AND run_at = %s) IS TRUE
            RETURNING id, queue, priority, run_at
        )"""


RELEASE_CTES = f"""
        stepped AS (
            SELECT ARRAY(SELECT id FROM job WHERE id = ANY(%s::bigint[])) AS ids
        ), {release_ctes("(SELECT ids FROM stepped)::bigint[]")}"""
"""A step's release as ``WITH`` parts after :func:`complete_ctes`, in the completion's own
statement: the steps among the jobs whose fenced completion matched (``job``) count themselves
off their children, and the children brought to zero become due — a refused completion
releases nothing, and the release costs no round trip of its own. Placeholders: the leases'
job ids that are workflow steps, the blocked steps' due time
(:data:`~scheduler_core.domain.workflows.BLOCKED_AT`); the parts are :func:`release_ctes`."""

DUE_RESULT = (
    "(SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM due) AS due_ids, "
    "(SELECT coalesce(array_agg(queue ORDER BY id), '{}') FROM due) AS due_queues, "
    "(SELECT coalesce(array_agg(priority ORDER BY id), '{}') FROM due) AS due_priorities, "
    "(SELECT min(run_at) FROM due) AS due_at"
)
"""The steps :data:`RELEASE_CTES` made due: their ids, queues and priorities (in id order), and
the earliest due time among them (a wake-up announcing them must not name a later one)."""


def complete_sql(fence_match: str = FENCE_MATCH, *, steps: bool = False) -> str:
    """:meth:`PostgresDriver.complete`'s statement for one lease; with ``steps``, the lease is
    a workflow step's and the statement releases its children (:data:`RELEASE_CTES`)."""
    if steps:
        return (
            f"WITH {complete_ctes(fence_match)}, {RELEASE_CTES} "
            f"SELECT {COMPLETE_RESULT}, {DUE_RESULT}"
        )
    return f"WITH {complete_ctes(fence_match)} SELECT {COMPLETE_RESULT}"


def complete_many_sql(shape: str, fence_match: str = FENCE_MATCH, *, steps: bool = False) -> str:
    """:meth:`PostgresDriver.complete_many_and_claim`'s statement: the claim's and the
    completions' parts, one row per claimed job (at least one, for the completions' result);
    with ``steps``, some leases are workflow steps' and the statement releases their children
    (:data:`RELEASE_CTES`; placeholders after the completions')."""
    release = f", {RELEASE_CTES}" if steps else ""
    due = f", {DUE_RESULT}" if steps else ""
    return (
        f"WITH {claim_ctes(shape)}, {complete_ctes(fence_match)}{release} "
        f"SELECT {COMPLETE_RESULT}{due}, {limited_sql(shape)} AS limited, got.* "
        "FROM (SELECT 1) AS one LEFT JOIN got ON true"
    )


# -- the lease ---------------------------------------------------------------------------

_RENEW_LEASE = f"""
    UPDATE tenure_job SET lease_expires_at = {{expiry}}, heartbeat_at = {{now}}
    WHERE id = %s AND (state = '{states.State.LEASED.value}') IS TRUE AND fence = %s
        AND deadline_at > {{now}}
    RETURNING cancel_requested_at, lease_expires_at, heartbeat_at
"""
"""The lease renewal: ``{now}`` and ``{expiry}`` (the database's now plus the lease, its one
placeholder first) are the clock's expressions; then the job id and the fence.
It returns whether an operator asked the attempt to stop, so the attempt learns it from the
renewal it makes anyway, and the renewed lease, which the attempt's row then holds too. The
state is tested as ``(…) IS TRUE`` so that the leases index cannot serve it
(:func:`~scheduler_core.storage.records.still_open` says why)."""

RENEW_LEASE = _RENEW_LEASE.format(now=PG_NOW, expiry=f"({PG_NOW} + make_interval(secs => %s))")
"""``PostgresDriver.renew_lease``: the lease renewal with PostgreSQL's clock. Placeholders: the
lease in seconds, the job id, the fence."""


# -- claim floors ------------------------------------------------------------------------

PRIORITY_MAX = 32_767
"""The largest ``priority`` (a ``smallint``)."""

WAITING_PRIORITIES = """
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


# -- enqueue -----------------------------------------------------------------------------

DB_SET = ("id", "run_at", "created_at", "updated_at", "hinted_at")
"""The columns of a new job whose values the database sets (its clock, its sequence)."""


PG_TYPES = {
    "name": "text",
    "queue": "text",
    "priority": "int",
    "run_at": "timestamptz",
    "max_attempts": "int",
    "lease_seconds": "int",
    "effect": "text",
    "timeout_seconds": "float8",
    "payload": "jsonb",
    "workflow_id": "bigint",
    "trace_context": "jsonb",
}
"""PostgreSQL's column list of the job spec (``records.OPTION_COLUMNS``): each column's type, to
which every insert casts its value (a workflow's steps arrive as a JSON recordset typed by it).
``tests/unit/test_job_options.py`` fails when it misses a column."""


def option_value(column: str, source: str) -> str:
    """The value an insert writes for ``column`` of the job spec, from ``source`` (a placeholder
    or a recordset's column), cast to the column's type; a due time of NULL is the database's
    now."""
    value = f"{source}::{PG_TYPES[column]}"
    return f"COALESCE({value}, {PG_NOW})" if column == "run_at" else value


def _values(columns: Sequence[str], source: str, **instead: str) -> str:
    """:func:`option_value` of each of ``columns`` from ``source`` (``{c}``: the column's name),
    but ``instead``'s expression where it names one."""
    return ", ".join(instead.get(c) or option_value(c, source.format(c=c)) for c in columns)


def insert_job_sql(*, on_conflict: str) -> str:
    """One job and its spec row, with the values the database sets (:data:`DB_SET`) returned;
    ``on_conflict`` the clause for a unique key. Placeholders by name: the job spec's columns
    (``records.OPTION_COLUMNS``), ``unique_key``, ``schedule_id`` and ``hint`` (whether its
    hint is marked sent now)."""
    # The spec row is inserted from the job's: a job refused by ``ON CONFLICT`` gets none.
    return f"""
    WITH ins AS (
        INSERT INTO tenure_job ({", ".join(JOB_OPTION_COLUMNS)}, state, fence, lease_owner,
            attempts, unique_key, next_kind, version, schedule_id, created_at, updated_at,
            hinted_at, last_error, reason)
        VALUES ({_values(JOB_OPTION_COLUMNS, "%({c})s")}, 'waiting', 0, '', 0, %(unique_key)s,
            'run', 1, %(schedule_id)s, clock_timestamp(), clock_timestamp(),
            CASE WHEN %(hint)s THEN clock_timestamp() END, '', '')
        {on_conflict}
        RETURNING {", ".join(DB_SET)}
    ), spec AS (
        INSERT INTO tenure_job_spec (job_id, {", ".join(SPEC_COLUMNS)})
        SELECT id, {_values(SPEC_COLUMNS, "%({c})s")}
        FROM ins
    )
    SELECT {", ".join("ins." + c for c in DB_SET)} FROM ins
"""


INSERT_JOB = {
    False: insert_job_sql(on_conflict=""),
    # The conflict target names the unique index's predicate: the index holds set keys only.
    True: insert_job_sql(
        on_conflict="ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING"
    ),
}
""":func:`insert_job` on PostgreSQL, without and with a unique key: the insert and the values
the database sets, in one statement. Written out rather than compiled by the ORM on every
enqueue, which cost more (0.8 ms of the client's CPU) than the round trips it saves."""


def insert_jobs_sql(*, hinted: bool) -> str:
    """``PostgresDriver.insert_jobs``: one waiting job and its spec row per payload, in one
    statement. Placeholders by name: ``payloads`` (a JSON array) and the job spec's other
    columns (``records.OPTION_COLUMNS``), the same for every job. ``hinted``: the jobs' hint is
    marked sent now."""
    hint = PG_NOW if hinted else "NULL"
    # Each payload's job id is drawn first, in the payloads' order, so the job rows and
    # their spec rows pair up in one statement.
    return f"""
            WITH p AS (
                SELECT nextval(pg_get_serial_sequence('tenure_job', 'id')) AS id, payload
                FROM (
                    SELECT payload, n
                    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS e(payload, n)
                    ORDER BY n
                ) AS e
            ), ins AS (
                INSERT INTO tenure_job (id, {", ".join(JOB_OPTION_COLUMNS)}, state, fence,
                    lease_owner, attempts, next_kind, version, created_at, updated_at,
                    hinted_at, last_error, reason)
                SELECT p.id, {_values(JOB_OPTION_COLUMNS, "%({c})s")}, 'waiting', 0, '', 0,
                    'run', 1, {PG_NOW}, {PG_NOW}, {hint}, '', ''
                FROM p
                RETURNING id, run_at
            ), spec AS (
                INSERT INTO tenure_job_spec (job_id, {", ".join(SPEC_COLUMNS)})
                SELECT p.id, {_values(SPEC_COLUMNS, "%({c})s", payload="p.payload")} FROM p
            )
            SELECT id, run_at FROM ins
        """


# -- retention ---------------------------------------------------------------------------

PRUNE_FINISHED = f"""
    WITH doomed AS (
        SELECT j.id FROM tenure_job j
        WHERE j.state = %s AND j.updated_at < statement_timestamp() - make_interval(secs => %s)
          AND NOT EXISTS (SELECT 1 FROM tenure_audit a WHERE a.job_id = j.id)
          AND NOT EXISTS (
            SELECT 1 FROM tenure_effect e WHERE e.job_id = j.id
                AND e.state IN ('{Effect.INTENDED}', '{Effect.UNKNOWN}'))
          AND NOT EXISTS (
            SELECT 1 FROM tenure_workflow_edge w JOIN tenure_job c ON c.id = w.child_id
            WHERE w.parent_id = j.id AND c.state IN ('waiting', 'leased'))
        ORDER BY j.updated_at, j.id
        LIMIT %s
        FOR UPDATE SKIP LOCKED
    ), steps AS (
        DELETE FROM tenure_workflow_step WHERE job_id IN (SELECT id FROM doomed)
    ), edges AS (
        DELETE FROM tenure_workflow_edge
        WHERE parent_id IN (SELECT id FROM doomed) OR child_id IN (SELECT id FROM doomed)
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
"""``PostgresDriver.prune_finished``: one statement (placeholders: the state, the age in seconds,
the batch's size, the state again); rows another transaction holds are
skipped (two schedulers pruning at once delete disjoint batches). The cut-off is the
statement's time, not ``clock_timestamp()``: a volatile bound is no index condition, and every
round then read the whole state's range of ``tenure_job_state`` (25,000 succeeded jobs, 25 ms,
in a soak's third minute) to delete nothing."""


# -- history -----------------------------------------------------------------------------

ROLLUP_KIND = """
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
"""What an ended attempt counts as: ``history.rollup_outcome``, in SQL (``a`` the attempt,
``j`` its job)."""

ROLLUP_JOBS = " OR ".join(
    [
        "(j.state IN ({}) AND j.updated_at >= %(since)s)".format(
            ", ".join(f"'{st.value}'" for st in states.RESTING)
        ),
        # A waiting job has an attempt only if it was claimed before (its fence grew): the
        # retried index holds just those, by time; without it this arm reads every waiting
        # job (docs/architecture.md, "Why some statements look as they do").
        f"(j.state = '{states.State.WAITING.value}' AND j.fence > 0 AND j.updated_at >= %(since)s)",
        f"(j.state = '{states.State.LEASED.value}' AND j.updated_at >= %(since)s)",
    ]
)
"""The jobs an attempt of the rollup's range can belong to (written since it began): one arm
per index that holds them — the state index's range for jobs at rest, the retried index's for
waiting jobs claimed before, the leases index for leased jobs (``models.in_states``)."""

MINUTE_ROLLUP = f"""
WITH j AS MATERIALIZED (
    SELECT j.id, j.queue, j.name, j.state, j.fence, j.run_at
    FROM tenure_job j
    WHERE {ROLLUP_JOBS}
), pairs AS MATERIALIZED (
    SELECT j.queue, j.name, a.claimed_at, a.finished_at, {ROLLUP_KIND} AS kind,
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
"""``PostgresDriver.minute_rollup``: counts by outcome and ``percentile_cont`` of the queue
wait, per minute, queue and type, in one statement. Placeholders by name: ``start`` and
``end`` of the range, ``since`` (the start less ``history.ROLLUP_MARGIN``)."""


MINUTE_ROLLUP_SETTINGS = ("SET LOCAL jit = off", "SET LOCAL max_parallel_workers_per_gather = 0")
"""Sent before :data:`MINUTE_ROLLUP`, in its transaction: the round runs on one core, never
compiled."""


# -- workflows -----------------------------------------------------------------------------

STEPS_SUCCEEDED = f"""
    WITH parents AS (SELECT %s::bigint[] AS ids), {release_ctes("(SELECT ids FROM parents)::bigint[]")}
    SELECT id, queue, priority, run_at FROM due
"""
"""``PostgresDriver.steps_succeeded``, a step's release: its children count it off, and those
it brings to zero become due, in one statement (:func:`release_ctes`, as the completion's own
statement writes it). Placeholders: the parents' ids, the blocked steps' due time
(:data:`~scheduler_core.domain.workflows.BLOCKED_AT`).

The children's step rows are named as an array of keys: as a join, a table filled since its
statistics were taken looked small, and the planner read every step row on every completion
(1 ms at 4,200 steps, growing with them). The jobs made due are found by key too, and their
state and due time are tested as ``(…) IS TRUE``
(:class:`~scheduler_core.storage.records.Holds`): written plainly, PostgreSQL read the claim
index's waiting entries, every blocked step among them, instead of the rows by key (2 ms at
4,200 blocked steps, growing with them)."""

INSERT_WORKFLOW_JOBS = f"""
    WITH s AS (
        SELECT nextval(pg_get_serial_sequence('tenure_job', 'id')) AS id, e.*
        FROM (
            SELECT * FROM jsonb_to_recordset(%s::jsonb) AS x(
                n int, blocked boolean, hinted boolean, step text, pending int,
                {", ".join(f"{c} {PG_TYPES[c]}" for c in OPTION_COLUMNS)})
            ORDER BY n
        ) AS e
    ), ins AS (
        INSERT INTO tenure_job (id, {", ".join(JOB_OPTION_COLUMNS)}, state, fence, lease_owner,
            attempts, next_kind, version, created_at, updated_at, hinted_at, last_error, reason)
        SELECT s.id, {_values(JOB_OPTION_COLUMNS, "s.{c}")}, 'waiting', 0, '', 0, 'run', 1,
            {PG_NOW}, {PG_NOW}, CASE WHEN s.hinted THEN {PG_NOW} END, '',
            CASE WHEN s.blocked THEN %s ELSE '' END
        FROM s
    ), spec AS (
        INSERT INTO tenure_job_spec (job_id, {", ".join(SPEC_COLUMNS)})
        SELECT s.id, {_values(SPEC_COLUMNS, "s.{c}")}
        FROM s
    ), step AS (
        INSERT INTO tenure_workflow_step (job_id, workflow_id, name, pending, cancelled_by)
        SELECT s.id, %s, s.step, s.pending, NULL FROM s
    ), edge AS (
        INSERT INTO tenure_workflow_edge (workflow_id, parent_id, child_id)
        SELECT %s, p.id, c.id
        FROM unnest(%s::int[], %s::int[]) AS e(parent, child)
        JOIN s AS p ON p.n = e.parent
        JOIN s AS c ON c.n = e.child
    )
    SELECT n, id FROM s
"""
"""``PostgresDriver.insert_workflow_jobs``: a workflow's jobs, specs, step rows and edges in one
statement. Placeholders: the steps (a JSON array: each step's job spec by column name, a
blocked step's due time :data:`~scheduler_core.domain.workflows.BLOCKED_AT`, with ``n``,
``blocked``, ``hinted``, ``step`` and ``pending``), the blocked reason, the workflow id
(twice), the edges' parents and children (step indexes)."""


# -- the connection and the server ---------------------------------------------------------

TIMELINE = "SELECT tenure_fence_epoch() + 1"
"""``PostgresDriver.timeline``: the timeline the server writes on now, from the name of the WAL
file it writes (``tenure_fence_epoch()``, the function the claim reads)."""

RECORD_TIMELINE = (
    "INSERT INTO tenure_timeline (timeline, first_seen_at) "
    "SELECT tenure_fence_epoch() + 1, clock_timestamp() "
    "ON CONFLICT (timeline) DO NOTHING"
)
"""``PostgresDriver.record_timeline``: the current timeline with the database's now, unless it
is recorded already (a probe of a one-row-per-timeline table)."""

DATABASE_IDENTITY = (
    "SELECT oid::text AS oid, datname FROM pg_database WHERE datname = current_database()"
)
"""``PostgresDriver.read_identity``: the database's oid and name."""

CLUSTER_IDENTITY = "SELECT system_identifier::text AS system_identifier FROM pg_control_system()"
"""``PostgresDriver.read_identity``: the cluster's ``system_identifier`` (some servers refuse
``pg_control_system()``)."""

TRANSACTION_ID = "SELECT txid_current()"
"""``PostgresDriver.transaction_id``: this transaction's id, assigned now."""

TRANSACTION_STATUS = "SELECT txid_status(%s)"
"""``PostgresDriver.transaction_status``: what became of transaction ``%s``."""


def idle_timeout_sql(ms: int, *, local: bool = False) -> str:
    """How long a transaction may idle between statements before the server ends it: the
    session's (``configure_executor_connection``) or, ``local``, this transaction's
    (``limit_handler_idle``). No placeholder: ``SET`` takes none."""
    if local:
        return f"SET LOCAL idle_in_transaction_session_timeout = {ms}"
    return f"SET idle_in_transaction_session_timeout = {ms}"


GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
"""``PostgresDriver.configure_executor_connection``, with prepared statements: the claim and the
completion keep their generic plans, which look rows up by key."""

DISCARD_PLANS = "DISCARD PLANS"
"""Every ``REPLAN_SECONDS``: plan every statement of the connection afresh."""

SEND_WAKEUP = (
    "SELECT pg_notify(%s, w) FROM unnest(%s::text[]) AS w, "
    "(SELECT set_config('synchronous_commit', 'off', true)) AS local"
)
"""``PostgresDriver.send_wakeups``: wake-ups, in a transaction that only notifies, so nothing
in it needs to reach the disk before they are delivered (``set_config(..., true)`` lasts
until its end). Placeholders: the channel (:data:`WAKEUP_CHANNEL`), the wake-ups' texts."""

LISTEN = f"LISTEN {WAKEUP_CHANNEL}"
"""``PostgresDriver.listen``: wake-ups, on a connection of their own."""

OLDEST_SNAPSHOT = """
                SELECT pid, application_name, state, xact_start,
                    extract(epoch FROM clock_timestamp() - xact_start) AS seconds
                FROM pg_stat_activity
                WHERE datname = current_database() AND backend_xmin IS NOT NULL
                    AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
                ORDER BY xact_start LIMIT 1
                """
"""``PostgresDriver.database_pressure``: the session holding the oldest snapshot this
database's vacuum must respect."""

JOB_TABLE_ROWS = """
                SELECT n_dead_tup, n_live_tup, autovacuum_count, last_autovacuum,
                    pg_total_relation_size(relid) AS bytes
                FROM pg_stat_user_tables WHERE relname = 'tenure_job'
                """
"""``PostgresDriver.database_pressure``: the job table's dead and live rows, its autovacuums
and its size."""

ESTIMATED_JOBS = "SELECT reltuples::bigint FROM pg_class WHERE oid = 'tenure_job'::regclass"
"""``PostgresDriver.estimated_jobs``: the planner's estimate of the job table's rows."""
