"""What the system does while the nemesis works: a seeded stream of enqueues, and afterwards
an operator who settles every parked job from the destination's own records.

Every enqueue is logged to ``enqueue.jsonl`` once its outcome is known to the client:
``ack`` (the commit returned: the job must never be lost), ``rolled_back`` (deliberately: the
job and its effects must never appear), or ``unknown`` (the connection failed on the way, so
the commit may or may not have happened; the checker looks the unique key up afterwards).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection, transaction

from scheduler_core.api import registry
from scheduler_core.exceptions import ActionConflict, ActionRefused
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver

from . import truth
from .evidence import (
    ASYNC_SUFFIX,
    BROKER_SUFFIX,
    EFFECTS_OF_TYPE,
    FALLBACK_TYPE,
    MULTI_TYPE,
    OVERRUN_TYPE,
    SNOOZE_TYPE,
    STUBBORN_TYPE,
    UNTIMED_TYPE,
)

CHAOS_TYPES = (
    "chaos.transactional",
    "chaos.idempotent",
    "chaos.reconcilable",
    "chaos.at_least_once",
    "chaos.at_most_once",
)
DEMO_TYPES = (
    "demo.ledger_credit",
    "demo.charge",
    "demo.charge_reconcilable",
    "demo.email",
    "demo.email_at_most_once",
)
"""The demo's own job types, enqueued as they ship (no work time, so rarely hit mid-flight)."""

OPERATOR = "chaos-operator"
HANG_SHARE = 0.03
"""Share of the verifier's jobs whose first attempt hangs past the maximum runtime."""
UNTIMED_HANG_SHARE = 0.5
"""Share of the hung jobs given to ``chaos.untimed``, which declares no maximum runtime: the
installation's default ends them."""

FALLBACK_CASES: tuple[tuple[float, str], ...] = (
    (0.35, "unknown_then_away"),
    (0.15, "unknown_then_gone"),
    (0.25, "away_first"),
    (0.10, "away_first_fallback_unknown"),
    (0.15, "clean"),
)
"""The planned cases of ``chaos.fallback`` jobs and their shares:

* ``unknown_then_away``: the payment provider applies the first attempt's charge and answers
  after the caller's timeout (unknown), then turns the second attempt away (503 or a refused
  connection; nothing sent), then answers again: the sticky unknown outcome must keep the job
  off the fallback, and the third attempt gets the first charge's answer replayed;
* ``unknown_then_gone``: the same, but the provider turns every later attempt away: the job
  must be parked ``indeterminate`` when its attempts run out, never handed over;
* ``away_first``: the first attempt is turned away, nothing was ever sent: the fallback may run
  and charges at the second provider;
* ``away_first_fallback_unknown``: the same, and the second provider applies the fallback's
  charge and times out: parked (neither provider can tell what the other did);
* ``clean``: no planned trouble.
"""
PATH_CASES: tuple[tuple[float, str], ...] = (
    (0.40, MULTI_TYPE),
    (0.20, SNOOZE_TYPE),
    (0.15, OVERRUN_TYPE),
    (0.25, STUBBORN_TYPE),
)
"""The job types that walk the end paths and their shares among them:

* ``chaos.multi`` (reconcilable, two effects: a charge, then its receipt): the first attempt
  loses the charge's reply (40 %), or the receipt's (30 %), or nothing (30 %); reconcile is
  asked per effect and the job must go on to send the receipt;
* ``chaos.snooze`` (idempotent, ``max_age``): the first attempt charges and loses the reply,
  later attempts snooze until ``max_age`` passes: the job must end ``indeterminate``, never
  ``failed``;
* ``chaos.overrun`` (idempotent, one attempt): charges, then runs past its maximum runtime:
  ``indeterminate`` (the charge is applied), never ``failed``;
* ``chaos.stubborn``: works 2-3 leases ignoring ``ctx.cancelled`` (a fifth of them run past
  their maximum runtime on the first attempt); the workload asks each running one to stop, and
  the job must end ``cancelled``.
"""
SCENARIO_CASES = frozenset({"unknown_then_away", "unknown_then_gone"})
"""The cases where the first provider's outcome is unknown and the next attempt sends
nothing (the issue's scenario)."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One planned enqueue."""

    i: int
    name: str
    payload: dict[str, Any]
    key: str
    rollback: bool = False
    delay: float = 0.0


