"""The testing mode a host project's suite uses (docs/howto/testing.md): the ``tenure_jobs``
fixture, ``jobs_under_test()`` and ``run_pending()`` run enqueued jobs on the real claim,
fence, ledger and completion path in the test's thread, under a plain ``TestCase``
transaction and under ``transaction=True`` alike. Written as a user's tests would be."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TestCase

from demo.models import LedgerEntry
from scheduler_core import Transient, job, pytest_plugin
from scheduler_core.models import Attempt, Effect, Job
from scheduler_core.testing import (
    assert_enqueued,
    assert_not_enqueued,
    jobs_under_test,
    run_pending,
)

# The fixture, taken where it is used; a project loads it for its whole suite with
# ``pytest_plugins = ["scheduler_core.pytest_plugin"]`` in its top conftest.py.
tenure_jobs = pytest_plugin.tenure_jobs

SENT: list[tuple[str, int, int]] = []


@job(name="shop.send_receipt", effect="idempotent")
def send_receipt(ctx: Any, *, order: int, email: str) -> dict[str, Any]:
    with ctx.effect("mail") as eff:
        SENT.append((email, ctx.fence, order))
        eff.applied(destination_ref=f"msg-{order}")
    return {"sent_to": email}


@job(name="shop.checkout", effect="transactional")
def checkout(ctx: Any, *, order: int) -> None:
    LedgerEntry.objects.create(
        account="shop", cents=100, effect_key=f"order-{order}", job_id=ctx.job_id, fence=ctx.fence
    )
    send_receipt.enqueue(order=order, email=f"o{order}@example.com")


@job(name="shop.flaky", max_attempts=3)
def flaky(ctx: Any) -> None:
    raise Transient("the gateway is down")


MODES = [
    pytest.param(False, marks=pytest.mark.django_db, id="TestCase"),
    pytest.param(True, marks=pytest.mark.django_db(transaction=True), id="transaction"),
]


@pytest.mark.parametrize("transactional", MODES)
def test_a_job_and_the_jobs_it_enqueues_run_on_the_real_path(
    tenure_jobs: Any, transactional: bool
) -> None:
    SENT.clear()
    order = checkout.enqueue(order=7)
    tenure_jobs.assert_enqueued(checkout, order=7)
    tenure_jobs.assert_not_enqueued(send_receipt)

    ran = tenure_jobs.run_pending()

    assert [(r.name, r.outcome) for r in ran] == [
        ("shop.checkout", "succeeded"),
        ("shop.send_receipt", "succeeded"),
    ]
    [receipt] = tenure_jobs.assert_enqueued(send_receipt, order=7, count=1)
    assert Job.objects.get(pk=order.pk).state == "succeeded"
    assert LedgerEntry.objects.filter(job_id=order.pk, fence=1).count() == 1
    # Claimed and fenced by the database, with an attempt row and the effect in the ledger.
    attempt = Attempt.objects.get(job_id=receipt.pk)
    assert (attempt.fence, attempt.outcome) == (1, "succeeded")
    assert ":test-" in attempt.executor
    assert Effect.objects.get(job_id=receipt.pk).state == Effect.APPLIED
    assert SENT == [("o7@example.com", 1, 7)]
    assert receipt.result == {"sent_to": "o7@example.com"}
    assert tenure_jobs.run_pending() == []  # nothing left due


@pytest.mark.parametrize("transactional", MODES)
def test_a_failing_job_is_retried_later_and_its_error_is_reported(
    tenure_jobs: Any, transactional: bool
) -> None:
    j = flaky.enqueue()
    [ran] = tenure_jobs.run_pending()
    assert ran.outcome == "retried"
    assert "Transient: the gateway is down" in ran.error
    row = Job.objects.get(pk=j.pk)
    assert (row.state, row.attempts) == ("waiting", 1)  # its backoff is not over: not due
    assert tenure_jobs.run_pending() == []


@pytest.mark.django_db
def test_assert_enqueued_says_what_was_enqueued_instead(tenure_jobs: Any) -> None:
    send_receipt.enqueue(order=1, email="a@example.com")
    with pytest.raises(AssertionError, match=r"(?s)found 0.*'order': 1"):
        tenure_jobs.assert_enqueued(send_receipt, order=2)
    with pytest.raises(AssertionError, match="expected 2 job"):
        tenure_jobs.assert_enqueued("shop.send_receipt", count=2)
    with pytest.raises(AssertionError, match="expected no job"):
        tenure_jobs.assert_not_enqueued(send_receipt, email="a@example.com")


@pytest.mark.django_db
def test_the_context_manager_sees_only_the_jobs_enqueued_inside_it() -> None:
    send_receipt.enqueue(order=1, email="before@example.com")
    with jobs_under_test() as jobs:
        send_receipt.enqueue(order=2, email="inside@example.com")
        jobs.assert_enqueued(send_receipt, count=1, order=2)
        jobs.assert_not_enqueued(send_receipt, order=1)
    assert_enqueued(send_receipt, count=2)  # the module's functions see every job
    assert [r.outcome for r in run_pending(queues=["default"])] == ["succeeded"] * 2
    assert_not_enqueued(checkout)


class CheckoutTests(TestCase):
    """Django's own ``TestCase``, as a project's ``manage.py test`` suite writes it."""

    databases = "__all__"

    def test_checkout_sends_one_receipt(self) -> None:
        SENT.clear()
        with jobs_under_test() as jobs:
            checkout.enqueue(order=9)
            outcomes = [r.outcome for r in jobs.run_pending()]
            self.assertEqual(outcomes, ["succeeded", "succeeded"])
            jobs.assert_enqueued(send_receipt, count=1, order=9)
        self.assertEqual(SENT, [("o9@example.com", 1, 9)])


@pytest.mark.django_db
def test_a_django_task_runs_too_and_on_commit_work_waits_for_a_commit_or_a_capture(
    tenure_jobs: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from tests.tasks_for_tests import add

    try:
        from django.tasks.signals import task_enqueued
    except ImportError:
        from django_tasks.signals import task_enqueued

    heard: list[str] = []

    def hear(sender: Any, task_result: Any, **_: Any) -> None:
        heard.append(task_result.id)

    task_enqueued.connect(hear)
    try:
        first = add.enqueue(2, 3)
        assert heard == []  # sent once the enqueue commits: in a TestCase, never on its own
        with django_capture_on_commit_callbacks(execute=True):
            second = add.enqueue(4, 5)
        assert heard == [second.id]
    finally:
        task_enqueued.disconnect(hear)
    assert [r.outcome for r in tenure_jobs.run_pending()] == ["succeeded", "succeeded"]
    assert add.get_result(first.id).return_value == 5
    assert add.get_result(second.id).return_value == 9
