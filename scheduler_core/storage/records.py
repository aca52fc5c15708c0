"""The values the storage layer hands out and the helpers without SQL text every driver uses:
:class:`Lease`, :class:`Failure`, :class:`InFlightOwner`, :class:`IndexSize`,
:class:`InstallationRecord`, executor ids, the job spec's one mapping to columns
(:func:`row_values`, :func:`options_from_row`), the columns a claim returns and the one builder
of a lease from a claimed row (:func:`lease_from_row`), the ORM's guard "this attempt is still
open" of the writes that name an attempt by key (:func:`still_open`), and an error's SQLSTATE. Each database's statements are its own
(:mod:`.pg_statements`, :mod:`.sqlite_statements`)."""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, Func, Q

from ..domain import states
from ..domain.installation import INSTALLATION_ID_CHARS as INSTALLATION_ID_CHARS  # their old home
from ..domain.installation import check_installation_id as check_installation_id
from ..domain.options import JobOptions
from .clock import to_datetime

log = logging.getLogger("tenure.storage")


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a claim grants: the right to act for one attempt of one job, until it expires.
    Built only by :func:`lease_from_row`, from a claimed row read by column name."""

    job_id: int
    fence: int
    attempt: int
    attempt_id: int
    kind: str
    created_at: datetime
    executor: str
    options: JobOptions
    """The job spec as the claim read it back from the job's rows (:func:`options_from_row`)."""
    attempt_base: int = 0
    """What the attempt's number adds to ``attempt`` (the attempts spent, which the retry
    policy counts): raised past the numbers a timeline lost in a failover may have given."""
    granted_at: float = field(default=0.0, compare=False)
    """This process's monotonic clock just before the claim was sent: the lease cannot
    expire before ``granted_at + lease_seconds`` (0 when unknown)."""
    claimed_at: datetime | None = field(default=None, compare=False)
    """When the claim took the job, by the database's clock (None when unknown)."""

    @property
    def number(self) -> int:
        """The attempt's number, as its Attempt row, logs, spans and the handler see it: the
        attempts spent plus :attr:`attempt_base`, so no number repeats across a failover."""
        return self.attempt + self.attempt_base

    # The spec's fields as the lease's own: every reader of a lease reads them so.

    @property
    def name(self) -> str:
        """The job type."""
        return self.options.name

    @property
    def queue(self) -> str:
        """The job's queue."""
        return self.options.queue

    @property
    def payload(self) -> dict[str, Any]:
        """The handler's keyword arguments."""
        return self.options.payload

    @property
    def lease_seconds(self) -> int:
        """How long the lease lasts between renewals."""
        return self.options.lease_seconds

    @property
    def effect(self) -> str:
        """The effect mode's value."""
        return self.options.effect

    @property
    def max_attempts(self) -> int:
        """The attempt budget as the claim found it."""
        return self.options.max_attempts

    @property
    def timeout_seconds(self) -> float:
        """The attempt's maximum runtime (the job's ``timeout_seconds``); 0 when unknown. The
        database holds the deadline (``Job.deadline_at``); this lets the executor stop renewing
        on its own clock too."""
        return self.options.timeout_seconds

    @property
    def priority(self) -> int:
        """The job's priority."""
        return self.options.priority

    @property
    def due_at(self) -> datetime | None:
        """The job's ``run_at`` when it was claimed: where it stood in the claim order."""
        return self.options.run_at

    @property
    def workflow_id(self) -> int | None:
        """The workflow the job is a step of (None: an ordinary job): its end moves other
        steps."""
        return self.options.workflow_id

    @property
    def trace_context(self) -> dict[str, str] | None:
        """The trace context stored with the job at enqueue (``scheduler_core.tracing``), which
        the attempt's span descends from; None when none was stored."""
        return self.options.trace_context


@dataclass(frozen=True, kw_only=True)
class Failure:
    """What went wrong in an attempt, for its record."""

    error_class: str
    error_type: str
    message: str
    traceback: str = ""


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
    ended: str = "lease expired"
    """How the attempt ended without its owner's result: ``lease expired`` (the reaper ended
    it, its maximum runtime included) or ``released`` (its executor gave it up unfinished)."""
    clear_at: datetime | None = None
    """The database time before which a new attempt must not start: the attempt's lease end
    (or release) plus the reaper's grace, the time a paused owner is given everywhere."""


IN_FLIGHT_OUTCOMES = {"lease_expired": "lease expired", "released": "released"}
"""The attempt outcomes that leave its owner possibly still running: ended for it, not by it."""


def new_executor_id(kind: str = "exec") -> str:
    """A unique executor identity: ``host:pid:uuid``."""
    return f"{socket.gethostname()}:{os.getpid()}:{kind}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True, kw_only=True)
class InstallationRecord:
    """The database's own installation id and the identity of the database it was recorded
    for (:class:`~scheduler_core.models.Installation`)."""

    key: str
    identity: dict[str, str]
    """Empty: none recorded (or the database could not say)."""
    identity_at: datetime | None
    created_at: datetime | None


