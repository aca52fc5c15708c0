"""The write seam: every write of a job's state, fence and lease happens here.

Each function names a transition from :mod:`scheduler_core.states`; the transition's source
states become the write's ``WHERE state IN (...)`` guard, and every write made on behalf of an
attempt also carries ``fence = <the attempt's fence>``. A write that matches no row raises
:class:`~scheduler_core.exceptions.StaleAttempt` (the caller stops and records the refusal
with :func:`record_stale`); nothing is ever read and then written unconditionally.

Lease times come from the database's clock (:mod:`scheduler_core.dbclock`), never a worker's.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import secrets
import socket
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Exists, F, OuterRef, Q

from . import conf, db, metrics, outcomes, states
from .dbclock import DbNow, now_sql, to_datetime
from .exceptions import (
    ActionConflict,
    ActionRefused,
    AttemptOverrun,
    EffectsUnsettled,
    Indeterminate,
    StaleAttempt,
)
from .models import (
    Attempt,
    AuditEntry,
    Effect,
    EffectEvent,
    Executor,
    Installation,
    Job,
    StaleWrite,
)
from .modes import EffectMode
from .outcomes import Decision, Kind, Situation
from .retry import RetryPolicy

log = logging.getLogger("tenure.store")

DB = db.alias()
"""Tenure's database alias (``TENURE_DATABASE``): every statement here runs on it."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a claim grants: the right to act for one attempt of one job, until it expires."""

    job_id: int
    fence: int
    attempt: int
    attempt_id: int
    kind: str
    name: str
    queue: str
    payload: dict[str, Any]
    lease_seconds: int
    effect: str
    max_attempts: int
    created_at: datetime
    executor: str
    timeout_seconds: float = 0.0
    """The attempt's maximum runtime (the job's ``timeout_seconds``); 0 when unknown. The
    database holds the deadline (``Job.deadline_at``); this lets the executor stop renewing
    on its own clock too."""
    priority: int = 0
    due_at: datetime | None = None
    """The job's ``run_at`` when it was claimed: where it stood in the claim order."""
    granted_at: float = field(default=0.0, compare=False)
    """This process's monotonic clock just before the claim was sent: the lease cannot
    expire before ``granted_at + lease_seconds`` (0 when unknown)."""


def new_executor_id(kind: str = "exec") -> str:
    """A unique executor identity: ``host:pid:uuid``."""
    import os

    return f"{socket.gethostname()}:{os.getpid()}:{kind}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------------------------
# Claim
# ---------------------------------------------------------------------------------------------

_CLAIM_SET = """
    state = 'leased', fence = {t}fence + 1, attempts = {t}attempts + 1, lease_owner = %s,
    lease_expires_at = {expiry}, deadline_at = {deadline}, heartbeat_at = {now},
    updated_at = {now}, version = {t}version + 1
"""
_RETURNED = (
    "id",
    "fence",
    "attempts",
    "next_kind",
    "name",
    "queue",
    "payload",
    "lease_seconds",
    "effect",
    "max_attempts",
    "created_at",
    "run_at",
    "heartbeat_at",
    "priority",
    "timeout_seconds",
)
"""The job columns a claim returns, in order; each claimed row then ends with its attempt's
id (``attempt_id``). :func:`_leases` reads them by these names."""
_RETURNING = ", ".join(_RETURNED)


_ATTEMPT_INSERT = """
    INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at,
        lease_expires_at, heartbeat_at, outcome, error_class, error_type, message, traceback)
    SELECT id, attempts, fence, next_kind, lease_owner, heartbeat_at, lease_expires_at,
        heartbeat_at, '', '', '', '', ''
"""
"""The Attempt row of each claimed job, read from the job as the claim left it."""


CLAIM_BY_ID, CLAIM_ONE_QUEUE, CLAIM_QUEUES, CLAIM_FROM_FLOORS = "id", "queue", "queues", "floors"
"""The shapes of PostgreSQL's claim: the job a message names; a queue's due jobs read from the
start of the claim index; the same for several queues; and a seek from this process's floors
(:class:`ClaimFloors`)."""


def _claim_shape(*, by_id: bool, nqueues: int, floors: bool) -> str:
    if by_id:
        return CLAIM_BY_ID
    if floors:
        return CLAIM_FROM_FLOORS
    return CLAIM_ONE_QUEUE if nqueues == 1 else CLAIM_QUEUES


def _claim_ctes(shape: str) -> str:
    """PostgreSQL's claim as ``WITH`` parts: ``cand`` (the due rows, locked), ``claimed`` (the
    jobs leased), ``new_attempt`` (their Attempt rows) and ``got`` (each claimed row with its
    attempt's id). Placeholders: :func:`_claim_params`."""
    now = now_sql("postgresql")
    if shape in (CLAIM_BY_ID, CLAIM_ONE_QUEUE):
        # One queue: an ordered walk of the claim index (``tenure_job_claim``), stopping at
        # the first due rows, however long the backlog.
        cand = f"""
        SELECT id FROM tenure_job
        WHERE state = 'waiting' AND {"id" if shape == CLAIM_BY_ID else "queue"} = %s
            AND run_at <= {now}
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
            WHERE state = 'waiting' AND queue = q.name AND run_at <= {now}
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
                AND run_at >= f.floor AND run_at <= {now}
            ORDER BY run_at, id
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT %s"""
    expiry = f"{now} + make_interval(secs => j.lease_seconds)"
    deadline = f"{now} + make_interval(secs => j.timeout_seconds)"
    # ``(state = …) IS TRUE`` keeps each guard out of the index conditions: a table filled
    # since its statistics were taken looks empty, and the planner then walked the state
    # index through every waiting job instead of looking the locked rows up by key (1.0 →
    # 2.5 ms per job on a 3,000-job backlog, tests/db/test_claim_plan.py).
    return f"""
    cand AS ({cand}
    ), claimed AS (
        UPDATE tenure_job AS j SET {
        _CLAIM_SET.format(t="j.", now=now, expiry=expiry, deadline=deadline)
    }
        FROM cand WHERE j.id = cand.id AND (j.state = 'waiting') IS TRUE
        RETURNING {", ".join("j." + c for c in _RETURNED)}, j.lease_owner, j.lease_expires_at
    ), new_attempt AS (
        {_ATTEMPT_INSERT} FROM claimed
        RETURNING id, job_id
    ), got AS (
        SELECT {", ".join("claimed." + c for c in _RETURNED)}, new_attempt.id AS attempt_id
        FROM claimed JOIN new_attempt ON new_attempt.job_id = claimed.id
    )"""


def _claim_params(
    shape: str,
    *,
    executor: str,
    queues: Sequence[str],
    limit: int,
    job_id: int | None = None,
    seeks: Sequence[tuple[str, int, datetime]] = (),
) -> list[Any]:
    """The placeholders of :func:`_claim_ctes` for ``shape``, in text order."""
    if shape == CLAIM_BY_ID:
        return [job_id, limit, executor]
    if shape == CLAIM_ONE_QUEUE:
        return [queues[0], limit, executor]
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


def _claim_sql(vendor: str, *, by_id: bool, nqueues: int) -> str:
    """The claim statement on SQLite (PostgreSQL's is :func:`_claim_ctes`)."""
    assert vendor != "postgresql"
    now = now_sql(vendor)
    # SQLite: the transaction began IMMEDIATE, so it holds the write lock from its first
    # statement; the conditional UPDATE below is still the single ownership decision. A
    # reader holds no old index entries here (SQLite updates in place), so there are no
    # floors to seek from.
    expiry = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || lease_seconds || ' seconds')"
    deadline = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || timeout_seconds || ' seconds')"
    where = "id = %s" if by_id else f"queue IN ({', '.join(['%s'] * nqueues)})"
    return f"""
    UPDATE tenure_job SET {_CLAIM_SET.format(t="", now=now, expiry=expiry, deadline=deadline)}
    WHERE state = 'waiting' AND id IN (
        SELECT id FROM tenure_job
        WHERE state = 'waiting' AND {where} AND run_at <= {now}
        ORDER BY priority DESC, run_at, id
        LIMIT %s
    )
    RETURNING {_RETURNING}
    """


