"""The fault verifier's I9: a job planned to fail for good must end ``failed`` once it has
run; a workflow step called off before it ran (ended ``cancelled`` by a sibling's failure)
never met its planned failure and is not counted as misclassified."""

from __future__ import annotations

from collections import Counter

from verifier.checker import classification_section
from verifier.evidence import AttemptRow, Evidence, JobRow
from verifier.job_types import PLANNED_PERMANENT


def _evidence(state: str, ran: bool) -> Evidence:
    job = JobRow(
        id=1, name="chaos.idempotent", key="k1", state=state, mode="idempotent", fence=1,
        reason="", payload={"permanent": True},
    )  # fmt: skip
    attempt = AttemptRow(
        id=1, job=1, fence=1, kind="run", executor="h:1:x", claimed=0.0, heartbeat=None,
        expires=None, finished=1.0, outcome="failed", error_class="permanent",
        error_type="verifier.job_types.Permanent", message=PLANNED_PERMANENT,
    )  # fmt: skip
    return Evidence(
        plan={}, meta={}, enqueues=[], faults=[], operator=[], events=[], sweep=None,
        jobs={1: job}, other_jobs=[], attempts={1: [attempt]} if ran else {}, effects={},
        stale=[], audits={}, applied=Counter(), replayed=set(),
    )  # fmt: skip


def test_a_planned_permanent_failure_that_ran_must_end_failed() -> None:
    assert classification_section(_evidence("failed", ran=True))[1]["status"] == "pass"
    assert classification_section(_evidence("waiting", ran=True))[1]["status"] == "fail"


def test_a_step_called_off_before_it_ran_is_not_misclassified() -> None:
    assert classification_section(_evidence("cancelled", ran=False))[1]["status"] == "pass"