def _fallback_payload(rng: random.Random, i: int, long_job: bool) -> dict[str, Any]:
    """A ``chaos.fallback`` job's payload: one of :data:`FALLBACK_CASES`, drawn from ``rng``."""
    from .job_types import FALLBACK_OPTIONS

    draw = rng.random()
    case = FALLBACK_CASES[-1][1]
    for share, name in FALLBACK_CASES:
        if draw < share:
            case = name
            break
        draw -= share
    payload: dict[str, Any] = {
        "n": i,
        "work": round(rng.uniform(3.0, 8.0) if long_job else rng.uniform(0.0, 1.2), 3),
        "hold": round(rng.uniform(0.0, 0.4), 3),
        "timeout": 1.5,
        "case": case,
        # Turned away by a 503 or by a refused connection, half and half: both say that
        # nothing was sent.
        "refuse": rng.random() < 0.5,
    }
    if case in SCENARIO_CASES:
        payload["slow"] = True
        last = 2 if case == "unknown_then_away" else int(FALLBACK_OPTIONS["max_attempts"])
        payload["a_down"] = list(range(2, last + 1))
    elif case.startswith("away_first"):
        payload["a_down"] = [1]
        if case == "away_first_fallback_unknown":
            payload["b_slow"] = [2]
    return payload


def _path_spec(rng: random.Random, i: int, long_job: bool) -> tuple[str, dict[str, Any]]:
    """One of :data:`PATH_CASES`, drawn from ``rng``: its type and payload."""
    draw = rng.random()
    name = PATH_CASES[-1][1]
    for share, case in PATH_CASES:
        if draw < share:
            name = case
            break
        draw -= share
    work = round(rng.uniform(3.0, 8.0) if long_job else rng.uniform(0.0, 1.2), 3)
    if name == MULTI_TYPE:
        lost = rng.choices(["charge", "receipt", ""], [0.4, 0.3, 0.3])[0]
        hold = round(rng.uniform(0.0, 0.4), 3)
        return name, {"n": i, "work": work, "hold": hold, "timeout": 1.5, "lost": lost}
    if name == STUBBORN_TYPE:
        from .job_types import LEASE

        stubborn_work = round(rng.uniform(2.0 * LEASE, 3.0 * LEASE), 3)
        return name, {"n": i, "work": stubborn_work, "overrun": rng.random() < 0.2}
    return name, {"n": i, "timeout": 1.5}


def plan_job(
    rng: random.Random,
    i: int,
    seed: int,
    long_share: float = 0.12,
    broker_share: float = 0.0,
    fallback_share: float = 0.0,
    async_share: float = 0.0,
    paths_share: float = 0.0,
) -> Spec:
    """The ``i``-th enqueue of run ``seed``: its type, payload and fate, drawn from ``rng``.

    A ``fallback_share`` of the verifier's own jobs are ``chaos.fallback`` (payloads from
    :data:`FALLBACK_CASES`); a ``broker_share`` of the verifier's own job types go to their
    broker twins (the same handler on the queue the Celery workers serve). Half the hung jobs
    are ``chaos.untimed``, which declares no maximum runtime. An ``async_share`` of the other
    jobs of the five types on the broker-less executors' queue go to their ``async def``
    twins. A ``paths_share`` of the verifier's own jobs on that queue walk the end paths
    (:data:`PATH_CASES`)."""
    key = f"chaos:{seed}:{i}"
    rollback = rng.random() < 0.03
    delay = rng.choice([0.0] * 9 + [rng.uniform(0.5, 3.0)])
    if rng.random() < 0.1:
        name = rng.choice(DEMO_TYPES)
        slow = int(rng.random() < 0.2)
        payload: dict[str, Any]
        if name == "demo.ledger_credit":
            payload = {"account": f"demo-{i}", "cents": 100}
        elif name.startswith("demo.email"):
            payload = {"to": f"demo-{i}@example.test", "timeout": 1.5, "slow_reply_attempts": slow}
        else:
            payload = {"invoice_id": i, "cents": 100, "timeout": 1.5, "slow_reply_attempts": slow}
        return Spec(i=i, name=name, payload=payload, key=key, rollback=rollback, delay=delay)
    suffix = BROKER_SUFFIX if broker_share and rng.random() < broker_share else ""
    long_job = rng.random() < long_share
    if not suffix and paths_share and rng.random() < paths_share:
        name, payload = _path_spec(rng, i, long_job)
        return Spec(i=i, name=name, payload=payload, key=key, rollback=rollback, delay=delay)
    if rng.random() < fallback_share:
        payload = _fallback_payload(rng, i, long_job)
        return Spec(
            i=i,
            name=FALLBACK_TYPE + suffix,
            payload=payload,
            key=key,
            rollback=rollback,
            delay=delay,
        )
    name = rng.choice(CHAOS_TYPES)
    payload = {
        "n": i,
        "work": round(rng.uniform(3.0, 8.0) if long_job else rng.uniform(0.0, 1.2), 3),
        "hold": round(rng.uniform(0.0, 0.4), 3),
        "fail_first": rng.choice([0] * 8 + [1, 2]),
        "permanent": rng.random() < 0.03,
        "slow": rng.random() < 0.12,
        "timeout": 1.5,
    }
    if rng.random() < HANG_SHARE:
        payload["hang"] = True
        if rng.random() < UNTIMED_HANG_SHARE:
            name = UNTIMED_TYPE
    if async_share and not suffix and name in CHAOS_TYPES and rng.random() < async_share:
        suffix = ASYNC_SUFFIX
    return Spec(i=i, name=name + suffix, payload=payload, key=key, rollback=rollback, delay=delay)


