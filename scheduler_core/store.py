"""The write seam: every write of a job's state, fence and lease happens here.

Each function names a transition from :mod:`scheduler_core.states`; the transition's source
states become the write's ``WHERE state IN (...)`` guard, and every write made on behalf of an
attempt also carries ``fence = <the attempt's fence>``. A write that matches no row raises
:class:`~scheduler_core.exceptions.StaleAttempt` (the caller stops and records the refusal
with :func:`record_stale`); nothing is ever read and then written unconditionally.

Lease times come from the database's clock (:mod:`scheduler_core.dbclock`), never a worker's.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q

from . import conf, outcomes, states
from .dbclock import DbNow, now_sql, to_datetime
from .exceptions import ActionConflict, ActionRefused, StaleAttempt
from .models import Attempt, AuditEntry, Effect, Executor, Job, StaleWrite
from .modes import EffectMode
from .outcomes import Decision, Kind, Situation
from .retry import RetryPolicy

log = logging.getLogger("tenure.store")

DB = "default"


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a claim grants: the right to act for one attempt of one job, until it expires."""

    job_id: int
    fence: int
    attempt: int
    attempt_id: int
    kind: str
    name: str
    queue: str
    payload: dict[str, Any]
    lease_seconds: int
    effect: str
    max_attempts: int
    created_at: datetime
    executor: str


def new_executor_id(kind: str = "exec") -> str:
    """A unique executor identity: ``host:pid:uuid``."""
    import os

    return f"{socket.gethostname()}:{os.getpid()}:{kind}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------------------------
# Claim
# ---------------------------------------------------------------------------------------------

_CLAIM_SET = """
    state = 'leased', fence = {t}fence + 1, attempts = {t}attempts + 1, lease_owner = %s,
    lease_expires_at = {expiry}, heartbeat_at = {now}, updated_at = {now},
    version = {t}version + 1
"""
_RETURNING = (
    "id, fence, attempts, next_kind, name, queue, payload, lease_seconds, effect, "
    "max_attempts, created_at"
)


def _claim_sql(vendor: str, *, by_id: bool, nqueues: int) -> str:
    now = now_sql(vendor)
    if vendor == "postgresql":
        where = "id = %s" if by_id else "queue = ANY(%s)"
        return f"""
        WITH cand AS (
            SELECT id FROM tenure_job
            WHERE state = 'waiting' AND {where} AND run_at <= {now}
            ORDER BY priority DESC, run_at, id
            LIMIT %s
            FOR UPDATE SKIP LOCKED
        )
        UPDATE tenure_job AS j SET {
            _CLAIM_SET.format(
                t="j.", now=now, expiry=f"{now} + make_interval(secs => j.lease_seconds)"
            )
        }
        FROM cand WHERE j.id = cand.id AND j.state = 'waiting'
        RETURNING {", ".join("j." + c.strip() for c in _RETURNING.split(","))}
        """
    # SQLite: the transaction began IMMEDIATE, so it holds the write lock from its first
    # statement; the conditional UPDATE below is still the single ownership decision.
    expiry = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || lease_seconds || ' seconds')"
    where = "id = %s" if by_id else f"queue IN ({', '.join(['%s'] * nqueues)})"
    return f"""
    UPDATE tenure_job SET {_CLAIM_SET.format(t="", now=now, expiry=expiry)}
    WHERE state = 'waiting' AND id IN (
        SELECT id FROM tenure_job
        WHERE state = 'waiting' AND {where} AND run_at <= {now}
        ORDER BY priority DESC, run_at, id
        LIMIT %s
    )
    RETURNING {_RETURNING}
    """