def with_note(old: str, new: str) -> str:
    """The ledger's note keeps its history: each cause is appended, the newest kept whole."""
    return (f"{old}; {new}" if old else new)[-2000:]


JOB_OPTION_COLUMNS = ("name", "queue", "priority", "run_at", "max_attempts")
"""The job spec's columns on the job row (``tenure_job``): what the claim orders and filters by,
and what an operator may change (the attempt budget). Every other field of
:class:`~scheduler_core.domain.options.JobOptions` is a column of the spec row."""

SPEC_COLUMNS = tuple(f.name for f in fields(JobOptions) if f.name not in JOB_OPTION_COLUMNS)
"""The job spec's columns on its spec row (``tenure_job_spec``, written once at enqueue and
never changed), in the fields' order: every field the job row does not hold, so a new option
lands here without a line of its own."""

OPTION_COLUMNS = (*JOB_OPTION_COLUMNS, *SPEC_COLUMNS)
"""Every column of the job spec, each named as its field."""

_TYPES = {f.name: str(f.type) for f in fields(JobOptions)}

JSON_COLUMNS = tuple(c for c in OPTION_COLUMNS if _TYPES[c].startswith("dict"))
"""The spec's JSON columns (its fields typed as mappings): each driver encodes them on insert,
and SQLite's raw statements return them as text, which :func:`options_from_row` decodes."""

CLAIMED_JOB_COLUMNS = (
    "id",
    "fence",
    "attempts",
    "attempt_base",
    "next_kind",
    "created_at",
    "heartbeat_at",
    *JOB_OPTION_COLUMNS,
)
"""The job row's columns a claim returns, as the claim left them: its claim state, then the
job spec's columns on the job row."""

LEASE_COLUMNS = (*CLAIMED_JOB_COLUMNS, *SPEC_COLUMNS, "attempt_id")
"""The columns of a claimed row every driver's claim returns, by these names: the job as the
claim left it, its spec row, then its new attempt's id. :func:`lease_from_row` reads them."""


def row_values(options: JobOptions) -> dict[str, Any]:
    """The job spec as the insert's column values, by column name (:data:`OPTION_COLUMNS`;
    :data:`JOB_OPTION_COLUMNS` on the job row, :data:`SPEC_COLUMNS` on the spec row). Values
    as the spec holds them: a driver encodes :data:`JSON_COLUMNS` and a ``run_at`` of None
    (the database's now) as its statements need."""
    return {c: getattr(options, c) for c in OPTION_COLUMNS}


def _read(column: str, value: Any) -> Any:
    """A column's value as its field holds it: JSON from text, a timestamp as an aware datetime,
    a float from any number (the type the field's annotation names)."""
    kind = _TYPES[column]
    if column in JSON_COLUMNS:
        return json.loads(value) if isinstance(value, str | bytes) else value
    if kind.startswith("datetime"):
        return to_datetime(value)
    if kind == "float":
        return float(value)
    return value


def options_from_row(row: Mapping[str, Any]) -> JobOptions:
    """The job spec read back from a row holding :data:`OPTION_COLUMNS`, by column name."""
    values = {c: _read(c, row[c]) for c in OPTION_COLUMNS}
    if not isinstance(values["trace_context"], dict):
        values["trace_context"] = None  # a stored JSON null, or no context of a known shape
    return JobOptions(**values)


EPOCH_BITS = 32
"""Where a fence's epoch starts: a fence is ``epoch << EPOCH_BITS`` plus the claims made in it
(docs/architecture.md, "Fences across a failover"; PostgreSQL's claim computes it,
``pg_statements.NEXT_FENCE``)."""


class Holds(Func):
    """``(condition) IS TRUE``: the rows ``condition`` selects, in a form PostgreSQL's planner
    does not match to a partial index's predicate (it proves ``finished_at IS NULL`` from
    ``finished_at IS NULL``, never from this)."""

    template = "(%(expressions)s) IS TRUE"
    output_field = BooleanField()


def still_open() -> Holds:
    """The guard "this attempt has not ended" of every write that names its attempt by key.

    Written plainly, PostgreSQL could serve it from the partial index of open attempts that
    migration 0015 built (0017 replaced it by the table ``tenure_open_attempt``; the form stays
    so that no later index of open attempts is read instead of the key): statistics taken while no
    attempt was open say that index is empty, so reading all of it (and ANDing it with the
    key's) looks free. But while a snapshot is held the index keeps an entry for every attempt
    opened since, and each completion read every one: in an hour's soak the completion with
    its next claim read 12,500 buffers on average, and seven minutes into a held snapshot the
    queue began to fall behind: 24,748 jobs sixteen minutes in, p99 wait 168 s. In this form
    the index cannot serve the guard, and the row is found by its key
    (``tests/db/test_claim_plan.py::test_an_attempts_own_writes_find_its_row_by_key_past_the_entries_a_held_snapshot_keeps``)."""
    return Holds(Q(finished_at__isnull=True))


PRUNABLE = (states.State.SUCCEEDED.value, states.State.FAILED.value)
"""The states whose jobs retention deletes."""


