"""The lifecycle table is the only source of transitions, and only the write seam writes state."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scheduler_core.domain import states
from scheduler_core.domain.states import State

ROOT = Path(__file__).resolve().parents[2]

# The lifecycle as DESIGN.md draws it: every (source, target) pair that may happen.
EXPECTED_EDGES = {
    (State.WAITING, State.LEASED),
    (State.LEASED, State.SUCCEEDED),
    (State.LEASED, State.FAILED),
    (State.LEASED, State.WAITING),
    (State.LEASED, State.INDETERMINATE),
    (State.WAITING, State.CANCELLED),
    (State.FAILED, State.CANCELLED),
    (State.INDETERMINATE, State.CANCELLED),
    (State.FAILED, State.WAITING),
    (State.INDETERMINATE, State.WAITING),
    (State.FAILED, State.SUCCEEDED),
    (State.INDETERMINATE, State.SUCCEEDED),
    (State.INDETERMINATE, State.FAILED),
    # A running job's cancel: the operator's request keeps it leased, the attempt ends it.
    (State.LEASED, State.LEASED),
    (State.LEASED, State.CANCELLED),
    # An operator's cancel of a waiting job with an effect in question and no fact: held.
    (State.WAITING, State.INDETERMINATE),
    # A workflow step called off upstream (waiting -> cancelled, above) waits again when the
    # operator retries the step that called it off.
    (State.CANCELLED, State.WAITING),
}


def test_transition_table_has_exactly_the_designed_edges() -> None:
    edges = {(s, t.target) for t in states.TRANSITIONS for s in t.sources}
    assert edges == EXPECTED_EDGES


@pytest.mark.parametrize("source", list(State))
@pytest.mark.parametrize("target", list(State))
def test_allowed_matches_table_for_every_pair(source: State, target: State) -> None:
    assert states.allowed(source, target) == ((source, target) in EXPECTED_EDGES)


def test_terminal_states_are_left_only_by_operator_transitions() -> None:
    for t in states.TRANSITIONS:
        if t.sources & states.TERMINAL:
            assert t.operator, t.name


def test_attempt_transitions_are_fenced_and_operator_ones_are_not() -> None:
    for t in states.TRANSITIONS:
        if t.name == "claim":
            assert not t.fenced  # the claim issues the fence
        elif t.operator:
            assert not t.fenced
        elif t.follows:
            # Written in the transaction of another step's fenced or version-checked end, and
            # only to a step never claimed (no attempt holds a fence for it).
            assert not t.fenced and t.sources == {State.WAITING}, t.name
        else:
            assert t.fenced and t.sources == {State.LEASED}, t.name


def _job_state_writes(path: Path) -> list[int]:
    """Lines that write a Job's ``state``: ``Job....update(state=...)`` / ``create(state=...)``
    chains, or ``<job>.state = ...`` assignments."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    hits: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            writes = node.func.attr in {"update", "create", "update_or_create", "bulk_create"}
            if writes and any(k.arg == "state" for k in node.keywords):
                segment = ast.get_source_segment(source, node.func) or ""
                if "Job" in segment or "job" in segment:
                    hits.append(node.lineno)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "state"
                    and "job" in (ast.get_source_segment(source, target.value) or "").lower()
                ):
                    hits.append(node.lineno)
    return hits


def test_no_module_but_the_write_seam_writes_job_state() -> None:
    offenders: dict[str, list[int]] = {}
    for folder in ("scheduler_core", "admin_ui", "demo", "config"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("scheduler_core/storage/") or "/migrations/" in rel:
                continue
            lines = _job_state_writes(path)
            if lines:
                offenders[rel] = lines
    assert offenders == {}, f"job state written outside the storage drivers: {offenders}"


def test_the_scan_finds_a_state_write_when_there_is_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("Job.objects.filter(pk=1).update(state='succeeded')\njob.state = 'failed'\n")
    assert sorted(_job_state_writes(bad)) == [1, 2]


def test_every_job_state_write_in_the_seam_names_a_transition() -> None:
    """Each ``state=`` a storage driver writes comes from a Transition's target, never a
    literal."""
    for path in (ROOT / "scheduler_core" / "storage").glob("*.py"):
        _no_literal_states(ast.parse(path.read_text()))


def _no_literal_states(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            for k in node.keywords:
                if k.arg == "state" and node.func.attr == "update":
                    # Job writes use ``t.target`` / ``transition.target``; Effect writes use
                    # Effect state names. A bare string literal would bypass the table.
                    assert not isinstance(k.value, ast.Constant), (
                        f"literal state at line {node.lineno}"
                    )
