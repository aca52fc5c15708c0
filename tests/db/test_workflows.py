"""Workflows on the real database (SQLite and PostgreSQL): a step is claimable only once every
parent has succeeded, and its release is part of the parent's fenced completion — a stale
completion releases nothing; a failed step calls off its dependents; an indeterminate step
holds them until an operator states a verified fact. Each test fails on the code before
workflows existed (no ``scheduler_core.workflow``)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.db import transaction

from scheduler_core import Permanent, job, workflow
from scheduler_core.domain.workflows import BLOCKED_AT, WAITING_FOR_PARENTS
from scheduler_core.exceptions import EnqueueError, StaleAttempt
from scheduler_core.models import Job, Workflow, WorkflowEdge, WorkflowStep
from scheduler_core.read import liveness
from scheduler_core.runtime.attempt import run_lease
from scheduler_core.services import operator, reaper
from scheduler_core.storage import pg_statements
from scheduler_core.storage.drivers import driver
from scheduler_core.storage.records import Lease

pytestmark = pytest.mark.django_db(transaction=True)

Q = "workflows"
EXEC = "t:1:workflows"
ran: list[tuple[str, Any]] = []
fail_on: set[str] = set()


@job(name="tests.wf.step", queue=Q, effect="at_least_once", max_attempts=1)
def step(ctx: Any, *, label: str) -> dict[str, Any]:
    ran.append((label, dict(ctx.parent_results)))
    if label in fail_on:
        raise Permanent(f"{label} fails")
    return {"label": label, "workflow": ctx.workflow_id}


@job(name="tests.wf.again", queue=Q, effect="at_least_once", max_attempts=3)
def again(ctx: Any, *, label: str) -> None:
    ran.append((label, {}))


@job(name="tests.wf.send", queue=Q, effect="at_most_once", max_attempts=3)
def send(ctx: Any, *, label: str) -> None:
    ran.append((label, {}))
    with ctx.effect("mail"):
        raise TimeoutError("sent; the reply was lost")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ran.clear()
    fail_on.clear()


def _claim() -> list[Lease]:
    return driver().claim(executor=EXEC, queues=[Q], limit=50)


def _run_all() -> list[str]:
    """Claim and run whatever is due, round after round, until nothing is: the labels run."""
    while True:
        leases = _claim()
        if not leases:
            return [label for label, _ in ran]
        for lease in leases:
            run_lease(lease)


def _state(job_id: int) -> str:
    return str(Job.objects.get(pk=job_id).state)


def _diamond(on_failure: str = "cancel", root: Any = step) -> Any:
    wf = workflow("order.fulfil", on_failure=on_failure)
    a = wf.step(root, name="charge", label="charge")
    b = wf.step(step, name="ship", after=[a], label="ship")
    c = wf.step(step, name="email", after=[a], label="email")
    wf.step(step, name="close", after=[b, c], label="close")
    return wf.enqueue()


def test_a_step_is_claimable_only_after_every_parent_succeeded() -> None:
    run = _diamond()
    # Only the root is due: its children wait, not due, whatever the claim asks for.
    [lease] = _claim()
    assert lease.job_id == run.jobs["charge"] and lease.workflow_id == run.id
    assert Job.objects.get(pk=run.jobs["ship"]).run_at == BLOCKED_AT
    assert _claim() == []
    run_lease(lease)
    middle = _claim()
    assert sorted(x.job_id for x in middle) == sorted([run.jobs["ship"], run.jobs["email"]])
    # The fan-in waits for both parents: one is not enough.
    run_lease(middle[0])
    assert _claim() == []
    run_lease(middle[1])
    [last] = _claim()
    assert last.job_id == run.jobs["close"]
    run_lease(last)
    assert {_state(j) for j in run.jobs.values()} == {"succeeded"}
    assert ran[0][0] == "charge" and ran[-1][0] == "close"


def test_parents_results_reach_the_child() -> None:
    run = _diamond()
    _run_all()
    close = dict(ran)["close"]
    assert close == {
        "ship": {"label": "ship", "workflow": run.id},
        "email": {"label": "email", "workflow": run.id},
    }
    assert dict(ran)["charge"] == {}


def _taken_over(first: Lease) -> Lease:
    """``first``'s lease runs out, the reaper puts its step back, and a second owner claims it
    under a higher fence: the second owner's lease."""
    Job.objects.filter(pk=first.job_id).update(
        lease_expires_at=driver().now() - dt.timedelta(seconds=60)
    )
    reaper.reap_once()
    Job.objects.filter(pk=first.job_id).update(run_at=driver().now() - dt.timedelta(seconds=1))
    [second] = driver().claim(executor=EXEC, queues=[Q], job_id=first.job_id)
    return second


