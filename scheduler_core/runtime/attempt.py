"""One claimed attempt, end to end: the handler (or the reconcile lookup) under the job's
effect mode, its completion or failure decided by the job type's policy
(:mod:`scheduler_core.api.policy`) and written through the storage driver, and the release of
an attempt given up unfinished. Every transport ends here: the broker-less worker, the Celery
and RQ adapters all call :func:`run_lease`."""

from __future__ import annotations

import inspect
import logging
import random
import time
import traceback
from collections.abc import Callable
from typing import Any

import scheduler_core.hooks as hooks
import scheduler_core.tracing as tracing

from ..api import policy, registry
from ..api.results import checked_result
from ..conf import tenure_settings
from ..domain import outcomes, states
from ..domain.classify import FailureClass, PayloadMismatch, classify, retry_after_of
from ..domain.modes import EffectMode
from ..domain.outcomes import Decision, Kind, Reconciliation, Situation
from ..exceptions import JobCancelled, Snooze, StaleAttempt
from ..models import Effect
from ..read import metrics
from ..storage.drivers import driver
from ..storage.records import Failure, Lease
from .completion import NextClaim, complete_read_back
from .context import EffectRef, JobContext, effect_recorded
from .heartbeat import Heartbeater
from .invoke import invoke
from .observe import finished, logged_end, started

log = logging.getLogger("tenure.executor")


def _outcome_label(decision: Decision) -> str:
    target = decision.transition.target
    if target == states.State.WAITING:
        return "retried" if decision.spend_attempt else "snoozed"
    return str(target.value)


def run_lease(
    lease: Lease,
    *,
    heartbeater: Heartbeater | None = None,
    rng: random.Random | None = None,
    next_claim: NextClaim | None = None,
    defer: Callable[[JobContext], bool] | None = None,
) -> str:
    """Run one claimed attempt and record its end through the write seam.

    Returns the attempt's outcome (``succeeded``, ``retried``, ``failed``, ``indeterminate``,
    ``snoozed``, ``cancelled``, ``reconciled`` (every effect in question settled: the job
    resumes) or ``stale``). A refused write stops the attempt; nothing more is written for
    it and the refusal is recorded. With ``next_claim``, a successful attempt's completion
    transaction also claims the executor's next job (see :class:`NextClaim`). With ``defer``,
    a successful attempt of a job that is not ``transactional`` is handed to ``defer`` instead
    of being completed; when it accepts, the outcome is ``deferred``: the caller writes the
    completion later (:mod:`scheduler_core.runtime.chain`) and the attempt stays in ``heartbeater``.
    """
    rng = rng or random.Random()
    ctx = JobContext(lease)
    jt = registry.get(lease.name)
    ctx.sender = jt
    if heartbeater is not None:
        heartbeater.add(ctx)
    began = time.monotonic()
    outcome = ""
    started(ctx, jt)
    try:
        with tracing.current(ctx.span):
            hooks.failpoint("after_claim")
            if jt is None:
                outcome = _park_unregistered(ctx)
            elif lease.kind == outcomes.Kind.RECONCILE:
                outcome = _reconcile(ctx, jt, rng)
            else:
                outcome = _run(ctx, jt, rng, next_claim, defer)
    except StaleAttempt as e:
        metrics.stale_refused(e.write)
        driver().record_stale(e, lease.executor)
        outcome = "stale"
    except BaseException as e:
        tracing.end_attempt(ctx.span, "error", e)
        raise
    finally:
        metrics.attempt_finished(lease.name, time.monotonic() - began)
        # A deferred completion keeps its lease renewed until it is written.
        if heartbeater is not None and outcome != "deferred":
            heartbeater.remove(ctx)
    if outcome != "deferred":
        # Its end has committed (a deferred one's is announced where it is written).
        finished(ctx, jt, outcome)
    return outcome


def _handler(jt: registry.JobType, kind: str) -> Callable[..., Any]:
    """The function an attempt of ``kind`` calls: the fallback for a ``fallback`` attempt."""
    if kind == outcomes.Kind.FALLBACK and jt.fallback is not None:
        return jt.fallback
    return jt.func


