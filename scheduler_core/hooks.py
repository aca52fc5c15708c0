"""Hooks for a fault verifier: named failpoints in the executor's path and an event log of what
an executor saw. Both do nothing unless something installs :class:`Hooks` (the example
project's ``verifier`` app does, when its environment asks for them); production code only
names the points.

The points: ``after_claim`` (claimed, nothing run), ``before_effect`` (intent recorded, call not
made), ``after_effect`` (call returned, outcome not recorded), ``before_complete`` (effects
recorded, the completion not written), ``in_commit`` (completion written, ``COMMIT`` not sent),
``before_group_commit`` (completions handed to a group write, its statement not sent). The
events: ``claim``, ``end``, ``refused``, ``heartbeat_late``, ``heartbeat_slow``.
"""

from __future__ import annotations

from typing import Any

POINTS = (
    "after_claim",
    "before_effect",
    "after_effect",
    "before_complete",
    "in_commit",
    "before_group_commit",
)
"""Every failpoint the executor's path names."""


class Hooks:
    """What a verifier may do at the named points; this base does nothing."""

    def failpoint(self, name: str) -> None:
        """The executor reached point ``name`` (one of :data:`POINTS`)."""

    def event(self, kind: str, **fields: Any) -> None:
        """The executor saw ``kind`` happen (a claim, an attempt's end, a refused write)."""


_installed = Hooks()


def install(hooks: Hooks) -> None:
    """Make ``hooks`` this process's (a verifier's, at start-up)."""
    global _installed
    _installed = hooks


def installed() -> Hooks:
    """This process's hooks (the base, doing nothing, unless a verifier installed its own)."""
    return _installed


def failpoint(name: str) -> None:
    """Point ``name`` of the executor's path: whatever the installed hooks do there."""
    _installed.failpoint(name)


def event(kind: str, **fields: Any) -> None:
    """Record that ``kind`` happened, if the installed hooks keep a log."""
    _installed.event(kind, **fields)