def test_a_stale_completion_releases_nothing() -> None:
    run = _diamond(root=again)
    [first] = _claim()
    second = _taken_over(first)
    assert second.fence == first.fence + 1
    with pytest.raises(StaleAttempt):
        driver().complete(first)
    # Refused: no child was released, none is claimable.
    assert Job.objects.get(pk=run.jobs["ship"]).run_at == BLOCKED_AT
    assert WorkflowStep.objects.get(job_id=run.jobs["ship"]).pending == 1
    assert _claim() == []
    driver().complete(second)
    assert sorted(x.job_id for x in _claim()) == sorted([run.jobs["ship"], run.jobs["email"]])


def test_a_stale_completion_with_the_next_claim_releases_nothing() -> None:
    run = _diamond(root=again)
    [first] = _claim()
    second = _taken_over(first)
    with transaction.atomic(using=driver().alias):
        _, matched, got = driver().complete_many_and_claim(
            [first], executor=EXEC, queues=[Q], limit=5
        )
    assert matched == set() and got == []
    assert Job.objects.get(pk=run.jobs["email"]).run_at == BLOCKED_AT
    with transaction.atomic(using=driver().alias):
        _, matched, _ = driver().complete_many_and_claim(
            [second], executor=EXEC, queues=[Q], limit=0
        )
    assert matched == {second.job_id}
    assert len(_claim()) == 2


def test_a_failed_step_cancels_the_steps_not_yet_run() -> None:
    fail_on.add("ship")
    run = _diamond()
    _run_all()
    assert _state(run.jobs["ship"]) == "failed"
    close = Job.objects.get(pk=run.jobs["close"])
    assert close.state == "cancelled" and close.reason == "upstream failed: ship"
    assert "close" not in [label for label, _ in ran]


def test_continue_runs_the_branches_that_can() -> None:
    fail_on.add("left")
    wf = workflow("two.branches", on_failure="continue")
    root = wf.step(step, name="root", label="root")
    left = wf.step(step, name="left", after=[root], label="left")
    wf.step(step, name="left.after", after=[left], label="left.after")
    right = wf.step(step, name="right", after=[root], label="right")
    wf.step(step, name="right.after", after=[right], label="right.after")
    run = wf.enqueue()
    labels = _run_all()
    assert "right.after" in labels and "left.after" not in labels
    after = Job.objects.get(pk=run.jobs["left.after"])
    assert after.state == "cancelled" and after.reason == "upstream failed: left"
    assert _state(run.jobs["right.after"]) == "succeeded"


def test_the_default_policy_cancels_the_other_branches_not_yet_run() -> None:
    fail_on.add("left")
    wf = workflow("two.branches")
    root = wf.step(step, name="root", label="root")
    wf.step(step, name="left", after=[root], label="left")
    right = wf.step(step, name="right", after=[root], label="right")
    wf.step(step, name="right.after", after=[right], label="right.after")
    run = wf.enqueue()
    run_lease(_claim()[0])
    # Run the failing branch alone: the other one, due but not yet run, is called off.
    [lease] = driver().claim(executor=EXEC, queues=[Q], job_id=run.jobs["left"])
    run_lease(lease)
    for name in ("right", "right.after"):
        j = Job.objects.get(pk=run.jobs[name])
        assert (j.state, j.reason) == ("cancelled", "upstream failed: left")
    assert _claim() == []


def test_an_indeterminate_step_holds_its_dependents_until_resolved_applied() -> None:
    wf = workflow("mail.then.log")
    m = wf.step(send, name="mail", label="mail")
    wf.step(step, name="log", after=[m], label="log")
    run = wf.enqueue()
    [lease] = _claim()
    assert run_lease(lease) == "indeterminate"
    held = Job.objects.get(pk=run.jobs["log"])
    assert held.state == "waiting" and held.run_at == BLOCKED_AT
    assert held.reason == "held by an unknown outcome: step mail is indeterminate"
    assert driver().held_steps() == 1
    reasons = {r.key: r.text for r in liveness.assess(executors=[], pressure=None).reasons}
    assert "1 workflow step held by an unknown outcome" in reasons["held_steps"]
    assert _claim() == []
    parked = Job.objects.get(pk=run.jobs["mail"])
    operator.operator_action(
        parked.pk,
        action="resolve",
        expected_version=parked.version,
        actor="olivia",
        reason="the mail is in the recipient's inbox",
        verified="applied",
    )
    assert driver().held_steps() == 0
    assert _run_all() == ["mail", "log"]
    assert _state(run.jobs["log"]) == "succeeded"


