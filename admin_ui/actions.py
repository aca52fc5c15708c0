"""The operator actions the dashboard offers, and the guarantee each one puts at stake.

Each action maps to one call of :func:`scheduler_core.store.operator_action` (or its bulk
form); this module decides only which actions a job's state and mode allow and what the
confirmation says. The store re-checks everything inside the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_core import store
from scheduler_core.models import Effect, Job
from scheduler_core.modes import GUARANTEES, EffectMode
from scheduler_core.states import State


@dataclass(frozen=True, kw_only=True)
class ActionSpec:
    """One button on a job: the store action it calls and when it is offered."""

    key: str
    """URL slug."""
    action: str
    """``operator_action(action=...)``."""
    verified: str
    """The fact the operator states they verified (``operator_action(verified=...)``)."""
    label: str
    states: frozenset[str]
    modes: frozenset[str] | None = None
    """Effect modes the action is offered for; None means every mode."""
    danger: bool = False

    def offered_for(self, job: Job) -> bool:
        """Whether the job's state (and mode) allow this action."""
        if job.state not in self.states:
            return False
        return self.modes is None or job.effect in self.modes


W, F, I = State.WAITING.value, State.FAILED.value, State.INDETERMINATE.value  # noqa: E741

ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec(key="retry", action="retry", verified="", label="Retry", states=frozenset({F})),
    ActionSpec(
        key="retry-not-applied",
        action="retry",
        verified="not_applied",
        label="Retry: I verified the effect did not happen",
        states=frozenset({I, F}),
    ),
    ActionSpec(
        key="retry-same-key",
        action="retry",
        verified="same_key",
        label="Retry under the same idempotency key",
        states=frozenset({I, F}),
        modes=frozenset({EffectMode.IDEMPOTENT.value}),
    ),
    ActionSpec(
        key="resolve-applied",
        action="resolve",
        verified="applied",
        label="Resolve as succeeded: I verified the effect happened",
        states=frozenset({I}),
    ),
    ActionSpec(
        key="give-up",
        action="give_up",
        verified="",
        label="Give up (mark failed)",
        states=frozenset({I}),
        danger=True,
    ),
    ActionSpec(
        key="cancel",
        action="cancel",
        verified="",
        label="Cancel",
        states=frozenset({W, F, I}),
        danger=True,
    ),
)
BY_KEY: dict[str, ActionSpec] = {a.key: a for a in ACTIONS}


VERIFIED_RETRIES = frozenset({"retry-not-applied", "retry-same-key"})


def offered(job: Job) -> list[ActionSpec]:
    """The actions a job's current state and mode allow (none while it is leased).

    A failed job whose ledger holds an effect of unknown outcome is retried only with a
    stated fact, like an indeterminate one; without such effects a plain retry is offered.
    """
    unsettled = job.state == F and store.has_unsettled_effect(job.pk)
    out = []
    for a in ACTIONS:
        if not a.offered_for(job):
            continue
        if job.state == F and a.key == "retry" and unsettled:
            continue
        if job.state == F and a.key in VERIFIED_RETRIES and not unsettled:
            continue
        out.append(a)
    return out


def _promise(job: Job) -> str:
    try:
        g = GUARANTEES[EffectMode(job.effect)]
    except ValueError:
        return "unknown mode"
    return g.promise


def _keys(effects: Sequence[Effect]) -> str:
    return ", ".join(e.key for e in effects) if effects else "none recorded yet"


def statement(spec: ActionSpec, job: Job, effects: Sequence[Effect]) -> str:
    """The confirmation the operator ticks: what the action does to the effect guarantee."""
    mode, promise = job.effect, _promise(job)
    unsettled = [e for e in effects if e.state in (Effect.INTENDED, Effect.UNKNOWN)]
    keys = _keys(effects)
    if spec.key == "retry":
        text = (
            f"The job runs again with a fresh attempt budget under the same effect key "
            f"({keys}). Its mode is {mode}: {promise}"
        )
        if unsettled:
            text += (
                f" The ledger holds {len(unsettled)} effect(s) whose outcome was never recorded;"
                " running again may repeat them."
            )
        return text
    if spec.key == "retry-not-applied":
        return (
            "I verified at the destination that the effect did NOT happen. The ledger records "
            f"it as not applied and the job runs again under the same key ({keys}). If the "
            f"effect did happen after all, it happens twice: mode {mode} promises only: {promise}"
        )
    if spec.key == "retry-same-key":
        return (
            f"The job runs again under the same idempotency key ({keys}). The destination "
            f"absorbs the repeat only while it still keeps that key: {promise}"
        )
    if spec.key == "resolve-applied":
        return (
            "I verified at the destination that the effect happened. The ledger records it as "
            "applied and the job is marked succeeded; it never runs again. If the effect did "
            "not in fact happen, it is lost."
        )
    if spec.key == "give-up":
        return (
            "The job is marked failed and never runs again unless someone retries it. Its "
            "effect stays unknown in the ledger: it may or may not have happened, and nothing "
            "will find out."
        )
    if spec.key == "cancel":
        text = "The job is cancelled and never runs again. An effect already applied is not undone."
        if unsettled:
            text += f" The ledger holds {len(unsettled)} effect(s) whose outcome is unknown."
        return text
    raise ValueError(f"no statement for {spec.key!r}")


BULK_LABELS = {"retry": "Retry failed jobs", "cancel": "Cancel jobs"}


def bulk_statement(action: str, count: int) -> str:
    """The confirmation for a bulk action over ``count`` jobs."""
    if action == "retry":
        return (
            f"All {count} failed jobs matched run again with a fresh attempt budget, each under "
            "its own unchanged effect key; each job's mode decides whether a repeated effect is "
            "absorbed, recorded as a possible duplicate, or prevented. Indeterminate jobs are "
            "not included: each needs its own verified fact."
        )
    return (
        f"All {count} jobs matched (waiting, failed or indeterminate) are cancelled and never "
        "run again. Effects already applied are not undone."
    )