def claim(
    *,
    executor: str,
    queues: Sequence[str] = ("default",),
    limit: int = 1,
    job_id: int | None = None,
) -> list[Lease]:
    """Claim up to ``limit`` due waiting jobs (or exactly ``job_id``) in one statement.

    Each claimed job's fence grows by one and its lease runs from the database's clock; an
    Attempt row is written in the same transaction. Jobs locked by another claimer are skipped
    (PostgreSQL ``FOR UPDATE SKIP LOCKED``); on SQLite the write lock serialises claims.
    """
    if limit < 1:
        return []
    conn = connections[DB]
    vendor = conn.vendor
    by_id = job_id is not None
    sql = _claim_sql(vendor, by_id=by_id, nqueues=len(queues))
    where: list[Any] = (
        [job_id] if by_id else [list(queues)] if vendor == "postgresql" else [*queues]
    )
    # Placeholders in text order: PostgreSQL's CTE comes before the SET, SQLite's after it.
    if vendor == "postgresql":
        params = [*where, limit, executor]
    else:
        params = [executor, *where, limit]
    with transaction.atomic(using=DB), conn.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        marks = ", ".join(["%s"] * len(ids))
        cur.execute(
            f"""
            INSERT INTO tenure_attempt (job_id, number, fence, kind, executor, claimed_at,
                lease_expires_at, heartbeat_at, outcome, error_class, error_type, message,
                traceback)
            SELECT id, attempts, fence, next_kind, lease_owner, heartbeat_at, lease_expires_at,
                heartbeat_at, '', '', '', '', ''
            FROM tenure_job WHERE id IN ({marks})
            RETURNING id, job_id
            """,
            ids,
        )
        attempt_ids = {job: att for att, job in cur.fetchall()}
    leases = []
    for r in rows:
        payload = json.loads(r[6]) if isinstance(r[6], str | bytes) else r[6]
        leases.append(
            Lease(
                job_id=r[0],
                fence=r[1],
                attempt=r[2],
                attempt_id=attempt_ids[r[0]],
                kind=r[3],
                name=r[4],
                queue=r[5],
                payload=payload,
                lease_seconds=r[7],
                effect=r[8],
                max_attempts=r[9],
                created_at=to_datetime(r[10]),
                executor=executor,
            )
        )
    return leases


# ---------------------------------------------------------------------------------------------
# Fenced writes on behalf of an attempt
# ---------------------------------------------------------------------------------------------


def _mine(lease: Lease, transition: states.Transition | None = None) -> Any:
    """The job row, only while it is still ``lease``'s: the guard of every attempt write.

    ``transition`` (default: any write that keeps the job leased) supplies the source states.
    """
    sources = transition.sources if transition else {states.State.LEASED}
    qs = Job.objects.using(DB).filter(pk=lease.job_id, state__in=list(sources))
    if not conf.get().TEST_DISABLE_FENCE:
        qs = qs.filter(fence=lease.fence)
    return qs


def heartbeat(lease: Lease) -> bool:
    """Extend the lease by ``lease_seconds`` from the database's now.

    Raises :class:`StaleAttempt` when the job is no longer leased under this fence.
    """
    with transaction.atomic(using=DB):
        n = _mine(lease).update(lease_expires_at=DbNow(lease.lease_seconds), heartbeat_at=DbNow())
        if n != 1:
            raise StaleAttempt(lease.job_id, lease.fence, "heartbeat")
        Attempt.objects.using(DB).filter(pk=lease.attempt_id).update(
            heartbeat_at=DbNow(), lease_expires_at=DbNow(lease.lease_seconds)
        )
    return True


def assert_current(lease: Lease, write: str, *, lease_valid: bool = True) -> None:
    """Lock the job row and check ``lease`` still owns it (and, by default, is unexpired).

    Used before an effect starts: a paused attempt whose lease ran out cannot begin one, even
    if the reaper has not yet moved the job.
    """
    qs = _mine(lease)
    if lease_valid:
        qs = qs.filter(lease_expires_at__gt=DbNow())
    # A no-op write takes the row lock, so the check holds until this transaction ends.
    if qs.update(heartbeat_at=F("heartbeat_at")) != 1:
        raise StaleAttempt(lease.job_id, lease.fence, write)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """What went wrong in an attempt, for its record."""

    error_class: str
    error_type: str
    message: str
    traceback: str = ""


