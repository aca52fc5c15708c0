"""SQLite's named statements: the text of every statement SQLite's driver sends that the ORM
does not write, outside the settings every new connection gets (:mod:`.connection_settings`).
:class:`~scheduler_core.storage.sqlite.SqliteDriver` sends them; PostgreSQL has its own
(:mod:`.pg_statements`), and no text is shared between the two.

A statement is named after the driver operation that sends it, in capitals
(``SqliteDriver.renew_lease`` sends :data:`RENEW_LEASE`); a statement put together per call is
built by a function ending in ``_sql`` (:func:`claim_sql`). Each says what the statement does
and what its placeholders are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..domain import states
from .records import CLAIMED_JOB_COLUMNS, JOB_OPTION_COLUMNS, JSON_COLUMNS, SPEC_COLUMNS

SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
"""The database's clock in SQLite's statements, as the text Django stores datetimes in (``%``
escaped for the placeholders' pass)."""

NOW = f"SELECT {SQLITE_NOW}"
"""``SqliteDriver.now``: the database's clock."""

# -- the claim ------------------------------------------------------------------------------

CLAIM_SET = """
    state = 'leased', fence = {fence}, attempts = {t}attempts + 1, lease_owner = %s,
    lease_expires_at = {expiry}, deadline_at = {deadline}, heartbeat_at = {now},
    updated_at = {now}, version = {t}version + 1
"""
"""The claim's ``SET`` list: ``{t}`` the table's alias with its dot (or nothing), ``{fence}``
the new fence (:data:`NEXT_FENCE`), ``{now}``, ``{expiry}`` and ``{deadline}`` the clock's
expressions (from the spec's ``lease_seconds`` and ``timeout_seconds``); its one placeholder is
the new owner."""

NEXT_FENCE = "{t}fence + 1"
"""The new fence: one more than the job's (SQLite has one history: no timelines, epoch 0)."""


def claimable(job: str) -> str:
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
    key per candidate read (PostgreSQL's copy, :func:`.pg_statements.claimable`, keeps its
    probe per candidate with ``OFFSET 0``, which SQLite does not need)."""
    return (
        f"EXISTS (SELECT 1 FROM tenure_job_spec AS cs WHERE cs.job_id = {job}.id) "
        "AND NOT EXISTS (SELECT 1 FROM tenure_attempt AS oa "
        # The space before the parenthesis is the statement's text as it has always been.
        f"WHERE oa.job_id = {job}.id AND oa.finished_at IS NULL )"
    )


RESTRICTED_QUEUE = "(tq.paused OR tq.max_leased IS NOT NULL OR tq.max_per_second IS NOT NULL)"
"""A ``tenure_queue`` row (alias ``tq``) that stops the plain claim: paused, or limited."""


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


def claim_sql(*, by_id: bool, nqueues: int, gate: bool = True) -> str:
    """The claim: one conditional ``UPDATE ... RETURNING`` of the due waiting jobs in the
    claim's order (placeholders: the new owner, the job id or the queues, the limit).
    ``gate`` keeps out the jobs of paused and limited queues (:func:`open_queue`); only
    :meth:`SqliteDriver.claim_limited_queue` leaves it out. It always passes over a job without
    its spec or beside an open attempt (:func:`claimable`)."""
    guards = f"AND {claimable('tenure_job')} " + (
        f"AND {open_queue('tenure_job.queue')}" if gate else ""
    )
    # SQLite's UPDATE ... FROM may not name the joined table in RETURNING; a subquery by key
    # per column may, in the SET list and in RETURNING alike.
    spec = "(SELECT {c} FROM tenure_job_spec AS s WHERE s.job_id = tenure_job.id)"
    lease, timeout = spec.format(c="lease_seconds"), spec.format(c="timeout_seconds")
    returned = [
        *CLAIMED_JOB_COLUMNS,
        *(f"{spec.format(c=c)} AS {c}" for c in SPEC_COLUMNS),
    ]
    expiry = f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || {lease} || ' seconds')"
    deadline = f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || {timeout} || ' seconds')"
    where = "id = %s" if by_id else f"queue IN ({', '.join(['%s'] * nqueues)})"
    return f"""
    UPDATE tenure_job SET {CLAIM_SET.format(t="", fence=NEXT_FENCE.format(t=""), now=SQLITE_NOW, expiry=expiry, deadline=deadline)}
    WHERE state = 'waiting' AND id IN (
        SELECT id FROM tenure_job
        WHERE state = 'waiting' AND {where} AND run_at <= {SQLITE_NOW} {guards}
        ORDER BY priority DESC, run_at, id
        LIMIT %s
    )
    RETURNING {", ".join(returned)}
    """


ATTEMPT_INSERT = """
    INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at,
        lease_expires_at, heartbeat_at, deadline_at, outcome, error_class, error_type, message,
        traceback)
    SELECT id, attempts + attempt_base, fence, next_kind, lease_owner, heartbeat_at, lease_expires_at,
        heartbeat_at, deadline_at, '', '', '', '', ''
