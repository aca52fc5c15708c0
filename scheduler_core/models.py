"""The record: jobs (work identity), attempts (one try each), the effect ledger, schedules,
the operator audit trail and live executors.

Rows are read anywhere; ``Job.state``, its fence and lease are written only by
the storage drivers (``scheduler_core.storage``), and the model itself refuses to write a job
(``Job.save()``, ``create()``, ``bulk_create()``, ``delete()`` raise ``WriteRefused``). Every model's manager reads and writes Tenure's database
(``TENURE_DATABASE``, :mod:`scheduler_core.db`) unless told ``.using()`` another.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from django.db import models
from django.db.models import Q

from .db import alias
from .domain.modes import MODE_CHOICES
from .domain.states import MOVING, RESTING, STATE_CHOICES, State
from .exceptions import WriteRefused

_M = TypeVar("_M", bound=models.Model)


class TenureManager(models.Manager[_M]):
    """A manager whose querysets use Tenure's database alias, so no router is needed."""

    def get_queryset(self) -> models.QuerySet[_M]:
        """A queryset on ``.using()``'s alias if one was given, else on Tenure's."""
        # Manager.get_queryset with the alias filled in: no second queryset per call.
        cls = self._queryset_class  # type: ignore[attr-defined]
        return cls(  # type: ignore[no-any-return]
            model=self.model,
            using=self._db or alias(),
            hints=self._hints,  # type: ignore[attr-defined]
        )


_RESTING = [st.value for st in RESTING]
"""The states the state, name and queue indexes hold (PostgreSQL), as the index predicate."""


def in_states(states: Iterable[State | str]) -> Q:
    """A filter for jobs in any of ``states`` that each state's index can serve: one term per
    moving state (waiting: the claim index; leased: the leases index) and one ``IN`` for the
    resting ones (the state index). A single ``state IN (...)`` across both kinds would match
    no index predicate on PostgreSQL, and the planner would read the table."""
    wanted = {State(st) for st in states}
    terms = [Q(state=st.value) for st in MOVING if st in wanted]
    resting = [st.value for st in RESTING if st in wanted]
    if resting:
        terms.append(Q(state=resting[0]) if len(resting) == 1 else Q(state__in=resting))
    if not terms:
        return Q(pk__in=[])
    q = terms[0]
    for t in terms[1:]:
        q |= t
    return q


class JobQuerySet(models.QuerySet["Job"]):
    """Named reads used by the executor, the maintenance loop and the dashboard."""

    def waiting(self) -> JobQuerySet:
        return self.filter(state=State.WAITING)

    def leased(self) -> JobQuerySet:
        return self.filter(state=State.LEASED)

    def in_states(self, states: Iterable[State | str]) -> JobQuerySet:
        """Jobs in any of ``states``, read through each state's index (:func:`in_states`)."""
        return self.filter(in_states(states))

    def unfinished(self) -> JobQuerySet:
        return self.in_states([State.WAITING, State.LEASED, State.INDETERMINATE])

    def results(self) -> dict[int, Any]:
        """The result of each succeeded job of this queryset, by job id: the JSON value its
        handler returned in the attempt whose completion was accepted (``None`` when it
        returned ``None``, and for a job an operator resolved). Jobs not succeeded are left
        out. One query."""
        won = Attempt.objects.using(self.db).filter(
            job_id=models.OuterRef("pk"), outcome="succeeded"
        )
        rows = (
            self.filter(state=State.SUCCEEDED)
            .annotate(kept=models.Subquery(won.values("return_value")[:1]))
            .values_list("pk", "kept")
        )
        return dict(rows)

    def create(self, **kwargs: Any) -> Job:
        """Refused: see :meth:`Job.save`."""
        raise WriteRefused(REFUSED_WRITE.format(how="Job.objects.create()"))

    def bulk_create(self, *args: Any, **kwargs: Any) -> list[Job]:
        """Refused: see :meth:`Job.save`."""
        raise WriteRefused(REFUSED_WRITE.format(how="Job.objects.bulk_create()"))


