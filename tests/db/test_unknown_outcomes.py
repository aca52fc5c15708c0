"""An unknown effect outcome is never forgotten: a later attempt that sent nothing does not
erase it, and every decision that asks "may this effect have happened?" reads the sticky
answer — the fallback hand-over, retries, attempts exhausted, a Permanent error, the reaper,
retention. A job type that is no longer registered is parked, never decided.

Each test here fails on the code before the change that made the unknown sticky (the ledger
row then became ``not_applied`` and the decisions believed it)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from scheduler_core import Permanent, Transient, job
from scheduler_core.api import registry
from scheduler_core.models import Effect, EffectEvent, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "unknown-outcomes"
EXEC = "t:1:unknown"

# Two payment providers as the destinations see them: A deduplicates by the effect key (an
# idempotency key), B keeps its own keys, so it cannot tell a repeat of A's charge.
provider_a: dict[str, int] = {}
provider_b: list[str] = []
# What provider A does with each attempt, in order: "apply_then_timeout", "refuse", "apply".
script_a: list[str] = []


def _charge_at_a(ctx: Any, *, invoice: int = 1) -> None:
    with ctx.effect("charge") as eff:
        if eff.done:
            return
        step = script_a.pop(0) if script_a else "apply"
        if step == "refuse":
            # Connection refused: nothing was sent (the demo clients raise Transient so).
            raise Transient("provider A refuses connections; nothing sent")
        # A deduplicates by the idempotency key: a repeat replays the first charge.
        provider_a.setdefault(eff.key, 1)
        if step == "apply_then_timeout":
            raise TimeoutError("provider A applied the charge; the reply was lost")
        eff.applied(destination_ref="a")


def _charge_at_b(ctx: Any, *, invoice: int = 1) -> None:
    with ctx.effect("charge") as eff:
        if not eff.done:
            provider_b.append(eff.key)
            eff.applied(destination_ref="b")


@job(
    name="tests.unknown.unshared",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    backoff_base=0.01,
    backoff_cap=0.01,
    fallback=_charge_at_b,
    fallback_shares_key=False,
)
def charge_unshared(ctx: Any, *, invoice: int = 1) -> None:
    _charge_at_a(ctx, invoice=invoice)


@job(
    name="tests.unknown.default_fallback",
    queue=Q,
    effect="idempotent",
    max_attempts=4,
    backoff_base=0.01,
    backoff_cap=0.01,
    fallback=_charge_at_b,
)
def charge_default_fallback(ctx: Any, *, invoice: int = 1) -> None:
    _charge_at_a(ctx, invoice=invoice)


@job(
    name="tests.unknown.idem2",
    queue=Q,
    effect="idempotent",
    max_attempts=2,
    backoff_base=0.01,
    backoff_cap=0.01,
)
def idem2(ctx: Any, *, permanent_second: bool = False) -> None:
    if ctx.attempt == 2 and permanent_second:
        raise Permanent("the customer's card was closed")
    _charge_at_a(ctx)


@job(name="tests.unknown.amo", queue=Q, effect="at_most_once", max_attempts=5)
def amo_two_effects(ctx: Any) -> None:
    for name in ("receipt", "sms"):
        with ctx.effect(name) as eff:
            if eff.done:
                continue
            raise Transient(f"{name} gateway refuses connections; nothing sent")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    provider_a.clear()
    provider_b.clear()
    script_a.clear()


def _due(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


def _run_next(job_id: int) -> str:
    _due(job_id)
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=job_id)
    return run_lease(lease)


def test_an_unknown_outcome_followed_by_nothing_sent_never_hands_over_to_an_unshared_fallback() -> (
    None
):
    """The issue's double charge: A applies and the reply is lost; A then refuses; the
    fallback (B, its own keys) must not run. The job retries A under the same key, which A
    absorbs: one charge in the world."""
    script_a.extend(["apply_then_timeout", "refuse", "apply"])
    j = charge_unshared.enqueue()
    assert _run_next(j.pk) == "retried"  # unknown at A
    assert _run_next(j.pk) == "retried"  # A refused: nothing sent, the unknown stands
    e = Effect.objects.get(job_id=j.pk)
    assert (e.state, e.in_doubt) == ("unknown", True)
    assert Job.objects.get(pk=j.pk).next_kind == "run"  # not the fallback
    assert _run_next(j.pk) == "succeeded"
    assert provider_b == []
    assert sum(provider_a.values()) == 1
    kinds = list(j.attempt_set.order_by("fence").values_list("kind", flat=True))
    assert kinds == ["run", "run", "run"]


def test_the_ledger_keeps_who_learned_what_and_only_a_stated_fact_settles_it() -> None:
    script_a.extend(["apply_then_timeout", "refuse", "apply"])
    j = charge_unshared.enqueue()
    for _ in range(3):
        _run_next(j.pk)
    e = Effect.objects.get(job_id=j.pk)
    assert (e.state, e.in_doubt) == ("applied", False)
    history = list(
        EffectEvent.objects.filter(effect=e)
        .order_by("id")
        .values_list("fence", "event", "state_after", "in_doubt_after")
    )
    assert history == [
        (1, "intended", "intended", False),
        (1, "unknown", "unknown", True),
        (2, "intended", "intended", True),
        (2, "not_sent", "unknown", True),  # nothing sent by fence 2 does not erase fence 1's
        (3, "intended", "intended", True),
        (3, "applied", "applied", False),  # the destination's acknowledgement settles it
    ]


def test_fallback_shares_key_defaults_to_false_so_an_undeclared_fallback_waits_for_a_fact() -> None:
    assert registry.get("tests.unknown.default_fallback").fallback_shares_key is False  # type: ignore[union-attr]
    script_a.extend(["apply_then_timeout", "refuse", "refuse", "refuse"])
    j = charge_default_fallback.enqueue()
    outcomes = [_run_next(j.pk) for _ in range(4)]
    assert outcomes == ["retried", "retried", "retried", "indeterminate"]
    assert provider_b == []


def test_attempts_exhausted_while_the_effect_may_have_happened_end_indeterminate_not_failed() -> (
    None
):
    script_a.extend(["apply_then_timeout", "refuse"])
    j = idem2.enqueue()
    assert _run_next(j.pk) == "retried"
    assert _run_next(j.pk) == "indeterminate"
    j.refresh_from_db()
    assert j.state == "indeterminate"
    assert "attempts exhausted with the effect unsettled" in j.reason


def test_a_permanent_error_after_an_unknown_outcome_parks_the_job() -> None:
    script_a.extend(["apply_then_timeout"])
    j = idem2.enqueue(permanent_second=True)
    assert _run_next(j.pk) == "retried"
    assert _run_next(j.pk) == "indeterminate"
    j.refresh_from_db()
    assert j.reason.startswith("permanent error: the customer's card was closed")
    assert "may have happened" in j.reason


def test_the_reaper_reads_the_sticky_answer() -> None:
    """Attempt 2 learns nothing was sent, then its executor vanishes: the reaper must still
    see the effect unsettled (attempts exhausted: indeterminate, not failed)."""
    script_a.extend(["apply_then_timeout"])
    j = idem2.enqueue()
    assert _run_next(j.pk) == "retried"
    _due(j.pk)
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    row = driver().effect_intend(lease, "charge")
    assert driver().effect_settle(lease, row.key, Effect.NOT_APPLIED) == Effect.UNKNOWN
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=30))
    assert reaper.reap_once() == {"reap_park": 1}
    assert Job.objects.get(pk=j.pk).state == "indeterminate"


def test_a_retry_of_an_at_most_once_job_reads_the_other_effects_unknown() -> None:
    """Two effects left unknown; the operator verifies one (by name). The retry sends
    nothing for that one; the other is still unknown, so at most once parks the job again
    instead of retrying it."""
    j = amo_two_effects.enqueue()
    _due(j.pk)
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    for name in ("receipt", "sms"):
        driver().effect_intend(lease, name)
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=30))
    reaper.reap_once()
    j.refresh_from_db()
    assert j.state == "indeterminate"
    operator.operator_action(
        j.pk,
        action="retry",
        expected_version=j.version,
        actor="op",
        reason="no receipt in the outbox",
        verified="not_applied",
        effects=["receipt"],
        accept_in_flight=True,
    )
    assert dict(Effect.objects.filter(job=j).values_list("name", "state")) == {
        "receipt": "not_applied",
        "sms": "unknown",
    }
    assert _run_next(j.pk) == "indeterminate"


def test_jobs_whose_effect_may_have_happened_are_never_pruned() -> None:
    """A failed job with an unknown effect (one failed before these rules, or given up by an
    operator) keeps its record: the question stays open until someone settles it."""
    script_a.extend(["apply_then_timeout"])
    j = idem2.enqueue()
    _run_next(j.pk)
    Job.objects.filter(pk=j.pk).update(
        state="failed", updated_at=timezone.now() - dt.timedelta(days=90)
    )
    assert Effect.objects.get(job_id=j.pk).state == "unknown"
    assert driver().prune_finished("failed", 30 * 24 * 3600.0) == 0
    assert Job.objects.filter(pk=j.pk).exists()


def test_a_job_type_no_longer_registered_is_parked_by_the_executor_and_the_reaper() -> None:
    """Fail closed: without its type there is no policy, reconcile function or fallback
    rule, so nothing is retried or handed over."""
    a = charge_unshared.enqueue()
    b = charge_unshared.enqueue()
    Job.objects.filter(pk__in=[a.pk, b.pk]).update(name="tests.unknown.removed_by_a_deploy")
    assert _run_next(a.pk) == "indeterminate"
    a.refresh_from_db()
    assert "no job type 'tests.unknown.removed_by_a_deploy' is registered" in a.reason
    _due(b.pk)
    driver().claim(executor=EXEC, queues=[Q], job_id=b.pk)
    Job.objects.filter(pk=b.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=30))
    assert reaper.reap_once() == {"reap_park": 1}
    assert Job.objects.get(pk=b.pk).state == "indeterminate"
