"""Pure decisions of the effect protocol: each mode's answer to an ambiguous outcome."""

from __future__ import annotations

import random

import pytest

from scheduler_core.domain import states
from scheduler_core.domain.classify import FailureClass, classify
from scheduler_core.domain.modes import GUARANTEES, EffectMode
from scheduler_core.domain.outcomes import (
    Kind,
    Reconciliation,
    Situation,
    after_abandon,
    after_failure,
    after_reconcile,
)
from scheduler_core.domain.retry import RetryPolicy
from scheduler_core.exceptions import Indeterminate, Transient
from verifier import failpoints

POLICY = RetryPolicy(base=0.1, cap=1.0)


def _s(mode: EffectMode, attempt: int = 1, max_attempts: int = 5, **kw: object) -> Situation:
    return Situation(
        mode=mode,
        attempt=attempt,
        max_attempts=max_attempts,
        age_seconds=float(kw.get("age", 1.0)),  # type: ignore[arg-type]
        has_reconcile=bool(kw.get("has_reconcile", mode == EffectMode.RECONCILABLE)),
    )


def _indeterminate(s: Situation, grace: float = 0.0) -> object:
    return after_failure(
        s,
        FailureClass.INDETERMINATE,
        policy=POLICY,
        rng=random.Random(7),
        message="timed out after sending",
        in_flight_grace=grace,
    )


@pytest.mark.parametrize(
    ("mode", "target", "kind", "duplicate"),
    [
        (EffectMode.TRANSACTIONAL, states.State.WAITING, Kind.RUN, False),
        (EffectMode.IDEMPOTENT, states.State.WAITING, Kind.RUN, False),
        (EffectMode.RECONCILABLE, states.State.WAITING, Kind.RECONCILE, False),
        (EffectMode.AT_LEAST_ONCE, states.State.WAITING, Kind.RUN, True),
        (EffectMode.AT_MOST_ONCE, states.State.INDETERMINATE, Kind.RUN, False),
    ],
)
def test_indeterminate_failure_follows_the_modes_rule(
    mode: EffectMode, target: states.State, kind: Kind, duplicate: bool
) -> None:
    d = _indeterminate(_s(mode))
    assert d.transition.target == target  # type: ignore[attr-defined]
    assert d.next_kind == kind  # type: ignore[attr-defined]
    assert d.duplicate_possible is duplicate  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "mode", [EffectMode.IDEMPOTENT, EffectMode.RECONCILABLE, EffectMode.AT_LEAST_ONCE]
)
def test_attempt_after_a_reported_ambiguity_waits_at_least_the_in_flight_grace(
    mode: EffectMode,
) -> None:
    for seed in range(50):
        d = after_failure(
            _s(mode),
            FailureClass.INDETERMINATE,
            policy=POLICY,
            rng=random.Random(seed),
            in_flight_grace=2.0,
        )
        assert d.delay >= 2.0


def test_reaper_adds_no_grace_of_its_own_it_already_waited_lease_plus_grace() -> None:
    d = after_abandon(
        _s(EffectMode.RECONCILABLE),
        unsettled_effect=True,
        policy=POLICY,
        rng=random.Random(1),
        why="lease expired",
    )
    assert d.transition == states.REAP_RETRY
    assert d.next_kind == Kind.RECONCILE
    assert d.delay <= POLICY.cap


@pytest.mark.parametrize("mode", [EffectMode.IDEMPOTENT, EffectMode.AT_LEAST_ONCE])
def test_ambiguous_outcome_with_attempts_exhausted_parks_instead_of_failing(
    mode: EffectMode,
) -> None:
    d = _indeterminate(_s(mode, attempt=5, max_attempts=5))
    assert d.transition == states.PARK  # type: ignore[attr-defined]


