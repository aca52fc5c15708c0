"""Everything the checker judges, read once into plain values.

Three independent sources, so no single one has to be trusted:

* the run's own logs, kept outside the database: what the workload was told about each
  enqueue, what the nemesis did and when, what each executor saw (``TENURE_EVENT_LOG``), what
  the operator decided, what the hostile-input sweep observed;
* the scheduler's database: jobs, attempts (with database-clock times), the effect ledger,
  refused stale writes, the audit trail;
* the destinations' own records of the effects they applied (:mod:`.truth`).

Times are seconds since the epoch. The database and the verifier run on this machine's real
clock; the executors' skewed clocks appear nowhere here.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import truth

CHAOS_PREFIX = "chaos:"
BROKER_SUFFIX = ".broker"
"""Job types ending in this are the broker twins (see :mod:`verifier.job_types`)."""
ASYNC_SUFFIX = ".async"
"""Job types ending in this are the ``async def`` twins (see :mod:`verifier.job_types`)."""


def base_type_of(name: str) -> str:
    """The job type ``name`` is a twin of (itself when it is none)."""
    return name.removesuffix(BROKER_SUFFIX).removesuffix(ASYNC_SUFFIX)


EFFECT_OF_TYPE: dict[str, str] = {
    "chaos.transactional": "credit",
    "chaos.idempotent": "charge",
    "chaos.reconcilable": "transfer",
    "chaos.at_least_once": "email",
    "chaos.at_most_once": "email",
    "chaos.fallback": "charge",
    "chaos.untimed": "charge",
    "chaos.multi": "charge",
    "chaos.snooze": "charge",
    "chaos.overrun": "charge",
    "demo.ledger_credit": "credit",
    "demo.charge": "charge",
    "demo.charge_reconcilable": "transfer",
    "demo.email": "email",
    "demo.email_at_most_once": "email",
}
"""Job type -> the name of its (first) effect; ``chaos.stubborn`` makes none."""
MULTI_TYPE = "chaos.multi"
"""The reconcilable job type with two effects (a charge, then its receipt)."""
SNOOZE_TYPE = "chaos.snooze"
OVERRUN_TYPE = "chaos.overrun"
STUBBORN_TYPE = "chaos.stubborn"
PATH_TYPES = (MULTI_TYPE, SNOOZE_TYPE, OVERRUN_TYPE, STUBBORN_TYPE)
"""The job types that walk the end paths (``docs/guarantees.md``, "How a job ends")."""
EFFECTS_OF_TYPE: dict[str, tuple[str, ...]] = {
    **{t: (name,) for t, name in EFFECT_OF_TYPE.items()},
    MULTI_TYPE: ("charge", "receipt"),
}
"""Job type -> every effect a succeeded job of it has made."""
FALLBACK_TYPE = "chaos.fallback"
"""The job type whose fallback charges at a second provider that keeps its own keys."""
UNTIMED_TYPE = "chaos.untimed"
"""The job type that declares no maximum runtime (the installation's default applies)."""


def _t(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of ``path`` ([] when it does not exist); a torn last line is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@dataclass(frozen=True, kw_only=True)
class JobRow:
    id: int
    name: str
    key: str
    state: str
    mode: str
    fence: int
    reason: str
    payload: dict[str, Any]
    timeout: float = 0.0
    """The maximum runtime of one attempt stored on the job when it was enqueued."""
    effect_key: str = ""
    """The key of the job's effect as its ledger row holds it; "" when the job never recorded
    the effect (or its type is unknown)."""
    effect_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Every effect of the job's ledger: name -> the keys its rows hold."""

    @property
    def base_type(self) -> str:
        """The job type, the broker and async twins' suffixes removed."""
        return base_type_of(self.name)

    @property
    def effect_name(self) -> str:
        """The name of the one effect the job's type makes, or "" for unknown types."""
        return EFFECT_OF_TYPE.get(self.base_type, "")


@dataclass(frozen=True, kw_only=True)
class AttemptRow:
    id: int
    job: int
    fence: int
    kind: str
    executor: str
    claimed: float
    heartbeat: float | None
    expires: float | None
    finished: float | None
    outcome: str
    error_class: str
    error_type: str
    message: str

    @property
    def pid(self) -> int | None:
        """The pid in the executor id ``host:pid:uuid``."""
        parts = self.executor.split(":")
        return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


@dataclass(frozen=True, kw_only=True)
class EffectRow:
    job: int
    name: str
    key: str
    state: str
    in_doubt: bool
    fence: int
    intents: int
    duplicate_possible: bool
    note: str
    updated: float


@dataclass(frozen=True, kw_only=True)
class LedgerEvent:
    """One entry of the ledger's history (``tenure_effect_event``)."""

    event: str
    """``intended``, ``applied``, ``not_sent``, ``unknown``, ``left_unsettled``,
    ``reconciled`` or ``operator``."""
    fence: int | None
    """The fence of the attempt it was written for; None for an operator's fact."""
    at: float
    """When it was written, by the database's clock."""


@dataclass(frozen=True, kw_only=True)
class AuditRow:
    job: int | None
    action: str
    verified: str
    actor: str
    created: float
    state_before: str
    state_after: str


@dataclass(kw_only=True)
class Evidence:
    """Everything one run left behind."""

    plan: dict[str, Any]
    meta: dict[str, Any]
    enqueues: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    operator: list[dict[str, Any]]
    events: list[dict[str, Any]]
    sweep: dict[str, Any] | None
    jobs: dict[int, JobRow]
    other_jobs: list[dict[str, Any]]
    attempts: dict[int, list[AttemptRow]]
    effects: dict[int, list[EffectRow]]
    stale: list[dict[str, Any]]
    audits: dict[int, list[AuditRow]]
    applied: Counter[str]
    """Effects per key at every destination together."""
    replayed: set[str]
    requests: dict[str, Counter[str]] = field(default_factory=dict)
    applied_at: dict[str, Counter[str]] = field(default_factory=dict)
    """Effects per destination (:data:`.truth.DESTINATIONS`) and key."""
    turned_away: Counter[str] = field(default_factory=Counter)
    """Per key, the payment provider's charge requests it answered 503 unseen."""
    ledger_history: dict[int, list[LedgerEvent]] = field(default_factory=dict)
    """Per job, its ledger's history in order: every effect's events."""
    edges: list[tuple[int, int]] = field(default_factory=list)
    """``(parent, child)`` job ids of every workflow step edge of the run's workflows."""
    workflow_of: dict[int, str] = field(default_factory=dict)
    """Per step's job id, its workflow's unique key."""

    def attempts_of(self, job_id: int) -> list[AttemptRow]:
        return self.attempts.get(job_id, [])


def load(workdir: Path) -> Evidence:
    """Read the run's logs and the database (Django must be set up on the run's database)."""
    from scheduler_core.models import Attempt, AuditEntry, Effect, EffectEvent, Job, StaleWrite

    meta = json.loads((workdir / "run.json").read_text()) if (workdir / "run.json").exists() else {}
    events: list[dict[str, Any]] = []
    for p in sorted((workdir / "events").glob("*.jsonl")):
        events.extend(read_jsonl(p))
    sweep_path = workdir / "sweep.json"
    effects: dict[int, list[EffectRow]] = {}
    for e in Effect.objects.all():
        effects.setdefault(e.job_id, []).append(
            EffectRow(
                job=e.job_id,
                name=e.name,
                key=e.key,
                state=e.state,
                in_doubt=e.in_doubt,
                fence=e.fence,
                intents=e.intents,
                duplicate_possible=e.duplicate_possible,
                note=e.note,
                updated=e.updated_at.timestamp(),
            )
        )
    from scheduler_core.models import WorkflowEdge, WorkflowStep

    # A workflow step has no key of its own: the run's logs name it <workflow key>/<step>.
    step_key: dict[int, str] = {}
    workflow_of: dict[int, str] = {}
    for job_id, wf_key, step_name in WorkflowStep.objects.values_list(
        "job_id", "workflow__unique_key", "name"
    ):
        if wf_key and wf_key.startswith(CHAOS_PREFIX):
            step_key[job_id] = f"{wf_key}/{step_name}"
            workflow_of[job_id] = str(wf_key)
    edges = [
        (int(p), int(c))
        for p, c in WorkflowEdge.objects.values_list("parent_id", "child_id")
        if c in workflow_of
    ]
    jobs: dict[int, JobRow] = {}
    other: list[dict[str, Any]] = []
    for j in Job.objects.select_related("spec").order_by("id"):
        key = j.unique_key or step_key.get(j.pk, "")
        if not key.startswith(CHAOS_PREFIX):
            other.append({"id": j.pk, "name": j.name, "key": j.unique_key, "state": j.state})
            continue
        name = EFFECT_OF_TYPE.get(base_type_of(j.name), "")
        keys = [e.key for e in effects.get(j.pk, []) if name and e.name == name]
        by_name: dict[str, tuple[str, ...]] = {}
        for row in effects.get(j.pk, []):
            by_name[row.name] = (*by_name.get(row.name, ()), row.key)
        jobs[j.pk] = JobRow(
            id=j.pk,
            name=j.name,
            key=key,
            state=j.state,
            mode=j.effect,
            fence=j.fence,
            reason=j.reason,
            payload=j.payload if isinstance(j.payload, dict) else {},
            timeout=float(j.timeout_seconds),
            effect_key=keys[0] if keys else "",
            effect_keys=by_name,
        )
    attempts: dict[int, list[AttemptRow]] = {}
    for a in Attempt.objects.all().order_by("job_id", "fence"):
        attempts.setdefault(a.job_id, []).append(
            AttemptRow(
                id=a.pk,
                job=a.job_id,
                fence=a.fence,
                kind=a.kind,
                executor=a.executor,
                claimed=a.claimed_at.timestamp(),
                heartbeat=_t(a.heartbeat_at),
                expires=_t(a.lease_expires_at),
                finished=_t(a.finished_at),
                outcome=a.outcome,
                error_class=a.error_class,
                error_type=a.error_type,
                message=a.message[:500],
            )
        )
    audits: dict[int, list[AuditRow]] = {}
    for au in AuditEntry.objects.all().order_by("created_at"):
        audits.setdefault(au.job_id or 0, []).append(
            AuditRow(
                job=au.job_id,
                action=au.action,
                verified=au.verified,
                actor=au.actor,
                created=au.created_at.timestamp(),
                state_before=au.state_before,
                state_after=au.state_after,
            )
        )
    stale: list[dict[str, Any]] = [
        dict(row) for row in StaleWrite.objects.values("job_id", "fence", "write", "executor")
    ]
    history: dict[int, list[LedgerEvent]] = {}
    for job_id, event, fence, created in EffectEvent.objects.values_list(
        "effect__job_id", "event", "fence", "created_at"
    ).order_by("id"):
        history.setdefault(int(job_id), []).append(
            LedgerEvent(event=str(event), fence=fence, at=created.timestamp())
        )
    applied_at = truth.applied_by_destination()
    applied: Counter[str] = Counter()
    for counts in applied_at.values():
        applied.update(counts)
    return Evidence(
        plan=meta.get("plan", {}),
        meta=meta,
        enqueues=read_jsonl(workdir / "enqueue.jsonl"),
        faults=read_jsonl(workdir / "faults.jsonl"),
        operator=read_jsonl(workdir / "operator.jsonl"),
        events=events,
        sweep=json.loads(sweep_path.read_text()) if sweep_path.exists() else None,
        jobs=jobs,
        other_jobs=other,
        attempts=attempts,
        effects=effects,
        stale=stale,
        audits=audits,
        applied=applied,
        replayed=truth.replayed_keys(),
        requests=truth.requests_by_outcome(),
        applied_at=applied_at,
        turned_away=truth.turned_away(),
        ledger_history=history,
        edges=edges,
        workflow_of=workflow_of,
    )
