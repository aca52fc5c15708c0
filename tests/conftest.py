"""Shared fixtures: the database the suite runs on, URLs for child processes, helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.api import hints
from scheduler_core.services import reaper
from scheduler_core.storage import floors
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import new_executor_id

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Skip PostgreSQL-only tests on SQLite runs, with the reason said."""
    from django.conf import settings

    on_pg = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: run with DATABASE_URL=postgres://...")
    for item in items:
        if "postgres" in item.keywords and not on_pg:
            item.add_marker(skip_pg)


@pytest.fixture(autouse=True)
def _tenure_test_settings(settings: Any) -> None:
    """Fast, broker-less defaults; tests that need more set them explicitly. Each test starts
    with no claim floors and no reaper walk: the database it left them for was emptied."""

    settings.TENURE_TRANSPORT = "polling"
    # A password hash that costs nothing: the default one is slow on purpose, and the console's
    # tests make a user each (logins through the real form still check the password).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.TENURE_REAP_GRACE_SECONDS = 0.0
    settings.TENURE_POLL_INTERVAL = 0.05
    floors.forget()
    reaper.WALK.forget()
    hints.CONSUMERS.forget()


@pytest.fixture(autouse=True)
def _no_executor_connection_settings_left() -> Iterator[None]:
    """A test that set this process up as an executor (a transport's worker start-up calls
    ``limit_idle_transactions``) leaves its receiver connected: every later connection, the
    next tests' own included, would get the executor's short idle limit. Undone after each."""
    from django.db.backends.signals import connection_created

    yield
    connection_created.disconnect(dispatch_uid="tenure.executor.idle_tx")


def broker_consumer(transport: str = "celery", queues: tuple[str, ...] = ("*",)) -> str:
    """Register a live consumer of ``queues`` (broker names) for ``transport`` in the executor
    registry, as a worker does when it starts; returns its id."""

    executor_id = new_executor_id(f"test-{transport}")
    driver().executor_started(executor_id, transport=transport, queues=list(queues), concurrency=1)
    hints.CONSUMERS.forget()
    return executor_id


@pytest.fixture
def vendor() -> str:
    from django.db import connection

    return str(connection.vendor)


def test_database_url() -> str:
    """A DATABASE_URL that points child processes at the test database."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@pytest.fixture
def child_env(transactional_db: Any) -> dict[str, str]:
    """Environment for child processes (executors, schedulers) sharing the test database."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(ROOT),
        TENURE_TRANSPORT="polling",
        PYTHONUNBUFFERED="1",
    )
    env.pop("TENURE_FAILPOINTS", None)
    return env


@pytest.fixture
def spawn(
    child_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``manage.py <args>`` as a child process; every child is killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        *args: str, env: dict[str, str] | None = None, log: str | None = None
    ) -> subprocess.Popen[bytes]:
        e = dict(child_env)
        e.update(env or {})
        out = open(tmp_path / (log or f"child-{len(procs)}.log"), "wb")
        p = subprocess.Popen(
            [PYTHON, str(ROOT / "manage.py"), *args],
            env=e,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(18)  # SIGCONT, in case a test left it stopped
                p.kill()
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def manage_variant(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py <args>`` to its end on ``tests.settings_variant`` (the example project
    changed as its ``TEST_*`` environment variables say, see that module), with ``env`` added
    to this process's environment."""
    e = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings_variant", PYTHONPATH=str(ROOT))
    e.pop("TENURE_FAILPOINTS", None)
    e.update(env)
    return subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), *args],
        env=e,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def wait_until(pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@pytest.fixture
def commit_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every completion's ``COMMIT`` fails as if the connection broke (the ``in_commit``
    failpoint raises), before anything was committed."""
    from django.db import OperationalError

    from scheduler_core import hooks

    class Breaks(hooks.Hooks):
        def failpoint(self, name: str) -> None:
            if name == "in_commit":
                raise OperationalError("connection lost during COMMIT (test)")

    monkeypatch.setattr(hooks, "_installed", Breaks())


@pytest.fixture
def commit_reply_lost(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``arm()``: the next transaction this thread's connection makes durable really commits,
    and then its reply is lost: ``OperationalError``, as when the connection breaks after the
    server committed. On PostgreSQL a claim or completion statement run outside a transaction
    (autocommit) is its own commit and counts too. Fires once per ``arm()``."""
    from django.db import OperationalError, connections

    conn = connections["default"]
    armed: list[bool] = []
    real_commit = conn.commit
    # PostgreSQL's driver sends its hot statements through ``_rows`` (an autocommit
    # statement there is its own commit); SQLite's has none.
    real_rows = getattr(driver(), "_rows", None)

    def lose_reply() -> None:
        armed.clear()
        raise OperationalError("connection lost after COMMIT landed (test)")

    def commit() -> None:
        real_commit()
        if armed:
            lose_reply()

    def rows(sql: str, params: Any) -> list[Any]:
        assert real_rows is not None
        got = real_rows(sql, params)
        if armed and connections["default"] is conn and not conn.in_atomic_block:
            lose_reply()
        return got

    monkeypatch.setattr(conn, "commit", commit)
    if real_rows is not None:
        monkeypatch.setattr(driver(), "_rows", rows)
    return lambda: armed.append(True)


@pytest.fixture
def celery_task_process() -> Iterator[Any]:
    """The Celery transport's module, to call its task in this process; afterwards the
    process-wide heartbeat thread it started is stopped (it holds a database connection)."""
    from scheduler_core.transports import celery as celery_transport

    yield celery_transport
    hb = celery_transport._state.get("hb")
    if hb is not None:
        hb.stop()
    celery_transport._state.clear()