def finish(
    lease: Lease,
    decision: Decision,
    *,
    outcome: str,
    failure: Failure | None = None,
    expired_for: float | None = None,
) -> None:
    """End ``lease``'s attempt with ``decision``'s transition, fenced.

    Joins an open transaction (transactional jobs complete inside the handler's transaction),
    so a refusal raised here rolls the handler's writes back with it. ``expired_for`` (the
    reaper's) adds "and the lease expired at least that many seconds ago" to the guard.
    """
    t = decision.transition
    fields: dict[str, Any] = {
        "state": t.target,
        "updated_at": DbNow(),
        "version": F("version") + 1,
        "lease_owner": "",
        "lease_expires_at": None,
        "reason": decision.reason[:2000],
    }
    if failure is not None:
        fields["last_error"] = f"{failure.error_type}: {failure.message}"[:2000]
    if t.target == states.State.WAITING:
        fields["run_at"] = DbNow(decision.delay)
        fields["next_kind"] = decision.next_kind.value
        if not decision.spend_attempt:
            fields["attempts"] = F("attempts") - 1
    else:
        fields["next_kind"] = Kind.RUN.value
    if t.target in states.TERMINAL:
        fields["finished_at"] = DbNow()
    guard = _mine(lease, t)
    if expired_for is not None:
        guard = guard.filter(lease_expires_at__lt=DbNow(-expired_for))
    with transaction.atomic(using=DB):
        if guard.update(**fields) != 1:
            raise StaleAttempt(lease.job_id, lease.fence, t.name)
        _close_attempt(lease.attempt_id, outcome, failure)
        if decision.duplicate_possible:
            _mark_unsettled(lease.job_id, duplicate_possible=True)
        elif t.target == states.State.INDETERMINATE:
            _mark_unsettled(lease.job_id, duplicate_possible=False)


def complete(lease: Lease) -> None:
    """Mark ``lease``'s job succeeded (fenced)."""
    finish(lease, Decision(transition=states.COMPLETE), outcome="succeeded")


def _close_attempt(attempt_id: int, outcome: str, failure: Failure | None) -> None:
    fields: dict[str, Any] = {"outcome": outcome, "finished_at": DbNow()}
    if failure is not None:
        limit = conf.get().TRACEBACK_MAX_CHARS
        fields.update(
            error_class=failure.error_class,
            error_type=failure.error_type[:200],
            message=failure.message[:4000],
            traceback=failure.traceback[-limit:],
        )
    Attempt.objects.using(DB).filter(pk=attempt_id, finished_at__isnull=True).update(**fields)


def _mark_unsettled(job_id: int, *, duplicate_possible: bool) -> None:
    """An attempt ended without settling its effect intents: their outcome is unknown."""
    qs = Effect.objects.using(DB).filter(job_id=job_id, state=Effect.INTENDED)
    extra: dict[str, Any] = {"duplicate_possible": True} if duplicate_possible else {}
    qs.update(state=Effect.UNKNOWN, updated_at=DbNow(), **extra)


def has_unsettled_effect(job_id: int) -> bool:
    """Whether the job has an effect whose intent was recorded but whose outcome is not."""
    return (
        Effect.objects.using(DB)
        .filter(job_id=job_id, state__in=[Effect.INTENDED, Effect.UNKNOWN])
        .exists()
    )


def record_stale(err: StaleAttempt, executor: str = "") -> None:
    """Record a refused write as evidence (``jobs_status`` counts these)."""
    log.warning("stale write refused: %s (executor %s)", err, executor)
    try:
        StaleWrite.objects.using(DB).create(
            job_id=err.job_id, fence=err.fence, write=err.write[:30], executor=executor[:200]
        )
    except Exception:  # the evidence is best effort; the refusal itself already held
        log.exception("could not record stale write for job %s", err.job_id)


# ---------------------------------------------------------------------------------------------
# Effect ledger (fenced)
# ---------------------------------------------------------------------------------------------


def effect_key(job_id: int, name: str) -> str:
    """The effect's key: the work identity and the effect's name, never the attempt."""
    return f"tenure-{job_id}-{name}"


