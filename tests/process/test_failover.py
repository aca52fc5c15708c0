"""The failover nemesis (``manage.py chaos_failover``) judged on itself: a short run of each
replication mode crashes the primary mid-run and promotes its standby, and every invariant
holds (no fence given twice, no effect twice under one fence, nothing acknowledged lost in
synchronous mode, every surviving job terminal, the console names the failover, each
occurrence of the run's schedule has one job, and a unique key lost in the gap is accepted
again as a new job that succeeds); the negative control, claims without the epoch, hands a
fence out twice and is caught.

Each run builds its own pair of clusters, so these do not touch the test database; they are
marked ``postgres`` to run once, in the PostgreSQL pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.process, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path(os.environ.get("TENURE_CHAOS_PG_BIN", "/usr/lib/postgresql/15/bin"))

needs_cluster = pytest.mark.skipif(
    not (PG_BIN / "pg_basebackup").exists() or (os.geteuid() == 0 and not shutil.which("runuser")),
    reason="needs PostgreSQL server binaries to build clusters of its own",
)


def chaos_failover(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    """Run ``manage.py chaos_failover`` in a child process; exit status, output, report."""
    report = tmp_path / "report.json"
    # The servers run as ``postgres``, which cannot enter pytest's own temporary folders.
    workdir = Path(tempfile.mkdtemp(prefix="tenure-failover-test-"))
    workdir.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PG"))}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "manage.py"), "chaos_failover", "--report", str(report)]
    try:
        proc = subprocess.run(
            [*cmd, "--workdir", str(workdir), *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=420,
            check=False,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = proc.stdout.decode("utf-8", "replace")
    results = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, out, results


@needs_cluster
def test_a_promoted_standby_never_repeats_a_fence_and_the_fleet_drains(tmp_path: Path) -> None:
    code, out, report = chaos_failover(tmp_path, "--jobs", "200", "--gap", "1")
    assert code == 0, out[-3000:]
    for mode in ("sync", "async"):
        r = report["modes"][mode]
        assert r["fences_given_twice"] == 0 and r["effects_sent_twice_under_one_fence"] == 0
        assert r["attempt_numbers_given_twice"] == 0
        assert r["status_failover"]["timeline_changed"]
        assert r["drain_after_promotion_seconds"] is not None and r["workers_exited"] == 0
        # The schedule fired through the crash and promotion, each occurrence with one job.
        assert r["schedule_occurrences_fired"] >= 2
        assert r["schedule_occurrences_with_two_jobs"] == 0
        # Every key lost in the gap (none in sync mode) is accepted again and succeeds.
        lost = r["lost_acknowledged"]
        assert r["lost_keys_enqueued_again"] == lost
        assert r["lost_keys_accepted_as_new_job"] == r["lost_keys_new_job_succeeded"] == lost
    sync = report["modes"]["sync"]
    assert sync["lost_acknowledged"] == 0 and sync["schedule_occurrences_fired_again"] == 0
    # Fired again only where the first job was lost with the gap (the run fails otherwise).
    for again in report["modes"]["async"]["schedule_occurrences_fired_again_detail"]:
        assert again["lost_job_ran_before_crash"], again


@needs_cluster
def test_without_the_epoch_the_async_failover_hands_a_fence_out_twice(tmp_path: Path) -> None:
    """Before the epoch, the claim on the promoted standby counted on from the fences it had
    received, and a claim lost in the gap was handed out again."""
    code, out, report = chaos_failover(
        tmp_path, "--modes", "async", "--jobs", "200", "--gap", "1", "--negative-control"
    )
    assert code == 1, out[-3000:]
    assert report["negative_control_caught"]
    r = report["modes"]["async"]
    assert r["fences_given_twice"] > 0 or r["effects_sent_twice_under_one_fence"] > 0