REFUSED_WRITE = (
    "{how} is refused: a job is written only through Tenure, which keeps its spec row beside "
    "it and conditions every change on the job's state and fence. Enqueue with "
    "JobType.enqueue() or JobType.enqueue_many(); move a job on with the operator's actions "
    "(the dashboard, manage.py jobs). Nothing was written."
)
"""Why a write through Django's model is refused. Such a row had no spec row (the claim passes
over it; it stays due, reported as stuck) and such a change bypassed every fence."""


class Job(models.Model):
    """The work identity: one row per accepted piece of work, whatever its attempts.

    This row holds what changes as the job moves (state, fence, lease, times) and what the
    claim order and the dashboard's filters read. What the job was accepted as and never
    changes — payload, effect mode, lease length, maximum runtime — is its :class:`JobSpec`,
    a row of its own: every claim and every completion writes a new version of this row, and
    while a long transaction holds a snapshot each old version stays, so the narrower this
    row, the less a held snapshot costs (docs/operations.md, "Why the tables outgrow…").
    ``job.payload``, ``job.effect``, ``job.lease_seconds`` and ``job.timeout_seconds`` read the
    spec (``select_related("spec")`` reads it in the same query)."""

    name = models.CharField(max_length=200, help_text="Registered handler name.")
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first.")
    run_at = models.DateTimeField(help_text="Due time (database clock).")
    state = models.CharField(max_length=16, choices=STATE_CHOICES, default=State.WAITING)
    fence = models.BigIntegerField(default=0, help_text="Fencing token; grows by 1 per claim.")
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0, help_text="Attempts spent (claims, less snoozes).")
    attempt_base = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Added to attempts to number an attempt; raised by the first claim after a "
        "failover that may have lost claims of this job (docs/architecture.md).",
    )
    max_attempts = models.IntegerField(
        default=5, help_text="Attempt budget; an operator's retry raises it."
    )
    deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="When the current attempt's maximum runtime runs out."
    )
    unique_key = models.CharField(
        max_length=300,
        null=True,
        blank=True,
        help_text="At most one job holds a key (Meta.constraints: a unique index of the keys "
        "set, so jobs without one cost the index nothing).",
    )
    next_kind = models.CharField(
        max_length=10,
        default="run",
        help_text="Kind of the next attempt: run, reconcile or fallback.",
    )
    version = models.IntegerField(default=1, help_text="Optimistic check for operator actions.")
    schedule = models.ForeignKey(
        "Schedule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        db_index=False,  # Meta.indexes: only the jobs a schedule fired
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    hinted_at = models.DateTimeField(
        null=True, blank=True, help_text="Last broker hint sent (dispatcher)."
    )
    last_error = models.TextField(blank=True, default="")
    reason = models.TextField(
        blank=True, default="", help_text="Why the job is terminal, indeterminate or backing off."
    )
    cancel_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="An operator asked the running attempt to stop (database clock); the attempt "
        "learns it at its next renewal. Audited in AuditEntry.",
    )

    objects = TenureManager.from_queryset(JobQuerySet)()

    class Meta:
        db_table = "tenure_job"
        indexes = [
            # The claim: due waiting jobs of a queue in priority order.
            models.Index(
                fields=["queue", "-priority", "run_at", "id"],
                name="tenure_job_claim",
                condition=Q(state="waiting"),
            ),
            # The reaper: expired leases.
            models.Index(
                fields=["lease_expires_at"],
                name="tenure_job_leases",
                condition=Q(state="leased"),
            ),
            # A limited queue's count of its leased jobs (storage/queues.py), by queue. The
            # leases index holds every queue's leases, and while a snapshot is held, an entry
            # of every job leased since, in any queue: each claim of a limited queue read
            # them all under its queue's lock (0016).
            models.Index(
                fields=["queue"],
                name="tenure_job_queue_leased",
                condition=Q(state="leased"),
            ),
            # Jobs at rest, by state and time (retention, the dashboard's lists and counts,
            # the history rollup), type and queue. Waiting and leased rows are left out: a
            # claim and a completion each leave a version of them behind, which would cost
            # these indexes three entries a job, and while a snapshot is held those entries
            # stay; a plan that read the state='waiting' entries of one of these indexes
            # instead of the claim index's (the planner costed the two almost alike) walked
            # every such entry on every claim (docs/operations.md, "A long
            # transaction"). On SQLite, which keeps no old versions and could not use these
            # predicates, they index every row (migration 0010).
            models.Index(
                fields=["state", "updated_at", "id"],
                name="tenure_job_state",
                condition=Q(state__in=_RESTING),
            ),
            models.Index(
                fields=["name", "state"],
                name="tenure_job_name_state",
                condition=Q(state__in=_RESTING),
            ),
            models.Index(
                fields=["queue", "state"],
                name="tenure_job_queue_state",
                condition=Q(state__in=_RESTING),
            ),
            # Waiting jobs claimed before (retried, snoozed, released, rescued), by time: the
            # history rollup's read of the waiting jobs an attempt of its minute can belong
            # to. A new job (fence 0) has no entry, so the claim path writes none (0011).
            models.Index(
                fields=["updated_at"],
                name="tenure_job_retried",
                condition=Q(state="waiting", fence__gt=0),
            ),
            # A schedule's jobs (its page, SET_NULL on its deletion); most jobs have none.
            models.Index(
                fields=["schedule"],
                name="tenure_job_schedule",
                condition=Q(schedule__isnull=False),
            ),
        ]
        # Every index costs each row version an entry: a claim and a completion each write a
        # new version, and while a long snapshot is held none of the old entries can go
        # (docs/operations.md, "Long transactions"). So the key and schedule indexes hold
        # only the jobs that have one, and nothing is indexed for text patterns.
        constraints = [
            models.UniqueConstraint(
                fields=["unique_key"],
                name="tenure_job_unique_key",
                condition=Q(unique_key__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} [{self.state}] fence {self.fence}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refused (:class:`~scheduler_core.exceptions.WriteRefused`): Tenure's own writes are
        statements of its storage layer, never this; ``Job.objects.create()`` comes here."""
        raise WriteRefused(REFUSED_WRITE.format(how="Job.save()"))

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        """Refused, like :meth:`save`: retention deletes finished jobs with their rows."""
        raise WriteRefused(REFUSED_WRITE.format(how="Job.delete()"))

    # What the job was accepted as, read from its spec row (one query, unless the spec was
    # read with the job: ``select_related("spec")``).

    def _spec_row(self) -> JobSpec | None:
        try:
            return self.spec
        except JobSpec.DoesNotExist:
            return None

    @property
    def result(self) -> Any:
        """The job's result, read now: the JSON value its handler returned in the attempt
        whose completion was accepted; ``None`` while the job has not succeeded, when the
        handler returned ``None``, and for a job an operator resolved. Stored by the fenced
        completion (:mod:`scheduler_core.api.results`), deleted with the job by retention."""
        return Job.objects.using(self._state.db).filter(pk=self.pk).results().get(self.pk)

    @property
    def has_spec(self) -> bool:
        """False for a job row written outside Tenure without its spec row (SQL by hand): no
        claim takes it, the verdict calls it stuck, and the dashboard shows it so that an
        operator can cancel it."""
        return self._spec_row() is not None

    @property
    def payload(self) -> Any:
        """The keyword arguments the handler is called with (``JobSpec.payload``); None for a
        job without its spec row (:attr:`has_spec`)."""
        spec = self._spec_row()
        return spec.payload if spec is not None else None

    @property
    def effect(self) -> str:
        """The job's effect mode (``JobSpec.effect``); empty for a job without its spec row
        (:attr:`has_spec`), which no mode's promise covers."""
        spec = self._spec_row()
        return spec.effect if spec is not None else ""

    @property
    def lease_seconds(self) -> int:
        """How long one claim's lease lasts between renewals (``JobSpec.lease_seconds``)."""
        return self.spec.lease_seconds

    @property
    def timeout_seconds(self) -> float:
        """The maximum runtime of one attempt (``JobSpec.timeout_seconds``)."""
        return self.spec.timeout_seconds


class JobSpec(models.Model):
    """What a job was accepted as, written once in the enqueue's statement and never changed:
    the handler's arguments, the effect mode, the lease length and the maximum runtime. A
    claim reads it by key beside the job row it updates; retention deletes it with the job.
    Kept apart from :class:`Job` so the row versions that claims and completions write do not
    copy it (nor its payload index entries)."""

    # No foreign key in the database: Tenure writes a spec row only with its job and deletes it
    # only with it, and PostgreSQL's check of the key could turn a bulk enqueue quadratic
    # (migration 0014 says how).
    job = models.OneToOneField(
        Job,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="spec",
        db_constraint=False,
    )
    payload = models.JSONField(default=dict)
    effect = models.CharField(max_length=20, choices=MODE_CHOICES, default="at_least_once")
    lease_seconds = models.IntegerField(default=30)
    timeout_seconds = models.FloatField(
        default=600.0,
        help_text="Maximum runtime of one attempt; past it the attempt may not renew its lease, "
        "complete or start an effect.",
    )
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="The trace context of the enqueue (W3C traceparent and tracestate) its "
        "attempts' spans descend from; empty while tracing is off (scheduler_core.tracing).",
    )
    workflow_id = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The workflow this job is a step of (None: an ordinary job). A claim returns "
        "it, so an attempt knows whether its end moves other steps.",
    )

    objects = TenureManager()

    class Meta:
        db_table = "tenure_job_spec"

    def __str__(self) -> str:
        return f"spec of job {self.pk} ({self.effect})"


