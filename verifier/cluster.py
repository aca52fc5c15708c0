"""The run's own PostgreSQL cluster: initdb into a temporary folder, its own port.

Restarting it (even ``pg_ctl -m immediate``) disturbs nothing else on the machine. PostgreSQL
refuses to run as root, so every server command runs as the ``postgres`` user on a folder it
owns. Durability is as shipped (``fsync=on``, ``synchronous_commit=on``) except in the
negative control, which turns ``synchronous_commit`` off and lets the WAL writer wait, so an
immediate restart loses commits clients were told had happened.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

PG_BIN = Path(os.environ.get("TENURE_CHAOS_PG_BIN", "/usr/lib/postgresql/15/bin"))
DB_NAME = "chaos"
APP_PREFIX = "chaos-exec-"
"""``application_name`` prefix of executor connections (``PGAPPNAME``), so a fault can end
exactly their backends."""


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres() -> list[str]:
    """Prefix that runs a command as the ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--"]
    return ["su", "postgres", "-s", "/bin/sh", "-c"]  # pragma: no cover - fallback


class PgCluster:
    """A throw-away PostgreSQL cluster under ``root`` listening on ``127.0.0.1:port``."""

    def __init__(self, root: Path, *, port: int, negative_control: bool = False) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.log = root / "postgresql.log"
        self.port = port or free_port()
        self.negative_control = negative_control

    # -- lifecycle ------------------------------------------------------------------------
    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*_as_postgres(), *args],
            check=check,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.root,
        )

    def _options(self) -> str:
        opts = [
            f"-p {self.port}",
            f"-k {self.root}",
            "-c listen_addresses=127.0.0.1",
            "-c fsync=on",
            "-c max_connections=200",
            "-c shared_buffers=64MB",
            "-c log_min_messages=warning",
        ]
        if self.negative_control:
            # The WAL writer may hold up to 10 s of acknowledged commits in memory.
            opts += [
                "-c synchronous_commit=off",
                "-c wal_writer_delay=10000",
                "-c wal_writer_flush_after=1GB",
            ]
        else:
            opts.append("-c synchronous_commit=on")
        return " ".join(opts)

    def init(self) -> None:
        """``initdb`` (trust auth on loopback) into a folder owned by ``postgres``."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self, *, wait: bool = True) -> None:
        """Start the server (waits until it accepts connections)."""
        args = ["-D", str(self.data), "-o", self._options(), "-l", str(self.log)]
        self._run(str(PG_BIN / "pg_ctl"), *args, "-w" if wait else "-W", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``immediate`` is a crash (no checkpoint, recovery at start)."""
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False
        )

    def restart_immediate(self) -> None:
        """Crash and start again: ``pg_ctl -m immediate restart``."""
        args = ["-D", str(self.data), "-o", self._options(), "-l", str(self.log)]
        self._run(str(PG_BIN / "pg_ctl"), *args, "-m", "immediate", "-w", "restart")

    # -- access ---------------------------------------------------------------------------
    def url(self, port: int | None = None) -> str:
        """``DATABASE_URL`` of the run's database, directly or through a proxy ``port``."""
        return f"postgres://postgres@127.0.0.1:{port or self.port}/{DB_NAME}"

    def connect(self, dbname: str = DB_NAME, *, timeout: float = 3.0) -> Any:
        """A fresh autocommit connection (the verifier's own, never through a proxy)."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=dbname,
            autocommit=True,
            connect_timeout=max(1, int(timeout)),
            application_name="chaos-verifier",
        )

    def create_database(self) -> None:
        """Create the run's database."""
        with self.connect("postgres") as conn:
            conn.execute(f"CREATE DATABASE {DB_NAME}")

    def wait_up(self, timeout: float = 30.0) -> float:
        """Wait until the database answers; returns the seconds waited."""
        start = time.monotonic()
        while True:
            try:
                with self.connect(timeout=1) as conn:
                    conn.execute("SELECT 1")
                return time.monotonic() - start
            except Exception:
                if time.monotonic() - start > timeout:
                    raise
                time.sleep(0.1)

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh connection; rows, or [] when there are none."""
        with self.connect() as conn:
            cur = conn.execute(sql, params or [])
            return list(cur.fetchall()) if cur.description else []

    def terminate_backends(self, app_like: str) -> int:
        """``pg_terminate_backend`` every backend whose application name matches."""
        with contextlib.suppress(Exception):
            rows = self.query(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
                [app_like],
            )
            return int(rows[0][0])
        return 0