def lease_from_row(row: Mapping[str, Any], *, executor: str, sent: float) -> Lease:
    """The one builder of a :class:`Lease`: from a claimed row (a mapping of
    :data:`LEASE_COLUMNS`), read by column name. ``sent`` is this process's monotonic clock
    just before the claim was sent (0: unknown); the row's ``heartbeat_at`` is the claim's
    time by the database's clock (None: unknown)."""
    return Lease(
        job_id=row["id"],
        fence=row["fence"],
        attempt=row["attempts"],
        attempt_base=row["attempt_base"],
        attempt_id=row["attempt_id"],
        kind=row["next_kind"],
        created_at=to_datetime(row["created_at"]),
        executor=executor,
        options=options_from_row(row),
        granted_at=sent,
        claimed_at=to_datetime(row["heartbeat_at"]),
    )


def leases_from_rows(rows: Sequence[dict[str, Any]], *, executor: str, sent: float) -> list[Lease]:
    """Leases from claimed rows (each a mapping of :data:`LEASE_COLUMNS`), in the claim's order
    (priority, then due time, then id): a statement returns them in any order. ``sent`` is this
    process's monotonic clock just before the claim was sent."""
    ordered = sorted(rows, key=lambda r: (-r["priority"], to_datetime(r["run_at"]), r["id"]))
    return [lease_from_row(r, executor=executor, sent=sent) for r in ordered]


def named_rows(cursor: Any) -> list[dict[str, Any]]:
    """A DB-API cursor's remaining rows as mappings of column name to value."""
    cols = [c[0] for c in cursor.description]
    return [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]


@dataclass(frozen=True, kw_only=True)
class IndexSize:
    """One B-tree index of Tenure's tables as the server describes it: its size, the entries it
    held at its table's last vacuum or analyse, and the bytes those entries need."""

    name: str
    table: str
    bytes: int
    entries: int
    """-1: the table was never vacuumed nor analysed, so the server does not know."""
    entry_bytes: int | None
    """What one entry takes on a page (header, key and line pointer, the key's width from the
    column statistics); None when a key column has none yet."""
    counted: bool = False
    """Whether :attr:`entries` was counted (the table's rows) rather than read from the
    statistics (the count its table's last vacuum or analyse estimated)."""

    @property
    def needed_bytes(self) -> int | None:
        """The bytes the entries need packed as a B-tree packs rising keys (pages 90 % full),
        with its meta and root pages; None when unknown."""
        if self.entries < 0 or self.entry_bytes is None:
            return None
        return int(self.entries * self.entry_bytes / 0.9) + 2 * 8192


@dataclass(frozen=True, kw_only=True)
class TableSpace:
    """One table of Tenure's as the server's statistics describe it: the bytes its heap takes
    and an estimate of what its rows need (PostgreSQL; the table's indexes are
    :class:`IndexSize`)."""

    name: str
    bytes: int
    """The heap's size (its main fork; TOAST and indexes apart)."""
    rows: int
    needed_bytes: int
    """What the rows take packed as the table's fill factor packs them, in whole pages: from
    the row count at the last vacuum or analyse and the columns' average widths, which leave
    out padding and null bitmaps — so below the truth, and a table this finds compact is."""
    page_bytes: int


@dataclass(frozen=True, kw_only=True)
class PageUse:
    """Where a table's rows are, page by page of its heap, as one read of the table found them
    right after a vacuum (PostgreSQL)."""

    name: str
    page_bytes: int
    usable_bytes: int
    """What a page holds at the table's fill factor."""
    rows: list[int]
    """Per page, the live rows on it."""
    used: list[int]
    """Per page, the bytes those rows take: each row's header, null bitmap and values aligned
    to 8, and its line pointer."""

    @property
    def bytes(self) -> int:
        """The heap's size."""
        return len(self.rows) * self.page_bytes

    @property
    def needed_bytes(self) -> int:
        """What the rows would take packed, in whole pages."""
        total = sum(self.used)
        return -(-total // self.usable_bytes) * self.page_bytes if total else 0


@dataclass(frozen=True, kw_only=True)
class Compaction:
    """What one compaction of a table did: its rows moved out of its last pages, the pages
    vacuum then gave back."""

    table: str
    bytes_before: int
    bytes_after: int
    rows_moved: int
    updates: int
    """Statements' rows written: a row whose page still had room took more than one."""
    rows_left: int
    """Rows still at or past the cut when it ended: locked by a write then, or landed there by
    an insert while the vacuum ran; the next look moves them."""
    no_room: bool = False
    """It stopped because a moved row found no room before the cut and was written past the
    table's end: the cut was too tight (or others' inserts had taken the holes)."""
    vacuum_refused: bool = False
    """Its vacuum was refused its lock within the session's ``lock_timeout`` (another vacuum
    of the table held it): the rows moved stay moved and a later vacuum gives the pages back."""


def sqlstate(e: BaseException) -> str | None:
    """The SQLSTATE of the server's error behind ``e`` (Django wraps the driver's error, which
    carries it), or None (SQLite's errors carry none)."""
    state = getattr(e.__cause__ or e, "sqlstate", None)
    return str(state) if state is not None else None