"""
"""The Attempt row of each claimed job, read from the job as the claim left it (the claim adds
its ``FROM``: :func:`attempt_insert_sql`)."""


def attempt_insert_sql(claimed: int) -> str:
    """``SqliteDriver.claim``'s second statement: the Attempt rows of the ``claimed`` jobs just
    claimed, their ids returned with their jobs'. Placeholders: the jobs' ids."""
    marks = ", ".join(["%s"] * claimed)
    return f"{ATTEMPT_INSERT} FROM tenure_job WHERE id IN ({marks}) RETURNING id, job_id"


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

RENEW_LEASE = _RENEW_LEASE.format(
    now=SQLITE_NOW, expiry="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
)
"""``SqliteDriver.renew_lease``: the lease renewal with SQLite's clock. Placeholders: the lease
as a modifier (``"+30.000000 seconds"``), the job id, the fence."""


# -- enqueue -----------------------------------------------------------------------------


def option_value(column: str) -> str:
    """The placeholder an insert writes for ``column`` of the job spec: JSON columns through
    ``json()`` (SQLite's own text of the document), a due time of NULL as the database's now."""
    if column in JSON_COLUMNS:
        return "json(%s)"
    return f"COALESCE(%s, {SQLITE_NOW})" if column == "run_at" else "%s"


def insert_jobs_sql(*, hinted: bool) -> str:
    """``SqliteDriver.insert_jobs``' first statement: one waiting job per payload, in the
    payloads' order. Placeholders: the job spec's columns on the job row
    (``records.JOB_OPTION_COLUMNS``), then the payloads (a JSON array). ``hinted``: the jobs'
    hint is marked sent now."""
    hint = SQLITE_NOW if hinted else "NULL"
    return f"""
            INSERT INTO tenure_job ({", ".join(JOB_OPTION_COLUMNS)}, state, fence, lease_owner,
                attempts, next_kind, version, created_at, updated_at, hinted_at, last_error,
                reason)
            SELECT {", ".join(option_value(c) for c in JOB_OPTION_COLUMNS)}, 'waiting', 0, '',
                0, 'run', 1, {SQLITE_NOW}, {SQLITE_NOW}, {hint}, '', ''
            FROM json_each(%s) AS p ORDER BY p.key
            RETURNING id, run_at
        """


INSERT_JOB_SPEC = f"""
            INSERT INTO tenure_job_spec (job_id, {", ".join(SPEC_COLUMNS)})
            VALUES (%s, {", ".join(option_value(c) for c in SPEC_COLUMNS)})
        """
"""``SqliteDriver.insert_jobs``' second statement, once per job: its spec row. Placeholders:
the job id, then the job spec's columns on the spec row (``records.SPEC_COLUMNS``)."""


# -- workflows ---------------------------------------------------------------------------

_RELEASE = """
        UPDATE tenure_workflow_step SET pending = pending - (
            SELECT count(*) FROM tenure_workflow_edge AS e
            WHERE e.child_id = tenure_workflow_step.job_id AND e.parent_id IN ({parents}))
        WHERE job_id {children}
        RETURNING job_id, pending
    """
"""The release's statement: each child of the completed ``{parents}`` counts them off."""

_CHILDREN_OF = "IN (SELECT child_id FROM tenure_workflow_edge WHERE parent_id IN ({parents}))"
"""How the release names the children's step rows (PostgreSQL's names them as an array of
keys: ``pg_statements.STEPS_SUCCEEDED`` says why)."""


def steps_succeeded_sql(parents: int) -> str:
    """``SqliteDriver.steps_succeeded``' first statement, a step's release: the children of
    ``parents`` steps count them off; returns each child's ``job_id`` and ``pending`` left.
    Placeholders: the parents' ids, twice."""
    marks = ", ".join(["%s"] * parents)
    return _RELEASE.format(parents=marks, children=_CHILDREN_OF.format(parents=marks))


def make_due_sql(steps: int) -> str:
    """``SqliteDriver.steps_succeeded``' second statement: ``steps`` blocked steps whose
    parents all succeeded become due now, if they are still blocked. Placeholders: the steps'
    ids, the waiting state, the blocked due time (``domain.workflows.BLOCKED_AT``). The state and
    due time are tested as ``(…) IS TRUE`` as PostgreSQL's release tests them
    (``pg_statements.STEPS_SUCCEEDED`` says why)."""
    marks = ", ".join(["%s"] * steps)
    return f"""
                UPDATE tenure_job SET run_at = {SQLITE_NOW}, updated_at = {SQLITE_NOW},
                    hinted_at = NULL, reason = ''
                WHERE id IN ({marks}) AND (state = %s AND run_at = %s) IS TRUE
                RETURNING id, queue, priority, run_at
                """


# -- payload search ----------------------------------------------------------------------

_PAYLOAD = '"tenure_job_spec"."payload"'
"""The payload a search's leaves read: the spec row of the job (:meth:`SqliteDriver.payload_contains`
joins it)."""


def json_path(path: Sequence[str]) -> str:
    """A SQLite JSON path naming ``path``'s keys, each quoted (the payload-search parser
    refuses keys with quotes or backslashes)."""
    return "$" + "".join(f'."{k}"' for k in path)


def payload_leaf_sql(path: Sequence[str], value: Any) -> tuple[str, list[Any]]:
    """One leaf of a payload search as SQL: the value's JSON type and the value itself, so a
    number never equals a string nor ``true`` the number 1."""
    p = json_path(path)
    kind = f"json_type({_PAYLOAD}, %s)"
    if value is None:
        return f"{kind} = 'null'", [p]
    if isinstance(value, bool):
        return f"{kind} = %s", [p, "true" if value else "false"]
    if isinstance(value, dict):
        return f"{kind} = 'object'", [p]
    if isinstance(value, (int, float)):
        return f"{kind} IN ('integer', 'real') AND json_extract({_PAYLOAD}, %s) = %s", [p, p, value]
    return f"{kind} = 'text' AND json_extract({_PAYLOAD}, %s) = %s", [p, p, str(value)]


# -- the database -------------------------------------------------------------------------

DATABASE_LIST = "PRAGMA database_list"
"""``SqliteDriver.read_identity``: the files of the connection's databases, by name."""