def _run(
    ctx: JobContext,
    jt: registry.JobType,
    rng: random.Random,
    nxt: NextClaim | None = None,
    defer: Callable[[JobContext], bool] | None = None,
) -> str:
    lease = ctx.lease
    handler = _handler(jt, lease.kind)
    try:
        try:
            inspect.signature(handler).bind(ctx, **lease.payload)
        except TypeError as e:
            raise PayloadMismatch(str(e)) from None
        if lease.workflow_id is not None and registry.is_async(handler):
            # An async def handler reads no database itself: its parents' results are read
            # before it runs. A plain handler reads them on first use.
            ctx.load_parent_results()
        if jt.effect == EffectMode.TRANSACTIONAL:
            # The handler's writes, its ledger rows and the fenced completion commit together;
            # a refused completion rolls all of them back. Not retried here: the handler's
            # writes would have to be made again, which is the next attempt's job.
            def commit_all() -> None:
                driver().limit_handler_idle(lease)
                ctx.result = checked_result(invoke(handler, ctx, **lease.payload))
                hooks.failpoint("before_complete")
                driver().complete(lease, result=ctx.result)
                if nxt is not None:
                    nxt.claim_in_transaction()

            complete_read_back(lease, commit_all, tries=1)
        else:
            # A value that cannot be kept fails the attempt here, before any completion.
            ctx.result = checked_result(invoke(handler, ctx, **lease.payload))
            hooks.failpoint("before_complete")
            if defer is not None and defer(ctx):
                return "deferred"

            def complete() -> int | None:
                if nxt is not None:
                    return nxt.complete_and_claim(lease, result=ctx.result)
                return driver().complete(lease, result=ctx.result)

            complete_read_back(lease, complete, xid_from_fn=True)
        if nxt is not None:
            nxt.committed()
        return "succeeded"
    except StaleAttempt:
        raise
    except JobCancelled as exc:
        # Raised by the handler (ctx.check_cancelled, a refused effect intent) or by the
        # completion the database refused after an operator's request: either way the
        # request is recorded, and the job ends cancelled.
        return end_cancelled(ctx, exc, rng=rng)
    except Snooze as s:
        if ctx.ambiguous:
            # An effect's outcome became unknown in this attempt: waiting would not settle
            # it, so the mode's rule for an ambiguous outcome applies.
            return _end_with_error(ctx, jt, s, rng)
        decision = outcomes.after_snooze(_situation(ctx, jt), s.seconds, policy=jt.retry_policy)
        driver().finish(lease, decision, outcome=_outcome_label(decision))
        logged_end(
            lease, _outcome_label(decision), decision.transition.target, why=f"snoozed {s.seconds}s"
        )
        return _outcome_label(decision)
    except Exception as exc:
        # EffectsUnsettled (the completion refused while the ledger holds an effect that may
        # or may not have happened) lands here too: an Indeterminate, never a success.
        if ctx.cancelled:
            # Asked to stop, the handler failed on its way out: retrying would run work the
            # operator called off.
            return end_cancelled(ctx, exc, rng=rng)
        return _end_with_error(ctx, jt, exc, rng)


def end_cancelled(ctx: JobContext, exc: BaseException, *, rng: random.Random | None = None) -> str:
    """End ``ctx``'s attempt after an operator's cancel request: the job becomes ``cancelled``
    (fenced, and conditioned on the request being recorded); returns the attempt's outcome.

    Effects this attempt intended and did not settle stay unknown in the ledger; effects
    already applied stay applied. A :class:`~scheduler_core.exceptions.JobCancelled` a handler
    raised with no request recorded is an ordinary failure of the attempt.
    """
    lease = ctx.lease
    # The handler stopped when it raised the cancel, or a refused effect intent did for it;
    # a refused completion means it returned.
    stopped = isinstance(exc, JobCancelled) and exc.write != states.COMPLETE.name
    jt = registry.get(lease.name)
    if jt is None:
        return _park_unregistered(ctx)
    decision = outcomes.after_cancel_request(_situation(ctx, jt), handler_stopped=stopped)
    failure = Failure(
        error_class="",
        error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
    )
    outcome = "cancelled" if decision.transition == states.CANCEL else _outcome_label(decision)
    try:
        driver().finish(lease, decision, outcome=outcome, failure=failure)
    except StaleAttempt:
        if driver().leased_job(lease) is None:
            raise
        # Still this attempt's, so no request was recorded: not a cancel at all.
        return _end_with_error(ctx, jt, exc, rng or random.Random())
    ctx.mark_cancel_requested()
    ctx.error = exc
    logged_end(lease, outcome, decision.transition.target, why="stopped after a cancel request")
    return outcome