class ClaimFloors:
    """Where this process's claims of each queue start reading the claim index (PostgreSQL).

    Leasing a job changes its row, and the job's old entry stays in the claim index until
    vacuum removes it, which vacuum cannot do while any snapshot older than the change is held
    (a long report, a forgotten ``REPEATABLE READ`` session). A claim reading the index from
    its start visits each such entry, and its row, before the first waiting job: 2 ms with
    10,000 of them, 5 ms with 30,000, without bound
    (``tests/db/test_claim_plan.py::test_a_claim_seeks_past_the_entries_a_held_snapshot_keeps``).

    So the process keeps, per (queue, priority), a floor, and its claims seek to the floors.
    A claim raises a floor to the oldest due time it took there, less
    ``TENURE_CLAIM_FLOOR_MARGIN_SECONDS`` (enqueues that commit a little late); a wake-up
    (every enqueue sends one, naming its job's priority and due time) lowers it to that job,
    or adds its priority. A full read from the start still comes on the first claim of a
    queue and every ``TENURE_CLAIM_FULL_SCAN_SECONDS`` whatever happens (a claim rolled back
    elsewhere, or a lost wake-up, can leave jobs below the floors). A full read cut off by its
    limit may not have reached the lower priorities: once a claim from the floors comes up
    short, the priorities below the lowest it took are *discovered* — one index probe per
    priority that has a waiting job (:func:`_waiting_priorities`) — rather than read again
    from the start, which under a held snapshot walks every entry claimed since and had made
    every other claim a full read when jobs arrive one at a time (the mean claim statement
    rose from 0.1 to 38 ms over a 160 s snapshot in a soak). Seeking only decides which
    waiting jobs a claim reads first; the claim itself, and what it guarantees, are unchanged.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floors: dict[tuple[str, int], datetime] = {}
        self._full_at: dict[str, float] = {}
        self._cut_off: dict[str, int | None] = {}
        """Queues whose last full read was cut off by its limit: the lowest priority it took
        there (None: it took none of that queue's jobs)."""
        self._rescan: set[str] = set()
        """Queues whose priorities below their cut-off are to be discovered."""
        self._pins: dict[tuple[str, int], tuple[datetime, float]] = {}
        """Wake-ups that lowered a floor: (due time, when), so a claim sent before one
        cannot raise the floor past its job again."""

    def seeks(self, queues: Sequence[str], *, now: float) -> list[tuple[str, int, datetime]]:
        """The (queue, priority, floor) seeks for a claim of ``queues``, or none when a full
        read is due for any of them."""
        every = conf.get().CLAIM_FULL_SCAN_SECONDS
        wanted = set(queues)
        with self._lock:
            for q in wanted:
                full_at = self._full_at.get(q)
                if full_at is None or now - full_at >= every:
                    return []
            return sorted((q, p, f) for (q, p), f in self._floors.items() if q in wanted)

    def undiscovered(self, queues: Sequence[str]) -> list[tuple[str, int | None]]:
        """The (queue, below) pairs whose priorities under ``below`` (None: every priority)
        are to be discovered before the next claim from the floors."""
        with self._lock:
            return sorted(
                ((q, self._cut_off.get(q)) for q in set(queues) & self._rescan),
                key=lambda x: x[0],
            )

    def discovered(self, queue: str, found: Sequence[tuple[int, datetime]]) -> None:
        """Record a discovery of ``queue``'s lower priorities: each priority found gets a
        floor at its oldest waiting job, and the queue counts as fully seen again."""
        for priority, due_at in found:
            self.woken(queue, priority, due_at)
        with self._lock:
            self._rescan.discard(queue)
            self._cut_off.pop(queue, None)

    def learn(
        self,
        queues: Sequence[str],
        leases: Sequence[Lease],
        *,
        limit: int,
        full: bool,
        now: float,
    ) -> None:
        """Record a claim of up to ``limit`` jobs of ``queues`` (``full``: read from the start)
        and what it leased."""
        margin = dt.timedelta(seconds=conf.get().CLAIM_FLOOR_MARGIN_SECONDS)
        oldest: dict[tuple[str, int], datetime] = {}
        for lease in leases:
            key = (lease.queue, lease.priority)
            if lease.due_at is not None and (key not in oldest or lease.due_at < oldest[key]):
                oldest[key] = lease.due_at
        short = len(leases) < limit
        with self._lock:
            for q in queues:
                if full:
                    self._full_at[q] = now
                    self._rescan.discard(q)
                    if short:
                        self._cut_off.pop(q, None)
                    else:
                        took = [x.priority for x in leases if x.queue == q]
                        self._cut_off[q] = min(took) if took else None
                elif short and q in self._cut_off:
                    self._rescan.add(q)
            for key, due in oldest.items():
                floor = due - margin
                pin = self._pins.get(key)
                if pin is not None:
                    if pin[1] >= now:
                        # Woken while this claim was under way: its job may not have been
                        # visible to it; keep the floor at that job until a later claim.
                        floor = min(floor, pin[0] - margin)
                    else:
                        del self._pins[key]
                if key not in self._floors or floor > self._floors[key]:
                    self._floors[key] = floor

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        """A job of ``queue`` is waiting, due at ``due_at``: lower its priority's floor to
        it (or add the priority), so the next claim's seek reaches it."""
        floor = due_at - dt.timedelta(seconds=conf.get().CLAIM_FLOOR_MARGIN_SECONDS)
        with self._lock:
            key = (queue, priority)
            if key not in self._floors or floor < self._floors[key]:
                self._floors[key] = floor
                self._pins[key] = (due_at, time.monotonic())

    def forget(self) -> None:
        """Drop every floor (tests; a process whose database was replaced)."""
        with self._lock:
            self._floors.clear()
            self._full_at.clear()
            self._cut_off.clear()
            self._rescan.clear()
            self._pins.clear()


FLOORS = ClaimFloors()
"""This process's claim floors (one set per process, shared by its threads)."""


def _seeks(queues: Sequence[str], *, now: float) -> list[tuple[str, int, datetime]]:
    """The floors a claim of ``queues`` seeks from (none: read from the start), after
    discovering the lower priorities a cut-off full read did not reach."""
    for queue, below in FLOORS.undiscovered(queues):
        FLOORS.discovered(queue, _waiting_priorities(queue, below))
    return FLOORS.seeks(queues, now=now)


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
""":func:`_waiting_priorities`: a skip scan of the claim index, one probe per priority."""


def _waiting_priorities(queue: str, below: int | None) -> list[tuple[int, datetime]]:
    """Each priority of ``queue`` under ``below`` (None: any) that has a waiting job, with
    the due time of its oldest waiting job (PostgreSQL)."""
    bound = _PRIORITY_MAX + 1 if below is None else below
    conn = connections[DB]
    with conn.cursor() as cur:
        cur.execute(_WAITING_PRIORITIES, [queue, bound, queue])
        return [(int(p), to_datetime(at)) for p, at in cur.fetchall()]


def _claim_pg(
    *, executor: str, queues: Sequence[str], limit: int, job_id: int | None
) -> list[Lease]:
    sent = time.monotonic()
    seeks = [] if job_id is not None else _seeks(queues, now=sent)
    shape = _claim_shape(by_id=job_id is not None, nqueues=len(queues), floors=bool(seeks))
    sql = f"WITH {_claim_ctes(shape)} SELECT * FROM got"
    rows = _pg_rows(
        sql,
        _claim_params(
            shape, executor=executor, queues=queues, limit=limit, job_id=job_id, seeks=seeks
        ),
    )
    leases = _leases(rows, executor=executor, sent=sent)
    if job_id is None:
        FLOORS.learn(queues, leases, limit=limit, full=not seeks, now=sent)
    return leases


def claim(
    *,
    executor: str,
    queues: Sequence[str] = ("default",),
    limit: int = 1,
    job_id: int | None = None,
) -> list[Lease]:
    """Claim up to ``limit`` due waiting jobs (or exactly ``job_id``) in one statement.

    Each claimed job's fence grows by one and its lease runs from the database's clock; an
    Attempt row is written in the same transaction. Jobs locked by another claimer are skipped
    (PostgreSQL ``FOR UPDATE SKIP LOCKED``); on SQLite the write lock serialises claims.
    """
    if limit < 1:
        return []
    conn = connections[DB]
    vendor = conn.vendor
    by_id = job_id is not None
    if vendor == "postgresql":
        return _claim_pg(executor=executor, queues=queues, limit=limit, job_id=job_id)
    sql = _claim_sql(vendor, by_id=by_id, nqueues=len(queues))
    sent = time.monotonic()
    # Placeholders in text order: SQLite's WHERE comes after the SET.
    params: list[Any] = [executor, *([job_id] if by_id else queues), limit]
    with transaction.atomic(using=DB), conn.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
        if not rows:
            return []
        marks = ", ".join(["%s"] * len(rows))
        cur.execute(
            f"{_ATTEMPT_INSERT} FROM tenure_job WHERE id IN ({marks}) RETURNING id, job_id",
            [r[0] for r in rows],
        )
        attempt_ids = {job: att for att, job in cur.fetchall()}
    return _leases([(*r, attempt_ids[r[0]]) for r in rows], executor=executor, sent=sent)


_LEASE_COLUMNS = (*_RETURNED, "attempt_id")


def _leases(rows: Sequence[Sequence[Any]], *, executor: str, sent: float) -> list[Lease]:
    """Leases from claimed rows (the ``_RETURNED`` columns, then the attempt's id), in the
    claim's order (priority, then due time, then id): a statement returns them in any order."""
    named = [dict(zip(_LEASE_COLUMNS, r, strict=True)) for r in rows]
    leases = []
    for r in sorted(named, key=lambda r: (-r["priority"], to_datetime(r["run_at"]), r["id"])):
        payload = r["payload"]
        if isinstance(payload, str | bytes):
            payload = json.loads(payload)
        # Claim latency: due time to claim, both by the database's clock.
        due, claimed = to_datetime(r["run_at"]), to_datetime(r["heartbeat_at"])
        metrics.claim_latency((claimed - due).total_seconds())
        leases.append(
            Lease(
                job_id=r["id"],
                fence=r["fence"],
                attempt=r["attempts"],
                attempt_id=r["attempt_id"],
                kind=r["next_kind"],
                name=r["name"],
                queue=r["queue"],
                payload=payload,
                lease_seconds=r["lease_seconds"],
                effect=r["effect"],
                max_attempts=r["max_attempts"],
                created_at=to_datetime(r["created_at"]),
                executor=executor,
                timeout_seconds=float(r["timeout_seconds"]),
                priority=r["priority"],
                due_at=due,
                granted_at=sent,
            )
        )
    return leases


def _pg_rows(sql: str, params: Sequence[Any]) -> list[Any]:
    """Run one hot-path statement on PostgreSQL as a prepared statement (planned once per
    connection, not on every call) and return its rows; errors are Django's, as for any query."""
    import psycopg

    conn = connections[DB]
    conn.ensure_connection()
    raw = conn.connection
    prepare = conf.get().PREPARED_STATEMENTS
    if prepare and raw.prepare_threshold is None:
        # Django turns automatic preparation off (None), which also ignores prepare=True. A
        # threshold never reached prepares only what asks for it: Django's own cursors bind
        # on the client and are never prepared either way.
        raw.prepare_threshold = 1 << 30
    with conn.wrap_database_errors, psycopg.Cursor(raw) as cur:
        if prepare:
            _replan_if_due(cur, raw)
        cur.execute(sql, params, prepare=prepare)
        return cur.fetchall()


_planned_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""When each connection last dropped its prepared statements (monotonic seconds)."""


def _replan_if_due(cur: Any, raw: Any) -> None:
    """Drop this connection's prepared statements every ``REPLAN_SECONDS``, so each is
    planned again from the table as it now is. A generic plan made while the table was nearly
    empty and never analysed reads it whole, and nothing else replaces that plan until the
    server's statistics of the table change (tests/db/test_claim_plan.py)."""
    now = time.monotonic()
    at = _planned_at.get(raw)
    if at is not None and now - at < conf.get().REPLAN_SECONDS:
        return
    if at is not None:
        # The driver recognises the command and forgets its own names for them too.
        cur.execute("DEALLOCATE ALL", prepare=False)
    _planned_at[raw] = now


# ---------------------------------------------------------------------------------------------
# Fenced writes on behalf of an attempt
# ---------------------------------------------------------------------------------------------


def _mine(lease: Lease, transition: states.Transition | None = None) -> Any:
    """The job row, only while it is still ``lease``'s: the guard of every attempt write.

    ``transition`` (default: any write that keeps the job leased) supplies the source states.
    """
    sources = transition.sources if transition else {states.State.LEASED}
    qs = Job.objects.using(DB).filter(pk=lease.job_id, state__in=list(sources))
    if not conf.get().TEST_DISABLE_FENCE:
        qs = qs.filter(fence=lease.fence)
    return qs


def _unsettled(job_id: int) -> Any:
    """The job's ledger rows whose effect may or may not have happened."""
    return unsettled_of_job(job_id)


def refusal(lease: Lease, write: str) -> StaleAttempt | EffectsUnsettled:
    """Why a fenced write on behalf of ``lease`` matched no row, as the exception to raise.

    :class:`StaleAttempt` when the job is no longer leased under this fence (or, for a write
    that needs it, the lease has expired); :class:`AttemptOverrun` when the attempt still holds
    the fence but is past its maximum runtime; for a completion, :class:`EffectsUnsettled`
    when the ledger holds an effect that may or may not have happened. Read only after a
    refusal, so the common path pays nothing for it.
    """
    mine = _mine(lease)
    if not mine.exists():
        return StaleAttempt(lease.job_id, lease.fence, write)
    if mine.filter(deadline_at__lte=DbNow()).exists():
        return AttemptOverrun(lease.job_id, lease.fence, write)
    if write == states.COMPLETE.name:
        keys = sorted(_unsettled(lease.job_id).values_list("key", flat=True))
        if keys:
            return EffectsUnsettled(lease.job_id, keys)
    return StaleAttempt(lease.job_id, lease.fence, write)


def heartbeat(lease: Lease) -> bool:
    """Extend the lease by ``lease_seconds`` from the database's now.

    Raises :class:`StaleAttempt` when the job is no longer leased under this fence, and
    :class:`AttemptOverrun` once the attempt is past its maximum runtime: a lease is never
    renewed past the attempt's deadline, so a hung handler is not held forever.
    """
    with transaction.atomic(using=DB):
        n = (
            _mine(lease)
            .filter(deadline_at__gt=DbNow())
            .update(lease_expires_at=DbNow(lease.lease_seconds), heartbeat_at=DbNow())
        )
        if n != 1:
            raise refusal(lease, "heartbeat")
        Attempt.objects.using(DB).filter(pk=lease.attempt_id).update(
            heartbeat_at=DbNow(), lease_expires_at=DbNow(lease.lease_seconds)
        )
    return True


def assert_current(lease: Lease, write: str, *, lease_valid: bool = True) -> None:
    """Lock the job row and check ``lease`` still owns it (and, by default, is unexpired and
    within its maximum runtime).

    Used before an effect starts: a paused attempt whose lease ran out, or a hung one past its
    maximum runtime, cannot begin one, even if the reaper has not yet moved the job.
    """
    qs = _mine(lease)
    if lease_valid:
        qs = qs.filter(lease_expires_at__gt=DbNow(), deadline_at__gt=DbNow())
    # A no-op write takes the row lock, so the check holds until this transaction ends.
    if qs.update(heartbeat_at=F("heartbeat_at")) != 1:
        raise refusal(lease, write)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """What went wrong in an attempt, for its record."""

    error_class: str
    error_type: str
    message: str
    traceback: str = ""


def finish(
    lease: Lease,
    decision: Decision,
    *,
    outcome: str,
    failure: Failure | None = None,
    expired_for: float | None = None,
) -> None:
    """End ``lease``'s attempt with ``decision``'s transition, fenced.

    Joins an open transaction (transactional jobs complete inside the handler's transaction),
    so a refusal raised here rolls the handler's writes back with it. ``expired_for`` (the
    reaper's) adds "and the lease expired at least that many seconds ago" to the guard.
    """
    t = decision.transition
    fields: dict[str, Any] = {
        "state": t.target,
        "updated_at": DbNow(),
        "version": F("version") + 1,
        "lease_owner": "",
        "lease_expires_at": None,
        "reason": decision.reason[:2000],
    }
    if failure is not None:
        fields["last_error"] = f"{failure.error_type}: {failure.message}"[:2000]
    if t.target == states.State.WAITING:
        fields["run_at"] = DbNow(decision.delay)
        # The dispatcher sends a fresh hint once the job is due again.
        fields["hinted_at"] = None
        fields["next_kind"] = decision.next_kind.value
        if not decision.spend_attempt:
            fields["attempts"] = F("attempts") - 1
    else:
        fields["next_kind"] = Kind.RUN.value
    if t.target in states.TERMINAL:
        fields["finished_at"] = DbNow()
    guard = _mine(lease, t)
    if expired_for is not None:
        guard = guard.filter(lease_expires_at__lt=DbNow(-expired_for))
    if t == states.COMPLETE:
        # Succeeded means the effect happened once: not past the attempt's maximum runtime,
        # and never while the ledger says an effect may or may not have happened.
        guard = guard.filter(deadline_at__gt=DbNow()).exclude(
            Exists(unsettled_of_job(OuterRef("pk")))
        )
    # No savepoint (two round trips per attempt): a refusal writes nothing and is raised after
    # the block, so an enclosing transaction (the reaper's loop) goes on; a database error
    # inside ends the enclosing transaction, as it does on PostgreSQL in any case.
    with transaction.atomic(using=DB, savepoint=False):
        mine = guard.update(**fields) == 1
        if mine:
            _close_attempt(lease.attempt_id, outcome, failure)
            if t.target != states.State.SUCCEEDED:
                # Whatever this attempt intended and did not settle may or may not have
                # happened: say so in the ledger, whatever the job's next state.
                _mark_unsettled(lease, duplicate_possible=decision.duplicate_possible)
    if not mine:
        if t == states.COMPLETE:
            raise refusal(lease, t.name)
        raise StaleAttempt(lease.job_id, lease.fence, t.name)


def complete(lease: Lease) -> int | None:
    """Mark ``lease``'s job succeeded (fenced).

    On PostgreSQL this is one statement, the job's and the attempt's rows written as
    :func:`finish` writes them, and it returns the transaction's id, which the executor keeps
    to read the outcome back if the connection breaks during ``COMMIT``. Elsewhere it is
    :func:`finish` and returns None.
    """
    conn = connections[DB]
    if conn.vendor != "postgresql":
        finish(lease, Decision(transition=states.COMPLETE), outcome="succeeded")
        return None
    with transaction.atomic(using=DB, savepoint=False):
        ((matched, xid),) = _pg_rows(
            f"WITH {_COMPLETE_CTES} SELECT {_COMPLETE_RESULT}", _complete_params([lease])
        )
        if lease.job_id not in matched:
            raise refusal(lease, states.COMPLETE.name)
    return int(xid)


def complete_and_claim(
    lease: Lease, *, executor: str, queues: Sequence[str], limit: int
) -> tuple[int | None, list[Lease]]:
    """:func:`complete` ``lease`` and :func:`claim` up to ``limit`` more jobs in the caller's
    transaction; the claims stand only if that transaction commits.

    On PostgreSQL both are one prepared statement (the claim's and the completion's ``WITH``
    parts together), returning the transaction's id as :func:`complete` does. A refused
    completion raises :class:`StaleAttempt`; the caller's rollback then undoes the claims too.
    """
    xid, matched, got = complete_many_and_claim(
        [lease], executor=executor, queues=queues, limit=limit
    )
    if lease.job_id not in matched:
        raise refusal(lease, states.COMPLETE.name)
    return xid, got


def complete_many_and_claim(
    leases: Sequence[Lease], *, executor: str, queues: Sequence[str], limit: int
) -> tuple[int | None, set[int], list[Lease]]:
    """:func:`complete` each of ``leases`` and :func:`claim` up to ``limit`` more jobs in the
    caller's transaction: one commit for many completions.

    Each completion is fenced on its own; a refused one is left out, the others stand (the
    caller asks :func:`refusal` why, once the rest has committed). Returns
    the transaction's id (PostgreSQL; None elsewhere), the ids of the jobs completed and the
    new leases, which stand only if the caller's transaction commits. On PostgreSQL this is
    one prepared statement whatever the number of leases.
    """
    if connections[DB].vendor != "postgresql":
        matched: set[int] = set()
        for lease in leases:
            try:
                complete(lease)
                matched.add(lease.job_id)
            except (StaleAttempt, EffectsUnsettled):
                pass  # left out; the caller asks why once the rest has committed
        got = claim(executor=executor, queues=queues, limit=limit) if limit > 0 else []
        return None, matched, got
    return _complete_many_pg(leases, executor=executor, queues=queues, limit=limit)


def _complete_many_pg(
    leases: Sequence[Lease], *, executor: str, queues: Sequence[str], limit: int
) -> tuple[int, set[int], list[Lease]]:
    """The completions of ``leases`` and a claim of up to ``limit`` jobs: one statement."""
    sent = time.monotonic()
    seeks = _seeks(queues, now=sent) if limit > 0 else FLOORS.seeks(queues, now=sent)
    shape = _claim_shape(by_id=False, nqueues=len(queues), floors=bool(seeks))
    params = [
        *_claim_params(shape, executor=executor, queues=queues, limit=limit, seeks=seeks),
        *_complete_params(leases),
    ]
    rows = _pg_rows(_complete_many_sql(shape), params)
    matched, xid = set(rows[0][0]), int(rows[0][1])
    claimed = [r[2:] for r in rows if r[2] is not None]
    got = _leases(claimed, executor=executor, sent=sent)
    if limit > 0:
        FLOORS.learn(queues, got, limit=limit, full=not seeks, now=sent)
    return xid, matched, got


def _complete_many_sql(shape: str) -> str:
    """The statement of :func:`_complete_many_pg`: the completions' and the claim's parts."""
    return (
        f"WITH {_claim_ctes(shape)}, {_COMPLETE_CTES} "
        f"SELECT {_COMPLETE_RESULT}, got.* FROM (SELECT 1) AS one LEFT JOIN got ON true"
    )


def _complete_params(leases: Sequence[Lease]) -> list[Any]:
    """The placeholders of ``_COMPLETE_CTES``, in text order."""
    jobs = [lease.job_id for lease in leases]
    attempts = [lease.attempt_id for lease in leases]
    return [
        jobs,
        [lease.fence for lease in leases],
        attempts,
        # Again, as index conditions: the rows are looked up by primary key whatever the
        # planner guesses about the arrays' length or the table's size (see _claim_ctes).
        jobs,
        [s.value for s in states.COMPLETE.sources],
        conf.get().TEST_DISABLE_FENCE,
        attempts,
    ]


_COMPLETE_CTES = f"""
    done AS (
        SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS d(jid, jfence, aid)
    ), job AS (
        UPDATE tenure_job SET state = '{states.COMPLETE.target.value}',
            updated_at = clock_timestamp(), version = version + 1, lease_owner = '',
            lease_expires_at = NULL, reason = '', next_kind = 'run',
            finished_at = clock_timestamp()
        FROM done
        WHERE tenure_job.id = ANY(%s::bigint[]) AND tenure_job.id = done.jid
            AND (state = ANY(%s)) IS TRUE AND (fence = done.jfence OR %s)
            AND (deadline_at > clock_timestamp()) IS TRUE
            AND NOT EXISTS (
                SELECT 1 FROM tenure_effect AS e WHERE e.job_id = tenure_job.id
                    AND e.state IN ('{Effect.INTENDED}', '{Effect.UNKNOWN}'))
        RETURNING tenure_job.id
    ), attempt AS (
        UPDATE tenure_attempt SET outcome = 'succeeded', finished_at = clock_timestamp()
        FROM done JOIN job ON job.id = done.jid
        WHERE tenure_attempt.id = ANY(%s::bigint[]) AND tenure_attempt.id = done.aid
            AND tenure_attempt.finished_at IS NULL
    )"""
""":func:`complete` on PostgreSQL as ``WITH`` parts, for any number of leases: :func:`finish`'s
writes for ``COMPLETE`` (``tests/db/test_bulk_and_fast_paths.py`` checks the two leave the same
rows), each job fenced by its own lease, refused past the attempt's deadline or while the
ledger holds an effect that may or may not have happened (an index probe per job)."""

_COMPLETE_RESULT = "(SELECT coalesce(array_agg(id), '{}') FROM job), txid_current()"
"""The ids of the jobs whose fenced completion matched, and the transaction's id."""


def _close_attempt(attempt_id: int, outcome: str, failure: Failure | None) -> None:
    fields: dict[str, Any] = {"outcome": outcome, "finished_at": DbNow()}
    if failure is not None:
        limit = conf.get().TRACEBACK_MAX_CHARS
        fields.update(
            error_class=failure.error_class,
            error_type=failure.error_type[:200],
            message=failure.message[:4000],
            traceback=failure.traceback[-limit:],
        )
    Attempt.objects.using(DB).filter(pk=attempt_id, finished_at__isnull=True).update(**fields)


def _mark_unsettled(lease: Lease, *, duplicate_possible: bool) -> None:
    """An attempt ended without settling its effect intents: their outcome is unknown, and
    stays so (``in_doubt``) until a stated fact settles it."""
    left = list(
        Effect.objects.using(DB)
        .filter(job_id=lease.job_id, state=Effect.INTENDED)
        .values_list("pk", flat=True)
    )
    if not left:
        return
    extra: dict[str, Any] = {"duplicate_possible": True} if duplicate_possible else {}
    Effect.objects.using(DB).filter(pk__in=left, state=Effect.INTENDED).update(
        state=Effect.UNKNOWN, in_doubt=True, updated_at=DbNow(), **extra
    )
    for pk in left:
        _event(
            pk,
            lease,
            EffectEvent.LEFT_UNSETTLED,
            Effect.UNKNOWN,
            in_doubt=True,
            note=f"attempt {lease.attempt} (fence {lease.fence}) ended without recording the "
            "outcome of its intent",
        )


def unsettled_of_job(job: Any) -> Any:
    """The ledger rows of ``job`` (a value, or ``OuterRef("pk")`` in a subquery) whose effect
    may or may not have happened: the one definition of "unsettled"."""
    return Effect.objects.using(DB).filter(job_id=job, state__in=[Effect.INTENDED, Effect.UNKNOWN])


def has_unsettled_effect(job_id: int) -> bool:
    """Whether an effect of the job may or may not have happened: its intent was recorded and
    no outcome since, or an attempt's outcome was unknown and no stated fact (a
    reconciliation's answer, the destination's acknowledgement, an operator's verified fact)
    has settled it. Every decision that asks "may this effect have happened?" asks this."""
    return bool(_unsettled(job_id).exists())


def unsettled_effects(job_id: int) -> list[Effect]:
    """The job's ledger rows that may or may not have happened, by name."""
    return list(_unsettled(job_id).order_by("name"))


def _event(
    effect_id: int,
    lease: Lease | None,
    event: str,
    state_after: str,
    *,
    in_doubt: bool,
    note: str = "",
    actor: str = "",
) -> None:
    """Append one entry to the ledger's history (in the caller's transaction)."""
    EffectEvent.objects.using(DB).create(
        effect_id=effect_id,
        attempt_id=lease.attempt_id if lease and lease.attempt_id else None,
        fence=lease.fence if lease else None,
        event=event,
        state_after=state_after,
        in_doubt_after=in_doubt,
        actor=actor[:150],
        note=note[:2000],
        created_at=DbNow(),
    )


def record_stale(err: StaleAttempt, executor: str = "") -> None:
    """Record a refused write as evidence (``jobs_status`` counts these)."""
    log.warning("stale write refused: %s (executor %s)", err, executor)
    log_event("refused", job=err.job_id, fence=err.fence, write=err.write, executor=executor)
    try:
        StaleWrite.objects.using(DB).create(
            job_id=err.job_id, fence=err.fence, write=err.write[:30], executor=executor[:200]
        )
    except Exception:  # the evidence is best effort; the refusal itself already held
        log.exception("could not record stale write for job %s", err.job_id)


def log_event(kind: str, **fields: Any) -> None:
    """Append one JSON line to the file ``TENURE_EVENT_LOG`` names, if set: the fault
    verifier's record of what an executor saw (claims, attempt ends, refusals), kept outside
    the database it checks. Does nothing otherwise."""
    import os

    path = os.environ.get("TENURE_EVENT_LOG")
    if not path:
        return
    line = json.dumps(
        {"event": kind, "pid": os.getpid(), "t": round(time.time(), 3), **fields}, default=str
    )
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as e:
        log.warning("could not append to the event log %s: %s", path, e)


# ---------------------------------------------------------------------------------------------
# Effect ledger (fenced)
# ---------------------------------------------------------------------------------------------


INSTALLATION_ID_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)
_installation: dict[str, str] = {}