def effect_intend(lease: Lease, name: str) -> Effect:
    """Record the intent to perform effect ``name`` before the external call (fenced).

    Refused (:class:`StaleAttempt`) when the attempt no longer owns the job or its lease has
    expired by the database's clock, so a paused attempt cannot start a new effect. Returns the
    ledger row; a row already ``applied`` is returned unchanged for the caller to skip.
    """
    key = effect_key(lease.job_id, name)
    with transaction.atomic(using=DB):
        assert_current(lease, "effect_intent")
        row = Effect.objects.using(DB).filter(key=key).first()
        if row is None:
            return Effect.objects.using(DB).create(
                key=key,
                job_id=lease.job_id,
                name=name,
                state=Effect.INTENDED,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
                created_at=DbNow(),
                updated_at=DbNow(),
            )
        if row.state == Effect.APPLIED:
            return row
        dup = row.duplicate_possible or (
            row.state in (Effect.INTENDED, Effect.UNKNOWN)
            and lease.effect == EffectMode.AT_LEAST_ONCE
        )
        Effect.objects.using(DB).filter(pk=row.pk).update(
            state=Effect.INTENDED,
            attempt_id=lease.attempt_id,
            fence=lease.fence,
            intents=F("intents") + 1,
            duplicate_possible=dup,
            updated_at=DbNow(),
        )
        row.refresh_from_db()
        return row


def effect_settle(
    lease: Lease, key: str, state: str, *, destination_ref: str = "", note: str = ""
) -> None:
    """Record an effect's outcome (``applied``, ``not_applied`` or ``unknown``), fenced."""
    with transaction.atomic(using=DB):
        assert_current(lease, "effect_outcome", lease_valid=False)
        fields: dict[str, Any] = {"state": state, "updated_at": DbNow()}
        if destination_ref:
            fields["destination_ref"] = destination_ref[:300]
        if note:
            fields["note"] = note[:2000]
        n = (
            Effect.objects.using(DB)
            .filter(key=key, fence=lease.fence)
            .exclude(state=Effect.APPLIED)
            .update(**fields)
        )
        if n != 1:
            raise StaleAttempt(lease.job_id, lease.fence, "effect_outcome")


# ---------------------------------------------------------------------------------------------
# Abandoned leases: the reaper and graceful release
# ---------------------------------------------------------------------------------------------


def _situation(
    job: Job, policy: RetryPolicy | None, has_reconcile: bool, now: datetime
) -> Situation:
    return Situation(
        mode=EffectMode(job.effect),
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        age_seconds=(now - job.created_at).total_seconds(),
        has_reconcile=has_reconcile,
    )


def _type_policy(name: str) -> tuple[RetryPolicy, bool]:
    from . import registry

    jt = registry.get(name)
    if jt is None:
        s = conf.get()
        return RetryPolicy(base=s.BACKOFF_BASE_SECONDS, cap=s.BACKOFF_CAP_SECONDS), False
    return jt.retry_policy, jt.reconcile is not None


def reap(*, limit: int = 100, rng: random.Random | None = None) -> Counter[str]:
    """Move jobs whose lease expired (by the database's clock, plus a grace) on.

    Safe in many processes at once: candidates are locked ``SKIP LOCKED`` and each write is
    conditioned on the job still being leased under the same fence with its lease expired.
    Returns counts by transition name.
    """
    rng = rng or random.Random()
    grace = conf.get().REAP_GRACE_SECONDS
    counts: Counter[str] = Counter()
    conn = connections[DB]
    with transaction.atomic(using=DB):
        qs = (
            Job.objects.using(DB)
            .filter(state=states.State.LEASED, lease_expires_at__lt=DbNow(-grace))
            .order_by("lease_expires_at")
        )
        if conn.vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True)
        jobs = list(qs[:limit])
        if not jobs:
            return counts
        now = to_datetime(_now(conn))
        for job in jobs:
            policy, has_reconcile = _type_policy(job.name)
            unsettled = job.effect != EffectMode.TRANSACTIONAL and has_unsettled_effect(job.pk)
            decision = outcomes.after_abandon(
                _situation(job, policy, has_reconcile, now),
                unsettled_effect=unsettled,
                policy=policy,
                rng=rng,
                why=f"lease expired (owner {job.lease_owner})",
            )
            lease = _lease_of(job)
            try:
                # The expiry is re-checked in the write itself: a late heartbeat may have landed.
                finish(lease, decision, outcome="lease_expired", expired_for=grace)
                counts[decision.transition.name] += 1
            except StaleAttempt:
                continue
    for name, n in counts.items():
        log.info("reaper: %s x%d", name, n)
    return counts


