"""The operator actions on one job that the console and the command line offer: each maps to
one call of :func:`scheduler_core.services.operator.operator_action` and names the lifecycle
transition that call takes (``scheduler_core.domain.states``). The states an action is offered
for are that transition's sources, never a list of their own, so no surface can offer what the
lifecycle forbids nor hide what it allows. On top of the state, only two things narrow the
choice: whether the job needs a verified fact (:func:`operator.needs_fact`) and the job's
effect mode (and a running job's cancel is offered once: not while a request is recorded). The
store re-checks everything inside the write.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import states
from ..domain.modes import EffectMode
from ..models import Job
from ..read import jobs as job_reads
from . import operator

STORE_ACTIONS: dict[str, str] = {
    states.OP_RETRY.name: "retry",
    states.OP_RESOLVE.name: "resolve",
    states.OP_CANCEL.name: "cancel",
    states.OP_GIVE_UP.name: "give_up",
    states.OP_REQUEST_CANCEL.name: "cancel_running",
}
"""The ``operator_action(action=...)`` that takes each operator transition."""

FACT_OUTCOMES: dict[str, str] = {"not_applied": "did not happen", "applied": "happened"}
"""The verified facts that settle named effects in the ledger, and what the operator saw."""


@dataclass(frozen=True, kw_only=True)
class ActionSpec:
    """One button on a job: the lifecycle transition it takes and when it is offered."""

    key: str
    """URL slug."""
    transition: states.Transition
    """The operator transition the store call takes; its sources are the states offered."""
    verified: str
    """The fact the operator states they verified (``operator_action(verified=...)``)."""
    label: str
    fact: bool | None
    """True: offered only when the job needs a verified fact; False: only when it does not;
    None: either way (the action states no fact about the effect)."""
    modes: frozenset[str] | None = None
    """Effect modes the action is offered for; None means every mode."""
    danger: bool = False
    ending: bool = False
    """A cancel or give-up: its need of a fact is :func:`operator.ending_needs_fact` (an
    effect of unknown outcome), not the retry's."""

    @property
    def action(self) -> str:
        """``operator_action(action=...)``."""
        return STORE_ACTIONS[self.transition.name]

    @property
    def states(self) -> frozenset[str]:
        """The states the action is offered for: its transition's sources."""
        return frozenset(s.value for s in self.transition.sources)

    @property
    def settles_effects(self) -> bool:
        """Whether the action records the operator's fact on the effects they name."""
        return self.verified in FACT_OUTCOMES

    @property
    def covers_all(self) -> bool:
        """Whether the fact must name every effect of unknown outcome (the action ends the
        job, which must not keep one unknown behind it)."""
        return self.settles_effects and (self.ending or self.transition == states.OP_RESOLVE)

    def offered_for(
        self,
        job: Job,
        *,
        fact_needed: bool | None = None,
        unknown_effect: bool | None = None,
        applied_effect: bool | None = None,
    ) -> bool:
        """Whether the job's state, mode and need of a fact allow this action.

        ``fact_needed`` is :func:`operator.needs_fact` of the job, ``unknown_effect``
        :func:`operator.ending_needs_fact` and ``applied_effect`` whether its ledger records an
        effect applied; each is read here when not given.
        """
        if job.state not in self.states:
            return False
        if self.transition == states.OP_REQUEST_CANCEL and job.cancel_requested_at is not None:
            return False  # asked once already; the attempt has yet to answer
        if self.modes is not None and job.effect not in self.modes:
            return False
        if self.ending:
            if unknown_effect is None:
                unknown_effect = operator.ending_needs_fact(job)
            if self.transition == states.OP_GIVE_UP:
                if applied_effect is None:
                    applied_effect = job_reads.has_applied_effect(job.pk)
                if applied_effect:
                    return False  # failed would say the applied effect did not happen
            if self.verified:
                return unknown_effect
            # Without a fact: at once when nothing is unknown; a waiting job's cancel then
            # holds it indeterminate (the store's rule), anything else needs the fact.
            return not unknown_effect or (
                self.transition == states.OP_CANCEL and job.state == states.State.WAITING
            )
        if self.fact is None:
            return True
        if fact_needed is None:
            fact_needed = operator.needs_fact(job)
        return self.fact == fact_needed


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec(
        key="retry",
        transition=states.OP_RETRY,
        verified="",
        label="Retry",
        fact=False,
    ),
    ActionSpec(
        key="retry-not-applied",
        transition=states.OP_RETRY,
        verified="not_applied",
        label="Retry: I verified the effect did not happen",
        fact=True,
    ),
    ActionSpec(
        key="retry-same-key",
        transition=states.OP_RETRY,
        verified="same_key",
        label="Retry under the same idempotency key",
        fact=True,
        modes=frozenset({EffectMode.IDEMPOTENT.value}),
    ),
    ActionSpec(
        key="resolve-applied",
        transition=states.OP_RESOLVE,
        verified="applied",
        label="Resolve as succeeded: I verified the effect happened",
        fact=True,
    ),
    ActionSpec(
        key="give-up",
        transition=states.OP_GIVE_UP,
        verified="",
        label="Give up (mark failed)",
        fact=None,
        danger=True,
        ending=True,
    ),
    ActionSpec(
        key="give-up-not-applied",
        transition=states.OP_GIVE_UP,
        verified="not_applied",
        label="Give up: I verified the effect did not happen",
        fact=None,
        danger=True,
        ending=True,
    ),
    ActionSpec(
        key="cancel",
        transition=states.OP_CANCEL,
        verified="",
        label="Cancel",
        fact=None,
        danger=True,
        ending=True,
    ),
    ActionSpec(
        key="cancel-not-applied",
        transition=states.OP_CANCEL,
        verified="not_applied",
        label="Cancel: I verified the effect did not happen",
        fact=None,
        danger=True,
        ending=True,
    ),
    ActionSpec(
        key="cancel-applied",
        transition=states.OP_CANCEL,
        verified="applied",
        label="Cancel: I verified the effect happened",
        fact=None,
        danger=True,
        ending=True,
    ),
    ActionSpec(
        key="cancel-running",
        transition=states.OP_REQUEST_CANCEL,
        verified="",
        label="Cancel",
        fact=None,
        danger=True,
    ),
)
BY_KEY: dict[str, ActionSpec] = {a.key: a for a in ACTIONS}


def offered(job: Job) -> list[ActionSpec]:
    """The actions a job's current state, mode and need of a fact allow (none while leased).

    A job that needs a verified fact (indeterminate, or an effect of unknown outcome in its
    ledger) is retried or resolved only with one; otherwise only the plain retry is offered.
    """
    if not any(job.state in a.states for a in ACTIONS):
        return []
    fact_needed = operator.needs_fact(job)
    unknown = operator.ending_needs_fact(job)
    applied = job_reads.has_applied_effect(job.pk)
    return [
        a
        for a in ACTIONS
        if a.offered_for(
            job, fact_needed=fact_needed, unknown_effect=unknown, applied_effect=applied
        )
    ]
