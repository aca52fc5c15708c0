"""``TENURE_DATABASE`` names another alias: enqueue, claim, run and record all happen there,
and the host's default database holds none of Tenure's rows (real processes, two SQLite
files)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import manage_variant

pytestmark = pytest.mark.process


def _manage(env: dict[str, str], *args: str) -> str:
    done = manage_variant(*args, **env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_every_read_and_write_goes_to_the_alias_tenure_database_names(tmp_path: Path) -> None:
    default, tenure = tmp_path / "default.sqlite3", tmp_path / "tenure.sqlite3"
    env = dict(
        TEST_DEFAULT_SQLITE=str(default),
        TEST_TENURE_SQLITE=str(tenure),
        TENURE_TRANSPORT="polling",
        TENURE_JOB_MODULES="tests.process.jobs",
    )
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "migrate", "--noinput", "-v", "0", "--database", "tenure")
    assert "tenure_job" not in _tables(default)  # the router kept Tenure's tables out
    assert "tenure_job" in _tables(tenure)

    out = _manage(
        env,
        "shell",
        "-v",
        "0",
        "-c",
        "from django.db import transaction\n"
        "from tests.process.jobs import noop\n"
        "with transaction.atomic(using='tenure'):\n"
        "    print('job', noop.enqueue(n=7).pk)",
    )
    job_id = int(out.split("job")[-1])
    _manage(env, "run_executor", "--burst", "--concurrency", "1", "--poll-interval", "0.05")
    state = _manage(
        env,
        "shell",
        "-v",
        "0",
        "-c",
        f"from scheduler_core.models import Job; print(Job.objects.get(pk={job_id}).state)",
    )
    assert state.strip() == "succeeded"

    with sqlite3.connect(tenure) as c:
        rows = c.execute("SELECT state, fence FROM tenure_job WHERE id = ?", [job_id]).fetchall()
        attempts = c.execute(
            "SELECT outcome FROM tenure_attempt WHERE job_id = ?", [job_id]
        ).fetchall()
        executors = c.execute("SELECT count(*) FROM tenure_executor").fetchone()[0]
    assert rows == [("succeeded", 1)]
    assert attempts == [("succeeded",)]
    assert executors == 1  # the executor's liveness row too