class _Rollback(Exception):
    """Raised inside the enqueue's transaction to roll it back on purpose."""


WORKFLOW_SEPARATOR = "/"
"""A workflow step's key in the run's logs: the workflow's unique key, this, the step name."""


def plan_workflow(
    rng: random.Random, i: int, seed: int
) -> tuple[str, list[tuple[str, Spec, list[str]]]]:
    """The ``i``-th enqueue as a workflow: its unique key and steps ``(name, spec, parents)``.
    A chain of three, or a fan-out of 2 to 50 steps into one fan-in; steps are short chaos
    jobs, a few failing for good or losing their effect's reply (``slow``)."""
    key = f"chaos:{seed}:{i}"

    def step(n: int) -> Spec:
        payload = {
            "n": i * 1000 + n,
            "work": round(rng.uniform(0.0, 0.3), 3),
            "hold": round(rng.uniform(0.0, 0.1), 3),
            "fail_first": rng.choice([0] * 8 + [1]),
            "permanent": rng.random() < 0.02,
            "slow": rng.random() < 0.08,
            "timeout": 1.5,
        }
        return Spec(i=i, name=rng.choice(CHAOS_TYPES), payload=payload, key=key)

    if rng.random() < 0.5:
        steps = [("s0", step(0), []), ("s1", step(1), ["s0"]), ("s2", step(2), ["s1"])]
    else:
        width = rng.choice([2, 5, 10, 50])
        parts = [(f"p{k}", step(k + 1), ["root"]) for k in range(width)]
        steps = [("root", step(0), []), *parts, ("join", step(width + 1), [n for n, _, _ in parts])]
    return key, steps


def enqueue_workflow(rng: random.Random, i: int, seed: int) -> list[dict[str, Any]]:
    """Enqueue a planned workflow in its own transaction (3 % rolled back on purpose); one log
    line per step, keyed ``<workflow key>/<step>``, with the outcome as the client knows it."""
    from scheduler_core import workflow

    key, steps = plan_workflow(rng, i, seed)
    rollback = rng.random() < 0.03
    on_failure = rng.choice(["cancel", "continue"])
    jobs: dict[str, int] = {}
    status: dict[str, Any]
    try:
        with transaction.atomic():
            wf = workflow("chaos.workflow", unique_key=key, on_failure=on_failure)
            made: dict[str, Any] = {}
            for name, spec, parents in steps:
                made[name] = wf.step(
                    spec.name, name=name, after=[made[p] for p in parents], **spec.payload
                )
            jobs = wf.enqueue().jobs
            if rollback:
                raise _Rollback
        status = {"status": "ack"}
    except _Rollback:
        status = {"status": "rolled_back"}
    except DatabaseError as e:
        connection.close()
        status = {"status": "unknown", "error": f"{type(e).__name__}: {e}"[:300]}
    return [
        {
            "i": i,
            "key": f"{key}{WORKFLOW_SEPARATOR}{name}",
            "name": spec.name,
            "payload": spec.payload,
            "rollback": rollback,
            "delay": 0.0,
            "workflow": key,
            "after": parents,
            "job": jobs.get(name),
            **status,
        }
        for name, spec, parents in steps
    ]


