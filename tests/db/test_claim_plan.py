"""The claim walks the claim index in order and stops at the first due rows: its cost does not
grow with the backlog. Several queues are claimed in the same global order as one."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from scheduler_core import job, store
from scheduler_core.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

EXEC = "t:1:claim-plan"


@job(name="tests.claimplan.a", queue="plan_a")
def in_a(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


@job(name="tests.claimplan.b", queue="plan_b")
def in_b(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


def _plan(sql: str, params: list[Any]) -> str:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
        transaction.set_rollback(True)
    return plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
@pytest.mark.parametrize("queues", [["plan_a"], ["plan_a", "plan_b"]])
def test_the_claim_reads_the_index_in_order_whatever_the_backlog(queues: list[str]) -> None:
    in_a.enqueue_many([{"n": i} for i in range(5000)])
    in_b.enqueue_many([{"n": i} for i in range(5000)])
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    sql = store._claim_sql("postgresql", by_id=False, nqueues=len(queues))
    params = store._claim_params(executor=EXEC, queues=queues, limit=1, job_id=None)
    plan = _plan(sql, params)
    # A sort of every waiting job (what `queue = ANY(...)` planned) is what this rules out.
    assert "tenure_job_claim" in plan, plan
    assert "Seq Scan on tenure_job" not in plan, plan
    assert "Sort Key: tenure_job.priority" not in plan, plan
    # The completion with the next claim uses the same walk.
    [lease] = store.claim(executor=EXEC, queues=queues, limit=1)
    assert Job.objects.get(pk=lease.job_id).state == "leased"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_claimed_and_completed_rows_are_found_by_key_when_statistics_are_stale() -> None:
    # Statistics taken while every job had succeeded (the usual picture), then a burst of new
    # jobs: the planner believes almost none is waiting, which once made it walk the state
    # index through every waiting job to find the few rows the claim had locked.
    in_b.enqueue_many([{"n": i} for i in range(3000)])
    Job.objects.update(state="succeeded")
    with connection.cursor() as cur:
        cur.execute("ANALYZE tenure_job")
    in_a.enqueue_many([{"n": i} for i in range(3000)])
    [lease] = store.claim(executor=EXEC, queues=["plan_a"], limit=1)
    sql = store._complete_many_sql(1)
    params = [
        *store._claim_params(executor=EXEC, queues=["plan_a"], limit=8, job_id=None),
        *store._complete_params([lease]),
    ]
    plan = _plan(sql, params)
    assert "tenure_job_state" not in plan, plan
    assert "Seq Scan on tenure_job" not in plan, plan
    assert "Index Scan using tenure_job_pkey on tenure_job j" in plan, plan


def test_several_queues_are_claimed_in_one_priority_order() -> None:
    low_a = in_a.enqueue(n=1)
    high_b = in_b.enqueue(n=2, priority=5)
    mid_a = in_a.enqueue(n=3, priority=2)
    low_b = in_b.enqueue(n=4)
    got = store.claim(executor=EXEC, queues=["plan_a", "plan_b"], limit=3)
    # Priority first, then due time and id, across both queues: of the two lowest, the
    # older is taken and the newer left.
    assert [x.job_id for x in got] == [high_b.pk, mid_a.pk, low_a.pk]
    assert Job.objects.get(pk=low_b.pk).state == "waiting"
    [last] = store.claim(executor=EXEC, queues=["plan_b", "plan_a"], limit=3)
    assert last.job_id == low_b.pk


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache")
def test_executor_connections_plan_the_prepared_statements_once() -> None:
    from scheduler_core import executor

    executor.limit_idle_transactions()
    connection.close()
    with connection.cursor() as cur:
        cur.execute("SHOW plan_cache_mode")
        assert cur.fetchone()[0] == "force_generic_plan"
    # The claim then runs on its generic plan: the same index walk.
    in_a.enqueue_many([{"n": i} for i in range(10)])
    for _ in range(7):  # past the five custom plans PostgreSQL would otherwise try first
        [_lease] = store.claim(executor=EXEC, queues=["plan_a"], limit=1)
    assert Job.objects.filter(state="leased").count() == 7
