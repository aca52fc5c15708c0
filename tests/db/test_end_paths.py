"""Every path a job takes to its end keeps the promise of its ledger: a reconcile lookup
settles one effect at a time and the job then performs the effects it never reached; no job
whose ledger holds an effect that may have happened, or did, ends ``failed``; a cancel never
hides an effect of unknown outcome. Each test walks one path of docs/guarantees.md's table
("How a job ends") through the real executor path and database, and fails on the code before
the change that made the ledger decide the end state (named in each docstring)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from scheduler_core import Snooze, job
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.models import Attempt, Effect, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.runtime.context import EffectRef
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "end-paths"
EXEC = "t:1:end-paths"

# A payment provider and a mailer as the destinations see them: keyed by the effect's key.
charges: dict[str, int] = {}
receipts: dict[str, int] = {}
asked: list[tuple[str, str]] = []
# What the charge does in each run attempt, in order: "apply_then_timeout" or "apply".
script: list[str] = []


def _charge_and_receipt(ctx: Any, *, order: int = 1) -> None:
    with ctx.effect("charge") as eff:
        if not eff.done:
            charges[eff.key] = charges.get(eff.key, 0) + 1
            if (script.pop(0) if script else "apply") == "apply_then_timeout":
                raise TimeoutError("the provider charged; the reply was lost")
    with ctx.effect("receipt") as eff:
        if not eff.done:
            receipts[eff.key] = receipts.get(eff.key, 0) + 1


def _lookup(ctx: Any, *, effect: EffectRef, order: int = 1) -> str:
    """The provider's lookup, by key: it knows only what it was sent."""
    asked.append((effect.name, effect.key))
    assert ctx.reconciling == effect
    book = charges if effect.name == "charge" else receipts
    return "applied" if book.get(effect.key) else "not_applied"


@job(
    name="tests.end.two_effects",
    queue=Q,
    effect="reconcilable",
    reconcile=_lookup,
    max_attempts=3,
    backoff_base=0.01,
    backoff_cap=0.01,
)
def two_effects(ctx: Any, *, order: int = 1) -> None:
    _charge_and_receipt(ctx, order=order)


def _old_style_lookup(ctx: Any, *, order: int = 1) -> str:
    """A reconcile function written before lookups were per effect: it reads
    ``ctx.reconciling``, or answers for the job as a whole."""
    ref = ctx.reconciling
    asked.append((ref.name if ref else "", ref.key if ref else ""))
    return "unknown" if ref is not None and ref.name == "receipt" else "applied"


@job(
    name="tests.end.old_style",
    queue=Q,
    effect="reconcilable",
    reconcile=_old_style_lookup,
    max_attempts=3,
    backoff_base=0.01,
    backoff_cap=0.01,
)
def old_style(ctx: Any, *, order: int = 1) -> None:
    _charge_and_receipt(ctx, order=order)


@job(
    name="tests.end.snoozes",
    queue=Q,
    effect="idempotent",
    max_attempts=5,
    max_age=60,
    backoff_base=0.01,
    backoff_cap=0.01,
)
def snoozes(ctx: Any) -> None:
    if ctx.attempt == 1:
        with ctx.effect("charge") as eff:
            charges[eff.key] = charges.get(eff.key, 0) + 1
            raise TimeoutError("the provider charged; the reply was lost")
    raise Snooze(30)  # the provider says "come back later", again and again


@job(name="tests.end.overruns", queue=Q, effect="idempotent", max_attempts=1, timeout=0.3)
def overruns(ctx: Any) -> None:
    with ctx.effect("charge") as eff:
        if not eff.done:
            charges[eff.key] = charges.get(eff.key, 0) + 1
    time.sleep(0.6)  # then runs past its maximum runtime


@job(name="tests.end.plain", queue=Q, effect="idempotent", max_attempts=3)
def plain(ctx: Any) -> None:
    with ctx.effect("charge") as eff:
        if not eff.done:
            charges[eff.key] = charges.get(eff.key, 0) + 1