def check_installation_id(value: str) -> str:
    """``value`` if it can name an installation in effect keys; else ``ValueError``."""
    if not 1 <= len(value) <= 40 or not set(value) <= INSTALLATION_ID_CHARS:
        raise ValueError(
            f"installation id {value!r} must be 1..40 letters, digits, '.', '_' or '-'"
        )
    return value


def installation_id() -> str:
    """This installation's name in effect keys: ``TENURE_INSTALLATION_ID`` if set, else the
    identity made once for this database (:class:`~scheduler_core.models.Installation`)."""
    configured = conf.get().INSTALLATION_ID
    if configured:
        return check_installation_id(configured)
    cached = _installation.get(DB)
    if cached is None:
        row = Installation.objects.using(DB).filter(pk=1).values_list("key", flat=True).first()
        if row is None:
            # The migrations make it; a database emptied since (a test flush) gets a new one.
            try:
                with transaction.atomic(using=DB):
                    Installation.objects.using(DB).create(id=1, key=secrets.token_hex(6))
            except IntegrityError:
                pass  # another process made it first
            row = Installation.objects.using(DB).values_list("key", flat=True).get(pk=1)
        cached = _installation[DB] = str(row)
    return cached


def _new_key(job_id: int, name: str) -> str:
    return f"tenure-{installation_id()}-{job_id}-{name}"


