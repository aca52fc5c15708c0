"""Migrating Tenure's app alone on a new database, as an upgrade note or a host project may:
the dashboard's permission hook waits for the tables it writes to."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _manage(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}"}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_migrating_the_core_app_alone_on_a_new_database_then_everything_grants_operate(
    tmp_path: Path,
) -> None:
    db = tmp_path / "new.sqlite3"
    alone = _manage(db, "migrate", "scheduler_core", "-v0")
    assert alone.returncode == 0, alone.stderr
    whole = _manage(db, "migrate", "-v0")
    assert whole.returncode == 0, whole.stderr
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT p.codename FROM auth_permission p JOIN django_content_type c"
            " ON c.id = p.content_type_id"
            " WHERE c.app_label = 'scheduler_core' AND p.codename = 'operate'"
        ).fetchall()
    assert rows == [("operate",)]