@pytest.fixture(autouse=True)
def _fresh() -> None:
    for book in (charges, receipts, asked, script):
        book.clear()


def _due(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


def _run_next(job_id: int) -> str:
    _due(job_id)
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=job_id)
    return run_lease(lease)


def _expire(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires_at=driver().now() - dt.timedelta(seconds=5))


# -- reconcile, per effect ------------------------------------------------------------------


def test_a_two_effect_job_reconciled_applied_resumes_and_sends_its_receipt() -> None:
    """The issue's 10 jobs: each charge applied with its reply lost, the receipt never
    reached. The lookup is asked about the charge only, settles it, and the job resumes: 10
    charges, 10 receipts, 10 succeeded. Fails on the code before (one "applied" completed the
    job: 0 receipts)."""
    jobs = []
    for order in range(10):
        script.append("apply_then_timeout")
        j = two_effects.enqueue(order=order)
        assert _run_next(j.pk) == "retried"  # reconcile next
        jobs.append(j)
    for j in jobs:
        assert Job.objects.get(pk=j.pk).next_kind == "reconcile"
        assert _run_next(j.pk) == "reconciled"
        assert _run_next(j.pk) == "succeeded"
    assert sorted(charges.values()) == [1] * 10
    assert sorted(receipts.values()) == [1] * 10
    assert [name for name, _ in asked] == ["charge"] * 10  # never the receipt it never sent
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)) == {
        "succeeded"
    }
    for j in jobs:
        ledger = dict(Effect.objects.filter(job=j).values_list("name", "state"))
        assert ledger == {"charge": "applied", "receipt": "applied"}


def test_each_effect_is_asked_about_and_settled_on_its_own() -> None:
    """Both effects unknown: the lookup is asked twice, once per key, and each answer settles
    its own row (fails on the code before: one answer settled both)."""
    j = two_effects.enqueue()
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    for name in ("charge", "receipt"):
        eff = driver().effect_intend(lease, name)
        driver().effect_settle(lease, eff.key, Effect.UNKNOWN)
    charges[driver().effect_key(j.pk, "charge")] = 1  # only the charge reached its provider
    _expire(j.pk)
    reaper.reap_once()
    assert _run_next(j.pk) == "reconciled"
    assert sorted(asked) == sorted(
        [
            ("charge", driver().effect_key(j.pk, "charge")),
            ("receipt", driver().effect_key(j.pk, "receipt")),
        ]
    )
    ledger = dict(Effect.objects.filter(job=j).values_list("name", "state"))
    assert ledger == {"charge": "applied", "receipt": "not_applied"}
    assert _run_next(j.pk) == "succeeded"
    assert list(charges.values()) == [1] and list(receipts.values()) == [1]


def test_an_unknown_answer_keeps_the_effect_unknown_and_asks_again_within_the_budget() -> None:
    """A reconcile function in the old signature still works: asked per effect through
    ``ctx.reconciling``; its "unknown" about the receipt is sticky and the job asks again,
    then parks when its attempts run out (fails on the code before: "unknown" parked at once,
    and "applied" about the charge completed the job)."""
    j = old_style.enqueue()
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    for name in ("charge", "receipt"):
        eff = driver().effect_intend(lease, name)
        driver().effect_settle(lease, eff.key, Effect.UNKNOWN)
    _expire(j.pk)
    reaper.reap_once()
    assert _run_next(j.pk) == "retried"  # attempt 2: charge settled, receipt still unknown
    ledger = dict(Effect.objects.filter(job=j).values_list("name", "state"))
    assert ledger == {"charge": "applied", "receipt": "unknown"}
    row = Job.objects.get(pk=j.pk)
    assert (row.state, row.next_kind) == ("waiting", "reconcile")
    assert _run_next(j.pk) == "indeterminate"  # attempt 3 of 3: asked again, still unknown
    row = Job.objects.get(pk=j.pk)
    assert "attempts exhausted" in row.reason and "receipt" in row.reason
    assert [name for name, _ in asked] == ["charge", "receipt", "receipt"]


