"""The fault verifier's I17 tells a workflow step held behind a parent left ``indeterminate``
(the workflow's rule: no dependent runs until an operator settles that parent) from a step
left behind: the first is counted apart and passes, the second fails the invariant, and a step
blocked after every parent succeeded is still a step left behind."""

from __future__ import annotations

from collections import Counter

from verifier.checker import workflows_section
from verifier.evidence import Evidence, JobRow


def _job(job_id: int, state: str) -> JobRow:
    return JobRow(
        id=job_id, name="chaos.charge", key=f"k{job_id}", state=state, mode="at_most_once",
        fence=0, reason="", payload={},
    )  # fmt: skip


def _evidence(states: dict[int, str]) -> Evidence:
    return Evidence(
        plan={}, meta={}, enqueues=[], faults=[], operator=[], events=[], sweep=None,
        jobs={j: _job(j, s) for j, s in states.items()}, other_jobs=[], attempts={},
        effects={}, stale=[], audits={}, applied=Counter(), replayed=set(),
        edges=[(1, 2), (2, 3)], workflow_of={1: "wf", 2: "wf", 3: "wf"},
    )  # fmt: skip


def test_a_step_held_behind_an_indeterminate_parent_is_counted_apart() -> None:
    section, verdict = workflows_section(
        _evidence({1: "succeeded", 2: "indeterminate", 3: "waiting"})
    )
    assert verdict["status"] == "pass", verdict
    assert section["held_behind_unknown"] == [3] and section["not_ended"] == []


def test_a_step_waiting_after_its_parents_succeeded_is_a_workflow_not_ended() -> None:
    section, verdict = workflows_section(_evidence({1: "succeeded", 2: "succeeded", 3: "waiting"}))
    assert verdict["status"] == "fail", verdict
    assert section["not_ended"] == ["wf"] and section["held_behind_unknown"] == []
