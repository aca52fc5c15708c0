"""The fault verifier (``manage.py chaos``) judged on itself: a short seeded run with every
fault kind passes every invariant, and four negative controls are caught: the fence check
switched off with ``synchronous_commit=off`` and immediate restarts; a ledger that forgets
an unknown outcome when a later attempt sends nothing (a fallback to a second provider then
charges again: I13), next to the same run with the ledger as shipped, which passes; and, next
to a run of the end paths that passes, reconcile answered for the whole job (a second effect
never sent: I15) and ``max_age`` ending a job ``failed`` with its effect unknown (I14).

Each run builds its own PostgreSQL cluster, so these do not touch the test database; they are
marked ``postgres`` to run once, in the PostgreSQL pass. ``TENURE_CHAOS_SECONDS`` lengthens
the fault phase (default 15 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.process, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
SECONDS = os.environ.get("TENURE_CHAOS_SECONDS", "15")
PG_BIN = Path(os.environ.get("TENURE_CHAOS_PG_BIN", "/usr/lib/postgresql/15/bin"))

needs_cluster = pytest.mark.skipif(
    not (PG_BIN / "initdb").exists() or (os.geteuid() == 0 and not shutil.which("runuser")),
    reason="needs PostgreSQL server binaries to build a cluster of its own",
)


def chaos(tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    """Run ``manage.py chaos`` in a child process; its exit status, output and JSON report."""
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PG"))}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "manage.py"), "chaos", "--seconds", SECONDS]
    cmd += ["--pg-port", "0", "--report", str(report), *args]
    proc = subprocess.run(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=280,
        check=False,
    )
    out = proc.stdout.decode("utf-8", "replace")
    results = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, out, results


def failing(results: dict[str, Any]) -> dict[str, str]:
    return {k: v["detail"] for k, v in results.get("verdicts", {}).items() if v["status"] == "fail"}


@needs_cluster
def test_short_seeded_run_with_every_fault_kind_passes_every_invariant(tmp_path: Path) -> None:
    # Shares above the defaults: on a loaded machine a 15-second run enqueues few jobs, and
    # each kind (a fallback, a workflow) must be met for its assertion below to mean anything.
    code, out, results = chaos(
        tmp_path, "--seed", "7", "--fallback-share", "0.35", "--workflow-share", "0.12"
    )
    assert code == 0, out[-6000:]
    assert not failing(results)
    assert results["jobs"]["acknowledged"] > 20
    assert sum(results["run"]["faults"].values()) >= 3
    # The hostile-input sweep ran and every case was refused.
    assert results["verdicts"]["I10"]["status"] == "pass", out[-3000:]
    # Jobs fell back to the second provider, and none was charged at both.
    assert results["verdicts"]["I13"]["status"] == "pass", out[-3000:]
    assert results["fallback"]["jobs"] > 0
    # The end paths' invariants were judged too.
    for invariant in ("I14", "I15"):
        assert results["verdicts"][invariant]["status"] == "pass", out[-3000:]
    # async def handlers ran among them, judged by the same invariants.
    assert results["async"]["jobs"] > 0 and results["async"]["by_state"].get("succeeded", 0) > 0
    # Workflows ran under the faults: no step before its parents succeeded, every one ended.
    assert results["verdicts"]["I17"]["status"] == "pass", out[-3000:]
    assert results["workflows"]["steps"] > 0


@needs_cluster
def test_negative_control_without_fence_and_durable_commits_is_caught(tmp_path: Path) -> None:
    # A little longer than the normal run: each kind of fault must land at least twice.
    seconds = str(int(SECONDS) + 5)
    code, out, results = chaos(
        tmp_path, "--seed", "2", "--negative-control", "--no-bad-input", "--seconds", seconds
    )
    assert code == 1, out[-6000:]
    assert failing(results), out[-3000:]
    assert results["plan"]["negative_control"] == "fence"


# The sticky-unknown pair: the same seed, length, faults and share of fallback jobs, once with
# the ledger as shipped and once with the executors' ledger forgetting an unknown outcome.
STICKY_RUN = ("--seed", "3", "--fallback-share", "0.6", "--no-bad-input")


@needs_cluster
def test_fallback_after_an_unknown_outcome_never_charges_a_second_provider(
    tmp_path: Path,
) -> None:
    code, out, results = chaos(tmp_path, *STICKY_RUN)
    assert code == 0, out[-6000:]
    assert not failing(results)
    fallback = results["fallback"]
    # The case was met: an unknown outcome at the first provider, then an attempt that sent
    # nothing; none of those jobs fell back, and no job was charged at both providers.
    assert fallback["unknown_then_turned_away"] >= 1, fallback
    assert fallback["scenario_fell_back"] == 0, fallback
    assert fallback["fell_back_after_unknown"] == 0, fallback
    assert fallback["applied_at_two_destinations"] == [], fallback
    assert fallback["fell_back"] >= 1, fallback


@needs_cluster
def test_negative_control_with_a_ledger_that_forgets_unknown_outcomes_is_caught(
    tmp_path: Path,
) -> None:
    code, out, results = chaos(tmp_path, *STICKY_RUN, "--negative-control=sticky")
    assert code == 1, out[-6000:]
    assert results["plan"]["negative_control"] == "sticky"
    assert "I13" in failing(results), out[-3000:]
    fallback = results["fallback"]
    assert fallback["applied_at_two_destinations"], fallback
    assert fallback["scenario_fell_back"] >= 1, fallback


@needs_cluster
def test_broker_restarts_and_duplicated_deliveries_lose_and_double_nothing(tmp_path: Path) -> None:
    # Only the broker's faults: its own Redis killed and started empty (hints lost), and every
    # held hint published again 2-5 times (duplicate deliveries).
    code, out, results = chaos(
        tmp_path, "--seed", "5", "--faults", "broker_restart,broker_duplicate", "--no-bad-input"
    )
    assert code == 0, out[-6000:]
    assert not failing(results)
    broker = results["broker"]
    assert broker["jobs"] > 0 and set(broker["states"]) <= {"succeeded", "failed"}, broker
    assert broker["restarts"] >= 1 and broker["duplications"] >= 1, broker
    assert results["jobs"]["lost"] == []


# The end-path runs: the same seed, length and faults, with 60 % of the verifier's own jobs on
# the end paths (two effects with a lost reply, snoozing after a lost reply, overrunning after
# the effect, an unanswered cancel request), once as shipped and once per negative control.
PATHS_RUN = ("--seed", "15", "--paths-share", "0.6", "--no-bad-input")


@needs_cluster
def test_end_paths_keep_every_effect_and_never_end_failed(tmp_path: Path) -> None:
    code, out, results = chaos(tmp_path, *PATHS_RUN)
    assert code == 0, out[-6000:]
    assert not failing(results)
    paths = results["end_paths"]
    assert all(paths["by_type"].values()), paths
    # A charge, then its receipt: reconcile asked per effect, the receipt sent after it.
    assert paths["multi_succeeded_with_receipt"] >= 1, paths
    # Snoozing past max_age with the charge unknown: never failed (parked, then resolved).
    assert "failed" not in paths["by_type"]["chaos.snooze"], paths
    assert "failed" not in paths["by_type"]["chaos.overrun"], paths
    # Running jobs asked to stop, the request unanswered: each ended cancelled.
    assert paths["cancel_requests"] >= 1, paths
    for invariant in ("I14", "I15", "I16"):
        assert results["verdicts"][invariant]["status"] == "pass", out[-3000:]


@needs_cluster
@pytest.mark.parametrize(("control", "invariant"), [("whole-job", "I15"), ("max-age-fails", "I14")])
def test_negative_controls_of_the_end_paths_are_caught(
    tmp_path: Path, control: str, invariant: str
) -> None:
    code, out, results = chaos(tmp_path, *PATHS_RUN, f"--negative-control={control}")
    assert code == 1, out[-6000:]
    assert results["plan"]["negative_control"] == control
    assert invariant in failing(results), out[-3000:]
    paths = results["end_paths"]
    if control == "whole-job":
        # The charge reconciled "applied" for the whole job: succeeded without its receipt.
        assert paths["missing_by_effect"].get("chaos.multi:receipt", 0) >= 1, paths
    else:
        assert paths["failed_with_effect_in_ledger"], paths