# -- no terminal failed with an effect that may have happened, or did -------------------------


def test_snoozing_past_max_age_after_a_lost_reply_ends_indeterminate_not_failed() -> None:
    """The issue's (a): fails on the code before (``failed``: "maximum age reached while
    snoozing", the charge's unknown outcome hidden)."""
    j = snoozes.enqueue()
    assert _run_next(j.pk) == "retried"
    assert _run_next(j.pk) == "snoozed"
    Job.objects.filter(pk=j.pk).update(created_at=driver().now() - dt.timedelta(seconds=61))
    assert _run_next(j.pk) == "indeterminate"
    row = Job.objects.get(pk=j.pk)
    assert row.state == "indeterminate"
    assert "maximum age reached while snoozing" in row.reason
    assert "an effect may have happened" in row.reason
    assert Effect.objects.get(job=j).state == "unknown"


def test_an_applied_effect_then_an_overrun_with_no_attempts_left_ends_indeterminate() -> None:
    """The issue's (b): fails on the code before (every one ended ``failed``)."""
    j = overruns.enqueue()
    assert _run_next(j.pk) == "stale"  # past its deadline: its completion is refused
    _expire(j.pk)
    assert reaper.reap_once() == {"reap_park": 1}
    row = Job.objects.get(pk=j.pk)
    assert row.state == "indeterminate"
    assert "effect(s) charge applied before the job ended" in row.reason
    assert Effect.objects.get(job=j).state == "applied"
    assert list(charges.values()) == [1]


# -- the operator's fact, against what the operator saw ------------------------------------


def _reaped_twice() -> Job:
    """An idempotent job whose two attempts both lost their lease with the charge intended."""
    j = plain.enqueue()
    for _ in range(2):
        _due(j.pk)
        [lease] = driver().claim(executor=f"{EXEC}:{_}", queues=[Q], job_id=j.pk)
        driver().effect_intend(lease, "charge")
        _expire(j.pk)
        reaper.reap_once()
    _due(j.pk)
    [lease] = driver().claim(executor=f"{EXEC}:3", queues=[Q], job_id=j.pk)
    driver().effect_intend(lease, "charge")
    _expire(j.pk)
    reaper.reap_once()
    row = Job.objects.get(pk=j.pk)
    assert row.state == "indeterminate"
    return row


def _retry(j: Job, **kw: Any) -> operator.ActionResult:
    return operator.operator_action(
        j.pk,
        action="retry",
        expected_version=j.version,
        actor="olivia",
        reason="checked the provider: no charge",
        verified="not_applied",
        **kw,
    )


def test_a_not_applied_retry_is_judged_against_the_owners_the_confirmation_showed() -> None:
    """Fails on the code before: the acceptance covered whatever owners existed at submit."""
    j = _reaped_twice()
    owners = driver().in_flight_owners(j.pk)
    assert [o.fence for o in owners] == [3, 2, 1]
    with pytest.raises(ActionConflict, match="showed fences 2, 3, now fences 1, 2, 3"):
        _retry(j, accept_in_flight=True, seen_owners=[2, 3])
    with pytest.raises(ActionRefused, match="may still be in flight"):
        _retry(j, seen_owners=[1, 2, 3])
    # The owner of fence 1 records its stop: the set the operator saw no longer holds.
    driver().executor_started(f"{EXEC}:0", transport="polling", queues=[Q], concurrency=1)
    driver().executor_stopped(f"{EXEC}:0")
    with pytest.raises(ActionConflict):
        _retry(j, accept_in_flight=True, seen_owners=[1, 2, 3])
    done = _retry(j, accept_in_flight=True, seen_owners=[2, 3])
    assert done.job.state == "waiting"
    assert done.audit.detail["in_flight_owners"] == [f"{EXEC}:3", f"{EXEC}:1"]