def effect_key(job_id: int, name: str) -> str:
    """The effect's key: the installation, the work identity and the effect's name, never the
    attempt (``tenure-<installation>-<job id>-<name>``). An effect keeps the key it was first
    recorded with, whatever the installation's name became since."""
    recorded = (
        Effect.objects.using(DB)
        .filter(job_id=job_id, name=name)
        .values_list("key", flat=True)
        .first()
    )
    return str(recorded) if recorded is not None else _new_key(job_id, name)


def _in_job_transaction(lease: Lease) -> bool:
    """Whether this is a transactional job's attempt, running inside its own transaction."""
    return lease.effect == EffectMode.TRANSACTIONAL and connections[DB].in_atomic_block


def _with_note(old: str, new: str) -> str:
    """The ledger's note keeps its history: each cause is appended, the newest kept whole."""
    return (f"{old}; {new}" if old else new)[-2000:]


def effect_intend(lease: Lease, name: str) -> Effect:
    """Record the intent to perform effect ``name`` before the external call (fenced).

    Refused (:class:`StaleAttempt`) when the attempt no longer owns the job or its lease has
    expired by the database's clock, so a paused attempt cannot start a new effect, and
    (:class:`AttemptOverrun`) past the attempt's maximum runtime. Returns the ledger row; a
    row already ``applied`` is returned unchanged for the caller to skip.

    An earlier intent whose outcome is not known (``intended`` or ``unknown``) is followed
    according to the job's mode: ``idempotent`` starts again under the same key;
    ``at_least_once`` starts again and the row records that a duplicate is possible and why;
    ``reconcilable`` and ``at_most_once`` refuse with
    :class:`~scheduler_core.exceptions.Indeterminate`, so only a reconcile attempt or an
    operator who checked the destination can unblock the effect. Starting again keeps the row
    ``in_doubt``: what this attempt then learns cannot erase the earlier unknown.

    A transactional job inside its transaction writes nothing here: its effect is a write in
    that same transaction, recorded ``applied`` by :func:`effect_settle` and committed with the
    completion or not at all. The ownership check then reads without locking, so an attempt
    paused mid-transaction holds no lock its replacement needs.
    """
    if _in_job_transaction(lease):
        live = _mine(lease).filter(lease_expires_at__gt=DbNow(), deadline_at__gt=DbNow())
        if not live.exists():
            raise refusal(lease, "effect_intent")
        existing = Effect.objects.using(DB).filter(job_id=lease.job_id, name=name).first()
        return existing or Effect(
            key=_new_key(lease.job_id, name),
            job_id=lease.job_id,
            name=name,
            state=Effect.INTENDED,
            attempt_id=lease.attempt_id,
            fence=lease.fence,
        )
    with transaction.atomic(using=DB):
        assert_current(lease, "effect_intent")
        row = Effect.objects.using(DB).filter(job_id=lease.job_id, name=name).first()
        if row is None:
            row = Effect.objects.using(DB).create(
                key=_new_key(lease.job_id, name),
                job_id=lease.job_id,
                name=name,
                state=Effect.INTENDED,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
                created_at=DbNow(),
                updated_at=DbNow(),
            )
            _event(row.pk, lease, EffectEvent.INTENDED, Effect.INTENDED, in_doubt=False)
            row.refresh_from_db()
            return row
        if row.state == Effect.APPLIED:
            return row
        mode = EffectMode(lease.effect)
        unsettled = row.unsettled
        note = row.note
        cause = ""
        if unsettled:
            if mode in (EffectMode.AT_MOST_ONCE, EffectMode.RECONCILABLE):
                raise Indeterminate(
                    f"effect {row.key} was left {row.state} by fence {row.fence}; a "
                    f"{mode.value} job does not start it again until it is settled"
                )
            if mode == EffectMode.AT_LEAST_ONCE:
                cause = (
                    f"duplicate possible: attempt {lease.attempt} (fence {lease.fence}) starts "
                    f"the effect again after fence {row.fence} left it {row.state}"
                )
            else:
                cause = (
                    f"attempt {lease.attempt} (fence {lease.fence}) retries under the same key "
                    f"after fence {row.fence} left it {row.state}"
                )
            note = _with_note(note, cause)
        in_doubt = row.in_doubt or unsettled
        Effect.objects.using(DB).filter(pk=row.pk).update(
            state=Effect.INTENDED,
            attempt_id=lease.attempt_id,
            fence=lease.fence,
            intents=F("intents") + 1,
            in_doubt=in_doubt,
            duplicate_possible=row.duplicate_possible
            or (unsettled and mode == EffectMode.AT_LEAST_ONCE),
            note=note,
            updated_at=DbNow(),
        )
        _event(row.pk, lease, EffectEvent.INTENDED, Effect.INTENDED, in_doubt=in_doubt, note=cause)
        row.refresh_from_db()
        return row