def _log(out: Any, **fields: Any) -> None:
    out.write(json.dumps(fields, sort_keys=True) + "\n")
    out.flush()


def enqueue_one(spec: Spec) -> dict[str, Any]:
    """Enqueue ``spec`` in its own transaction; the outcome as the client knows it."""
    import datetime as dt

    run_at = None
    if spec.delay:
        run_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=spec.delay)
    job_id = None
    try:
        with transaction.atomic():
            job = registry.enqueue(spec.name, spec.payload, unique_key=spec.key, run_at=run_at)
            job_id = job.pk
            if spec.rollback:
                raise _Rollback
    except _Rollback:
        return {"status": "rolled_back", "job": job_id}
    except DatabaseError as e:
        connection.close()
        return {"status": "unknown", "job": job_id, "error": f"{type(e).__name__}: {e}"[:300]}
    return {"status": "ack", "job": job_id}


def run(
    workdir: Path,
    *,
    seed: int,
    seconds: float,
    rate: float,
    long_share: float,
    broker_share: float = 0.0,
    fallback_share: float = 0.0,
    async_share: float = 0.0,
    paths_share: float = 0.0,
    workflow_share: float = 0.0,
) -> int:
    """Enqueue at ``rate`` per second for ``seconds``; returns how many were attempted.

    Uses wall time only to pace itself: the run's clock is the database's.
    """
    rng = random.Random(seed)
    interval = 1.0 / max(rate, 0.1)
    deadline = time.monotonic() + seconds
    i = 0
    next_cancel = time.monotonic()
    with (
        open(workdir / "enqueue.jsonl", "a", encoding="utf-8") as out,
        open(workdir / "cancel.jsonl", "a", encoding="utf-8") as cancels,
    ):
        while time.monotonic() < deadline:
            if workflow_share and rng.random() < workflow_share:
                started = time.time()
                for line in enqueue_workflow(rng, i, seed):
                    _log(out, t=started, took=round(time.time() - started, 3), **line)
                i += 1
                time.sleep(max(0.0, interval - (time.time() - started)))
                continue
            spec = plan_job(
                rng, i, seed, long_share, broker_share, fallback_share, async_share, paths_share
            )
            started = time.time()
            outcome = enqueue_one(spec)
            _log(
                out,
                i=spec.i,
                key=spec.key,
                name=spec.name,
                payload=spec.payload,
                rollback=spec.rollback,
                delay=spec.delay,
                t=started,
                took=round(time.time() - started, 3),
                **outcome,
            )
            # A repeat of an accepted unique key must return the same job and add nothing.
            if outcome["status"] == "ack" and rng.random() < 0.05:
                again = enqueue_one(Spec(**{**asdict(spec), "rollback": False}))
                _log(out, i=spec.i, key=spec.key, repeat=True, t=time.time(), **again)
            i += 1
            if paths_share and time.monotonic() >= next_cancel:
                next_cancel = time.monotonic() + CANCEL_EVERY
                cancel_running(cancels)
            time.sleep(max(0.0, interval - (time.time() - started)))
    return i


CANCEL_EVERY = 1.0
"""Seconds between the workload's looks for running ``chaos.stubborn`` jobs to cancel."""


def cancel_running(out: Any) -> None:
    """Ask every running ``chaos.stubborn`` job to stop (the audited ``cancel_running``), the
    way an operator would from the dashboard; each request and its answer are logged."""
    from scheduler_core.models import Job

    try:
        running = list(
            Job.objects.filter(
                name=STUBBORN_TYPE,
                state="leased",
                cancel_requested_at__isnull=True,
                unique_key__startswith="chaos:",
            ).values_list("pk", "version")
        )
    except DatabaseError:
        connection.close()
        return
    for job_id, version in running:
        try:
            operator.operator_action(
                job_id,
                action="cancel_running",
                expected_version=version,
                actor=OPERATOR,
                reason="the verifier calls the work off",
            )
            result = "requested"
        except (ActionConflict, ActionRefused) as e:
            result = f"refused: {e}"
        except DatabaseError as e:
            connection.close()
            result = f"error: {type(e).__name__}"
        _log(out, job=job_id, result=result, t=time.time())


