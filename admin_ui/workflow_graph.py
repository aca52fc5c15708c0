"""A workflow's steps laid out as a graph for a server-rendered SVG: each step in the column of
its longest path from a root, parents left of children, one row per step in a column. Pure:
steps in, boxes and edges out (no database, no JavaScript, nothing fetched)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_core.read.workflows import StepRow

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 170, 44, 60, 16, 12

FILL = {
    "waiting": "#dbeafe",
    "blocked": "#f1f5f9",
    "held": "#fde68a",
    "leased": "#bfdbfe",
    "succeeded": "#bbf7d0",
    "failed": "#fecaca",
    "indeterminate": "#fcd34d",
    "cancelled": "#e5e7eb",
}
"""Fill colour by what a step shows (its state, or blocked on its parents, or held)."""


@dataclass(frozen=True, kw_only=True)
class Box:
    job_id: int
    name: str
    shown: str
    """The state shown: the job's state, or ``blocked`` / ``held`` while it waits on parents."""
    fill: str
    x: int
    y: int
    w: int = BOX_W
    h: int = BOX_H

    @property
    def label(self) -> str:
        return self.name if len(self.name) <= 22 else self.name[:21] + "…"


@dataclass(frozen=True, kw_only=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int
    parent: int
    child: int


@dataclass(frozen=True, kw_only=True)
class Graph:
    boxes: list[Box]
    edges: list[Edge]
    width: int
    height: int


def shown_state(step: StepRow) -> str:
    if step.held:
        return "held"
    if step.blocked:
        return "blocked"
    return step.state


def layout(steps: Sequence[StepRow]) -> Graph:
    """Columns by depth (a step's longest chain of parents), rows in job order."""
    by_id = {s.job_id: s for s in steps}
    depth: dict[int, int] = {}

    def depth_of(job_id: int) -> int:
        # Iterative: a long chain must not exhaust the recursion limit.
        stack = [job_id]
        while stack:
            top = stack[-1]
            pending = [p for p in by_id[top].parents if p in by_id and p not in depth]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            depth[top] = 1 + max((depth[p] for p in by_id[top].parents if p in by_id), default=-1)
        return depth[job_id]

    for s in steps:
        depth_of(s.job_id)
    columns: dict[int, list[StepRow]] = {}
    for s in sorted(steps, key=lambda s: s.job_id):
        columns.setdefault(depth[s.job_id], []).append(s)
    at: dict[int, Box] = {}
    for col, members in columns.items():
        for row, s in enumerate(members):
            shown = shown_state(s)
            at[s.job_id] = Box(
                job_id=s.job_id,
                name=s.name,
                shown=shown,
                fill=FILL.get(shown, "#ffffff"),
                x=PAD + col * (BOX_W + GAP_X),
                y=PAD + row * (BOX_H + GAP_Y),
            )
    edges = [
        Edge(
            x1=at[p].x + BOX_W,
            y1=at[p].y + BOX_H // 2,
            x2=at[s.job_id].x,
            y2=at[s.job_id].y + BOX_H // 2,
            parent=p,
            child=s.job_id,
        )
        for s in steps
        for p in s.parents
        if p in at
    ]
    ncols = max(columns, default=0) + 1
    nrows = max((len(m) for m in columns.values()), default=1)
    return Graph(
        boxes=[at[s.job_id] for s in steps],
        edges=edges,
        width=2 * PAD + ncols * BOX_W + (ncols - 1) * GAP_X,
        height=2 * PAD + nrows * BOX_H + (nrows - 1) * GAP_Y,
    )