def _park_unregistered(ctx: JobContext) -> str:
    """No handler is registered for the job here: fail closed, park it for an operator."""
    decision = outcomes.unregistered(ctx.lease.name)
    failure = Failure(
        error_class="",
        error_type="",
        message=f"no handler registered as {ctx.lease.name!r} in this process",
    )
    driver().finish(ctx.lease, decision, outcome=_outcome_label(decision), failure=failure)
    logged_end(ctx.lease, _outcome_label(decision), decision.transition.target, why=decision.reason)
    return _outcome_label(decision)


def end_with_error(ctx: JobContext, exc: BaseException, *, rng: random.Random | None = None) -> str:
    """End ``ctx``'s attempt as a failure with ``exc`` (classified, then decided by the job's
    policy and effect mode) through the write seam; returns the attempt's outcome.

    For code that runs attempts outside :func:`run_lease` (:mod:`scheduler_core.runtime.chain`, whose
    deferred completion the database may refuse with
    :class:`~scheduler_core.exceptions.EffectsUnsettled`).
    """
    jt = registry.get(ctx.lease.name)
    if jt is None:
        return _park_unregistered(ctx)
    return _end_with_error(ctx, jt, exc, rng or random.Random())


def _end_with_error(
    ctx: JobContext, jt: registry.JobType, exc: BaseException, rng: random.Random
) -> str:
    lease = ctx.lease
    failure_class = classify(
        exc,
        retry_on=jt.retry_on,
        permanent_on=jt.permanent_on,
        in_effect=ctx.ambiguous,
    )
    policy = jt.retry_policy
    situation = _situation(ctx, jt)
    decision = outcomes.after_failure(
        situation,
        failure_class,
        policy=policy,
        rng=rng,
        message=str(exc)[:500],
        retry_after=retry_after_of(exc),
        in_flight_grace=tenure_settings().REAP_GRACE_SECONDS,
    )
    failure = Failure(
        error_class=failure_class.value,
        error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )
    outcome = _outcome_label(decision)
    driver().finish(lease, decision, outcome=outcome, failure=failure)
    ctx.error = exc
    logged_end(
        lease, outcome, decision.transition.target, error=exc, error_class=failure_class.value
    )
    return outcome


def _situation(ctx: JobContext, jt: registry.JobType) -> Situation:
    return policy.situation(jt, ctx.lease, now=driver().now(), ambiguous=ctx.ambiguous)


