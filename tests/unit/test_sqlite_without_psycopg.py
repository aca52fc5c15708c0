"""A project on SQLite installs Tenure without the ``postgres`` extra: nothing on its path
imports psycopg (fails on the code before, whose driver table imported the PostgreSQL driver
and with it psycopg, at start-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import sys

class NoPsycopg:
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ImportError("psycopg is not installed here")
        return None

sys.meta_path.insert(0, NoPsycopg())
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.sqlite import SqliteDriver
assert isinstance(driver(), SqliteDriver)
assert not any(m == "psycopg" or m.startswith("psycopg.") for m in sys.modules)
print("ok")
"""


def test_a_sqlite_project_runs_without_psycopg(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
