"""The database's clock as query expressions: lease expiry never uses a worker's clock.

PostgreSQL's ``clock_timestamp()`` is the wall time at evaluation (``now()`` would be frozen
at the start of a long transaction); SQLite's ``strftime(..., 'now')`` is read per statement.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import DateTimeField, Func
from django.utils import timezone
from django.utils.dateparse import parse_datetime


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

    def as_sql(  # type: ignore[override]  # the vendor decides; Func's templating is unused
        self, compiler: Any, connection: Any, **extra: Any
    ) -> tuple[str, list[Any]]:
        vendor = connection.vendor
        if vendor == "postgresql":
            now = "statement_timestamp()" if self.search else "clock_timestamp()"
            if self.seconds:
                return f"({now} + make_interval(secs => %s))", [self.seconds]
            return now, []
        if vendor == "sqlite":
            if self.seconds:
                return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [
                    f"{self.seconds:+.6f} seconds"
                ]
            return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')", []
        raise NotImplementedError(f"Tenure supports PostgreSQL and SQLite, not {vendor}")


def now_sql(vendor: str) -> str:
    """The database-clock expression for raw SQL of ``vendor`` (``%`` escaped for params)."""
    if vendor == "postgresql":
        return "clock_timestamp()"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def db_now(using: str | None = None) -> Any:
    """Read the database's clock (an aware datetime); ``using`` defaults to Tenure's."""
    from django.db import connections

    from . import db

    conn = connections[using or db.alias()]
    with conn.cursor() as cur:
        cur.execute("SELECT " + now_sql(conn.vendor), [])
        return to_datetime(cur.fetchone()[0])


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
