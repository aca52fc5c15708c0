"""The database's clock as query expressions: lease expiry never uses a worker's clock.

PostgreSQL's ``clock_timestamp()`` is the wall time at evaluation (``now()`` would be frozen
at the start of a long transaction); SQLite's ``strftime(..., 'now')`` is read per statement.
Each expression says it per vendor (Django's ``as_<vendor>``); a driver's raw SQL uses its
``now_sql``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import DateTimeField, F, Func
from django.utils import timezone
from django.utils.dateparse import parse_datetime

_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


class DbNow(Func):
    """The database's current time, optionally plus ``seconds`` (may be negative).

    ``search=True`` is for a bound that only picks candidates which a fenced write then
    re-checks with the wall time: on PostgreSQL it is the statement's start
    (``statement_timestamp()``, stable within the statement), which can bound an index scan,
    where the volatile ``clock_timestamp()`` is only a filter applied to every entry read."""

    output_field = DateTimeField()

    def __init__(self, seconds: float = 0.0, *, search: bool = False) -> None:
        super().__init__()
        self.seconds = float(seconds)
        self.search = search

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        raise NotImplementedError(f"Tenure supports PostgreSQL and SQLite, not {connection.vendor}")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        now = "statement_timestamp()" if self.search else "clock_timestamp()"
        if self.seconds:
            return f"({now} + make_interval(secs => %s))", [self.seconds]
        return now, []

    def as_sqlite(  # type: ignore[override]  # Func's SQLite mixin types its params as a tuple
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        if self.seconds:
            return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [
                f"{self.seconds:+.6f} seconds"
            ]
        return _SQLITE_NOW, []


class DbNowLessLeaseShare(Func):
    """Per leased job row: the database's now minus ``lease * factor + 1`` seconds — how long a
    live owner that renews every ``lease * HEARTBEAT_FRACTION`` may go without renewing before
    it is most likely gone (``factor`` = twice that fraction).

    The lease length is read from the row itself, as ``lease_expires_at - heartbeat_at``: the
    claim and every renewal (``CLAIM_SET`` and ``RENEW_LEASE`` of each database's statements)
    write both from one reading of the database's clock, the expiry that reading plus the spec's lease, and
    nothing else moves either while the job is leased. Reading the spec row instead costs a
    random read of ``tenure_job_spec`` per leased row in every count over the jobs (the
    dashboard's overview spent 535 ms of a 571-ms page at 10,000 leased jobs)."""

    output_field = DateTimeField()

    def __init__(self, factor: float) -> None:
        # Compiled as the query's own columns, so a join cannot make them ambiguous.
        super().__init__(F("lease_expires_at"), F("heartbeat_at"))
        self.factor = float(factor)

    def _columns(self, compiler: Any) -> tuple[str, str, list[Any]]:
        expiry, p1 = compiler.compile(self.source_expressions[0])
        beat, p2 = compiler.compile(self.source_expressions[1])
        return expiry, beat, [*p1, *p2]

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        raise NotImplementedError(f"Tenure supports PostgreSQL and SQLite, not {connection.vendor}")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        expiry, beat, params = self._columns(compiler)
        return (
            f"(clock_timestamp() - ({expiry} - {beat}) * %s - interval '1 second')",
            [*params, self.factor],
        )

    def as_sqlite(  # type: ignore[override]  # Func's SQLite mixin types its params as a tuple
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        expiry, beat, params = self._columns(compiler)
        # In Julian days: the lease a fraction of a day, the one second 1/86400 of one.
        return (
            "strftime('%%Y-%%m-%%d %%H:%%M:%%f', julianday('now')"
            f" - (julianday({expiry}) - julianday({beat})) * %s - 1.0 / 86400)",
            [*params, self.factor],
        )


def to_datetime(value: Any) -> Any:
    """A raw-SQL timestamp (SQLite text or a PostgreSQL datetime) as an aware datetime."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a timestamp: {value!r}")
        value = parsed
    if isinstance(value, dt.datetime) and timezone.is_naive(value):
        # SQLite stores UTC without an offset.
        return timezone.make_aware(value, dt.UTC)
    return value