def test_ambiguous_outcome_past_max_age_parks_so_no_retry_outlives_the_key() -> None:
    policy = RetryPolicy(base=0.1, cap=1.0, max_age=60)
    d = after_failure(
        _s(EffectMode.IDEMPOTENT, age=61),
        FailureClass.INDETERMINATE,
        policy=policy,
        rng=random.Random(1),
    )
    assert d.transition == states.PARK
    assert "maximum age" in d.reason


def test_reconcilable_without_a_reconcile_function_parks() -> None:
    d = _indeterminate(_s(EffectMode.RECONCILABLE, has_reconcile=False))
    assert d.transition == states.PARK  # type: ignore[attr-defined]


def test_abandoned_attempt_without_unsettled_effect_is_retried_in_every_mode() -> None:
    for mode in EffectMode:
        d = after_abandon(
            _s(mode), unsettled_effect=False, policy=POLICY, rng=random.Random(1), why="x"
        )
        assert d.transition == states.REAP_RETRY
        assert d.next_kind == Kind.RUN


def test_abandoned_at_most_once_attempt_with_unsettled_effect_is_parked() -> None:
    d = after_abandon(
        _s(EffectMode.AT_MOST_ONCE),
        unsettled_effect=True,
        policy=POLICY,
        rng=random.Random(1),
        why="lease expired",
    )
    assert d.transition == states.REAP_PARK


def _reconciled(s: Situation, still: tuple[str, ...] = (), **kw: object) -> object:
    return after_reconcile(s, still_unknown=still, policy=POLICY, rng=random.Random(1), **kw)  # type: ignore[arg-type]


def test_every_effect_settled_resumes_the_job_with_a_run_attempt_not_a_completion() -> None:
    """Fails on the code before per-effect reconcile: an "applied" answer completed the job
    though an effect it never reached (the receipt) had yet to be performed."""
    d = _reconciled(_s(EffectMode.RECONCILABLE))
    assert d.transition == states.RETRY  # type: ignore[attr-defined]
    assert d.next_kind == Kind.RUN  # type: ignore[attr-defined]
    assert d.spend_attempt is False  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("answer", "transition", "kind"),
    [
        (Reconciliation.APPLIED, states.COMPLETE, Kind.RUN),
        (Reconciliation.NOT_APPLIED, states.RETRY, Kind.RUN),
    ],
)
def test_the_job_as_a_whole_answers_when_its_ledger_holds_no_effect(
    answer: Reconciliation, transition: states.Transition, kind: Kind
) -> None:
    d = _reconciled(_s(EffectMode.RECONCILABLE), whole_job=answer)
    assert d.transition == transition  # type: ignore[attr-defined]
    assert d.next_kind == kind  # type: ignore[attr-defined]


@pytest.mark.parametrize("failure", [None, FailureClass.TRANSIENT, FailureClass.INDETERMINATE])
def test_an_effect_still_unknown_is_asked_again_later_never_rerun_blindly(
    failure: FailureClass | None,
) -> None:
    """An "unknown" answer or a lookup that raised keeps the effect unknown and follows the
    job's retry policy (fails on the code before: an unknown answer parked at once)."""
    d = _reconciled(_s(EffectMode.RECONCILABLE), ("receipt",), failure=failure)
    assert d.transition == states.RETRY  # type: ignore[attr-defined]
    assert d.next_kind == Kind.RECONCILE  # type: ignore[attr-defined]
    assert d.spend_attempt is True  # type: ignore[attr-defined]
    assert "receipt" in d.reason  # type: ignore[attr-defined]


def test_a_lookup_that_fails_permanently_parks() -> None:
    d = _reconciled(_s(EffectMode.RECONCILABLE), ("charge",), failure=FailureClass.PERMANENT)
    assert d.transition == states.PARK  # type: ignore[attr-defined]


@pytest.mark.parametrize("age", [1.0, 100.0])
def test_an_effect_still_unknown_with_attempts_or_age_spent_parks(age: float) -> None:
    policy = RetryPolicy(base=0.1, cap=1.0, max_age=50.0)
    attempt = 5 if age < 50 else 1
    d = after_reconcile(
        _s(EffectMode.RECONCILABLE, attempt=attempt, max_attempts=5, age=age),
        still_unknown=("charge",),
        policy=policy,
        rng=random.Random(1),
    )
    assert d.transition == states.PARK