def _now(conn: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute("SELECT " + now_sql(conn.vendor), [])
        return cur.fetchone()[0]


def _lease_of(job: Job) -> Lease:
    attempt_id = (
        Attempt.objects.using(DB)
        .filter(job_id=job.pk, fence=job.fence)
        .values_list("pk", flat=True)
        .first()
    )
    return Lease(
        job_id=job.pk,
        fence=job.fence,
        attempt=job.attempts,
        attempt_id=attempt_id or 0,
        kind=job.next_kind,
        name=job.name,
        queue=job.queue,
        payload=job.payload,
        lease_seconds=job.lease_seconds,
        effect=job.effect,
        max_attempts=job.max_attempts,
        created_at=job.created_at,
        executor=job.lease_owner,
    )


def release(lease: Lease, *, why: str = "executor shutting down") -> None:
    """Give an unfinished attempt back (graceful shutdown), fenced.

    With no unsettled effect the job waits again at once and the attempt is not spent; with
    one, the mode's rule for an ambiguous outcome applies, as it would after lease expiry.
    """
    policy, has_reconcile = _type_policy(lease.name)
    unsettled = lease.effect != EffectMode.TRANSACTIONAL and has_unsettled_effect(lease.job_id)
    job_now = to_datetime(_now(connections[DB]))
    situation = Situation(
        mode=EffectMode(lease.effect),
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        age_seconds=(job_now - lease.created_at).total_seconds(),
        has_reconcile=has_reconcile,
    )
    if unsettled:
        decision = outcomes.after_abandon(
            situation, unsettled_effect=True, policy=policy, rng=random.Random(), why=why
        )
    else:
        decision = Decision(transition=states.RELEASE, reason=why, spend_attempt=False)
    finish(lease, decision, outcome="released")


# ---------------------------------------------------------------------------------------------
# Broker hints (the database is the truth; messages are only wake-ups)
# ---------------------------------------------------------------------------------------------


def take_due_hints(*, limit: int = 500) -> list[tuple[int, str]]:
    """Pick due waiting jobs whose last hint is missing or old, and mark them hinted now.

    Returns ``(job_id, queue)`` pairs to publish. Two dispatchers may both pick a job; the
    second hint is absorbed by the claim.
    """
    resend = conf.get().REDISPATCH_AFTER_SECONDS
    with transaction.atomic(using=DB):
        qs = (
            Job.objects.using(DB)
            .filter(state=states.State.WAITING, run_at__lte=DbNow())
            .filter(Q(hinted_at__isnull=True) | Q(hinted_at__lt=DbNow(-resend)))
            .order_by("-priority", "run_at", "id")
        )
        if connections[DB].vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True)
        picked = list(qs.values_list("id", "queue")[:limit])
        if picked:
            Job.objects.using(DB).filter(
                pk__in=[p[0] for p in picked], state=states.State.WAITING
            ).update(hinted_at=DbNow())
    return picked


# ---------------------------------------------------------------------------------------------
# Executors (liveness rows, not job state)
# ---------------------------------------------------------------------------------------------


def executor_started(
    executor_id: str, *, transport: str, queues: Sequence[str], concurrency: int
) -> None:
    """Register a live executor."""
    import os

    Executor.objects.using(DB).update_or_create(
        id=executor_id,
        defaults={
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "transport": transport,
            "queues": ",".join(queues),
            "concurrency": concurrency,
            "active": 0,
            "started_at": DbNow(),
            "heartbeat_at": DbNow(),
            "stopped_at": None,
        },
    )