class Workflow(models.Model):
    """A set of jobs (its steps) that run in an order of dependence: a step is claimable only
    once every step it comes after has succeeded (:class:`WorkflowStep`, :class:`WorkflowEdge`).
    Written once by its enqueue; the steps' own rows say how far it got."""

    CANCEL = "cancel"
    CONTINUE = "continue"
    ON_FAILURE = [(CANCEL, CANCEL), (CONTINUE, CONTINUE)]

    name = models.CharField(max_length=200)
    unique_key = models.CharField(
        max_length=300,
        null=True,
        blank=True,
        help_text="At most one workflow holds a key (a unique index of the keys set).",
    )
    on_failure = models.CharField(
        max_length=10,
        choices=ON_FAILURE,
        default=CANCEL,
        help_text="When a step fails: cancel every step not yet run (cancel), or only its "
        "dependents (continue).",
    )
    created_at = models.DateTimeField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_workflow"
        constraints = [
            models.UniqueConstraint(
                fields=["unique_key"],
                name="tenure_workflow_unique_key",
                condition=Q(unique_key__isnull=False),
            )
        ]
        indexes = [models.Index(fields=["-created_at"], name="tenure_workflow_created")]

    def __str__(self) -> str:
        return f"workflow {self.pk} {self.name}"


class WorkflowStep(models.Model):
    """One job's place in its workflow: its step name and how many of its parents have not yet
    succeeded (``pending``). While ``pending`` is above zero the job waits unclaimable (its
    ``run_at`` is :data:`~scheduler_core.domain.workflows.BLOCKED_AT`); the fenced completion
    of its last parent makes it due, in the same transaction."""

    job = models.OneToOneField(
        Job,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="step",
        db_constraint=False,
    )
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="steps", db_constraint=False
    )
    name = models.CharField(max_length=200)
    pending = models.IntegerField(default=0, help_text="Parents that have not succeeded.")
    cancelled_by = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The step whose failure or cancel ended this one cancelled (an operator's "
        "retry of that step makes this one wait again).",
    )

    objects = TenureManager()

    class Meta:
        db_table = "tenure_workflow_step"
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="tenure_workflow_step_name")
        ]

    def __str__(self) -> str:
        return f"step {self.name} (job {self.job_id}) of workflow {self.workflow_id}"