def effect_settle(
    lease: Lease,
    key: str,
    state: str,
    *,
    destination_ref: str = "",
    note: str = "",
    name: str = "",
) -> str:
    """Record what this attempt learned of an effect (``applied``, ``not_applied`` or
    ``unknown``), fenced; returns the row's state afterwards.

    The answer is sticky: once an attempt's outcome was unknown (``in_doubt``), a later
    attempt that sent nothing (``not_applied``) leaves the row ``unknown``, since the earlier
    request may still have landed. Only a stated fact settles it: ``applied`` here (the
    destination acknowledged the request, a replay included), a reconciliation's answer
    (:func:`reconciled`) or an operator's verified fact. Every step is kept in the ledger's
    history (:class:`~scheduler_core.models.EffectEvent`).

    Inside a transactional job's transaction only ``applied`` is written (the row is created
    then), since any other outcome rolls the whole transaction back.
    """
    if _in_job_transaction(lease):
        if state != Effect.APPLIED:
            return state
        fields: dict[str, Any] = {
            "state": Effect.APPLIED,
            "in_doubt": False,
            "attempt_id": lease.attempt_id,
            "fence": lease.fence,
            "destination_ref": destination_ref[:300],
            "note": note[:2000],
            "updated_at": DbNow(),
        }
        row_id = Effect.objects.using(DB).filter(key=key).values_list("pk", flat=True).first()
        if row_id is not None:
            Effect.objects.using(DB).filter(pk=row_id).update(**fields)
        else:
            if not name:
                raise ValueError("a transactional effect's first outcome needs its name")
            # A concurrent stale attempt's row would make this insert fail: its transaction
            # rolls back whole, as it must.
            row_id = (
                Effect.objects.using(DB)
                .create(key=key, job_id=lease.job_id, name=name, created_at=DbNow(), **fields)
                .pk
            )
        _event(row_id, lease, EffectEvent.APPLIED, Effect.APPLIED, in_doubt=False, note=note)
        return Effect.APPLIED
    with transaction.atomic(using=DB):
        assert_current(lease, "effect_outcome", lease_valid=False)
        row = (
            Effect.objects.using(DB)
            .filter(key=key, fence=lease.fence)
            .exclude(state=Effect.APPLIED)
            .first()
        )
        if row is None:
            raise StaleAttempt(lease.job_id, lease.fence, "effect_outcome")
        event = {
            Effect.APPLIED: EffectEvent.APPLIED,
            Effect.NOT_APPLIED: EffectEvent.NOT_SENT,
            Effect.UNKNOWN: EffectEvent.UNKNOWN,
        }[state]
        in_doubt = state == Effect.UNKNOWN or (state == Effect.NOT_APPLIED and row.in_doubt)
        if state == Effect.APPLIED:
            in_doubt = False
        after = Effect.UNKNOWN if in_doubt else state
        if state == Effect.NOT_APPLIED and in_doubt:
            note = _with_note(
                note,
                f"attempt {lease.attempt} (fence {lease.fence}) sent nothing, but an earlier "
                "outcome is still unknown: the effect may have happened",
            )
        fields = {"state": after, "in_doubt": in_doubt, "updated_at": DbNow()}
        if destination_ref:
            fields["destination_ref"] = destination_ref[:300]
        if note:
            fields["note"] = _with_note(row.note, note)
        Effect.objects.using(DB).filter(pk=row.pk, fence=lease.fence).update(**fields)
        _event(row.pk, lease, event, after, in_doubt=in_doubt, note=note)
    return after


# ---------------------------------------------------------------------------------------------
# Abandoned leases: the reaper and graceful release
# ---------------------------------------------------------------------------------------------


def _situation(job: Job, now: datetime) -> Situation | None:
    """What the decision needs about ``job`` (leased, its attempt ending without a result),
    or None when its type is not registered here: then nothing is decided but to park it."""
    from . import registry

    jt = registry.get(job.name)
    if jt is None:
        return None
    mode = EffectMode(job.effect)
    return Situation(
        mode=mode,
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        age_seconds=(now - job.created_at).total_seconds(),
        has_reconcile=jt.reconcile is not None,
        kind=job.next_kind,
        has_fallback=jt.fallback is not None,
        fallback_shares_key=jt.fallback_shares_key,
        unsettled_effect=mode != EffectMode.TRANSACTIONAL and has_unsettled_effect(job.pk),
    )


def _policy(name: str) -> RetryPolicy:
    from . import registry

    jt = registry.get(name)
    if jt is None:
        s = conf.get()
        return RetryPolicy(base=s.BACKOFF_BASE_SECONDS, cap=s.BACKOFF_CAP_SECONDS)
    return jt.retry_policy


def _abandoned(
    job: Job, now: datetime, *, why: str, rng: random.Random, in_flight_grace: float = 0.0
) -> Decision:
    """The decision for a leased job whose attempt ended without a result (its lease expired,
    or its executor gave it up): fail closed when the type is unknown here."""
    situation = _situation(job, now)
    if situation is None:
        return outcomes.unregistered(job.name, by_reaper=True)
    return outcomes.after_abandon(
        situation,
        unsettled_effect=situation.unsettled_effect,
        policy=_policy(job.name),
        rng=rng,
        why=why,
        in_flight_grace=in_flight_grace,
    )


def expired_leases(grace: float) -> Any:
    """The leased jobs whose lease expired more than ``grace`` seconds ago, oldest expiry
    first, locked ``SKIP LOCKED`` on PostgreSQL (call inside a transaction)."""
    qs = (
        Job.objects.using(DB)
        # A bound the leases index can stop at: with the wall clock as a mere filter, every
        # sweep read the whole index, and under a held snapshot that is an entry for every
        # job leased since (the reaper's write re-checks the expiry with the wall clock).
        .filter(state=states.State.LEASED, lease_expires_at__lt=DbNow(-grace, search=True))
        .order_by("lease_expires_at")
    )
    if connections[DB].vendor == "postgresql":
        qs = qs.select_for_update(skip_locked=True)
    return qs


def reap(*, limit: int = 100, rng: random.Random | None = None) -> Counter[str]:
    """Move jobs whose lease expired (by the database's clock, plus a grace) on.

    Safe in many processes at once: candidates are locked ``SKIP LOCKED`` and each write is
    conditioned on the job still being leased under the same fence with its lease expired.
    A job whose type is not registered in this process is parked, never retried or handed
    to a fallback. Returns counts by transition name.
    """
    rng = rng or random.Random()
    grace = conf.get().REAP_GRACE_SECONDS
    counts: Counter[str] = Counter()
    conn = connections[DB]
    with transaction.atomic(using=DB):
        jobs = list(expired_leases(grace)[:limit])
        if not jobs:
            return counts
        now = to_datetime(_now(conn))
        for job in jobs:
            overran = job.deadline_at is not None and to_datetime(job.deadline_at) <= now
            why = (
                f"maximum runtime of {job.timeout_seconds:g}s exceeded (owner {job.lease_owner})"
                if overran
                else f"lease expired (owner {job.lease_owner})"
            )
            decision = _abandoned(job, now, why=why, rng=rng)
            lease = _lease_of(job)
            try:
                # The expiry is re-checked in the write itself: a late heartbeat may have landed.
                finish(lease, decision, outcome="lease_expired", expired_for=grace)
                counts[decision.transition.name] += 1
            except StaleAttempt:
                continue
    for name, n in counts.items():
        log.info("reaper: %s x%d", name, n)
    return counts


