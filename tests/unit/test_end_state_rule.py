"""The ledger's rule for a job's end state (``outcomes.final``), over every pure decision: no
path ends ``failed`` while an effect may have happened or did, and none ends ``cancelled``
while one may have happened. Seeded and exhaustive over modes, failure classes, kinds, budgets
and ages, so a new decision that forgets the rule fails here."""

from __future__ import annotations

import itertools
import random

import pytest

from scheduler_core.domain import states
from scheduler_core.domain.classify import FailureClass
from scheduler_core.domain.modes import EffectMode
from scheduler_core.domain.outcomes import (
    Decision,
    Kind,
    Situation,
    after_abandon,
    after_cancel_request,
    after_failure,
    after_reconcile,
    after_snooze,
    final,
)
from scheduler_core.domain.retry import RetryPolicy

NOT_TRANSACTIONAL = [m for m in EffectMode if m != EffectMode.TRANSACTIONAL]
POLICY = RetryPolicy(base=0.1, cap=1.0, max_age=60.0)


def _situations(ledger: str) -> list[Situation]:
    """Every combination of mode, kind, budget, age and fallback, with ``ledger`` saying what
    the job's ledger holds: ``unknown`` or ``applied``."""
    out = []
    for mode, kind, (attempt, most), age, fallback, shares in itertools.product(
        NOT_TRANSACTIONAL,
        list(Kind),
        [(1, 5), (5, 5)],
        [1.0, 100.0],
        [False, True],
        [False, True],
    ):
        out.append(
            Situation(
                mode=mode,
                attempt=attempt,
                max_attempts=most,
                age_seconds=age,
                has_reconcile=mode == EffectMode.RECONCILABLE,
                kind=kind,
                has_fallback=fallback,
                fallback_shares_key=shares,
                unsettled_effect=ledger == "unknown",
                applied_effects=("charge",) if ledger == "applied" else (),
            )
        )
    return out


def _decisions(s: Situation, rng: random.Random) -> list[tuple[str, Decision]]:
    out: list[tuple[str, Decision]] = []
    for failure in FailureClass:
        out.append(
            (f"failure {failure}", after_failure(s, failure, policy=POLICY, rng=rng, message="x"))
        )
    out.append(("snooze", after_snooze(s, 5.0, policy=POLICY)))
    for cancel in (False, True):
        c = Situation(**{**s.__dict__, "cancel_requested": cancel})
        out.append(
            (
                f"abandon cancel={cancel}",
                after_abandon(
                    c, unsettled_effect=c.unsettled_effect, policy=POLICY, rng=rng, why="expired"
                ),
            )
        )
    for stopped in (False, True):
        out.append((f"cancel stopped={stopped}", after_cancel_request(s, handler_stopped=stopped)))
    out.append(
        (
            "reconcile unknown",
            after_reconcile(s, still_unknown=("charge",), policy=POLICY, rng=rng),
        )
    )
    return out


@pytest.mark.parametrize("ledger", ["unknown", "applied"])
def test_no_decision_ends_failed_while_the_ledger_holds_an_unknown_or_applied_effect(
    ledger: str,
) -> None:
    """Fails on the code before the rule: a snooze past ``max_age`` and an exhausted
    abandoned attempt with an applied effect both ended ``failed``."""
    rng = random.Random(44)
    for s in _situations(ledger):
        for what, d in _decisions(s, rng):
            assert d.transition.target != states.State.FAILED, (what, s, d)


def test_no_decision_ends_cancelled_while_an_effect_may_have_happened() -> None:
    """Fails on the code before the rule: a cancelled attempt's unknown effect hid behind
    ``cancelled``."""
    rng = random.Random(45)
    for s in _situations("unknown"):
        for what, d in _decisions(s, rng):
            assert d.transition.target != states.State.CANCELLED, (what, s, d)


def test_cancelled_with_an_applied_effect_names_it() -> None:
    s = _situations("applied")[0]
    d = after_cancel_request(s, handler_stopped=True)
    assert d.transition == states.CANCEL
    assert "charge had been applied" in d.reason


@pytest.mark.parametrize(
    ("decision", "parked"),
    [
        (states.FAIL, states.PARK),
        (states.REAP_FAIL, states.REAP_PARK),
        (states.CANCEL, states.PARK),
        (states.REAP_CANCEL, states.REAP_PARK),
    ],
)
def test_the_rule_parks_under_the_same_author(
    decision: states.Transition, parked: states.Transition
) -> None:
    """The attempt's own end stays the attempt's, the reaper's the reaper's."""
    s = _situations("unknown")[0]
    assert final(s, Decision(transition=decision, reason="r")).transition == parked


def test_a_transactional_job_is_left_to_its_transaction() -> None:
    s = Situation(
        mode=EffectMode.TRANSACTIONAL,
        attempt=5,
        max_attempts=5,
        age_seconds=1.0,
        unsettled_effect=True,
        applied_effects=("row",),
    )
    d = Decision(transition=states.FAIL, reason="attempts exhausted")
    assert final(s, d) is d


def test_without_an_effect_in_question_failed_stays_failed() -> None:
    s = Situation(mode=EffectMode.IDEMPOTENT, attempt=5, max_attempts=5, age_seconds=1.0)
    d = after_failure(s, FailureClass.PERMANENT, policy=POLICY, rng=random.Random(1))
    assert d.transition == states.FAIL


def test_a_snooze_past_max_age_after_a_lost_reply_is_indeterminate() -> None:
    """The issue's first case, as a pure decision: the first attempt's reply was lost, the
    later ones snooze until ``max_age`` passes."""
    s = Situation(
        mode=EffectMode.IDEMPOTENT, attempt=3, max_attempts=5, age_seconds=61.0,
        unsettled_effect=True,
    )  # fmt: skip
    d = after_snooze(s, 5.0, policy=POLICY)
    assert d.transition == states.PARK
    assert "maximum age reached while snoozing" in d.reason