def test_a_released_attempt_counts_as_possibly_in_flight_and_its_grace_is_kept(
    settings: Any,
) -> None:
    """An attempt its executor released unfinished may still be running (fails on the code
    before: only reaped attempts counted, and the retry was due at once)."""
    settings.TENURE_REAP_GRACE_SECONDS = 30.0
    j = plain.enqueue()
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    driver().effect_intend(lease, "charge")
    from scheduler_core.runtime.attempt import release

    release(lease, why="executor shutting down")
    row = Job.objects.get(pk=j.pk)
    assert row.state == "waiting"  # idempotent: retried under the same key, after the grace
    assert Attempt.objects.get(job=j).outcome == "released"
    [owner] = driver().in_flight_owners(j.pk)
    assert owner.ended == "released" and owner.fence == lease.fence
    # The operator stops it while the effect is in question (held), then retries it.
    held = operator.operator_action(
        j.pk, action="cancel", expected_version=row.version, actor="olivia", reason="hold it"
    )
    assert held.job.state == "indeterminate"
    with pytest.raises(ActionRefused, match="released"):
        _retry(held.job)
    again = _retry(held.job, accept_in_flight=True, seen_owners=[lease.fence])
    assert again.job.state == "waiting"
    # It starts no earlier than the released owner's grace runs out.
    assert (again.job.run_at - driver().now()).total_seconds() > 20


# -- cancel never hides an effect --------------------------------------------------------------


def _waiting_with_unknown() -> Job:
    j = plain.enqueue()
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    driver().effect_intend(lease, "charge")
    _expire(j.pk)
    reaper.reap_once()
    row = Job.objects.get(pk=j.pk)
    assert row.state == "waiting"
    return row


def test_cancelling_a_job_with_an_unknown_effect_needs_the_fact_or_holds_it() -> None:
    """Fails on the code before: the job ended ``cancelled`` with its effect unknown."""
    j = _waiting_with_unknown()
    held = operator.operator_action(
        j.pk, action="cancel", expected_version=j.version, actor="olivia", reason="stop it"
    )
    assert held.job.state == "indeterminate"
    assert held.audit.detail["transition"] == "operator_hold"
    assert "may have happened" in held.job.reason
    with pytest.raises(ActionRefused, match="cancelled would hide"):
        operator.operator_action(
            j.pk, action="cancel", expected_version=held.job.version, actor="o", reason="stop"
        )
    done = operator.operator_action(
        j.pk,
        action="cancel",
        expected_version=held.job.version,
        actor="olivia",
        reason="the provider shows the charge",
        verified="applied",
        accept_in_flight=True,
    )
    assert done.job.state == "cancelled"
    assert Effect.objects.get(job=j).state == "applied"


def test_giving_up_never_says_failed_over_an_effect_that_happened_or_may_have() -> None:
    j = _waiting_with_unknown()
    held = operator.operator_action(
        j.pk, action="cancel", expected_version=j.version, actor="o", reason="stop"
    ).job
    with pytest.raises(ActionRefused, match="needs the fact"):
        operator.operator_action(
            j.pk, action="give_up", expected_version=held.version, actor="o", reason="enough"
        )
    failed = operator.operator_action(
        j.pk,
        action="give_up",
        expected_version=held.version,
        actor="o",
        reason="provider shows nothing",
        verified="not_applied",
        accept_in_flight=True,
    ).job
    assert failed.state == "failed"
    assert Effect.objects.get(job=j).state == "not_applied"
    # An applied effect: failed would be untrue.
    k = overruns.enqueue()
    assert _run_next(k.pk) == "stale"
    _expire(k.pk)
    reaper.reap_once()
    row = Job.objects.get(pk=k.pk)
    with pytest.raises(ActionRefused, match="were applied"):
        operator.operator_action(
            k.pk, action="give_up", expected_version=row.version, actor="o", reason="enough"
        )