def _reconcile(ctx: JobContext, jt: registry.JobType, rng: random.Random) -> str:
    """Ask the destination what happened to each effect of unknown outcome, one at a time;
    each answer settles that effect only (a fenced write, kept even if a later lookup fails).
    Then decide: resume the job once every effect is settled, ask again later, or park. Never
    re-run blindly."""
    lease = ctx.lease
    if jt.reconcile is None:
        decision = Decision(
            transition=states.PARK,
            reason="no reconcile function declared: the destination cannot be asked",
        )
        driver().finish(lease, decision, outcome="reconciled_unknown")
        return _outcome_label(decision)
    still: list[str] = []
    worst: tuple[FailureClass, BaseException] | None = None
    rows = driver().unsettled_effects(lease.job_id)
    refs: list[EffectRef | None] = [
        EffectRef(name=row.name, key=row.key, fence=row.fence, state=row.state) for row in rows
    ]
    # With no effect in the ledger to ask about (a handler that reported an ambiguous outcome
    # outside ``ctx.effect``), the function is asked once about the job as a whole.
    whole_job = not refs
    answered: Reconciliation | None = None
    for ref in refs or [None]:
        ctx.check("reconcile")
        name = ref.name if ref else "(the job)"
        try:
            answer = Reconciliation(_ask(jt, ctx, ref))
        except StaleAttempt:
            raise
        except Exception as exc:
            cls = classify(exc, retry_on=jt.retry_on, permanent_on=jt.permanent_on)
            log.warning(
                "job %s: reconcile of effect %s failed (%s): %s", lease.job_id, name, cls, exc
            )
            still.append(name)
            if worst is None or cls == FailureClass.PERMANENT:
                worst = (cls, exc)
            continue
        answered = answer
        if answer == Reconciliation.UNKNOWN:
            still.append(name)
        elif ref is not None and driver().reconciled(lease, answer, name=ref.name):
            effect_recorded(ctx, ref.name, ref.key, _SETTLED[answer])
    error = worst[1] if worst else None
    decision = outcomes.after_reconcile(
        _situation(ctx, jt),
        still_unknown=tuple(still),
        whole_job=answered if whole_job else None,
        failure=worst[0] if worst else None,
        policy=jt.retry_policy,
        rng=rng,
        message=str(error)[:500] if error else "",
        retry_after=retry_after_of(error) if error else None,
    )
    failure = None
    if worst is not None:
        cls, error = worst
        failure = Failure(
            error_class=cls.value,
            error_type=f"{type(error).__module__}.{type(error).__qualname__}",
            message=str(error),
            traceback="".join(traceback.format_exception(error)),
        )
    # The attempt's outcome column holds 20 characters; "reconciled_applied" is the one a
    # completion is accepted under (the job as a whole answered applied).
    if decision.transition == states.COMPLETE:
        outcome = "reconciled_applied"
    else:
        outcome = "reconciled" if not still else "reconciled_unknown"
    driver().finish(lease, decision, outcome=outcome, failure=failure)
    ctx.error = error
    logged_end(
        lease,
        outcome,
        decision.transition.target,
        error=error,
        error_class=worst[0].value if worst else "",
        why=decision.reason,
    )
    if outcome == "reconciled":
        return "reconciled"
    return _outcome_label(decision)


_SETTLED = {
    Reconciliation.APPLIED: Effect.APPLIED,
    Reconciliation.NOT_APPLIED: Effect.NOT_APPLIED,
}
"""The ledger state a reconcile answer settles an effect in."""


def _ask(jt: registry.JobType, ctx: JobContext, ref: EffectRef | None) -> Any:
    """Call the job type's reconcile function about one effect: ``ctx.reconciling`` names it,
    and a function that declares an ``effect`` parameter receives it there too (None: the
    job as a whole, which has no effect in the ledger)."""
    assert jt.reconcile is not None
    ctx.reconciling = ref
    try:
        if jt.reconcile_takes_effect:
            return invoke(jt.reconcile, ctx, effect=ref, **ctx.lease.payload)
        return invoke(jt.reconcile, ctx, **ctx.lease.payload)
    finally:
        ctx.reconciling = None


def release(lease: Lease, *, why: str = "executor shutting down") -> None:
    """Give an unfinished attempt back (graceful shutdown), fenced.

    With no unsettled effect the job waits again at once and the attempt is not spent; with
    one, the mode's rule for an ambiguous outcome applies, as it would after lease expiry (a
    job whose type is not registered here is parked).
    """
    d = driver()
    job = d.leased_job(lease)
    if job is None:
        raise StaleAttempt(lease.job_id, lease.fence, states.RELEASE.name)
    now = d.now()
    jt = registry.get(lease.name)
    cancel_requested = job.cancel_requested_at is not None
    if (
        jt is not None
        and not cancel_requested
        and not policy.situation(jt, lease, now=now).unsettled_effect
    ):
        decision = Decision(
            transition=states.RELEASE, reason=why, spend_attempt=False, next_kind=Kind(lease.kind)
        )
    else:
        # A live executor gives the attempt up: a request it sent may still be in flight. A
        # job an operator asked to stop is not handed back to run again.
        decision = policy.abandoned(
            lease,
            now=now,
            why=why,
            rng=random.Random(),
            in_flight_grace=tenure_settings().REAP_GRACE_SECONDS,
            cancel_requested=cancel_requested,
        )
    d.finish(lease, decision, outcome="released")