@pytest.mark.parametrize(
    ("exc", "in_effect", "expected"),
    [
        (TimeoutError("read timed out"), True, FailureClass.INDETERMINATE),
        (ConnectionResetError(), True, FailureClass.INDETERMINATE),
        (Indeterminate("sent, no answer"), False, FailureClass.INDETERMINATE),
        (Transient("503, nothing applied"), False, FailureClass.TRANSIENT),
    ],
)
def test_timeout_after_sending_is_indeterminate_not_transient(
    exc: BaseException, in_effect: bool, expected: FailureClass
) -> None:
    assert classify(exc, in_effect=in_effect) == expected


def test_every_mode_states_its_guarantee_in_one_table() -> None:
    assert set(GUARANTEES) == set(EffectMode)
    for mode, g in GUARANTEES.items():
        assert g.mode == mode
        assert g.promise and g.mechanism and g.needs and g.on_ambiguity


def test_failpoints_parse_names_and_actions_and_refuse_unknown_ones() -> None:
    assert failpoints.parse("before_effect=stop, after_effect=kill,in_commit=sleep:0.5") == {
        "before_effect": "stop",
        "after_effect": "kill",
        "in_commit": "sleep:0.5",
    }
    with pytest.raises(ValueError):
        failpoints.parse("nowhere=kill")
    with pytest.raises(ValueError):
        failpoints.parse("after_claim=explode")


def test_failpoint_raise_acts_only_when_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENURE_FAILPOINTS", raising=False)
    failpoints.hit("before_effect")
    monkeypatch.setenv("TENURE_FAILPOINTS", "before_effect=raise")
    with pytest.raises(failpoints.FailpointError):
        failpoints.hit("before_effect")
    failpoints.hit("after_effect")


def test_jobs_guarantees_prints_each_job_types_mode_and_guarantee() -> None:
    import io
    import json

    from django.core.management import call_command

    out = io.StringIO()
    call_command("jobs_guarantees", "--json", stdout=out)
    rows = {r["job"]: r for r in json.loads(out.getvalue())}
    assert rows["demo.charge"]["mode"] == "idempotent"
    assert rows["demo.ledger_credit"]["guarantee"] == GUARANTEES[EffectMode.TRANSACTIONAL].promise
    assert rows["demo.charge_reconcilable"]["reconcile"] is True
    assert rows["demo.charge"]["max_runtime_seconds"] > 0
    text = io.StringIO()
    call_command("jobs_guarantees", stdout=text)
    assert "demo.email_at_most_once" in text.getvalue()
    assert GUARANTEES[EffectMode.AT_MOST_ONCE].promise in text.getvalue()
    assert "maximum runtime:" in text.getvalue()


def test_the_reconcilable_guarantee_says_the_lookup_must_fence_out_older_requests() -> None:
    """A lookup that answers "not applied" while an older request is still on its way is
    overtaken by it unless the lookup raises the key's fence: the mode's text must say so
    wherever it is shown (jobs_guarantees, the dashboard, docs/guarantees.md)."""
    g = GUARANTEES[EffectMode.RECONCILABLE]
    assert "fences out older requests" in g.promise
    assert "older requests" in g.needs and "refused" in g.needs
    with open("docs/guarantees.md", encoding="utf-8") as f:
        assert "fences out older requests" in f.read()


def test_the_documented_maintenance_backoff_cap_is_the_codes() -> None:
    from scheduler_core.services.maintenance import BACKOFF_CAP_SECONDS

    with open("docs/reliability.md", encoding="utf-8") as f:
        doc = f.read()
    assert f"up to {BACKOFF_CAP_SECONDS:g} s" in doc
    assert "up to 30 s" not in doc