def _now(conn: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute("SELECT " + now_sql(conn.vendor), [])
        return cur.fetchone()[0]


def _lease_of(job: Job) -> Lease:
    attempt_id = (
        Attempt.objects.using(DB)
        .filter(job_id=job.pk, fence=job.fence)
        .values_list("pk", flat=True)
        .first()
    )
    return Lease(
        job_id=job.pk,
        fence=job.fence,
        attempt=job.attempts,
        attempt_id=attempt_id or 0,
        kind=job.next_kind,
        name=job.name,
        queue=job.queue,
        payload=job.payload,
        lease_seconds=job.lease_seconds,
        effect=job.effect,
        max_attempts=job.max_attempts,
        created_at=job.created_at,
        executor=job.lease_owner,
        timeout_seconds=job.timeout_seconds,
    )


def release(lease: Lease, *, why: str = "executor shutting down") -> None:
    """Give an unfinished attempt back (graceful shutdown), fenced.

    With no unsettled effect the job waits again at once and the attempt is not spent; with
    one, the mode's rule for an ambiguous outcome applies, as it would after lease expiry (a
    job whose type is not registered here is parked).
    """
    job = _mine(lease).first()
    if job is None:
        raise StaleAttempt(lease.job_id, lease.fence, states.RELEASE.name)
    now = to_datetime(_now(connections[DB]))
    situation = _situation(job, now)
    if situation is not None and not situation.unsettled_effect:
        decision = Decision(
            transition=states.RELEASE, reason=why, spend_attempt=False, next_kind=Kind(lease.kind)
        )
    else:
        # A live executor gives the attempt up: a request it sent may still be in flight.
        decision = _abandoned(
            job,
            now,
            why=why,
            rng=random.Random(),
            in_flight_grace=conf.get().REAP_GRACE_SECONDS,
        )
    finish(lease, decision, outcome="released")


def release_unstarted(lease: Lease, *, why: str) -> None:
    """Give back a claimed attempt whose handler never started (a Celery chain's queued job):
    the job waits again at once, the attempt is not spent, and its kind is kept. Nothing of
    this attempt can have happened, so no effect rule is asked; effects an earlier attempt
    left unsettled stay as the ledger has them. Fenced."""
    decision = Decision(
        transition=states.RELEASE, reason=why, spend_attempt=False, next_kind=Kind(lease.kind)
    )
    finish(lease, decision, outcome="released")


# ---------------------------------------------------------------------------------------------
# Broker hints (the database is the truth; messages are only wake-ups)
# ---------------------------------------------------------------------------------------------


def take_due_hints(
    *, limit: int = 500, queues: frozenset[str] | None = None
) -> list[tuple[int, str]]:
    """Pick due waiting jobs of ``queues`` (None: every queue) whose hint is missing, was sent
    for an earlier due time (before a retry), or is old, and mark them hinted now.

    "Old" grows with the wait: a hint is sent again once ``REDISPATCH_AFTER_SECONDS`` have
    passed and at least as long as the job had been due when its last hint went, so a job
    that stays unclaimed gets hints at due + 10 s, 20 s, 40 s, 80 s … (a bounded number,
    however long it waits), never one per round. Returns ``(job_id, queue)`` pairs to publish.
    Two dispatchers may both pick a job; the second hint is absorbed by the claim.
    """
    from django.db.models import DurationField, ExpressionWrapper

    if queues is not None and not queues:
        return []
    resend = conf.get().REDISPATCH_AFTER_SECONDS
    with transaction.atomic(using=DB):
        waited_at_last_hint = ExpressionWrapper(
            F("hinted_at") - F("run_at"), output_field=DurationField()
        )
        since_last_hint = ExpressionWrapper(DbNow() - F("hinted_at"), output_field=DurationField())
        qs = (
            Job.objects.using(DB)
            .filter(state=states.State.WAITING, run_at__lte=DbNow())
            .annotate(waited=waited_at_last_hint, since=since_last_hint)
            .filter(
                Q(hinted_at__isnull=True)
                | Q(hinted_at__lt=F("run_at"))
                | (Q(hinted_at__lt=DbNow(-resend)) & Q(since__gt=F("waited")))
            )
            .order_by("-priority", "run_at", "id")
        )
        if queues is not None:
            qs = qs.filter(queue__in=sorted(queues))
        if connections[DB].vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True, of=("self",))
        picked = list(qs.values_list("id", "queue")[:limit])
        if picked:
            Job.objects.using(DB).filter(
                pk__in=[p[0] for p in picked], state=states.State.WAITING
            ).update(hinted_at=DbNow())
    return picked


# ---------------------------------------------------------------------------------------------
# Executors (liveness rows, not job state)
# ---------------------------------------------------------------------------------------------


def executor_started(
    executor_id: str, *, transport: str, queues: Sequence[str], concurrency: int
) -> None:
    """Register a live executor."""
    import os

    Executor.objects.using(DB).update_or_create(
        id=executor_id,
        defaults={
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "transport": transport,
            "queues": ",".join(queues),
            "concurrency": concurrency,
            "active": 0,
            "started_at": DbNow(),
            "heartbeat_at": DbNow(),
            "stopped_at": None,
        },
    )


def executor_beat(executor_id: str, *, active: int) -> None:
    """Refresh an executor's liveness row."""
    Executor.objects.using(DB).filter(pk=executor_id).update(heartbeat_at=DbNow(), active=active)


def executor_stopped(executor_id: str) -> None:
    """Mark an executor stopped."""
    Executor.objects.using(DB).filter(pk=executor_id).update(stopped_at=DbNow(), active=0)


# ---------------------------------------------------------------------------------------------
# Operator actions (audited, version-checked; the dashboard's only way to change a job)
# ---------------------------------------------------------------------------------------------

VERIFIED_FACTS = {
    "not_applied": "The operator verified the effect did not happen.",
    "same_key": "Retry under the same idempotency key; the destination absorbs a repeat.",
    "applied": "The operator verified the effect happened.",
    "give_up": "The operator gives up on the job.",
}


@dataclass(frozen=True, kw_only=True)
class ActionResult:
    """The job after an operator action and its audit row."""

    job: Job
    audit: AuditEntry


@dataclass(frozen=True, kw_only=True)
class InFlightOwner:
    """An earlier owner of a job that may still act for it: its attempt was ended by the
    reaper (lease expired), and its executor is not known to have stopped. Paused between its
    last check and its call to the destination, it makes that call when it resumes; only a
    destination that checks the fencing token can refuse it."""

    attempt: int
    fence: int
    executor: str
    last_heartbeat: datetime | None
    reaped_at: datetime | None
    executor_last_seen: datetime | None
    """The executor's own last liveness beat (None: no row for it)."""


def needs_fact(job: Job) -> bool:
    """Whether retrying or resolving ``job`` needs a fact the operator verified: it is
    indeterminate, or its ledger holds an effect that may or may not have happened. The
    dashboard offers, and this module accepts, a plain retry only when it does not."""
    return job.state == states.State.INDETERMINATE or has_unsettled_effect(job.pk)


def in_flight_owners(job_id: int, *, limit: int = 20) -> list[InFlightOwner]:
    """The job's earlier owners that may still be in flight (see :class:`InFlightOwner`),
    newest first. An executor is known gone only once it recorded its own stop."""
    reaped = list(
        Attempt.objects.using(DB)
        .filter(job_id=job_id, outcome="lease_expired")
        .order_by("-fence")
        .values("number", "fence", "executor", "heartbeat_at", "finished_at")[:limit]
    )
    rows = {
        e.id: e for e in Executor.objects.using(DB).filter(id__in={a["executor"] for a in reaped})
    }
    out = []
    for a in reaped:
        ex = rows.get(a["executor"])
        if ex is not None and ex.stopped_at is not None:
            continue
        out.append(
            InFlightOwner(
                attempt=a["number"],
                fence=a["fence"],
                executor=a["executor"],
                last_heartbeat=a["heartbeat_at"],
                reaped_at=a["finished_at"],
                executor_last_seen=ex.heartbeat_at if ex is not None else None,
            )
        )
    return out


