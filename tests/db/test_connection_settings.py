"""A host project's own ``DATABASES`` entry is enough: Tenure applies the connection settings
its guarantees need to every new connection of its database, and the system checks refuse to
start without the ones only the entry's ``OPTIONS`` can give (docs/faults.md, 44)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from scheduler_core.storage import connection_settings as connsettings
from tests.conftest import manage_variant


def _fresh(alias: str = "default", **changes: Any) -> Any:
    """A new connection wrapper like the test database's, with ``changes`` to its entry."""
    base = connections["default"]
    entry = copy.deepcopy(base.settings_dict)
    entry.update(changes)
    return type(base)(entry, alias=alias)


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    conns: list[Any] = []
    yield conns
    for c in conns:
        c.close()


def _show(conn: Any, name: str) -> str:
    with conn.cursor() as cur:
        cur.execute(f"SHOW {name}")
        return str(cur.fetchone()[0])


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_postgres_connection_without_options_gets_lock_and_idle_timeouts(
    opened: list[Any],
) -> None:
    conn = _fresh(OPTIONS={})
    opened.append(conn)
    conn.connect()
    assert _show(conn, "lock_timeout") == "10s"
    assert _show(conn, "idle_in_transaction_session_timeout") == "1min"


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_postgres_timeout_the_host_set_itself_is_kept(opened: list[Any]) -> None:
    conn = _fresh(OPTIONS={"options": "-c lock_timeout=3000"})
    opened.append(conn)
    conn.connect()
    assert _show(conn, "lock_timeout") == "3s"
    assert _show(conn, "idle_in_transaction_session_timeout") == "1min"


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_connection_of_another_alias_is_left_as_the_host_made_it(opened: list[Any]) -> None:
    conn = _fresh(alias="reporting", OPTIONS={})
    opened.append(conn)
    conn.connect()
    assert _show(conn, "lock_timeout") == "0"


@pytest.mark.django_db
def test_a_new_sqlite_database_gets_the_write_ahead_log_and_a_busy_timeout(
    tmp_path: Path, opened: list[Any]
) -> None:
    from django.db.backends.sqlite3.base import DatabaseWrapper

    entry = copy.deepcopy(connections["default"].settings_dict)
    entry.update(
        ENGINE="django.db.backends.sqlite3",
        NAME=str(tmp_path / "host.sqlite3"),
        OPTIONS={"transaction_mode": "IMMEDIATE"},
    )
    conn = DatabaseWrapper(entry, alias="default")
    opened.append(conn)
    conn.connect()
    with conn.cursor() as cur:
        cur.execute("PRAGMA journal_mode")
        assert cur.fetchone()[0] == "wal"
        cur.execute("PRAGMA busy_timeout")
        assert cur.fetchone()[0] == 30000


SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}
POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (SQLITE, {"tenure.E021"}),
        ({**SQLITE, "OPTIONS": {"transaction_mode": "DEFERRED"}}, {"tenure.E021"}),
        ({**SQLITE, "OPTIONS": {"transaction_mode": "immediate"}}, set()),
        ({**SQLITE, "OPTIONS": {"transaction_mode": "EXCLUSIVE"}}, set()),
        (POSTGRES, {"tenure.E022"}),
        ({**POSTGRES, "OPTIONS": dict(connsettings.POSTGRES_OPTIONS)}, set()),
        (
            {**POSTGRES, "OPTIONS": {**connsettings.POSTGRES_OPTIONS, "keepalives": 0}},
            {"tenure.E022"},
        ),
        (
            {**POSTGRES, "OPTIONS": {**connsettings.POSTGRES_OPTIONS, "tcp_user_timeout": None}},
            {"tenure.E022"},
        ),
    ],
)
def test_what_only_the_options_can_give_is_reported(
    entry: dict[str, Any], expected: set[str]
) -> None:
    assert {p[0] for p in connsettings.problems(entry)} == expected


def test_the_postgres_message_names_each_missing_option() -> None:
    options = {k: v for k, v in connsettings.POSTGRES_OPTIONS.items() if k != "tcp_user_timeout"}
    ((_, message, hint),) = connsettings.problems({**POSTGRES, "OPTIONS": options})
    assert "tcp_user_timeout" in message
    assert "'tcp_user_timeout': 10000" in hint


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    return manage_variant("check", **env)


@pytest.mark.process
def test_check_refuses_a_database_entry_without_the_options_tenure_needs(vendor: str) -> None:
    done = _check(TEST_WITHOUT_DB_OPTIONS="1")
    assert done.returncode != 0
    expected = "tenure.E021" if vendor == "sqlite" else "tenure.E022"
    assert expected in done.stderr, done.stderr
    assert "OPTIONS" in done.stderr


@pytest.mark.process
def test_an_executor_refuses_to_start_without_the_options_tenure_needs(vendor: str) -> None:
    done = manage_variant("run_executor", "--burst", TEST_WITHOUT_DB_OPTIONS="1")
    assert done.returncode != 0
    assert ("tenure.E021" if vendor == "sqlite" else "tenure.E022") in done.stderr, done.stderr
    assert "claimed" not in done.stdout


@pytest.mark.process
def test_check_refuses_a_tenure_database_alias_that_does_not_exist() -> None:
    done = _check(TENURE_DATABASE="nowhere")
    assert done.returncode != 0
    assert "tenure.E020" in done.stderr, done.stderr


@pytest.mark.process
def test_the_example_project_passes_every_check() -> None:
    done = _check()
    assert done.returncode == 0, done.stderr