class WorkflowEdge(models.Model):
    """``child`` runs only after ``parent`` succeeded (both jobs of one workflow)."""

    workflow_id = models.BigIntegerField()
    parent_id = models.BigIntegerField()
    child_id = models.BigIntegerField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_workflow_edge"
        constraints = [
            models.UniqueConstraint(
                fields=["parent_id", "child_id"], name="tenure_workflow_edge_pair"
            )
        ]
        indexes = [models.Index(fields=["child_id"], name="tenure_workflow_edge_child")]

    def __str__(self) -> str:
        return f"job {self.child_id} after job {self.parent_id}"


class Attempt(models.Model):
    """One try at a job: the fence it was issued, its lease (owner, expiry, last renewal,
    deadline) as the claim and renewals left it, and what became of it. A job has at most one
    open attempt (``finished_at`` empty), a constraint of the database (:class:`OpenAttempt`)."""

    job = models.ForeignKey(
        Job,
        on_delete=models.CASCADE,
        related_name="attempt_set",
        db_index=False,  # the unique (job, fence) index serves every lookup by job
    )
    number = models.IntegerField(help_text="The job's attempt count when this claim was made.")
    fence = models.BigIntegerField()
    kind = models.CharField(max_length=10, default="run")
    executor = models.CharField(max_length=200)
    claimed_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When this attempt's maximum runtime runs out (database clock), as its claim "
        "set it on the job; empty on attempts made before migration 0015.",
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=40, blank=True, default="")
    error_class = models.CharField(max_length=20, blank=True, default="")
    error_type = models.CharField(max_length=200, blank=True, default="")
    message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    return_value = models.JSONField(
        null=True,
        blank=True,
        help_text="What the handler returned (JSON, size-bounded). A job's result, and a "
        "workflow step's value in its children's ctx.parent_results, is that of the attempt "
        "whose completion was accepted.",
    )

    objects = TenureManager()

    class Meta:
        db_table = "tenure_attempt"
        constraints = [
            models.UniqueConstraint(fields=["job", "fence"], name="tenure_attempt_job_fence"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id} fence {self.fence}"


class OpenAttempt(models.Model):
    """The open attempt of each job that has one, keyed by the job: one active attempt, held by
    the database. Written only by the database's triggers on ``tenure_attempt`` (migration
    0017): an attempt inserted open, or reopened, adds its row, and one whose ``finished_at`` is
    set, or that is deleted open, removes it; a second open attempt of a job breaks the key, so
    its insert fails whatever a claim's statement got wrong (tests/db/test_one_open_attempt.py).

    Kept apart from the attempt's row so that ending an attempt changes no column an index of
    ``tenure_attempt`` reads: PostgreSQL then writes the ended version beside the open one
    without a new entry in any index (a heap-only update), and the attempt's primary key and
    job-and-fence index grow by one entry per attempt instead of two
    (tests/db/test_one_open_attempt.py::test_ending_an_attempt_writes_no_index_entry)."""

    job_id = models.BigIntegerField(primary_key=True)
    attempt_id = models.BigIntegerField()

    class Meta:
        db_table = "tenure_open_attempt"

    def __str__(self) -> str:
        return f"open attempt {self.attempt_id} of job {self.job_id}"


class Effect(models.Model):
    """One business effect of a job, keyed by work identity (never by attempt)."""

    INTENDED = "intended"
    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"
    STATES = [(s, s) for s in (INTENDED, APPLIED, NOT_APPLIED, UNKNOWN)]

    key = models.CharField(max_length=300, unique=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="effect_set")
    name = models.CharField(max_length=100)
    state = models.CharField(max_length=16, choices=STATES, default=INTENDED)
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.SET_NULL)
    fence = models.BigIntegerField()
    destination_ref = models.CharField(max_length=300, blank=True, default="")
    intents = models.IntegerField(default=1, help_text="How many attempts recorded an intent.")
    in_doubt = models.BooleanField(
        default=False,
        help_text="An attempt's outcome was unknown and no stated fact has settled it since: "
        "a later attempt that sent nothing cannot clear it.",
    )
    duplicate_possible = models.BooleanField(default=False)
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_effect"
        indexes = [models.Index(fields=["job", "state"], name="tenure_effect_job_state")]
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="tenure_effect_job_name")
        ]

    def __str__(self) -> str:
        return f"effect {self.key} [{self.state}]"

    @property
    def unsettled(self) -> bool:
        """Whether the effect may or may not have happened (intended, or unknown)."""
        return self.state in (self.INTENDED, self.UNKNOWN)


