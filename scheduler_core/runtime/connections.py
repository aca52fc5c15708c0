"""An executor process's connections and liveness: the settings its connections need (the
driver's), keeping a thread's connection from one attempt to the next unless it broke, and the
one registration of an executor's liveness row, retried with backoff while the database is not
there yet."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError
from django.db.backends.signals import connection_created

from ..storage.drivers import driver

log = logging.getLogger("tenure.executor")


def limit_idle_transactions() -> None:
    """In this executor process, have PostgreSQL end any of its transactions left idle longer
    than ``EXECUTOR_IDLE_TX_TIMEOUT_MS`` (every connection opened from now on), and plan the
    prepared hot statements once per connection (with ``TENURE_PREPARED_STATEMENTS``).

    An executor stopped or cut off between a statement and its ``COMMIT`` would otherwise hold
    the job rows that statement locked, and the reaper (which skips locked rows) could not
    rescue them until the server noticed, up to the server-wide limit. Idempotent.
    """
    connection_created.connect(_on_connection, dispatch_uid="tenure.executor.idle_tx")


def _on_connection(sender: Any, connection: Any, **_: Any) -> None:
    d = driver()
    if connection.alias == d.alias:
        d.configure_executor_connection(connection)


def drop_connection_if_broken() -> None:
    """Keep this thread's connection from one attempt to the next unless it is unusable.

    Django's ``close_old_connections`` would also close it for its age, which with
    ``CONN_MAX_AGE = 0`` means before every attempt: a new connection per job cost more than
    the job. The broker-less worker threads and the Celery adapter call this before each
    attempt. A connection left outside its autocommit mode, or that saw an error and no longer
    answers, is closed as Django would; one that dies while idle fails the next write, which
    the attempt's read-back and the reaper already handle.
    """
    conn = driver().connection
    if conn.connection is None:
        return
    if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
        conn.close()
    elif conn.errors_occurred:
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()


def register_executor(
    executor_id: str,
    *,
    transport: str,
    queues: Sequence[str],
    concurrency: int,
    wait: Callable[[float], bool] | None = None,
) -> None:
    """Write the executor's liveness row. With ``wait``, a database that cannot be reached is
    asked again with backoff (0.5 s doubling to 10 s, never spinning): ``wait(seconds)`` waits
    and returns True to give up, which re-raises the last error. Without it the error is
    raised at once."""
    backoff = 0.5
    while True:
        try:
            driver().executor_started(
                executor_id, transport=transport, queues=queues, concurrency=concurrency
            )
            return
        except DatabaseError as e:
            if wait is None:
                raise
            log.warning("database unreachable at start (%s); retrying in %.1fs", e, backoff)
            driver().connection.close()
            if wait(backoff):
                raise
            backoff = min(10.0, backoff * 2)
