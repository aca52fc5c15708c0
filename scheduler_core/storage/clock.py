"""The database's clock as query expressions: lease expiry never uses a worker's clock.

PostgreSQL's ``clock_timestamp()`` is the wall time at evaluation (``now()`` would be frozen
at the start of a long transaction); SQLite's ``strftime(..., 'now')`` is read per statement.
Each expression says it per vendor (Django's ``as_<vendor>``); a driver's raw SQL uses its
``now_sql``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import DateTimeField, Func, OuterRef, Subquery
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
    """Per job row: the database's now minus ``lease_seconds * factor + 1`` seconds — how long a
    live owner that renews every ``lease_seconds * HEARTBEAT_FRACTION`` may go without
    renewing before it is most likely gone (``factor`` = twice that fraction)."""

    output_field = DateTimeField()

    def __init__(self, factor: float) -> None:
        # The lease length is the job's spec's, read by key for each row the condition
        # reaches: a join would bring the spec table into every count over the jobs.
        from ..models import JobSpec  # on use: records imports this module before apps load

        spec = JobSpec.objects.filter(job_id=OuterRef("pk")).values("lease_seconds")[:1]
        super().__init__(Subquery(spec))
        self.factor = factor

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, tuple[Any, ...]]:
        raise NotImplementedError(f"Tenure supports PostgreSQL and SQLite, not {connection.vendor}")

    def as_postgresql(
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, tuple[Any, ...]]:
        col, params = compiler.compile(self.source_expressions[0])
        return (
            f"(clock_timestamp() - make_interval(secs => {col} * %s + 1.0))",
            (*params, self.factor),
        )

    def as_sqlite(
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, tuple[Any, ...]]:
        col, params = compiler.compile(self.source_expressions[0])
        return (
            f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || ({col} * %s + 1.0) || ' seconds')",
            (*params, self.factor),
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