def test_not_applied_lets_the_indeterminate_step_be_retried_and_keeps_dependents_waiting() -> None:
    wf = workflow("mail.then.log")
    m = wf.step(send, name="mail", label="mail")
    wf.step(step, name="log", after=[m], label="log")
    run = wf.enqueue()
    run_lease(_claim()[0])
    parked = Job.objects.get(pk=run.jobs["mail"])
    operator.operator_action(
        parked.pk,
        action="retry",
        expected_version=parked.version,
        actor="olivia",
        reason="nothing in the outbox",
        verified="not_applied",
    )
    log_job = Job.objects.get(pk=run.jobs["log"])
    assert log_job.run_at == BLOCKED_AT and "held" not in log_job.reason
    [again] = _claim()
    assert again.job_id == run.jobs["mail"]  # the step runs again; its dependent still waits


def test_an_operators_retry_of_a_failed_step_brings_back_the_steps_it_called_off() -> None:
    fail_on.add("ship")
    run = _diamond()
    _run_all()
    assert _state(run.jobs["close"]) == "cancelled"
    fail_on.clear()
    failed = Job.objects.get(pk=run.jobs["ship"])
    operator.operator_action(
        failed.pk,
        action="retry",
        expected_version=failed.version,
        actor="olivia",
        reason="the warehouse is back",
    )
    close = Job.objects.get(pk=run.jobs["close"])
    assert (close.state, close.run_at) == ("waiting", BLOCKED_AT)
    _run_all()
    assert {_state(j) for j in run.jobs.values()} == {"succeeded"}


def test_enqueue_joins_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=driver().alias):
        _diamond()
        raise RuntimeError("the caller rolls back")
    assert not Workflow.objects.exists() and not Job.objects.filter(queue=Q).exists()


def test_a_unique_key_enqueues_a_workflow_once() -> None:
    def build() -> Any:
        wf = workflow("order.fulfil", unique_key="order-7")
        a = wf.step(step, name="charge", label="charge")
        wf.step(step, name="ship", after=[a], label="ship")
        return wf.enqueue()

    first, second = build(), build()
    assert first.created and not second.created
    assert first.id == second.id and first.jobs == second.jobs
    assert Job.objects.filter(queue=Q).count() == 2


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda wf: [wf.step(step, label="x"), wf.step(step, label="y")], "two steps are named"),
        (lambda wf: wf.step(step, wrong=1), "payload does not fit"),
        (lambda wf: wf.step("tests.wf.nope"), "no job is registered"),
        (
            lambda wf: wf.step(step, after=[workflow("other").step(step, label="x")], label="y"),
            "same workflow",
        ),
        (lambda wf: None, "at least one step"),
    ],
)
def test_bad_workflows_are_refused_and_write_nothing(build: Any, message: str) -> None:
    wf = workflow("bad")
    with pytest.raises((EnqueueError, Exception), match=message):
        build(wf)
        wf.enqueue()
    assert not Workflow.objects.exists() and not Job.objects.filter(queue=Q).exists()


def test_map_fans_out_and_the_fan_in_sees_every_result() -> None:
    wf = workflow("fan")
    root = wf.step(step, name="root", label="root")
    parts = wf.map(step, [{"label": f"part{i}"} for i in range(10)], after=[root], name="part")
    wf.step(step, name="join", after=parts, label="join")
    run = wf.enqueue()
    _run_all()
    join = dict(ran)["join"]
    assert sorted(join) == sorted(f"part[{i}]" for i in range(10))
    assert join["part[3]"] == {"label": "part3", "workflow": run.id}


@job(name="tests.wf.starter", queue=Q, effect="transactional", max_attempts=3)
def starter(ctx: Any, *, order: int) -> None:
    """Starts a workflow: a transactional job, so the workflow's enqueue commits with this
    job's fenced completion, and a refused completion enqueues nothing."""
    wf = workflow("order.fulfil", unique_key=f"order-{order}:started-by-{ctx.job_id}")
    a = wf.step(step, name="charge", label=f"charge {order}")
    wf.step(step, name="ship", after=[a], label=f"ship {order}")
    wf.enqueue()


