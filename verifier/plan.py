"""The parameters of one verifier run, with the defaults ``make chaos`` uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FAULT_KINDS: tuple[str, ...] = (
    "kill",
    "pause_long",
    "pause_short",
    "term",
    "backend_kill",
    "pg_restart",
    "pg_down",
    "blackhole",
    "drop_replies",
    "broker_restart",
    "broker_duplicate",
    "pool_kill",
)
"""Every fault the nemesis knows (see :mod:`verifier.nemesis`)."""

CELERY_FAULTS: tuple[str, ...] = ("broker_restart", "broker_duplicate", "pool_kill")
"""The faults that need the run's broker and Celery workers."""

NEGATIVE_FAULTS: tuple[str, ...] = ("pause_long", "pg_restart")
"""The faults the ``fence`` negative control injects: enough to show what the disabled guards
let through (a resumed stale attempt, acknowledged commits lost in a crash)."""

NEGATIVE_CONTROLS: tuple[str, ...] = ("fence", "sticky", "whole-job", "max-age-fails")
"""What a negative-control run switches off: ``fence`` — the executors' fence check
(:class:`verifier.drivers.FenceOff`), the database's index of one open attempt per job, and
durable commits; ``sticky`` — the ledger's sticky
unknown outcome, in the executors and Celery workers only (:class:`verifier.drivers.Forgetful`);
``whole-job`` — reconcile asked per effect (:class:`verifier.drivers.WholeJob`);
``max-age-fails`` — the ledger's rule at ``max_age`` (:class:`verifier.drivers.MaxAgeFails`)."""
CONTROL_DRIVERS: dict[str, str] = {
    "sticky": "verifier.drivers.Forgetful",
    "whole-job": "verifier.drivers.WholeJob",
    "max-age-fails": "verifier.drivers.MaxAgeFails",
}
"""The storage driver each negative control (but ``fence``) runs in every process that runs
jobs (``TENURE_DRIVER``)."""
PATHS_SHARE = 0.1
"""Share of the verifier's own jobs on the broker-less queue that walk the end paths
(``PATH_CASES`` in :mod:`verifier.workload`)."""
CONTROL_PATHS_SHARE = 0.6
"""The same share in the ``whole-job`` and ``max-age-fails`` negative controls, so a short run
meets their cases often."""
DOWN_URL_ENV = "CHAOS_PAY_DOWN_URL"
"""An address where nothing listens (the verifier holds the port, bound but not listening):
a request the payment provider should refuse goes there, and its connection is refused."""

WORKFLOW_SHARE = 0.04
"""The default share of enqueues that are workflows (``--workflow-share``)."""
FALLBACK_SHARE = 0.15
"""Share of the verifier's own jobs that fall back to the second provider (``chaos.fallback``)."""
STICKY_FALLBACK_SHARE = 0.6
"""The same share in the ``sticky`` negative control, so a short run meets its case often."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One run: how long, which seed, which faults, how big the system under test is."""

    seconds: float = 1800.0
    """Length of the fault phase; the drain and the checks come after it."""
    seed: int = 1
    negative_control: str = ""
    """Empty for a normal run, or which guard a negative control switches off
    (:data:`NEGATIVE_CONTROLS`): ``fence`` switches the fence check off in the executors,
    drops the one-open-attempt index and runs PostgreSQL with ``synchronous_commit=off``; ``sticky`` makes the executors' ledger
    forget an unknown outcome when a later attempt sends nothing. The checker must then report
    failures."""
    executors: int = 3
    concurrency: int = 4
    schedulers: int = 2
    rate: float = 3.0
    """Jobs enqueued per second during the fault phase."""
    long_share: float = 0.12
    """Share of jobs that work longer than a lease before their effect (renewals, and a
    replacement still running when a paused owner resumes)."""
    fallback_share: float = FALLBACK_SHARE
    """Share of the verifier's own jobs that are ``chaos.fallback``: a primary provider that
    sometimes applies, times out, then turns the next attempt away, and a fallback provider
    that keeps its own keys."""
    paths_share: float = PATHS_SHARE
    """Share of the verifier's own jobs on the broker-less executors' queue that walk the end
    paths: two effects with a lost reply, snoozing after a lost reply, overrunning after the
    effect, an unanswered cancel request (``PATH_CASES`` in :mod:`verifier.workload`)."""
    async_share: float = 0.25
    """Share of the verifier's jobs of the five types on the broker-less executors' queue
    whose handler is the ``async def`` twin (:data:`verifier.job_types.ASYNC_TWINS`)."""
    workflow_share: float = WORKFLOW_SHARE
    """Share of the enqueues that are workflows of the verifier's own types: a chain of three,
    or a fan-out of up to 50 steps into one fan-in, each step an ordinary chaos job (some
    with an effect whose reply is lost)."""
    lease_seconds: int = 4
    reap_grace: float = 1.0
    sweep_interval: float = 0.5
    faults: tuple[str, ...] = FAULT_KINDS
    fault_gap: tuple[float, float] = (1.0, 3.0)
    """Seconds between one fault's heal and the next fault, drawn uniformly."""
    celery_workers: int = 1
    """Celery workers (prefork, two processes each) serving the broker queue; 0 runs no
    broker at all (and leaves the broker faults out)."""
    broker_share: float = 0.25
    """Share of the verifier's jobs enqueued on the broker queue (announced through the run's
    own Redis, run by the Celery workers) instead of the broker-less executors' queue."""
    broker_port: int = 0
    """Port of the run's own Redis broker (0 picks a free one)."""
    redispatch_after: float = 3.0
    """Seconds before the dispatcher re-sends the hint of a due job nobody claimed."""
    pg_port: int = 55433
    """Port of the run's own PostgreSQL cluster (0 picks a free one)."""
    clock_offsets: tuple[str, ...] = ("+5m", "-5m")
    """``faketime`` offsets given to the first executors (and the first scheduler, reversed);
    the rest run on the real clock."""
    drain_timeout: float = 240.0
    bad_input: bool = True
    """Run the hostile-input sweep (API, broker, dashboard) after the drain."""
    redis_url: str = "redis://127.0.0.1:6379/14"
    """Broker for the sweep's Celery worker; the sweep touches only keys named after its own
    queue, so a shared Redis is left as it was."""
    workdir: Path | None = None
    keep: bool = False
    """Keep the run's folder (database, logs, event logs) after it ends."""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        """The faults this run injects: the broker's only when it has Celery workers."""
        if self.celery_workers:
            return self.faults
        return tuple(f for f in self.faults if f not in CELERY_FAULTS)

    @property
    def hint_bound(self) -> float:
        """Seconds a due job on the broker queue may wait after its hint was lost and the
        broker is back: the re-send delay and one sweep interval (the checker adds the
        Celery worker's reconnect)."""
        return self.redispatch_after + self.sweep_interval

    @property
    def default_timeout(self) -> float:
        """The installation's maximum runtime of an attempt in the run's processes
        (``TENURE_DEFAULT_TIMEOUT_SECONDS``): four leases, like the timeout the verifier's
        other job types declare, so a hung attempt of a type that declares none is ended
        within the run."""
        return 4.0 * self.lease_seconds

    @property
    def recovery_bound(self) -> float:
        """Seconds from an owner's last renewal to the reaper moving its job on: the lease,
        the reaper's grace and one sweep interval."""
        return self.lease_seconds + self.reap_grace + self.sweep_interval