def executor_beat(executor_id: str, *, active: int) -> None:
    """Refresh an executor's liveness row."""
    Executor.objects.using(DB).filter(pk=executor_id).update(heartbeat_at=DbNow(), active=active)


def executor_stopped(executor_id: str) -> None:
    """Mark an executor stopped."""
    Executor.objects.using(DB).filter(pk=executor_id).update(stopped_at=DbNow(), active=0)


# ---------------------------------------------------------------------------------------------
# Operator actions (audited, version-checked; the dashboard's only way to change a job)
# ---------------------------------------------------------------------------------------------

VERIFIED_FACTS = {
    "not_applied": "The operator verified the effect did not happen.",
    "same_key": "Retry under the same idempotency key; the destination absorbs a repeat.",
    "applied": "The operator verified the effect happened.",
    "give_up": "The operator gives up on the job.",
}


@dataclass(frozen=True, kw_only=True)
class ActionResult:
    """The job after an operator action and its audit row."""

    job: Job
    audit: AuditEntry


def operator_action(
    job_id: int,
    *,
    action: str,
    expected_version: int,
    actor: str,
    reason: str,
    verified: str = "",
) -> ActionResult:
    """Apply an operator's ``retry``, ``cancel``, ``resolve`` or ``give_up`` to one job.

    Conditioned on the job still having ``expected_version`` and a state the action may leave;
    otherwise :class:`ActionConflict` (nothing changes). The state change and its audit row
    commit together. Retrying an indeterminate job needs ``verified`` to name the fact the
    operator checked: ``not_applied`` or ``same_key`` (idempotent jobs only).
    """
    reason = (reason or "").strip()
    if not reason:
        raise ActionRefused("a reason is required")
    with transaction.atomic(using=DB):
        job = Job.objects.using(DB).filter(pk=job_id).first()
        if job is None:
            raise ActionRefused(f"job {job_id} does not exist")
        t, fields, effect_state = _operator_plan(job, action, verified)
        fields.update(updated_at=DbNow(), version=F("version") + 1)
        n = (
            Job.objects.using(DB)
            .filter(pk=job_id, version=expected_version, state__in=list(t.sources))
            .update(state=t.target, **fields)
        )
        if n != 1:
            raise ActionConflict(
                f"job {job_id} changed since version {expected_version}; reload and decide again"
            )
        if effect_state:
            Effect.objects.using(DB).filter(
                job_id=job_id, state__in=[Effect.INTENDED, Effect.UNKNOWN]
            ).update(
                state=effect_state, note=f"operator {actor}: {reason}"[:2000], updated_at=DbNow()
            )
        before = job.state
        job.refresh_from_db()
        audit = AuditEntry.objects.using(DB).create(
            job=job,
            actor=actor,
            action=action,
            reason=reason[:4000],
            verified=verified,
            state_before=before,
            state_after=job.state,
            version_before=expected_version,
            detail={"transition": t.name, "fence": job.fence},
        )
    return ActionResult(job=job, audit=audit)


def _operator_plan(
    job: Job, action: str, verified: str
) -> tuple[states.Transition, dict[str, Any], str]:
    """Which transition an action means for this job, its extra fields, and effect outcome."""
    state = states.State(job.state)
    if state == states.State.LEASED:
        raise ActionRefused("a leased job cannot be retried, resolved or cancelled")
    if action == "cancel":
        return states.OP_CANCEL, {"finished_at": DbNow(), "reason": "cancelled by operator"}, ""
    if action == "retry":
        effect_state = ""
        if state == states.State.INDETERMINATE:
            if verified == "not_applied":
                effect_state = Effect.NOT_APPLIED
            elif verified == "same_key":
                if job.effect != EffectMode.IDEMPOTENT:
                    raise ActionRefused(
                        "retrying under the same key is safe only for idempotent jobs"
                    )
            else:
                raise ActionRefused(
                    "retrying an indeterminate job needs the fact you verified: "
                    "not_applied, or same_key for an idempotent job"
                )
        from . import registry

        jt = registry.get(job.name)
        budget = jt.max_attempts if jt else conf.get().DEFAULT_MAX_ATTEMPTS
        return (
            states.OP_RETRY,
            {
                "run_at": DbNow(),
                "finished_at": None,
                "next_kind": Kind.RUN.value,
                "max_attempts": F("attempts") + budget,
                "reason": f"retried by operator ({verified or 'failed job'})",
            },
            effect_state,
        )
    if action == "resolve":
        if state == states.State.INDETERMINATE and verified != "applied":
            raise ActionRefused("resolving as succeeded needs verified=applied")
        return (
            states.OP_RESOLVE,
            {"finished_at": DbNow(), "reason": "resolved by operator: effect applied"},
            Effect.APPLIED if state == states.State.INDETERMINATE else "",
        )
    if action == "give_up":
        return (
            states.OP_GIVE_UP,
            {"finished_at": DbNow(), "reason": "operator gave up"},
            "",
        )
    raise ActionRefused(f"unknown action {action!r}")