def test_a_refused_starter_completion_starts_no_workflow() -> None:
    j = starter.enqueue(order=7)
    [first] = _claim()
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=60))
    reaper.reap_once()
    Job.objects.filter(pk=j.pk).update(run_at=driver().now() - dt.timedelta(seconds=1))
    [second] = driver().claim(executor=EXEC, queues=[Q], job_id=j.pk)
    assert run_lease(first) == "stale"
    assert not Workflow.objects.exists()
    assert run_lease(second) == "succeeded"
    [wf] = Workflow.objects.all()
    assert wf.unique_key == f"order-7:started-by-{j.pk}"
    assert _run_all() == ["charge 7", "ship 7"]


def test_a_schedule_starts_a_workflow_once_per_occurrence() -> None:
    from scheduler_core.services import scheduling

    t0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    scheduling.create_schedule(
        now=t0 - dt.timedelta(seconds=30),
        name="orders-every-minute",
        job_name="tests.wf.starter",
        cron="* * * * *",
        payload={"order": 8},
    )
    assert scheduling.fire_due(now=t0) == 1
    assert scheduling.fire_due(now=t0) == 0  # the occurrence is one job, so one workflow
    # Due now rather than in 2030 (a test's shortcut: no wake-up says so, so the claims'
    # floors, which the occurrence's own wake-up set, are dropped).
    # A second back: the claim compares with the database clock at its own precision.
    Job.objects.filter(name="tests.wf.starter").update(
        run_at=driver().now() - dt.timedelta(seconds=1)
    )
    driver().forget_floors()
    assert _run_all() == ["charge 8", "ship 8"]
    assert Workflow.objects.count() == 1


def test_retention_keeps_a_parent_until_its_children_have_run() -> None:
    run = _diamond()
    [root] = _claim()
    run_lease(root)
    ship = driver().claim(executor=EXEC, queues=[Q], job_id=run.jobs["ship"])[0]
    run_lease(ship)
    time.sleep(0.05)
    # email waits on charge, close on ship (and email): neither parent is pruned yet.
    assert driver().prune_finished("succeeded", 0.01) == 0
    _run_all()
    time.sleep(0.05)
    assert driver().prune_finished("succeeded", 0.01) == 4
    assert not WorkflowStep.objects.exists() and not WorkflowEdge.objects.exists()


@job(name="tests.wf.word", queue=Q, effect="at_least_once", max_attempts=1)
def word(ctx: Any, *, text: str) -> Any:
    ran.append((text, dict(ctx.parent_results)))
    return text if text != "none" else None


def test_parent_results_keep_each_json_value_as_returned() -> None:
    wf = workflow("words")
    a = wf.step(word, name="s", text="17")
    b = wf.step(word, name="n", text="none")
    wf.step(word, name="last", after=[a, b], text="last")
    wf.enqueue()
    _run_all()
    assert dict(ran)["last"] == {"s": "17", "n": None}


@job(name="tests.wf.async_step", queue=Q, effect="at_least_once", max_attempts=1)
async def async_step(ctx: Any, *, label: str) -> dict[str, Any]:
    """An async def step: its parents' results were read before it ran (no database here)."""
    ran.append((label, dict(ctx.parent_results)))
    return {"label": label}


def test_an_async_step_sees_its_parents_results() -> None:
    wf = workflow("async")
    a = wf.step(async_step, name="first", label="first")
    wf.step(async_step, name="second", after=[a], label="second")
    wf.enqueue()
    _run_all()
    assert dict(ran)["second"] == {"first": {"label": "first"}}


def _fan(name: str = "fan") -> Any:
    """A chain of 3 whose last fans out to 10 steps joined by one fan-in (bench/workflows.py)."""
    wf = workflow(name)
    a = wf.step(step, name="a", label="a")
    b = wf.step(step, name="b", after=[a], label="b")
    c = wf.step(step, name="c", after=[b], label="c")
    parts = wf.map(step, [{"label": f"part{i}"} for i in range(10)], after=[c], name="part")
    wf.step(step, name="join", after=parts, label="join")
    return wf


