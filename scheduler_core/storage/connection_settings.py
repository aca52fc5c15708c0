"""The connection settings Tenure's guarantees need, applied by Tenure or refused at start-up.

Tenure applies what a connection can still be told once open, on every new connection to its
database (``connection_created``, :func:`apply`):

* PostgreSQL: ``lock_timeout`` (``TENURE_LOCK_TIMEOUT_MS``, 10 s) and
  ``idle_in_transaction_session_timeout`` (``TENURE_IDLE_IN_TRANSACTION_TIMEOUT_MS``, 60 s),
  each only where the connection has none (0): a value the host set itself is kept. One round
  trip per new connection, skipped when the entry's ``OPTIONS["options"]`` sets both.
* SQLite: the write-ahead log (``journal_mode=WAL``, so readers never block the writer) and a
  busy timeout of at least ``TENURE_SQLITE_BUSY_TIMEOUT_MS`` (30 s).

What only the connection's own parameters can say, :func:`problems` reports and the system
checks refuse to start without (``tenure.E021``..``tenure.E023``); the message says exactly what
to add to ``DATABASES[alias]["OPTIONS"]``:

* SQLite ``transaction_mode = "IMMEDIATE"``: Django reads it at ``BEGIN``; every write
  transaction then takes the write lock first, so a claim is never a read overtaken before its
  write.
* PostgreSQL ``connect_timeout``, TCP keepalives and ``tcp_user_timeout``: options of the
  socket, set when it is opened; a server that vanished without closing the connection (a
  black hole) is then noticed within a lease, not after the kernel's two hours.
* PostgreSQL through psycopg 3 (Tenure's statements use its features).
"""

from __future__ import annotations

import logging
from typing import Any

import scheduler_core.db as db

from ..conf import tenure_settings
from . import floors

log = logging.getLogger("tenure.storage")

SQLITE_TRANSACTION_MODES = frozenset({"IMMEDIATE", "EXCLUSIVE"})
"""``BEGIN`` modes that take SQLite's write lock at the start of the transaction."""

POSTGRES_OPTIONS: dict[str, int] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
"""The connect-time options Tenure needs on PostgreSQL, with the values the example project
uses (seconds, except ``tcp_user_timeout`` in milliseconds). Any positive value passes the
check; these detect a silent server within about 11 s, inside the default 30 s lease."""


def problems(settings_dict: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What the ``DATABASES`` entry ``settings_dict`` lacks for Tenure's guarantees, as
    ``(check id, message, hint)``; empty when nothing is missing. Pure: reads only the dict."""
    engine = str(settings_dict.get("ENGINE", ""))
    options = dict(settings_dict.get("OPTIONS") or {})
    found: list[tuple[str, str, str]] = []
    if engine.endswith("sqlite3"):
        mode = str(options.get("transaction_mode") or "").upper()
        if mode not in SQLITE_TRANSACTION_MODES:
            found.append(
                (
                    "tenure.E021",
                    "Tenure's SQLite database begins transactions "
                    f"{mode or 'DEFERRED'}: a claim could read a job and be overtaken before "
                    "its write",
                    'Add "transaction_mode": "IMMEDIATE" to the database\'s OPTIONS.',
                )
            )
    elif engine.endswith("postgresql"):
        missing = {
            name: value
            for name, value in POSTGRES_OPTIONS.items()
            if not _positive(options.get(name))
        }
        if missing:
            found.append(
                (
                    "tenure.E022",
                    "Tenure's PostgreSQL connection options lack "
                    f"{', '.join(sorted(missing))}: a call to a server that vanished without "
                    "closing the connection could hang past its lease",
                    f"Add {missing!r} to the database's OPTIONS (docs/install.md).",
                )
            )
        if not _psycopg3():
            found.append(
                (
                    "tenure.E023",
                    "Tenure's PostgreSQL database is reached through psycopg2; Tenure needs "
                    "psycopg 3",
                    "pip install 'psycopg[binary]' (or tenure[postgres]) and uninstall psycopg2.",
                )
            )
    return found


def _positive(value: Any) -> bool:
    try:
        return not isinstance(value, bool) and float(value) > 0
    except (TypeError, ValueError):
        return False


def _psycopg3() -> bool:
    try:
        from django.db.backends.postgresql.psycopg_any import is_psycopg3
    except ImportError:  # no driver at all: Django says so itself when it connects
        return True
    return bool(is_psycopg3)


def on_connection_created(sender: Any, connection: Any, **_: Any) -> None:
    """``connection_created`` receiver: :func:`apply` to each connection of Tenure's alias."""
    if connection.alias == db.alias():
        if connection.vendor == "postgresql":
            # A new connection may reach another server: a promoted standby lacks the last
            # claims the floors were learned from, and their jobs wait below them again.
            floors.forget()
        apply(connection)


def apply(connection: Any) -> None:
    """Set what a new connection to Tenure's database must have and may still be given."""
    s = tenure_settings()
    if connection.vendor == "postgresql":
        given = str(connection.settings_dict.get("OPTIONS", {}).get("options", ""))
        if "lock_timeout" in given and "idle_in_transaction_session_timeout" in given:
            return  # the host sets both at connect time, and its values are kept anyway
        with connection.cursor() as cur:
            # One round trip; a timeout the connection already has (the host's own) is kept.
            cur.execute(
                "SELECT CASE WHEN current_setting('lock_timeout') = '0' "
                "THEN set_config('lock_timeout', %s, false) END, "
                "CASE WHEN current_setting('idle_in_transaction_session_timeout') = '0' "
                "THEN set_config('idle_in_transaction_session_timeout', %s, false) END",
                [str(int(s.LOCK_TIMEOUT_MS)), str(int(s.IDLE_IN_TRANSACTION_TIMEOUT_MS))],
            )
        if not connection.get_autocommit():
            connection.commit()  # AUTOCOMMIT=False: session settings last only once committed
    elif connection.vendor == "sqlite":
        with connection.cursor() as cur:
            cur.execute("PRAGMA busy_timeout")
            if int(cur.fetchone()[0]) < s.SQLITE_BUSY_TIMEOUT_MS:
                cur.execute(f"PRAGMA busy_timeout = {int(s.SQLITE_BUSY_TIMEOUT_MS)}")
            cur.execute("PRAGMA journal_mode")
            mode = str(cur.fetchone()[0]).lower()
            if mode not in ("wal", "memory"):
                cur.execute("PRAGMA journal_mode = WAL")
                mode = str(cur.fetchone()[0]).lower()
                if mode != "wal":
                    # Readers then block the writer (and the other way round): slower, not
                    # less safe, since every write transaction still begins IMMEDIATE.
                    log.warning("SQLite refused the write-ahead log (journal_mode=%s)", mode)
