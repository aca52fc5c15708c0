"""The job lifecycle: states and the only transitions between them.

::

    waiting --claim--> leased --complete--> succeeded
       ^                 |  \\--permanent / attempts exhausted--> failed
       |--retry----------|   \\--ambiguous effect, no safe retry--> indeterminate
       |--lease expired, retry is safe (reaper)
    leased --lease expired, effect intended but not settled--> indeterminate
    leased --operator asks the running attempt to stop--> leased (cancel requested)
    leased --the attempt stops after the request (fenced)--> cancelled
    leased --the request is never answered and the lease ends (reaper)--> cancelled
    waiting | failed | indeterminate --operator--> cancelled | waiting | succeeded
    waiting --operator cancels while an effect is unknown, no fact stated--> indeterminate
    waiting --a workflow step never run, upstream failed or cancelled--> cancelled
    cancelled --the operator retries the step upstream that called it off--> waiting

This module is pure: it names the states and transitions and answers whether a transition
applies to a state. ``scheduler_core.storage`` is the only module that writes ``Job.state``, and
every write it makes names one of these transitions, whose source states become the write's
``WHERE state IN (...)`` guard.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.StrEnum):
    """A job's lifecycle state (``Job.state``)."""

    WAITING = "waiting"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INDETERMINATE = "indeterminate"
    CANCELLED = "cancelled"


TERMINAL: frozenset[State] = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
"""States no executor ever leaves; only an audited operator action moves a failed job."""

MOVING: tuple[State, ...] = (State.WAITING, State.LEASED)
"""The states a job passes through on every run. Each claim and completion leaves a row version
behind in them, so only the index each needs holds their rows: the claim index the waiting
ones, the leases index the leased ones (``models.Job.Meta``)."""

RESTING: tuple[State, ...] = (
    State.CANCELLED,
    State.FAILED,
    State.INDETERMINATE,
    State.SUCCEEDED,
)
"""The states a job's row stays in until an operator or retention acts: the only rows the
state, name and queue indexes hold (PostgreSQL), in the order those indexes sort them."""


@dataclass(frozen=True, kw_only=True)
class Transition:
    """One edge of the lifecycle: its name, the states it may leave and the state it enters."""

    name: str
    sources: frozenset[State]
    target: State
    fenced: bool
    """True when the write is made on behalf of an attempt and must carry its fence."""
    operator: bool = False
    """True when only an audited operator action may make it."""
    follows: bool = False
    """True when it is written only in the transaction of another job's guarded end (a
    workflow step's, :mod:`scheduler_core.storage.workflows`), never on its own."""

    def applies_to(self, state: State | str) -> bool:
        """Whether a job in ``state`` may take this transition."""
        return State(state) in self.sources


def _t(
    name: str,
    sources: set[State],
    target: State,
    *,
    fenced: bool,
    operator: bool = False,
    follows: bool = False,
) -> Transition:
    return Transition(
        name=name,
        sources=frozenset(sources),
        target=target,
        fenced=fenced,
        operator=operator,
        follows=follows,
    )


W, L, S, F, I, C = (  # noqa: E741 - single letters keep the table readable
    State.WAITING,
    State.LEASED,
    State.SUCCEEDED,
    State.FAILED,
    State.INDETERMINATE,
    State.CANCELLED,
)

CLAIM = _t("claim", {W}, L, fenced=False)
COMPLETE = _t("complete", {L}, S, fenced=True)
RETRY = _t("retry", {L}, W, fenced=True)
FAIL = _t("fail", {L}, F, fenced=True)
PARK = _t("park", {L}, I, fenced=True)
RELEASE = _t("release", {L}, W, fenced=True)
REAP_RETRY = _t("reap_retry", {L}, W, fenced=True)
REAP_FAIL = _t("reap_fail", {L}, F, fenced=True)
REAP_PARK = _t("reap_park", {L}, I, fenced=True)
OP_RETRY = _t("operator_retry", {F, I}, W, fenced=False, operator=True)
CANCEL = _t("cancel", {L}, C, fenced=True)
"""The attempt's own end after an operator's cancel request: its handler stopped (or returned
without an applied effect). The write is also conditioned on the request being recorded."""
REAP_CANCEL = _t("reap_cancel", {L}, C, fenced=True)
"""The reaper's end of an attempt that never answered an operator's cancel request before its
lease ran out (or its maximum runtime): the work was called off, so the job is not retried."""
OP_CANCEL = _t("operator_cancel", {W, F, I}, C, fenced=False, operator=True)
OP_REQUEST_CANCEL = _t("operator_request_cancel", {L}, L, fenced=False, operator=True)
"""An operator asks a running attempt to stop: the job stays leased and records the request
(``Job.cancel_requested_at``); the attempt learns it at its next renewal and ends with
:data:`CANCEL`."""
OP_HOLD = _t("operator_hold", {W}, I, fenced=False, operator=True)
"""An operator's cancel of a waiting job whose ledger holds an effect of unknown outcome, with
no fact stated: the job stops running, but ``cancelled`` would hide the effect in question."""
OP_RESOLVE = _t("operator_resolve", {F, I}, S, fenced=False, operator=True)
OP_GIVE_UP = _t("operator_give_up", {I}, F, fenced=False, operator=True)
UPSTREAM_CANCEL = _t("upstream_cancel", {W}, C, fenced=False, follows=True)
"""A workflow step never run ends cancelled because a step it depends on (or, under the
workflow's ``cancel`` policy, any of its steps) failed or was cancelled: written in the
transaction of that step's end, which its own guard (fence or version) conditioned."""
UPSTREAM_RETRY = _t("upstream_retry", {C}, W, fenced=False, operator=True)
"""A step called off by :data:`UPSTREAM_CANCEL` waits again when an operator retries the step
whose end called it off (in the same transaction and audit as that retry)."""

TRANSITIONS: tuple[Transition, ...] = (
    CLAIM,
    COMPLETE,
    RETRY,
    FAIL,
    PARK,
    RELEASE,
    REAP_RETRY,
    REAP_FAIL,
    REAP_PARK,
    CANCEL,
    REAP_CANCEL,
    OP_RETRY,
    OP_CANCEL,
    OP_REQUEST_CANCEL,
    OP_HOLD,
    OP_RESOLVE,
    OP_GIVE_UP,
    UPSTREAM_CANCEL,
    UPSTREAM_RETRY,
)
BY_NAME: dict[str, Transition] = {t.name: t for t in TRANSITIONS}


def allowed(source: State | str, target: State | str) -> bool:
    """Whether any transition leads from ``source`` to ``target``."""
    return any(t.applies_to(source) and t.target == State(target) for t in TRANSITIONS)


STATE_CHOICES = [(s.value, s.value) for s in State]

OPERATOR_OUTCOMES: dict[str, str] = {
    "retry": "retry requested: waiting again",
    "resolve": "resolved: marked succeeded",
    "cancel": "cancelled: it never runs again",
    "give_up": "given up: marked failed",
    "cancel_running": "cancel requested: the running attempt stops at its next heartbeat",
}
"""What each operator action (``operator_action(action=...)``) did, as the console and the
command line say it."""


def what_happened(action: str, before: str, after: str) -> str:
    """An operator action's outcome in words, with the state it left (``retry requested:
    waiting again (was failed)``); an unknown action falls back to the two states."""
    words = OPERATOR_OUTCOMES.get(action)
    if words is None:
        return f"{action}: {before} to {after}"
    return f"{words} (was {before})" if before != after else words