def operator_action(
    job_id: int,
    *,
    action: str,
    expected_version: int,
    actor: str,
    reason: str,
    verified: str = "",
    effects: Sequence[str] = (),
    accept_in_flight: bool = False,
) -> ActionResult:
    """Apply an operator's ``retry``, ``cancel``, ``resolve`` or ``give_up`` to one job.

    Conditioned on the job still having ``expected_version`` and a state the action may leave;
    otherwise :class:`ActionConflict` (nothing changes). The state change, the facts recorded
    in the ledger and the audit row commit together.

    Retrying or resolving a job that :func:`needs_fact` needs ``verified`` to name the fact
    the operator checked: ``not_applied`` or ``same_key`` (idempotent jobs only) for a retry,
    ``applied`` for a resolve. A fact applies to the effects ``effects`` names (by effect
    name), never to every effect of the job: with one unsettled effect it may be left out;
    with several, each one verified is named. A resolve must cover every unsettled effect.

    A ``not_applied`` retry is refused while an earlier owner may still be in flight
    (:func:`in_flight_owners`) unless ``accept_in_flight`` says the operator accepts it: that
    owner, paused between its check and its send, would send when it resumes, and only a
    destination that checks the fencing token would refuse it.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ActionRefused("a reason is required")
    with transaction.atomic(using=DB):
        job = Job.objects.using(DB).filter(pk=job_id).first()
        if job is None:
            raise ActionRefused(f"job {job_id} does not exist")
        # A stale page is a conflict whatever the job became since (leased, succeeded...):
        # judge the action only against the state the operator actually saw.
        if job.version != expected_version:
            raise ActionConflict(
                f"job {job_id} changed since version {expected_version}; reload and decide again"
            )
        if verified and verified not in VERIFIED_FACTS:
            raise ActionRefused(f"unknown verified fact {verified!r}")
        t, fields, effect_state = _operator_plan(job, action, verified)
        if not t.applies_to(job.state):
            raise ActionRefused(f"{action} does not apply to a {job.state} job")
        named = _facts_about(job, action, effect_state, effects)
        owners = in_flight_owners(job_id)
        if effect_state == Effect.NOT_APPLIED and owners and not accept_in_flight:
            who = ", ".join(f"{o.executor} (attempt {o.attempt}, fence {o.fence})" for o in owners)
            raise ActionRefused(
                f"an earlier owner may still be in flight: {who}. Its lease ran out and it is "
                "not known to have stopped; paused between its check and its send, it sends "
                "when it resumes, and only a destination that checks the fencing token refuses "
                "it. Confirm that you accept this (or that the process is gone) to retry."
            )
        fields.update(updated_at=DbNow(), version=F("version") + 1)
        n = (
            Job.objects.using(DB)
            .filter(pk=job_id, version=expected_version, state__in=list(t.sources))
            .update(state=t.target, **fields)
        )
        if n != 1:
            raise ActionConflict(
                f"job {job_id} changed since version {expected_version}; reload and decide again"
            )
        for row in named:
            note = f"operator {actor} verified {effect_state}: {reason}"
            Effect.objects.using(DB).filter(pk=row.pk).update(
                state=effect_state,
                in_doubt=False,
                note=_with_note(row.note, note),
                updated_at=DbNow(),
            )
            _event(
                row.pk,
                None,
                EffectEvent.OPERATOR,
                effect_state,
                in_doubt=False,
                note=reason,
                actor=actor,
            )
        before = job.state
        job.refresh_from_db()
        audit = AuditEntry.objects.using(DB).create(
            job=job,
            actor=actor,
            action=action,
            reason=reason[:4000],
            verified=verified,
            state_before=before,
            state_after=job.state,
            version_before=expected_version,
            detail={
                "transition": t.name,
                "fence": job.fence,
                "effects": [row.name for row in named],
                "in_flight_owners": [o.executor for o in owners],
                "accepted_in_flight": bool(owners and accept_in_flight),
            },
        )
    return ActionResult(job=job, audit=audit)


def _facts_about(job: Job, action: str, effect_state: str, effects: Sequence[str]) -> list[Effect]:
    """The ledger rows a verified fact is about: the effects named, which must be unsettled;
    none named means the only unsettled one. A resolve must leave none unsettled."""
    if effects and not effect_state:
        raise ActionRefused(f"{action} records no fact about effects; name none")
    if not effect_state:
        return []
    unsettled = {row.name: row for row in unsettled_effects(job.pk)}
    if not effects:
        if len(unsettled) > 1:
            raise ActionRefused(
                f"the job has {len(unsettled)} effects whose outcome is unknown "
                f"({', '.join(sorted(unsettled))}): name the one(s) you verified"
            )
        effects = list(unsettled)
    named = []
    for name in dict.fromkeys(effects):
        if name not in unsettled:
            raise ActionRefused(f"effect {name!r} of job {job.pk} is not awaiting a fact")
        named.append(unsettled[name])
    left = sorted(set(unsettled) - {row.name for row in named})
    if action == "resolve" and left:
        raise ActionRefused(
            f"effect(s) {', '.join(left)} would stay unknown in a succeeded job: verify them too"
        )
    return named


def _operator_plan(
    job: Job, action: str, verified: str
) -> tuple[states.Transition, dict[str, Any], str]:
    """Which transition an action means for this job, its extra fields, and the effect
    outcome the operator's fact records."""
    state = states.State(job.state)
    if state == states.State.LEASED:
        raise ActionRefused("a leased job cannot be retried, resolved or cancelled")
    if action == "cancel":
        return states.OP_CANCEL, {"finished_at": DbNow(), "reason": "cancelled by operator"}, ""
    if action == "retry":
        effect_state = ""
        # A failed job whose effect outcome is unknown needs the same stated fact as an
        # indeterminate one: a retry may otherwise repeat an effect that happened.
        if needs_fact(job):
            if verified == "not_applied":
                effect_state = Effect.NOT_APPLIED
            elif verified == "same_key":
                if job.effect != EffectMode.IDEMPOTENT:
                    raise ActionRefused(
                        "retrying under the same key is safe only for idempotent jobs"
                    )
            else:
                raise ActionRefused(
                    "retrying this job needs the fact you verified: not_applied, or same_key "
                    "for an idempotent job"
                )
        elif verified:
            raise ActionRefused(f"{verified} is a fact about an unknown outcome; this job has none")
        from . import registry

        jt = registry.get(job.name)
        budget = jt.max_attempts if jt else conf.get().DEFAULT_MAX_ATTEMPTS
        return (
            states.OP_RETRY,
            {
                "run_at": DbNow(),
                "hinted_at": None,
                "finished_at": None,
                "next_kind": Kind.RUN.value,
                "max_attempts": F("attempts") + budget,
                "reason": f"retried by operator ({verified or 'failed job'})",
            },
            effect_state,
        )
    if action == "resolve":
        if verified != "applied":
            raise ActionRefused("resolving as succeeded needs verified=applied")
        return (
            states.OP_RESOLVE,
            {"finished_at": DbNow(), "reason": "resolved by operator: effect applied"},
            Effect.APPLIED,
        )
    if action == "give_up":
        return (
            states.OP_GIVE_UP,
            {"finished_at": DbNow(), "reason": "operator gave up"},
            "",
        )
    raise ActionRefused(f"unknown action {action!r}")


BULK_ACTIONS = frozenset({"retry", "cancel"})
BULK_MAX = 1000
"""The most jobs one bulk action may change; a larger filter must be narrowed first."""


@dataclass(frozen=True, kw_only=True)
class BulkResult:
    """What a bulk operator action changed: one audited action per job."""

    action: str
    results: list[ActionResult]


def bulk_operator_action(
    jobs: Any, *, action: str, confirmed_count: int, actor: str, reason: str
) -> BulkResult:
    """Apply ``retry`` or ``cancel`` to every job ``jobs`` (a Job queryset) matches.

    All or nothing, in one transaction: the operator confirmed ``confirmed_count`` jobs, and a
    filter that now matches a different number raises :class:`ActionConflict`, as does any job
    that changes between listing and writing. Each job goes through :func:`operator_action`
    (state guard, version check, its own audit row). An indeterminate job is never retried in
    bulk: it needs the fact its own operator verified, so it is refused.
    """
    if action not in BULK_ACTIONS:
        raise ActionRefused(f"bulk action must be one of {sorted(BULK_ACTIONS)}")
    if not (reason or "").strip():
        raise ActionRefused("a reason is required")
    with transaction.atomic(using=DB):
        matched = list(jobs.using(DB).order_by("id").values_list("id", "version")[: BULK_MAX + 1])
        if len(matched) > BULK_MAX:
            raise ActionRefused(f"a bulk action changes at most {BULK_MAX} jobs; narrow the filter")
        if len(matched) != confirmed_count:
            raise ActionConflict(
                f"the filter now matches {len(matched)} jobs, not the {confirmed_count} "
                "confirmed; reload and decide again"
            )
        if not matched:
            raise ActionRefused("the filter matches no jobs")
        results = [
            operator_action(job_id, action=action, expected_version=v, actor=actor, reason=reason)
            for job_id, v in matched
        ]
    return BulkResult(action=action, results=results)


# ---------------------------------------------------------------------------------------------
# Enqueue (the only insert of a job)
# ---------------------------------------------------------------------------------------------


def insert_job(
    *,
    name: str,
    queue: str,
    payload: dict[str, Any],
    priority: int,
    run_at: datetime | None,
    max_attempts: int,
    lease_seconds: int,
    unique_key: str | None,
    effect: str,
    timeout_seconds: float,
    schedule_id: int | None = None,
) -> Job:
    """Insert a waiting job in the caller's transaction; a known ``unique_key`` returns the
    job already accepted under it.

    A due job wakes executors: ``NOTIFY`` on PostgreSQL (delivered only if the transaction
    commits) and a broker hint published after commit. A hint lost between commit and publish
    is re-sent by the dispatcher, so a job never depends on its message.
    """
    from django.utils import timezone

    from . import transports

    due_now = run_at is None or run_at <= timezone.now()
    hint = due_now and transports.uses_broker(queue)
    fields: dict[str, Any] = {
        "name": name,
        "queue": queue,
        "payload": payload,
        "priority": priority,
        "run_at": run_at if run_at is not None else DbNow(),
        "state": states.State.WAITING,
        "max_attempts": max_attempts,
        "lease_seconds": lease_seconds,
        "timeout_seconds": timeout_seconds,
        "unique_key": unique_key,
        "effect": effect,
        "schedule_id": schedule_id,
        "created_at": DbNow(),
        "updated_at": DbNow(),
        "hinted_at": DbNow() if hint else None,
    }
    if connections[DB].vendor == "postgresql":
        job = _insert_job_pg(fields)
        if job is None:
            existing = Job.objects.using(DB).filter(unique_key=unique_key).first()
            if existing is None:  # accepted and already pruned: accept it anew
                return insert_job(
                    name=name,
                    queue=queue,
                    payload=payload,
                    priority=priority,
                    run_at=run_at,
                    max_attempts=max_attempts,
                    lease_seconds=lease_seconds,
                    unique_key=unique_key,
                    effect=effect,
                    timeout_seconds=timeout_seconds,
                    schedule_id=schedule_id,
                )
            return existing
        # The wake-up went out with the insert; this process's floors learn it at commit.
        due: datetime = job.run_at
        transaction.on_commit(lambda: FLOORS.woken(queue, priority, due), using=DB)
        if hint:
            job_id = job.pk
            transaction.on_commit(lambda: transports.publish(job_id, queue), using=DB)
        return job
    with transaction.atomic(using=DB):
        if unique_key is None:
            job = Job.objects.using(DB).create(**fields)
        else:
            try:
                with transaction.atomic(using=DB):
                    job = Job.objects.using(DB).create(**fields)
            except IntegrityError:
                existing = Job.objects.using(DB).filter(unique_key=unique_key).first()
                if existing is None:
                    raise
                return existing
        job.refresh_from_db()
        _notify(queue, priority, job.run_at)
        if hint:
            job_id = job.pk
            transaction.on_commit(lambda: transports.publish(job_id, queue), using=DB)
    return job


_DB_SET = ("id", "run_at", "created_at", "updated_at", "hinted_at")
"""The columns of a new job whose values the database sets (its clock, its sequence)."""


def _insert_job_sql(*, on_conflict: str) -> str:
    return f"""
    WITH ins AS (
        INSERT INTO tenure_job (name, queue, payload, priority, run_at, state, fence,
            lease_owner, attempts, max_attempts, lease_seconds, timeout_seconds, unique_key,
            effect, next_kind, version, schedule_id, created_at, updated_at, hinted_at,
            last_error, reason)
        VALUES (%(name)s, %(queue)s, %(payload)s::jsonb, %(priority)s,
            COALESCE(%(run_at)s::timestamptz, clock_timestamp()), 'waiting', 0, '', 0,
            %(max_attempts)s, %(lease_seconds)s, %(timeout_seconds)s, %(unique_key)s,
            %(effect)s, 'run', 1, %(schedule_id)s, clock_timestamp(), clock_timestamp(),
            CASE WHEN %(hint)s THEN clock_timestamp() END, '', '')
        {on_conflict}
        RETURNING {", ".join(_DB_SET)}, priority, queue
    )
    SELECT {", ".join("ins." + c for c in _DB_SET)},
        pg_notify(%(channel)s, ins.priority || ' '
            || to_char(extract(epoch FROM ins.run_at), 'FM9999999999.999999') || ' '
            || ins.queue)
    FROM ins
"""


_INSERT_JOB_PG = {
    False: _insert_job_sql(on_conflict=""),
    True: _insert_job_sql(on_conflict="ON CONFLICT (unique_key) DO NOTHING"),
}
""":func:`insert_job` on PostgreSQL, without and with a unique key: the insert and its wake-up
(``NOTIFY``, sent at commit) in one statement. Written out rather than compiled by the ORM on
every enqueue, which cost more (0.8 ms of the client's CPU) than the round trips it saves."""


