"""The workflow page's layout: each step in the column of its longest chain of parents,
whatever order its jobs were inserted in; one box per step, one line per edge."""

from __future__ import annotations

from admin_ui.workflow_graph import layout
from scheduler_core.storage.workflows import StepRow


def _row(job_id: int, *parents: int, state: str = "waiting") -> StepRow:
    return StepRow(
        job_id=job_id,
        name=f"s{job_id}",
        state=state,
        pending=len(parents),
        reason="",
        blocked=bool(parents),
        held=False,
        parents=parents,
    )


def test_columns_follow_the_longest_chain_not_the_ids() -> None:
    # 9 -> 2 -> 5, and 9 -> 5 directly: 5 is two columns after 9.
    g = layout([_row(2, 9), _row(5, 2, 9), _row(9, state="succeeded")])
    x = {b.job_id: b.x for b in g.boxes}
    assert x[9] < x[2] < x[5]
    assert len(g.edges) == 3
    assert {b.job_id: b.shown for b in g.boxes} == {2: "blocked", 5: "blocked", 9: "succeeded"}


def test_a_long_chain_lays_out_without_recursion() -> None:
    rows = [_row(1)] + [_row(i, i - 1) for i in range(2, 3000)]
    g = layout(rows)
    assert max(b.x for b in g.boxes) > 0 and g.width > g.height