class EffectEvent(models.Model):
    """The ledger's history: what one attempt, reconciliation or operator learned about one
    effect, in order. The :class:`Effect` row holds the sum of it; this says who said what."""

    INTENDED = "intended"
    APPLIED = "applied"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"
    LEFT_UNSETTLED = "left_unsettled"
    RECONCILED = "reconciled"
    OPERATOR = "operator"

    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.SET_NULL)
    fence = models.BigIntegerField(null=True, blank=True)
    event = models.CharField(max_length=20)
    state_after = models.CharField(max_length=16)
    in_doubt_after = models.BooleanField(default=False)
    actor = models.CharField(max_length=150, blank=True, default="")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_effect_event"
        indexes = [models.Index(fields=["effect", "id"], name="tenure_effect_event_effect")]

    def __str__(self) -> str:
        return f"{self.event} on effect {self.effect_id} (fence {self.fence})"


class Installation(models.Model):
    """This installation's id, made once for the database (by the migrations, or with the first
    effect key of a database emptied since): effect keys carry it, so two installations sending
    effects to one destination never share a key. ``TENURE_INSTALLATION_ID`` overrides it.

    ``identity`` is the identity of the database the id was made for (or adopted by: ``manage.py
    installation adopt``): a restored or cloned database reads another, and the check
    ``tenure.W024`` says so instead of letting the copy send the original's keys."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    key = models.CharField(max_length=40)
    created_at = models.DateTimeField(auto_now_add=True)
    identity = models.JSONField(
        default=dict,
        blank=True,
        help_text="The database's identity when the id was made or adopted (empty: unknown).",
    )
    identity_at = models.DateTimeField(null=True, blank=True)

    objects = TenureManager()

    class Meta:
        db_table = "tenure_installation"

    def __str__(self) -> str:
        return self.key


class Schedule(models.Model):
    """A recurring job: each occurrence becomes one Job whose unique_key names it."""

    name = models.CharField(max_length=200, unique=True)
    job_name = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    cron = models.CharField(max_length=200, blank=True, default="")
    interval_seconds = models.IntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    misfire = models.CharField(max_length=20, default="run_once")
    catch_up_max = models.IntegerField(default=1)
    overlap = models.CharField(max_length=10, default="allow")
    paused = models.BooleanField(default=False)
    source = models.CharField(max_length=10, default="database")
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenureManager()

    class Meta:
        db_table = "tenure_schedule"

    def __str__(self) -> str:
        return f"schedule {self.name}"


class AuditEntry(models.Model):
    """Every operator action: who, what, why, and the state before and after."""

    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=50)
    reason = models.TextField()
    verified = models.CharField(max_length=50, blank=True, default="")
    state_before = models.CharField(max_length=16, blank=True, default="")
    state_after = models.CharField(max_length=16, blank=True, default="")
    version_before = models.IntegerField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenureManager()

    class Meta:
        db_table = "tenure_audit"
        indexes = [models.Index(fields=["job", "-created_at"], name="tenure_audit_job")]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} job {self.job_id}"


class Executor(models.Model):
    """A heartbeat row per executor process, for the dashboard and jobs_status."""

    id = models.CharField(max_length=200, primary_key=True, help_text="host:pid:uuid")
    hostname = models.CharField(max_length=200)
    pid = models.IntegerField()
    transport = models.CharField(max_length=20)
    queues = models.CharField(max_length=500)
    concurrency = models.IntegerField(default=1)
    active = models.IntegerField(default=0)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    objects = TenureManager()

    class Meta:
        db_table = "tenure_executor"

    def __str__(self) -> str:
        return self.id


class StoreTimeline(models.Model):
    """A timeline of the PostgreSQL cluster behind the store, with when Tenure first wrote on
    it: recorded by the migration that added it and by every ``run_scheduler`` round, so a
    promotion (a new timeline) is dated to within a round. Fences handed out on timeline ``t``
    are at least ``(t - 1) << 32`` (docs/architecture.md, "Fences across a failover"). SQLite
    has no timelines and no rows."""

    timeline = models.BigIntegerField(primary_key=True)
    first_seen_at = models.DateTimeField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_timeline"

    def __str__(self) -> str:
        return f"timeline {self.timeline} since {self.first_seen_at:%Y-%m-%d %H:%M:%S}"


class StaleWrite(models.Model):
    """Evidence: a write on behalf of an attempt whose fence was no longer current, refused."""

    job_id = models.BigIntegerField(db_index=True)
    fence = models.BigIntegerField()
    write = models.CharField(max_length=30)
    executor = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenureManager()

    class Meta:
        db_table = "tenure_stale_write"

    def __str__(self) -> str:
        return f"stale {self.write} job {self.job_id} fence {self.fence}"


class CountSnapshot(models.Model):
    """Succeeded and cancelled jobs per (queue, type), as counted by ``run_scheduler`` at
    ``taken_at``.

    The dashboard reads these once the job table is too big to count on every load; every
    other state is always counted live (those sets stay small).
    """

    queue = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    state = models.CharField(max_length=16)
    n = models.BigIntegerField()
    taken_at = models.DateTimeField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_count_snapshot"

    def __str__(self) -> str:
        return f"{self.queue}/{self.name} {self.state}: {self.n}"


class Queue(models.Model):
    """An operator's settings for one queue: paused (claimed by no executor or transport) and
    limits across every executor. A queue without a row has none of them, and a row with none
    left costs its claims what no row does; the row stays once made, so its version only grows."""

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    paused_reason = models.TextField(blank=True, default="")
    paused_at = models.DateTimeField(null=True, blank=True)
    max_leased = models.IntegerField(
        null=True, blank=True, help_text="At most this many of the queue's jobs leased at once."
    )
    max_per_second = models.FloatField(
        null=True, blank=True, help_text="At most this many claims of the queue per second."
    )
    tokens = models.FloatField(default=0.0, help_text="The rate limit's bucket (claims left).")
    tokens_at = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1)
    updated_at = models.DateTimeField()

    objects = TenureManager()

    class Meta:
        db_table = "tenure_queue"

    def __str__(self) -> str:
        return f"queue {self.name}{' (paused)' if self.paused else ''}"


class MinuteStats(models.Model):
    """History for the console's charts, one row per (minute, queue, job type): attempts that
    ended in that minute by outcome, and the queue wait of the claims made in it. Written by
    ``run_scheduler`` for each minute once it is over; kept ``TENURE_HISTORY_KEEP_SECONDS``."""

    minute = models.DateTimeField()
    queue = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    succeeded = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    indeterminate = models.IntegerField(default=0)
    retried = models.IntegerField(default=0)
    claims = models.IntegerField(default=0)
    wait_p50_ms = models.FloatField(null=True, blank=True)
    wait_p95_ms = models.FloatField(null=True, blank=True)

    objects = TenureManager()

    class Meta:
        db_table = "tenure_minute_stats"
        constraints = [
            models.UniqueConstraint(fields=["minute", "queue", "name"], name="tenure_minute_key")
        ]
        indexes = [models.Index(fields=["minute"], name="tenure_minute_time")]

    def __str__(self) -> str:
        return f"{self.minute:%H:%M} {self.queue}/{self.name}"