def _insert_job_pg(fields: dict[str, Any]) -> Job | None:
    """PostgreSQL's enqueue: one statement and one round trip, atomic on its own or joining
    the caller's transaction. None when ``unique_key`` was taken already (nothing written)."""
    run_at = fields["run_at"]
    params = {
        **{k: fields[k] for k in ("name", "queue", "priority", "max_attempts", "lease_seconds")},
        "timeout_seconds": fields["timeout_seconds"],
        "unique_key": fields["unique_key"],
        "effect": fields["effect"],
        "schedule_id": fields["schedule_id"],
        "payload": json.dumps(fields["payload"], ensure_ascii=False, allow_nan=False),
        "run_at": None if isinstance(run_at, DbNow) else run_at,
        "hint": fields["hinted_at"] is not None,
        "channel": WAKEUP_CHANNEL,
    }
    with connections[DB].cursor() as cur:
        cur.execute(_INSERT_JOB_PG[fields["unique_key"] is not None], params)
        row = cur.fetchone()
    if row is None:
        return None
    known = {k: v for k, v in fields.items() if k not in _DB_SET}
    job = Job(**known, **dict(zip(_DB_SET, row[: len(_DB_SET)], strict=True)))
    job._state.adding = False
    job._state.db = DB
    return job


def insert_jobs(
    *,
    name: str,
    queue: str,
    payloads: Sequence[dict[str, Any]],
    priority: int,
    run_at: datetime | None,
    max_attempts: int,
    lease_seconds: int,
    effect: str,
    timeout_seconds: float,
) -> list[int]:
    """Insert many waiting jobs of one type in one statement, in the caller's transaction, and
    return their ids (in payload order).

    No unique keys: a job that must be accepted once goes through :func:`insert_job`. Due jobs
    send one ``NOTIFY`` for the whole batch and, on a broker transport, one hint per job after
    commit (a lost hint is re-sent by the dispatcher, as for a single job).
    """
    from django.utils import timezone

    from . import transports

    if not payloads:
        return []
    conn = connections[DB]
    now = now_sql(conn.vendor)
    due_now = run_at is None or run_at <= timezone.now()
    hint = due_now and transports.uses_broker(queue)
    run_at_param = conn.ops.adapt_datetimefield_value(run_at) if run_at is not None else None
    if conn.vendor == "postgresql":
        rows = "jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS p(payload, n)"
        payload, order, run_at_sql = "p.payload", "p.n", "%s::timestamptz"
    else:
        rows = "json_each(%s) AS p"
        payload, order, run_at_sql = "json(p.value)", "p.key", "%s"
    sql = f"""
        INSERT INTO tenure_job (name, queue, payload, priority, run_at, state, fence,
            lease_owner, attempts, max_attempts, lease_seconds, timeout_seconds, effect,
            next_kind, version, created_at, updated_at, hinted_at, last_error, reason)
        SELECT %s, %s, {payload}, %s, COALESCE({run_at_sql}, {now}), 'waiting', 0, '', 0,
            %s, %s, %s, %s, 'run', 1, {now}, {now}, {now if hint else "NULL"}, '', ''
        FROM {rows} ORDER BY {order}
        RETURNING id, run_at
    """
    params: list[Any] = [
        name,
        queue,
        priority,
        run_at_param,
        max_attempts,
        lease_seconds,
        timeout_seconds,
        effect,
        json.dumps(list(payloads), ensure_ascii=False, allow_nan=False),
    ]
    with transaction.atomic(using=DB), conn.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
        ids = sorted(r[0] for r in rows)
        if rows:
            _notify(queue, priority, min(to_datetime(r[1]) for r in rows))
        if hint:

            def publish_all() -> None:
                for job_id in ids:
                    transports.publish(job_id, queue)

            transaction.on_commit(publish_all, using=DB)
    return ids


WAKEUP_CHANNEL = "tenure_wakeup"


def _notify(queue: str, priority: int, due_at: datetime) -> None:
    """Tell executors a job of ``queue`` waits: ``NOTIFY`` on PostgreSQL, sent at commit and
    dropped on rollback, naming the job's place in the claim order (:func:`wakeup_payload`) so
    a listener's claim floors reach it (:meth:`ClaimFloors.woken`), whether it is due now or
    later. This process's own floors learn it at commit too."""
    conn = connections[DB]
    if conn.vendor != "postgresql":
        return
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_notify(%s, %s)", [WAKEUP_CHANNEL, wakeup_payload(queue, priority, due_at)]
        )
    transaction.on_commit(lambda: FLOORS.woken(queue, priority, due_at), using=DB)


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


def reconciled(lease: Lease, answer: outcomes.Reconciliation) -> None:
    """Record a reconcile attempt's answer on the job's unsettled effects (fenced): a stated
    fact, so it settles them (``unknown`` changes nothing)."""
    state = {
        outcomes.Reconciliation.APPLIED: Effect.APPLIED,
        outcomes.Reconciliation.NOT_APPLIED: Effect.NOT_APPLIED,
    }.get(answer)
    if state is None:
        return
    with transaction.atomic(using=DB):
        assert_current(lease, "effect_outcome", lease_valid=False)
        for pk in list(_unsettled(lease.job_id).values_list("pk", flat=True)):
            Effect.objects.using(DB).filter(pk=pk).update(
                state=state,
                in_doubt=False,
                note=f"reconciled by attempt {lease.attempt}",
                updated_at=DbNow(),
            )
            _event(
                pk,
                lease,
                EffectEvent.RECONCILED,
                state,
                in_doubt=False,
                note=f"the destination's lookup answered {answer.value}",
            )


# ---------------------------------------------------------------------------------------------
# Retention (finished jobs) and the dashboard's count snapshot
# ---------------------------------------------------------------------------------------------

PRUNABLE = (states.State.SUCCEEDED.value, states.State.FAILED.value)


def prune_finished(state: str, older_than: float, *, limit: int = 1000) -> int:
    """Delete up to ``limit`` jobs in ``state`` (succeeded or failed) last changed more than
    ``older_than`` seconds ago by the database's clock, with their attempts and ledger rows.

    Jobs with an audit entry (an operator acted on them) are kept, so the audit trail always
    names its job, and so are jobs whose ledger holds an effect that may or may not have
    happened (whatever their state, that question stays open until someone settles it).
    Terminal jobs never change again except through an audited operator action, so nothing
    deleted here could still be running. Returns how many jobs were deleted.
    """
    if state not in PRUNABLE:
        raise ValueError(f"only finished jobs are pruned, not {state!r}")
    if older_than <= 0 or limit < 1:
        return 0
    conn = connections[DB]
    if conn.vendor == "postgresql":
        with transaction.atomic(using=DB), conn.cursor() as cur:
            cur.execute(_PRUNE_SQL, [state, older_than, limit, state])
            return len(cur.fetchall())
    with transaction.atomic(using=DB):
        ids = list(
            Job.objects.using(DB)
            .filter(state=state, updated_at__lt=DbNow(-older_than))
            .exclude(pk__in=AuditEntry.objects.using(DB).filter(job__isnull=False).values("job"))
            .exclude(Exists(unsettled_of_job(OuterRef("pk"))))
            .order_by("updated_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return 0
        EffectEvent.objects.using(DB).filter(effect__job_id__in=ids).delete()
        Effect.objects.using(DB).filter(job_id__in=ids).delete()
        Attempt.objects.using(DB).filter(job_id__in=ids).delete()
        n, _ = Job.objects.using(DB).filter(pk__in=ids, state=state).delete()
        return len(ids) if n else 0


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
    )
    DELETE FROM tenure_job WHERE id IN (SELECT id FROM doomed) AND state = %s RETURNING id
"""
""":func:`prune_finished` on PostgreSQL: one statement; rows another transaction holds are
skipped (two schedulers pruning at once delete disjoint batches). The cut-off is the
statement's time, not ``clock_timestamp()``: a volatile bound is no index condition, and every
round then read the whole state's range of ``tenure_job_state`` (25,000 succeeded jobs, 25 ms,
in a soak's third minute) to delete nothing."""


def refresh_count_snapshot(*, older_than: float) -> bool:
    """Recount succeeded and cancelled jobs per (queue, type) into :class:`CountSnapshot` if
    the last count is older than ``older_than`` seconds; returns whether it recounted.

    The count is one scan of the job table; replacing the rows is one transaction, so the
    dashboard sees the old snapshot or the new one, never a mix.
    """
    from django.db.models import Count, Max

    from .models import CountSnapshot

    last = CountSnapshot.objects.using(DB).aggregate(t=Max("taken_at"))["t"]
    if last is not None and not _older_than(last, older_than):
        return False
    rows = (
        Job.objects.using(DB)
        .filter(state__in=[states.State.SUCCEEDED, states.State.CANCELLED])
        .values("queue", "name", "state")
        .annotate(n=Count("id"))
    )
    from .dbclock import db_now

    with transaction.atomic(using=DB):
        taken = db_now(DB)
        CountSnapshot.objects.using(DB).all().delete()
        CountSnapshot.objects.using(DB).bulk_create(
            CountSnapshot(
                queue=r["queue"], name=r["name"], state=r["state"], n=r["n"], taken_at=taken
            )
            for r in rows
        )
    return True


def _older_than(when: datetime, seconds: float) -> bool:
    from .dbclock import db_now

    return bool((db_now(DB) - when).total_seconds() > seconds)


# ---------------------------------------------------------------------------------------------
# Return values (django.tasks)
# ---------------------------------------------------------------------------------------------


def record_return_value(lease: Lease, value: Any) -> None:
    """Keep what ``lease``'s handler returned on its attempt's row, fenced like every attempt
    write: refused (:class:`StaleAttempt`, :class:`AttemptOverrun`) once the job is no longer
    leased under this fence or the attempt is past its maximum runtime.

    ``value`` is JSON already checked by the caller (:mod:`scheduler_core.backends`). It is
    written before the completion, in the caller's transaction when there is one (a
    ``transactional`` job's); a task's result is the value of the attempt whose completion was
    accepted, so one left by an attempt that did not complete is never read as the result.
    """
    mine = _mine(lease).filter(deadline_at__gt=DbNow())
    n = (
        Attempt.objects.using(DB)
        .filter(pk=lease.attempt_id, finished_at__isnull=True)
        .filter(Exists(mine))
        .update(return_value=value)
    )
    if n != 1:
        raise refusal(lease, "return_value")
