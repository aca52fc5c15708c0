"""An operator's verified fact applies to the effects it names, never to every effect of the
job; a "not applied" retry is refused while an earlier owner may still be in flight; effect
keys name one effect in the world (the installation's identity is in them).

Each test fails on the code before: facts then settled every unsettled effect of the job,
a retry never asked about the last owner, and keys were ``tenure-<job id>-<name>``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from scheduler_core import ActionRefused, job
from scheduler_core.domain import keys
from scheduler_core.models import AuditEntry, Effect, EffectEvent, Installation, Job
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import operator, reaper
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db(transaction=True)

Q = "operator-facts"
sent: list[tuple[str, int]] = []


@job(name="tests.facts.mail", queue=Q, effect="at_most_once", lease_seconds=30)
def mail(ctx: Any) -> None:
    with ctx.effect("email") as eff:
        if not eff.done:
            sent.append(("email", ctx.fence))


@job(name="tests.facts.two", queue=Q, effect="at_most_once", lease_seconds=30)
def two(ctx: Any) -> None:
    for name in ("email", "sms"):
        with ctx.effect(name) as eff:
            if not eff.done:
                sent.append((name, ctx.fence))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    sent.clear()


def _park_with_intents(jt: Any, names: tuple[str, ...], executor: str) -> Job:
    """An attempt records its intents, then is paused (its process never ends the attempt);
    its lease runs out and the reaper parks the at-most-once job."""
    j = jt.enqueue()
    [lease] = driver().claim(executor=executor, queues=[Q], job_id=j.pk)
    for name in names:
        driver().effect_intend(lease, name)
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=30))
    reaper.reap_once()
    j.refresh_from_db()
    assert j.state == "indeterminate"
    return j


def _retry(j: Job, **kw: Any) -> operator.ActionResult:
    return operator.operator_action(
        j.pk,
        action="retry",
        expected_version=j.version,
        actor="olivia",
        reason="nothing in the outbox",
        verified="not_applied",
        **kw,
    )


def test_a_not_applied_retry_is_refused_while_the_reaped_owner_may_still_be_in_flight() -> None:
    """The issue's two emails: A recorded its intent and paused before sending; the reaper
    parked the job. A retry would let B send while A, resumed, sends too."""
    driver().executor_started("host:1:paused-a", transport="polling", queues=[Q], concurrency=1)
    j = _park_with_intents(mail, ("email",), "host:1:paused-a")
    [owner] = driver().in_flight_owners(j.pk)
    assert (owner.executor, owner.attempt, owner.fence) == ("host:1:paused-a", 1, 1)
    assert owner.executor_last_seen is not None and owner.reaped_at is not None
    with pytest.raises(ActionRefused, match=r"may still be in flight: host:1:paused-a") as err:
        _retry(j)
    assert "only a destination that checks the fencing token" in str(err.value)
    assert Job.objects.get(pk=j.pk).state == "indeterminate"
    assert Effect.objects.get(job=j).state == "unknown"
    assert AuditEntry.objects.count() == 0
    done = _retry(j, accept_in_flight=True)
    assert done.job.state == "waiting"
    assert done.audit.detail["in_flight_owners"] == ["host:1:paused-a"]
    assert done.audit.detail["accepted_in_flight"] is True


def test_an_owner_that_recorded_its_stop_is_known_gone() -> None:
    driver().executor_started("host:1:stopped-a", transport="polling", queues=[Q], concurrency=1)
    j = _park_with_intents(mail, ("email",), "host:1:stopped-a")
    driver().executor_stopped("host:1:stopped-a")
    assert driver().in_flight_owners(j.pk) == []
    assert _retry(j).audit.detail["in_flight_owners"] == []


def test_a_verified_fact_applies_to_the_effect_it_names_not_to_every_effect() -> None:
    j = _park_with_intents(two, ("email", "sms"), "host:1:gone")
    with pytest.raises(ActionRefused, match=r"2 effects .*\(email, sms\): name the one"):
        _retry(j, accept_in_flight=True)
    with pytest.raises(ActionRefused, match="'fax' of job"):
        _retry(j, accept_in_flight=True, effects=["fax"])
    result = _retry(j, accept_in_flight=True, effects=["email"])
    assert result.audit.detail["effects"] == ["email"]
    states = dict(Effect.objects.filter(job=j).values_list("name", "state"))
    assert states == {"email": "not_applied", "sms": "unknown"}
    [event] = EffectEvent.objects.filter(effect__job=j, event="operator")
    assert (event.effect.name, event.actor, event.state_after) == ("email", "olivia", "not_applied")
    # The retry sends the email again; the sms is still unknown, so at most once parks it.
    Job.objects.filter(pk=j.pk).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    [lease] = driver().claim(executor="t:1:b", queues=[Q], job_id=j.pk)
    assert run_lease(lease) == "indeterminate"
    assert sent == [("email", 2)]


def test_a_resolve_must_settle_every_unknown_effect() -> None:
    j = _park_with_intents(two, ("email", "sms"), "host:1:gone")

    def resolve(*names: str) -> operator.ActionResult:
        return operator.operator_action(
            j.pk,
            action="resolve",
            expected_version=j.version,
            actor="olivia",
            reason="both in the provider's log",
            verified="applied",
            effects=list(names),
        )

    with pytest.raises(ActionRefused, match=r"sms would stay unknown in a succeeded job"):
        resolve("email")
    assert Job.objects.get(pk=j.pk).state == "indeterminate"
    assert resolve("email", "sms").job.state == "succeeded"
    assert set(Effect.objects.filter(job=j).values_list("state", flat=True)) == {"applied"}


def test_effect_keys_carry_the_installation_identity(settings: Any) -> None:
    """Two installations may share one provider: the installation's id makes the key name one
    effect in the world."""
    made = driver().installation_id()
    assert Installation.objects.get(pk=1).key == made  # made once per database, kept there
    j = mail.enqueue()
    [lease] = driver().claim(executor="t:1:k", queues=[Q], job_id=j.pk)
    row = driver().effect_intend(lease, "email")
    created = Job.objects.get(pk=j.pk).created_at
    assert row.key == keys.effect_key(made, j.pk, created, "email")
    settings.TENURE_INSTALLATION_ID = "staging-eu"
    assert driver().effect_key(j.pk, "email") == row.key  # an effect keeps its first key
    other = mail.enqueue()
    other_created = Job.objects.get(pk=other.pk).created_at
    assert driver().effect_key(other.pk, "email") == keys.effect_key(
        "staging-eu", other.pk, other_created, "email"
    )
    assert driver().effect_key(other.pk, "email").startswith("tenure2:staging-eu:")
    settings.TENURE_INSTALLATION_ID = "no spaces allowed"
    with pytest.raises(ValueError, match="installation id"):
        driver().effect_key(other.pk, "email")
