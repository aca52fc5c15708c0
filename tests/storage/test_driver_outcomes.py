"""The driver contract, part two: how an attempt ends and what it leaves behind — ``finish``
and its decisions, the reaper's reads, released attempts, the effect ledger (keys, intents,
outcomes, reconciliation) and operators' writes with their audit trail."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from scheduler_core.domain import keys, states
from scheduler_core.domain.outcomes import Decision, Kind, Reconciliation
from scheduler_core.exceptions import (
    AttemptOverrun,
    EffectsUnsettled,
    Indeterminate,
    StaleAttempt,
)
from scheduler_core.models import (
    AuditEntry,
    Effect,
    EffectEvent,
    Job,
)
from scheduler_core.storage.clock import DbNow
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Failure, check_installation_id

from . import (
    EXEC2,
    at_most_once,
    attempt_row,
    between,
    claim,
    claim_one,
    expire,
    job_row,
    overrun,
    reap,
    retry_now,
    take_over,
    transactional,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _events(effect: Effect) -> list[str]:
    return list(
        EffectEvent.objects.filter(effect_id=effect.pk)
        .order_by("id")
        .values_list("event", flat=True)
    )


# -- finish ------------------------------------------------------------------------------------


def test_finish_with_a_retry_decision_makes_the_job_wait_again_and_closes_the_attempt() -> None:
    d = driver()
    lease = claim_one()
    version = job_row(lease).version
    before = d.now()
    d.finish(
        lease,
        Decision(transition=states.RETRY, delay=60, reason="backing off"),
        outcome="failed",
        failure=Failure(
            error_class="transient", error_type="ValueError", message="boom", traceback="tb"
        ),
    )
    after = d.now()
    row = job_row(lease)
    minute = dt.timedelta(seconds=60)
    assert (row.state, row.lease_owner, row.lease_expires_at, row.hinted_at) == (
        "waiting",
        "",
        None,
        None,
    )
    assert between(row.run_at, before + minute, after + minute)
    assert (row.attempts, row.fence, row.next_kind, row.version) == (1, 1, "run", version + 1)
    assert (row.reason, row.last_error, row.finished_at) == (
        "backing off",
        "ValueError: boom",
        None,
    )
    a = attempt_row(lease)
    assert (a.outcome, a.error_class, a.error_type, a.message, a.traceback) == (
        "failed",
        "transient",
        "ValueError",
        "boom",
        "tb",
    )
    assert a.finished_at is not None
    assert claim() == []  # not due for a minute


def test_finish_with_a_retry_that_spends_no_attempt_gives_it_back_and_keeps_the_next_kind() -> None:
    lease = claim_one()
    retry_now(lease, spend_attempt=False, next_kind=Kind.RECONCILE)
    row = job_row(lease)
    assert (row.state, row.attempts, row.next_kind) == ("waiting", 0, "reconcile")
    [again] = claim()
    assert (again.kind, again.attempt, again.fence) == ("reconcile", 1, 2)
    assert attempt_row(again).kind == "reconcile"


@pytest.mark.parametrize(
    "transition, state, terminal",
    [(states.FAIL, "failed", True), (states.PARK, "indeterminate", False)],
)
def test_finish_enters_the_transitions_target_state(
    transition: states.Transition, state: str, terminal: bool
) -> None:
    lease = claim_one()
    driver().finish(lease, Decision(transition=transition, reason="why"), outcome="failed")
    row = job_row(lease)
    assert (row.state, row.reason, row.lease_owner) == (state, "why", "")
    assert (row.finished_at is not None) == terminal
    assert attempt_row(lease).outcome == "failed"


def test_finish_leaves_the_effects_an_attempt_did_not_settle_unknown() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    retry_now(lease, duplicate_possible=True)
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.in_doubt, row.duplicate_possible) == (Effect.UNKNOWN, True, True)
    assert list(row.events.order_by("id").values_list("event", flat=True)) == [
        "intended",
        "left_unsettled",
    ]


def test_finish_is_refused_with_stale_attempt_when_the_fence_moved() -> None:
    lease = claim_one()
    take_over(lease)
    with pytest.raises(StaleAttempt) as refused:
        retry_now(lease)
    assert refused.value.write == "retry"
    assert job_row(lease).state == "leased"
    assert attempt_row(lease).finished_at is None


def test_finish_with_complete_is_refused_while_an_effect_is_unsettled() -> None:
    d = driver()
    lease = claim_one()
    d.effect_intend(lease, "send")
    with pytest.raises(EffectsUnsettled):
        d.finish(lease, Decision(transition=states.COMPLETE), outcome="succeeded")
    assert job_row(lease).state == "leased"


def test_finish_with_expired_for_is_refused_until_the_lease_expired_that_long_ago() -> None:
    d = driver()
    lease = claim_one()
    reap_it = Decision(transition=states.REAP_RETRY, reason="lease expired")
    with pytest.raises(StaleAttempt):
        d.finish(lease, reap_it, outcome="lease_expired", expired_for=0)
    assert job_row(lease).state == "leased"
    expire(lease, 10)
    with pytest.raises(StaleAttempt):
        d.finish(lease, reap_it, outcome="lease_expired", expired_for=60)
    assert job_row(lease).state == "leased"
    d.finish(lease, reap_it, outcome="lease_expired", expired_for=5)
    assert (job_row(lease).state, job_row(lease).reason) == ("waiting", "lease expired")
    assert attempt_row(lease).outcome == "lease_expired"


# -- the reaper's reads: expired_leases, lease_of ---------------------------------------------


def test_expired_leases_lists_leases_expired_longer_than_grace_oldest_first() -> None:
    first, second, live = claim_one(), claim_one(), claim_one()
    expire(first, 10)
    expire(second, 30)
    d = driver()
    with d.atomic():
        assert [j.pk for j in d.expired_leases(5)] == [second.job_id, first.job_id]
    with d.atomic():
        assert [j.pk for j in d.expired_leases(20)] == [second.job_id]
    assert job_row(live).state == "leased"


def test_lease_of_rebuilds_the_lease_a_job_was_claimed_under() -> None:
    d = driver()
    lease = claim_one(payload={"n": 7}, priority=3)
    assert lease.priority == 3 and lease.due_at is not None
    expire(lease, 30)
    with d.atomic():
        [j] = list(d.expired_leases(5))
        rebuilt = d.lease_of(j)
    fields = (
        "job_id",
        "fence",
        "attempt",
        "attempt_id",
        "kind",
        "name",
        "queue",
        "payload",
        "lease_seconds",
        "effect",
        "max_attempts",
        "executor",
        "timeout_seconds",
        "priority",
        "due_at",
    )
    assert {f: getattr(rebuilt, f) for f in fields} == {f: getattr(lease, f) for f in fields}
    d.finish(
        rebuilt,
        Decision(transition=states.REAP_RETRY, reason="lease expired"),
        outcome="lease_expired",
        expired_for=5,
    )
    assert job_row(lease).state == "waiting"
    assert attempt_row(lease).outcome == "lease_expired"


# -- release_unstarted -------------------------------------------------------------------------


def test_release_unstarted_makes_the_job_wait_again_without_spending_the_attempt() -> None:
    d = driver()
    lease = claim_one()
    retry_now(lease, next_kind=Kind.RECONCILE)
    [again] = claim()
    before = d.now()
    d.release_unstarted(again, why="chain never started")
    row = job_row(again)
    assert (row.state, row.attempts, row.next_kind, row.reason) == (
        "waiting",
        1,
        "reconcile",
        "chain never started",
    )
    assert between(row.run_at, before, d.now())
    assert attempt_row(again).outcome == "released"
    assert [x.job_id for x in claim()] == [again.job_id]


def test_release_unstarted_leaves_earlier_unsettled_effects_as_the_ledger_has_them() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    retry_now(lease)
    events = Effect.objects.get(pk=eff.pk).events.count()
    [again] = claim()
    d.release_unstarted(again, why="never started")
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.in_doubt, row.fence) == (Effect.UNKNOWN, True, lease.fence)
    assert row.events.count() == events


def test_release_unstarted_is_refused_when_the_fence_moved() -> None:
    lease = claim_one()
    take_over(lease)
    with pytest.raises(StaleAttempt):
        driver().release_unstarted(lease, why="x")
    assert job_row(lease).state == "leased"


def test_a_reaped_attempt_cannot_write_for_the_job_any_more() -> None:
    d = driver()
    old = claim_one()
    reap(old)
    [new] = claim(executor=EXEC2)
    assert new.fence == old.fence + 1
    for write in (
        lambda: d.heartbeat(old),
        lambda: d.complete(old),
        lambda: d.effect_intend(old, "send"),
        lambda: retry_now(old),
    ):
        with pytest.raises(StaleAttempt):
            write()
    row = job_row(new)
    assert (row.state, row.fence, row.lease_owner) == ("leased", new.fence, EXEC2)
    assert not Effect.objects.exists()


# -- installation_id, effect_key ---------------------------------------------------------------


def test_installation_id_is_a_valid_name_that_stays_the_same() -> None:
    d = driver()
    name = d.installation_id()
    assert check_installation_id(name) == name
    assert d.installation_id() == name


def test_installation_id_is_the_configured_one_when_set(settings: Any) -> None:
    settings.TENURE_INSTALLATION_ID = "site-a"
    assert driver().installation_id() == "site-a"
    settings.TENURE_INSTALLATION_ID = "not a name!"
    with pytest.raises(ValueError, match="installation id"):
        driver().installation_id()


def test_effect_key_names_the_installation_the_job_and_the_effect_never_the_attempt() -> None:
    d = driver()
    lease = claim_one()
    key = d.effect_key(lease.job_id, "send")
    created = Job.objects.get(pk=lease.job_id).created_at
    assert key == keys.effect_key(d.installation_id(), lease.job_id, created, "send")
    retry_now(lease)
    claim()
    assert d.effect_key(lease.job_id, "send") == key


def test_effect_key_keeps_the_key_first_recorded_after_the_installation_is_renamed(
    settings: Any,
) -> None:
    d = driver()
    lease = claim_one()
    recorded = d.effect_intend(lease, "send").key
    settings.TENURE_INSTALLATION_ID = "renamed"
    assert d.effect_key(lease.job_id, "send") == recorded
    created = Job.objects.get(pk=lease.job_id).created_at
    assert d.effect_key(lease.job_id, "other") == keys.effect_key(
        "renamed", lease.job_id, created, "other"
    )


# -- effect_intend ------------------------------------------------------------------------------


def test_effect_intend_records_an_intended_row_with_the_attempts_fence() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    row = Effect.objects.get(job_id=lease.job_id, name="send")
    assert row.pk == eff.pk
    assert (row.key, row.state, row.fence, row.attempt_id, row.intents, row.in_doubt) == (
        d.effect_key(lease.job_id, "send"),
        Effect.INTENDED,
        lease.fence,
        lease.attempt_id,
        1,
        False,
    )
    [event] = EffectEvent.objects.filter(effect_id=row.pk)
    assert (event.event, event.state_after, event.fence, event.attempt_id) == (
        "intended",
        Effect.INTENDED,
        lease.fence,
        lease.attempt_id,
    )


def test_effect_intend_is_refused_once_the_lease_expired() -> None:
    lease = claim_one()
    expire(lease, 1)
    with pytest.raises(StaleAttempt) as refused:
        driver().effect_intend(lease, "send")
    assert type(refused.value) is StaleAttempt and refused.value.write == "effect_intent"
    assert not Effect.objects.exists()


def test_effect_intend_is_refused_with_attempt_overrun_past_the_deadline() -> None:
    lease = claim_one()
    overrun(lease)
    with pytest.raises(AttemptOverrun):
        driver().effect_intend(lease, "send")
    assert not Effect.objects.exists()


def test_effect_intend_returns_an_applied_row_unchanged() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    d.effect_settle(lease, eff.key, Effect.APPLIED, destination_ref="ref-1")
    again = d.effect_intend(lease, "send")
    assert (again.pk, again.state, again.intents, again.destination_ref) == (
        eff.pk,
        Effect.APPLIED,
        1,
        "ref-1",
    )
    assert _events(eff) == ["intended", "applied"]


def test_effect_intend_after_an_unknown_outcome_notes_a_possible_duplicate_at_least_once() -> None:
    d = driver()
    first = claim_one()
    eff = d.effect_intend(first, "send")
    d.effect_settle(first, eff.key, Effect.UNKNOWN)
    retry_now(first)
    [second] = claim()
    again = d.effect_intend(second, "send")
    row = Effect.objects.get(pk=eff.pk)
    assert again.pk == eff.pk
    assert (row.state, row.fence, row.attempt_id, row.intents) == (
        Effect.INTENDED,
        second.fence,
        second.attempt_id,
        2,
    )
    assert row.in_doubt and row.duplicate_possible
    assert "duplicate possible" in row.note


def test_effect_intend_after_an_unknown_outcome_is_refused_for_an_at_most_once_job() -> None:
    d = driver()
    first = claim_one(at_most_once)
    eff = d.effect_intend(first, "send")
    d.effect_settle(first, eff.key, Effect.UNKNOWN)
    retry_now(first)
    [second] = claim()
    with pytest.raises(Indeterminate) as refused:
        d.effect_intend(second, "send")
    assert type(refused.value) is Indeterminate
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.fence, row.intents) == (Effect.UNKNOWN, first.fence, 1)


# -- effect_settle, has_unsettled_effect, unsettled_effects ----------------------------------------


def test_effect_settle_applied_settles_the_effect() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    assert d.has_unsettled_effect(lease.job_id)
    assert d.effect_settle(lease, eff.key, Effect.APPLIED, destination_ref="msg-1") == "applied"
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.in_doubt, row.destination_ref) == (Effect.APPLIED, False, "msg-1")
    assert not d.has_unsettled_effect(lease.job_id)
    assert _events(eff) == ["intended", "applied"]


def test_effect_settle_not_applied_after_an_unknown_outcome_stays_unknown() -> None:
    d = driver()
    first = claim_one()
    eff = d.effect_intend(first, "send")
    assert d.effect_settle(first, eff.key, Effect.UNKNOWN) == Effect.UNKNOWN
    retry_now(first)
    [second] = claim()
    d.effect_intend(second, "send")
    assert d.effect_settle(second, eff.key, Effect.NOT_APPLIED) == Effect.UNKNOWN
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.in_doubt) == (Effect.UNKNOWN, True)
    assert d.has_unsettled_effect(first.job_id)


def test_effect_settle_is_accepted_after_the_lease_expired_while_the_fence_holds() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    expire(lease, 1)
    assert d.effect_settle(lease, eff.key, Effect.NOT_APPLIED) == Effect.NOT_APPLIED
    assert Effect.objects.get(pk=eff.pk).state == Effect.NOT_APPLIED


def test_effect_settle_is_refused_when_the_fence_moved() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    take_over(lease)
    with pytest.raises(StaleAttempt):
        d.effect_settle(lease, eff.key, Effect.APPLIED)
    assert Effect.objects.get(pk=eff.pk).state == Effect.INTENDED


def test_effect_settle_by_an_earlier_attempt_is_refused_once_a_new_one_intended() -> None:
    d = driver()
    first = claim_one()
    eff = d.effect_intend(first, "send")
    retry_now(first)
    [second] = claim()
    d.effect_intend(second, "send")
    with pytest.raises(StaleAttempt):
        d.effect_settle(first, eff.key, Effect.APPLIED)
    assert Effect.objects.get(pk=eff.pk).fence == second.fence


def test_unsettled_effects_are_the_intended_and_unknown_rows_by_name() -> None:
    d = driver()
    lease = claim_one()
    for name in ("b", "a", "c"):
        d.effect_intend(lease, name)
    d.effect_settle(lease, d.effect_key(lease.job_id, "a"), Effect.UNKNOWN)
    d.effect_settle(lease, d.effect_key(lease.job_id, "c"), Effect.APPLIED)
    assert [e.name for e in d.unsettled_effects(lease.job_id)] == ["a", "b"]
    assert d.has_unsettled_effect(lease.job_id)
    other = claim_one()
    assert d.unsettled_effects(other.job_id) == []
    assert not d.has_unsettled_effect(other.job_id)


def test_a_transactional_jobs_effect_is_written_with_its_completion_in_one_transaction() -> None:
    d = driver()
    lease = claim_one(transactional)
    with d.atomic():
        eff = d.effect_intend(lease, "credit")
        assert eff.pk is None and not Effect.objects.exists()
        assert d.effect_settle(lease, eff.key, Effect.APPLIED, name="credit") == Effect.APPLIED
        d.complete(lease)
    row = Effect.objects.get(job_id=lease.job_id)
    assert (row.key, row.state, row.fence) == (eff.key, Effect.APPLIED, lease.fence)
    assert job_row(lease).state == "succeeded"


def test_a_transactional_jobs_effect_rolls_back_with_its_transaction() -> None:
    d = driver()
    lease = claim_one(transactional)
    with pytest.raises(RuntimeError), d.atomic():
        eff = d.effect_intend(lease, "credit")
        d.effect_settle(lease, eff.key, Effect.APPLIED, name="credit")
        raise RuntimeError("the handler failed after its write")
    assert not Effect.objects.exists()
    assert job_row(lease).state == "leased"


# -- reconciled ---------------------------------------------------------------------------------


def _left_unknown() -> tuple[Effect, Any]:
    """An effect an attempt left unknown, and the reconcile attempt that follows."""
    d = driver()
    first = claim_one()
    eff = d.effect_intend(first, "send")
    d.effect_settle(first, eff.key, Effect.UNKNOWN)
    retry_now(first, next_kind=Kind.RECONCILE)
    [rec] = claim()
    assert rec.kind == "reconcile"
    return eff, rec


@pytest.mark.parametrize(
    "answer, state",
    [
        (Reconciliation.APPLIED, Effect.APPLIED),
        (Reconciliation.NOT_APPLIED, Effect.NOT_APPLIED),
    ],
)
def test_reconciled_settles_the_named_effect_with_the_destinations_answer(
    answer: Reconciliation, state: str
) -> None:
    d = driver()
    eff, rec = _left_unknown()
    assert d.reconciled(rec, answer, name="send") is True
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.in_doubt, row.note) == (state, False, "reconciled by attempt 2")
    last = EffectEvent.objects.filter(effect_id=eff.pk).latest("id")
    assert (last.event, last.state_after, last.fence, last.attempt_id) == (
        "reconciled",
        state,
        rec.fence,
        rec.attempt_id,
    )
    assert not d.has_unsettled_effect(rec.job_id)
    d.complete(rec)
    assert job_row(rec).state == "succeeded"


def test_reconciled_with_an_unknown_answer_changes_nothing() -> None:
    d = driver()
    eff, rec = _left_unknown()
    events = _events(eff)
    assert d.reconciled(rec, Reconciliation.UNKNOWN, name="send") is False
    assert Effect.objects.get(pk=eff.pk).state == Effect.UNKNOWN
    assert _events(eff) == events


def test_reconciled_is_refused_when_the_fence_moved() -> None:
    d = driver()
    eff, rec = _left_unknown()
    take_over(rec)
    with pytest.raises(StaleAttempt):
        d.reconciled(rec, Reconciliation.APPLIED, name="send")
    assert Effect.objects.get(pk=eff.pk).state == Effect.UNKNOWN


def test_reconciled_settles_only_the_effect_it_names() -> None:
    """Fails on the code before: one answer settled every unsettled effect of the job."""
    d = driver()
    first = claim_one()
    for name in ("charge", "receipt"):
        eff = d.effect_intend(first, name)
        d.effect_settle(first, eff.key, Effect.UNKNOWN)
    retry_now(first, next_kind=Kind.RECONCILE)
    [rec] = claim()
    assert d.reconciled(rec, Reconciliation.APPLIED, name="charge") is True
    states = dict(Effect.objects.filter(job_id=rec.job_id).values_list("name", "state"))
    assert states == {"charge": Effect.APPLIED, "receipt": Effect.UNKNOWN}
    assert d.ledger_summary(rec.job_id) == (("receipt",), ("charge",))
    assert d.reconciled(rec, Reconciliation.NOT_APPLIED, name="charge") is False  # settled


# -- operators: operator_transition, record_operator_fact, audit -------------------------------


def _failed_job() -> Job:
    lease = claim_one()
    driver().finish(lease, Decision(transition=states.FAIL, reason="gave up"), outcome="failed")
    return job_row(lease)


def test_operator_transition_moves_the_job_at_the_expected_version() -> None:
    j = _failed_job()
    assert driver().operator_transition(
        j.pk,
        expected_version=j.version,
        transition=states.OP_RETRY,
        fields={"reason": "operator retry", "run_at": DbNow()},
    )
    row = job_row(j)
    assert (row.state, row.version, row.reason) == ("waiting", j.version + 1, "operator retry")
    assert [x.job_id for x in claim()] == [j.pk]


def test_operator_transition_is_refused_at_another_version() -> None:
    j = _failed_job()
    assert not driver().operator_transition(
        j.pk, expected_version=j.version - 1, transition=states.OP_RETRY, fields={}
    )
    row = job_row(j)
    assert (row.state, row.version) == ("failed", j.version)


def test_operator_transition_is_refused_from_a_state_the_transition_does_not_leave() -> None:
    lease = claim_one()
    j = job_row(lease)
    assert not driver().operator_transition(
        j.pk, expected_version=j.version, transition=states.OP_RETRY, fields={}
    )
    assert (job_row(j).state, job_row(j).version) == ("leased", j.version)


def test_record_operator_fact_settles_the_effect_with_a_history_entry() -> None:
    d = driver()
    lease = claim_one()
    eff = d.effect_intend(lease, "send")
    d.effect_settle(lease, eff.key, Effect.UNKNOWN)
    d.record_operator_fact(
        Effect.objects.get(pk=eff.pk),
        effect_state=Effect.NOT_APPLIED,
        actor="alice",
        reason="checked the mail log",
    )
    row = Effect.objects.get(pk=eff.pk)
    assert (row.state, row.in_doubt) == (Effect.NOT_APPLIED, False)
    assert row.note.endswith("operator alice verified not_applied: checked the mail log")
    last = EffectEvent.objects.filter(effect_id=eff.pk).latest("id")
    assert (last.event, last.actor, last.attempt_id, last.fence, last.state_after) == (
        "operator",
        "alice",
        None,
        None,
        Effect.NOT_APPLIED,
    )
    assert not d.has_unsettled_effect(lease.job_id)


def test_audit_appends_an_entry_in_the_callers_transaction() -> None:
    d = driver()
    j = _failed_job()
    entry = d.audit(
        job_id=j.pk,
        actor="alice",
        action="retry",
        reason="fixed upstream",
        state_before="failed",
        state_after="waiting",
        version_before=j.version,
    )
    row = AuditEntry.objects.get(pk=entry.pk)
    assert (row.job_id, row.actor, row.action, row.reason, row.version_before) == (
        j.pk,
        "alice",
        "retry",
        "fixed upstream",
        j.version,
    )
    with pytest.raises(RuntimeError), d.atomic():
        d.audit(job_id=j.pk, actor="bob", action="cancel", reason="x")
        raise RuntimeError("the caller rolls back")
    assert list(AuditEntry.objects.values_list("actor", flat=True)) == ["alice"]
