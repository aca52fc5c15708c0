"""Operator actions through the write seam: a stated fact before any effect may repeat."""

from __future__ import annotations

import pytest

from scheduler_core import ActionRefused
from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import AuditEntry, Effect, Job
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver
from tests.process import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _failed_with_unsettled_effect() -> Job:
    j = jobs.noop.enqueue()
    [lease] = driver().claim(executor="t:1:a")
    driver().effect_intend(lease, "mark")
    driver().finish(lease, Decision(transition=states.FAIL, reason="permanent"), outcome="failed")
    j.refresh_from_db()
    return j


def test_an_attempt_that_ends_unsuccessfully_marks_its_unsettled_effect_unknown() -> None:
    j = _failed_with_unsettled_effect()
    assert j.state == "failed"
    assert Effect.objects.get(job=j).state == Effect.UNKNOWN


def test_failed_job_with_unknown_effect_needs_a_stated_fact_to_retry() -> None:
    j = _failed_with_unsettled_effect()
    with pytest.raises(ActionRefused, match="verified"):
        operator.operator_action(
            j.pk, action="retry", expected_version=j.version, actor="op", reason="r"
        )
    assert Job.objects.get(pk=j.pk).state == "failed"
    assert AuditEntry.objects.count() == 0
    result = operator.operator_action(
        j.pk,
        action="retry",
        expected_version=j.version,
        actor="op",
        reason="checked the destination",
        verified="not_applied",
    )
    assert result.job.state == "waiting"
    assert Effect.objects.get(job=j).state == Effect.NOT_APPLIED
    assert result.audit.verified == "not_applied"


def test_resolving_as_succeeded_always_needs_verified_applied() -> None:
    j = _failed_with_unsettled_effect()
    with pytest.raises(ActionRefused, match="verified=applied"):
        operator.operator_action(
            j.pk, action="resolve", expected_version=j.version, actor="op", reason="r"
        )
    done = operator.operator_action(
        j.pk,
        action="resolve",
        expected_version=j.version,
        actor="op",
        reason="seen at destination",
        verified="applied",
    )
    assert done.job.state == "succeeded"
    assert Effect.objects.get(job=j).state == Effect.APPLIED


def test_bulk_retry_leaves_out_failed_jobs_whose_effect_outcome_is_unknown() -> None:
    from scheduler_core.read.jobs import JobFilter, bulk_targets

    unknown = _failed_with_unsettled_effect()
    plain = jobs.noop.enqueue()
    [lease] = driver().claim(executor="t:1:b")
    driver().finish(lease, Decision(transition=states.FAIL, reason="permanent"), outcome="failed")
    targets = set(bulk_targets(JobFilter(state="failed"), "retry").values_list("pk", flat=True))
    assert targets == {plain.pk}
    assert unknown.pk not in targets