# ---------------------------------------------------------------------------------------------
# The operator: settle parked jobs from what the destination says
# ---------------------------------------------------------------------------------------------


def operator_pass(workdir: Path) -> dict[str, int]:
    """Settle every indeterminate job of the run (workflow steps included) through the audited
    operator action.

    The operator checks every destination's record of the job's effect keys (the keys its
    ledger rows hold): an effect found is ``resolve`` (verified ``applied``); none found is
    ``retry`` (verified ``not_applied``), or for an idempotent job ``retry`` under the same
    key. A verified fact names the effects it is about: every unsettled one.

    A job of several effects (``chaos.multi``) is resolved only when every effect of its type
    is found at the destination, and retried (``not_applied``) only when no unsettled one is;
    when an unsettled effect is found but another effect was never sent, no operator action
    states "this one applied, perform the rest", so the job is left ``indeterminate`` and the
    log says why. Each decision is logged.
    """
    from django.db.models import Q

    from scheduler_core.models import Effect, Job, WorkflowStep

    counts: dict[str, int] = {}
    # The run's own jobs: those it enqueued by key, and the steps of its workflows (a step has
    # no key of its own: its workflow has). A step settled here lets its children run.
    steps = WorkflowStep.objects.filter(workflow__unique_key__startswith="chaos:")
    ours = Q(unique_key__startswith="chaos:") | Q(pk__in=steps.values("job_id"))
    jobs = list(Job.objects.filter(ours, state="indeterminate"))
    rows = {j.pk: list(Effect.objects.filter(job_id=j.pk).values_list("name", "key")) for j in jobs}
    keys = {pk: [k for _, k in r] for pk, r in rows.items()}
    applied = truth.applied_counts(k for ks in keys.values() for k in ks)
    with open(workdir / "operator.jsonl", "a", encoding="utf-8") as out:
        for j in jobs:
            found = sum(applied[k] for k in keys[j.pk])
            found_by_name = {name: 0 for name in EFFECTS_OF_TYPE.get(j.name, ())}
            for name, k in rows[j.pk]:
                found_by_name[name] = found_by_name.get(name, 0) + applied[k]
            unsettled = [e.name for e in driver().unsettled_effects(j.pk)]
            if len(found_by_name) > 1 and any(found_by_name[u] for u in unsettled):
                if all(found_by_name.values()):
                    action, verified, effects = "resolve", "applied", unsettled
                else:
                    _log(
                        out,
                        job=j.pk,
                        mode=j.effect,
                        found=found,
                        result="left: an unsettled effect was applied, another never sent",
                        reason=j.reason[:300],
                        t=time.time(),
                    )
                    continue
            elif len(found_by_name) > 1:
                action, verified, effects = "retry", "not_applied", unsettled
            elif found:
                action, verified, effects = "resolve", "applied", unsettled
            elif j.effect == "idempotent":
                # Under the same key no fact about the effect is stated, so none is named.
                action, verified, effects = "retry", "same_key", []
            else:
                action, verified, effects = "retry", "not_applied", unsettled
            try:
                operator.operator_action(
                    j.pk,
                    action=action,
                    expected_version=j.version,
                    actor=OPERATOR,
                    reason=f"destination shows {found} effect(s) for {keys[j.pk] or 'no key'}",
                    verified=verified,
                    effects=effects,
                    # A not-applied retry is refused while a reaped owner is not known to have
                    # stopped. The operator acts only after every fault was healed and the
                    # work drained: each such owner was killed (a killed executor never
                    # records its stop) or resumed before the drain began, and a resumed
                    # owner sends at once or has its late intent refused by the fence. None
                    # is still waiting to send, so accepting that is honest here.
                    accept_in_flight=verified == "not_applied",
                )
                result = f"{action}:{verified}"
            except (ActionConflict, ActionRefused) as e:
                result = f"refused: {e}"
            counts[result] = counts.get(result, 0) + 1
            _log(
                out,
                job=j.pk,
                mode=j.effect,
                found=found,
                result=result,
                reason=j.reason[:300],
                t=time.time(),
            )
    return counts