@pytest.mark.postgres
def test_a_workflows_enqueue_is_two_statements_on_postgresql() -> None:
    """The workflow row, then every job, spec, step row and edge in one statement: no
    savepoint, no insert per group of steps, no update of the blocked steps' reason (on the
    code before: 15 statements for this workflow)."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    conn = connections[driver().alias]
    wf = _fan()
    with transaction.atomic(using=driver().alias), CaptureQueriesContext(conn) as seen:
        run = wf.enqueue()
    statements = [q["sql"].split()[0] for q in seen.captured_queries]
    assert statements == ["INSERT", "WITH"], statements
    steps = {s.name: s for s in WorkflowStep.objects.filter(workflow_id=run.id)}
    assert {n: s.job_id for n, s in steps.items()} == run.jobs
    assert steps["a"].pending == 0 and steps["c"].pending == 1 and steps["join"].pending == 10
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=run.jobs.values())}
    assert jobs[run.jobs["a"]].run_at < BLOCKED_AT and jobs[run.jobs["a"]].reason == ""
    assert all(
        jobs[run.jobs[n]].run_at == BLOCKED_AT and jobs[run.jobs[n]].reason == WAITING_FOR_PARENTS
        for n in run.jobs
        if n != "a"
    )
    edges = set(
        WorkflowEdge.objects.filter(workflow_id=run.id).values_list("parent_id", "child_id")
    )
    assert len(edges) == 2 + 10 + 10
    assert (run.jobs["c"], run.jobs["part[4]"]) in edges
    assert (run.jobs["part[9]"], run.jobs["join"]) in edges
    assert all(
        j.spec.workflow_id == run.id
        for j in Job.objects.filter(pk__in=run.jobs.values()).select_related("spec")
    )


@pytest.mark.postgres
def test_a_completion_its_release_and_the_children_it_makes_due_are_one_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On PostgreSQL a step's completion counts it off its children and makes due those it
    brings to zero in the completion's own statement, with the next claim (three statements
    on the code before: the completion, the release, the children made due; then two; two
    here on the code of 2026-12-07). Every statement sent to the server is counted, the
    driver's prepared ones too."""
    import psycopg

    run = _fan().enqueue()
    _run_all_until("c")
    parts = sorted(
        (x for x in _claim() if x.payload["label"].startswith("part")), key=lambda x: x.job_id
    )
    assert len(parts) == 10
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        # The connection's periodic re-planning (DISCARD PLANS) may come before any statement.
        if str(query) != pg_statements.DISCARD_PLANS:
            sent.append(str(query).split()[0])
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    with transaction.atomic(using=driver().alias):
        _, first, _ = driver().complete_many_and_claim(
            parts[:9], executor=EXEC, queues=[Q], limit=5
        )
    assert sent == ["WITH"]
    monkeypatch.undo()
    assert Job.objects.get(pk=run.jobs["join"]).run_at == BLOCKED_AT
    sent.clear()
    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    with transaction.atomic(using=driver().alias):
        _, last, got = driver().complete_many_and_claim(
            parts[9:], executor=EXEC, queues=[Q], limit=5
        )
        assert sent == ["WITH"]
    # Once committed, the wake-up for the step made due, in a transaction of its own.
    assert sent == ["WITH", "SELECT"]
    monkeypatch.undo()
    assert len(first) == 9 and len(last) == 1 and got == []
    join = Job.objects.get(pk=run.jobs["join"])
    assert join.run_at < BLOCKED_AT and join.reason == ""
    assert WorkflowStep.objects.get(job_id=run.jobs["join"]).pending == 0
    assert [x.job_id for x in _claim()] == [run.jobs["join"]]


def test_in_one_write_of_several_completions_only_the_matched_ones_release() -> None:
    """A batch holding a stale step's completion and a current one's: the current one
    releases its children, the stale one releases none (the release reads the completions
    the fence let through, not the leases sent)."""
    stale_run = _diamond(root=again)
    [first] = _claim()
    second = _taken_over(first)
    live_run = _diamond()
    [live] = _claim()
    assert live.job_id == live_run.jobs["charge"]
    with transaction.atomic(using=driver().alias):
        _, matched, _ = driver().complete_many_and_claim(
            [first, live], executor=EXEC, queues=[Q], limit=0
        )
    assert matched == {live.job_id}
    for name in ("ship", "email"):
        assert Job.objects.get(pk=stale_run.jobs[name]).run_at == BLOCKED_AT
        assert WorkflowStep.objects.get(job_id=stale_run.jobs[name]).pending == 1
        assert Job.objects.get(pk=live_run.jobs[name]).run_at < BLOCKED_AT
    assert sorted(x.job_id for x in _claim()) == sorted(
        [live_run.jobs["ship"], live_run.jobs["email"]]
    )
    driver().complete(second)
    assert len(_claim()) == 2


def _run_all_until(label: str) -> None:
    """Claim and run due steps until the one labelled ``label`` has run."""
    while label not in [x for x, _ in ran]:
        leases = _claim()
        assert leases, f"{label} never became due"
        for lease in leases:
            if lease.payload.get("label", "").startswith("part"):
                continue
            run_lease(lease)