# ---------------------------------------------------------------------------------------------
# Enqueue (the only insert of a job)
# ---------------------------------------------------------------------------------------------


def insert_job(
    *,
    name: str,
    queue: str,
    payload: dict[str, Any],
    priority: int,
    run_at: datetime | None,
    max_attempts: int,
    lease_seconds: int,
    unique_key: str | None,
    effect: str,
    schedule_id: int | None = None,
) -> Job:
    """Insert a waiting job in the caller's transaction; a known ``unique_key`` returns the
    job already accepted under it.

    A due job wakes executors: ``NOTIFY`` on PostgreSQL (delivered only if the transaction
    commits) and a broker hint published after commit. A hint lost between commit and publish
    is re-sent by the dispatcher, so a job never depends on its message.
    """
    from django.utils import timezone

    from . import transports

    due_now = run_at is None or run_at <= timezone.now()
    hint = due_now and transports.uses_broker()
    fields: dict[str, Any] = {
        "name": name,
        "queue": queue,
        "payload": payload,
        "priority": priority,
        "run_at": run_at if run_at is not None else DbNow(),
        "state": states.State.WAITING,
        "max_attempts": max_attempts,
        "lease_seconds": lease_seconds,
        "unique_key": unique_key,
        "effect": effect,
        "schedule_id": schedule_id,
        "created_at": DbNow(),
        "updated_at": DbNow(),
        "hinted_at": DbNow() if hint else None,
    }
    with transaction.atomic(using=DB):
        if unique_key is None:
            job = Job.objects.using(DB).create(**fields)
        else:
            try:
                with transaction.atomic(using=DB):
                    job = Job.objects.using(DB).create(**fields)
            except IntegrityError:
                existing = Job.objects.using(DB).filter(unique_key=unique_key).first()
                if existing is None:
                    raise
                return existing
        job.refresh_from_db()
        if due_now:
            _notify(queue)
        if hint:
            job_id = job.pk
            transaction.on_commit(lambda: transports.publish(job_id, queue), using=DB)
    return job


WAKEUP_CHANNEL = "tenure_wakeup"


def _notify(queue: str) -> None:
    """Wake broker-less executors on PostgreSQL (sent at commit, dropped on rollback)."""
    conn = connections[DB]
    if conn.vendor == "postgresql":
        with conn.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", [WAKEUP_CHANNEL, queue])


def reconciled(lease: Lease, answer: outcomes.Reconciliation) -> None:
    """Record a reconcile attempt's answer on the job's unsettled effects (fenced)."""
    state = {
        outcomes.Reconciliation.APPLIED: Effect.APPLIED,
        outcomes.Reconciliation.NOT_APPLIED: Effect.NOT_APPLIED,
    }.get(answer)
    if state is None:
        return
    with transaction.atomic(using=DB):
        assert_current(lease, "effect_outcome", lease_valid=False)
        Effect.objects.using(DB).filter(
            job_id=lease.job_id, state__in=[Effect.INTENDED, Effect.UNKNOWN]
        ).update(state=state, note=f"reconciled by attempt {lease.attempt}", updated_at=DbNow())
