"""Workflows' pure rules: the due time that keeps a step unclaimable until its parents have
succeeded, the failure policies, the reasons a step shows while it waits or after it was
called off, and the checks of a workflow's shape before anything is written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

BLOCKED_AT = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
"""The ``run_at`` of a step whose parents have not all succeeded: no claim takes a job due
then (every claim asks ``run_at <= now``), so the claim's statement and its index are those of
every job. The completion of the step's last parent sets its ``run_at`` to the database's now."""

CANCEL = "cancel"
CONTINUE = "continue"
ON_FAILURE = (CANCEL, CONTINUE)
"""What a workflow does when a step ends ``failed`` (or ``cancelled``): ``cancel`` ends every
step not yet run ``cancelled``; ``continue`` ends only the step's dependents so, and the other
branches run on."""

MAX_STEPS = 10_000
"""The most steps one workflow may have."""


WAITING_FOR_PARENTS = "waiting for its parent steps to succeed"
"""What a step blocked on its parents shows (the workflow's page counts them)."""


def held_reason(step: str) -> str:
    """What a step shows while a parent's outcome is unknown (that parent is indeterminate)."""
    return f"held by an unknown outcome: step {step} is indeterminate"


def upstream_reason(step: str, state: str) -> str:
    """Why a step was ended ``cancelled`` by another step's end."""
    word = "failed" if state == "failed" else "cancelled"
    return f"upstream {word}: {step}"


class ShapeError(ValueError):
    """A workflow that cannot be enqueued as described (nothing was written)."""


def check_shape(names: Sequence[str], parents: Mapping[int, Sequence[int]]) -> None:
    """Check a workflow before it is written: at least one step, at most :data:`MAX_STEPS`,
    names unique and not empty, and every parent an earlier step (so the graph has no cycle).
    ``parents`` maps a step's index to its parents' indexes."""
    if not names:
        raise ShapeError("a workflow needs at least one step")
    if len(names) > MAX_STEPS:
        raise ShapeError(f"a workflow has at most {MAX_STEPS} steps, not {len(names)}")
    seen: set[str] = set()
    for name in names:
        if not name or len(name) > 200:
            raise ShapeError(f"a step name is 1 to 200 characters, not {name!r}")
        if name in seen:
            raise ShapeError(f"two steps are named {name!r}: give one a name of its own (name=...)")
        seen.add(name)
    for child, ps in parents.items():
        for p in ps:
            if not 0 <= p < child:
                raise ShapeError(f"step {names[child]!r} comes after a step added later")
