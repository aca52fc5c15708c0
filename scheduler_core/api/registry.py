"""Job registration (``@job``), the registered job types, and enqueue by job type: every
payload and option is validated here before anything is written; the insert and its wake-ups
are :mod:`scheduler_core.api.enqueue`.

Apps define jobs in ``<app>/jobs.py``; those modules are imported when Django starts
(:meth:`scheduler_core.apps.SchedulerCoreConfig.ready`), so every process — web, executors,
the scheduler — knows the same handlers.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction

from ..conf import tenure_settings
from ..domain.classify import Matcher, check_matchers
from ..domain.modes import EffectMode
from ..domain.options import JobOptions
from ..domain.retry import RetryPolicy
from ..domain.schedules import ScheduleSpec, spec_for_job
from ..exceptions import EnqueueError, UnknownJob

if TYPE_CHECKING:
    from ..models import Job

# The insert path (:mod:`scheduler_core.api.enqueue`) reaches the models and the storage
# layer, which Django loads after this package: it is imported where a job is enqueued.

RESERVED = frozenset({"unique_key", "run_at", "priority", "queue", "delay", "ctx"})
"""Names a handler's payload may not use: ``enqueue`` takes them as per-call options, so a
handler declaring one is refused at registration (``ValueError``)."""
EFFECT_ALIASES = {"unprotected": EffectMode.AT_LEAST_ONCE}

_REGISTRY: dict[str, JobType] = {}


@dataclass(frozen=True, kw_only=True)
class JobType:
    """A registered handler and how its work is run, retried and protected."""

    name: str
    func: Callable[..., Any]
    queue: str
    effect: EffectMode
    max_attempts: int
    lease_seconds: int
    retry_policy: RetryPolicy
    retry_on: tuple[Matcher, ...] = ()
    permanent_on: tuple[Matcher, ...] = ()
    reconcile: Callable[..., Any] | None = None
    reconcile_takes_effect: bool = False
    """Whether the reconcile function declares an ``effect`` parameter: it then receives the
    effect it is asked about there (every reconcile function also finds it as
    ``ctx.reconciling``)."""
    fallback: Callable[..., Any] | None = None
    fallback_shares_key: bool = False
    """Whether the fallback's destination accepts the primary's effect key (see
    ``docs/guarantees.md``): a claim about that destination's dedup store, which the job type
    must state. When not, the fallback runs only after the primary's effect is known not
    applied."""
    schedule: ScheduleSpec | None = None
    timeout: float | None = None
    """The maximum runtime this job type declares, in seconds; None takes the project's
    (:attr:`max_runtime`)."""
    signature: inspect.Signature = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def max_runtime(self) -> float:
        """Maximum runtime of one attempt in seconds: ``timeout``, else
        ``TENURE_DEFAULT_TIMEOUT_SECONDS``. Every attempt has one: past it the attempt may not
        renew its lease, complete or start an effect, and shows as ``overrunning`` until the
        reaper moves the job on. Stored on each job when it is enqueued."""
        if self.timeout is not None:
            return self.timeout
        return float(tenure_settings().DEFAULT_TIMEOUT_SECONDS)

    def options(
        self,
        *,
        payload: dict[str, Any] | None = None,
        queue: str | None = None,
        priority: int = 0,
        run_at: dt.datetime | None = None,
    ) -> JobOptions:
        """The job spec of one job of this type: the type's options (attempts, lease, effect
        mode, maximum runtime, and its queue unless ``queue`` names another) with the per-call
        ones, already checked. The one mapping of a type to its jobs' spec, for an enqueue,
        a batch, a schedule's occurrence and a workflow's step alike."""
        return JobOptions(
            name=self.name,
            queue=self.queue if queue is None else queue,
            max_attempts=self.max_attempts,
            lease_seconds=self.lease_seconds,
            effect=self.effect.value,
            timeout_seconds=self.max_runtime,
            priority=priority,
            run_at=run_at,
            payload={} if payload is None else payload,
        )

    def __call__(self, ctx: Any, **payload: Any) -> Any:
        """Call the handler directly (tests); executors go through the claim protocol."""
        return self.func(ctx, **payload)

    def enqueue(
        self,
        *,
        unique_key: str | None = None,
        run_at: dt.datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        delay: Delay | None = None,
        **payload: Any,
    ) -> Job:
        """Accept one job of this type, joining the caller's transaction.

        Per-call options (each ``None``: the job type's): ``queue`` (a known queue:
        :func:`check_queue_known`), ``priority`` (-1000..1000, higher first; default 0),
        ``run_at`` (an aware datetime) or ``delay`` (seconds or a ``timedelta`` from now), not
        both. A ``unique_key`` already accepted returns the existing job and writes nothing.
        Bad input raises :class:`~scheduler_core.exceptions.EnqueueError` and writes nothing.
        """
        return enqueue(
            self.name,
            payload,
            unique_key=unique_key,
            run_at=run_at,
            priority=priority,
            queue=queue,
            delay=delay,
        )

    def enqueue_many(
        self,
        payloads: Iterable[dict[str, Any]],
        *,
        run_at: dt.datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        delay: Delay | None = None,
    ) -> list[int]:
        """Accept many jobs of this type in one statement; see :func:`enqueue_many`."""
        return enqueue_many(
            self.name, payloads, run_at=run_at, priority=priority, queue=queue, delay=delay
        )

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: dt.datetime | None = None,
        delay: Delay | None = None,
    ) -> Options:
        """This job type with per-call options set, to enqueue with later::

            charge.using(queue="urgent", priority=10).enqueue(invoice_id=1, cents=500)

        The options are checked when a job is enqueued, as :meth:`enqueue`'s are."""
        return Options(jt=self, queue=queue, priority=priority, run_at=run_at, delay=delay)

    def check_payload(self, payload: dict[str, Any]) -> None:
        """Raise ``TypeError`` when ``payload`` does not fit the handler's keyword arguments."""
        self.signature.bind(None, **payload)


Delay = float | int | dt.timedelta
"""A ``delay=``: seconds, or a ``timedelta``, from now (the enqueuing process's clock)."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """A job type with per-call options (:meth:`JobType.using`); ``None`` takes the type's."""

    jt: JobType
    queue: str | None = None
    priority: int | None = None
    run_at: dt.datetime | None = None
    delay: Delay | None = None

    def enqueue(self, *, unique_key: str | None = None, **payload: Any) -> Job:
        """:meth:`JobType.enqueue` with these options."""
        return self.jt.enqueue(
            unique_key=unique_key,
            queue=self.queue,
            priority=self.priority,
            run_at=self.run_at,
            delay=self.delay,
            **payload,
        )

    def enqueue_many(self, payloads: Iterable[dict[str, Any]]) -> list[int]:
        """:meth:`JobType.enqueue_many` with these options."""
        return self.jt.enqueue_many(
            payloads, queue=self.queue, priority=self.priority, run_at=self.run_at, delay=self.delay
        )


def job(
    name: str | None = None,
    *,
    queue: str | None = None,
    effect: str = "at_least_once",
    max_attempts: int | None = None,
    lease_seconds: int | None = None,
    retry_on: Iterable[Matcher] = (),
    permanent_on: Iterable[Matcher] = (),
    backoff_base: float | None = None,
    backoff_cap: float | None = None,
    max_age: float | None = None,
    reconcile: Callable[..., Any] | None = None,
    fallback: Callable[..., Any] | None = None,
    fallback_shares_key: bool = False,
    schedule: Any = None,
    schedule_tz: str = "UTC",
    misfire: str = "run_once",
    catch_up_max: int = 1,
    overlap: str = "allow",
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], JobType]:
    """Register a handler ``fn(ctx, **payload)`` as a job type.

    ``effect`` declares how the job's business effect is protected: ``transactional``,
    ``idempotent``, ``reconcilable``, ``at_least_once`` or ``at_most_once`` (see
    ``docs/guarantees.md``). Registration errors raise ``ValueError`` at import time.

    ``retry_on`` / ``permanent_on`` take exception types or predicates; ``fallback`` (with
    ``fallback_shares_key``, false unless the job type states that the fallback's destination
    deduplicates by the same key) and ``schedule`` (a cron string or a ``timedelta``, with
    ``schedule_tz``, ``misfire``, ``catch_up_max`` and ``overlap``) are described in
    ``docs/guarantees.md``. ``timeout`` is the maximum runtime of one attempt in seconds
    (default ``TENURE_DEFAULT_TIMEOUT_SECONDS``); there is no way to declare none.
    """

    def register(fn: Callable[..., Any]) -> JobType:
        s = tenure_settings()
        jname = name or f"{fn.__module__}.{fn.__qualname__}"
        check_callable(fn, what=f"job {jname}: the handler")
        if reconcile is not None:
            check_callable(reconcile, what=f"job {jname}: the reconcile function")
        try:
            mode = EFFECT_ALIASES.get(effect) or EffectMode(effect)
        except ValueError:
            raise ValueError(
                f"job {jname}: effect must be one of {', '.join(m.value for m in EffectMode)}"
            ) from None
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise ValueError(f"job {jname}: the handler's first parameter must be ctx")
        clash = RESERVED & {p.name for p in params[1:]}
        if clash:
            raise ValueError(f"job {jname}: payload names {sorted(clash)} are reserved")
        attempts = s.DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts
        lease = s.DEFAULT_LEASE_SECONDS if lease_seconds is None else lease_seconds
        _check_limits(jname, attempts, lease)
        runtime = None if timeout is None else check_timeout(timeout, what=f"job {jname}: timeout")
        if mode == EffectMode.RECONCILABLE and reconcile is None:
            raise ValueError(f"job {jname}: effect='reconcilable' needs reconcile=<function>")
        takes_effect = _reconcile_takes_effect(jname, reconcile, sig)
        checked = _check_errors_and_schedule(
            jname,
            sig,
            retry_on=retry_on,
            permanent_on=permanent_on,
            fallback=fallback,
            schedule=schedule,
            schedule_options={
                "tz": schedule_tz,
                "misfire": misfire,
                "catch_up_max": catch_up_max,
                "overlap": overlap,
            },
        )
        try:
            policy = RetryPolicy(
                base=s.BACKOFF_BASE_SECONDS if backoff_base is None else backoff_base,
                cap=s.BACKOFF_CAP_SECONDS if backoff_cap is None else backoff_cap,
                max_age=max_age,
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"job {jname}: {e}") from None
        jt = JobType(
            name=jname,
            func=fn,
            queue=queue or s.DEFAULT_QUEUE,
            effect=mode,
            max_attempts=attempts,
            lease_seconds=lease,
            retry_policy=policy,
            reconcile=reconcile,
            reconcile_takes_effect=takes_effect,
            fallback=fallback,
            fallback_shares_key=bool(fallback_shares_key),
            **checked,
            timeout=runtime,
            signature=sig,
        )
        existing = _REGISTRY.get(jname)
        if existing is not None and existing.func is not fn:
            same = (existing.func.__module__, existing.func.__qualname__) == (
                fn.__module__,
                fn.__qualname__,
            )
            if not same:
                raise ValueError(f"job name {jname!r} is already registered by {existing.func}")
        _REGISTRY[jname] = jt
        return jt

    return register


def _reconcile_takes_effect(
    jname: str, reconcile: Callable[..., Any] | None, sig: inspect.Signature
) -> bool:
    """Whether ``reconcile`` declares the ``effect`` parameter (the effect it is asked about);
    ``ValueError`` when it is no function of ``ctx``, or when the handler's payload also names
    ``effect`` (the two would collide in the reconcile call)."""
    if reconcile is None:
        return False
    if not callable(reconcile):
        raise ValueError(f"job {jname}: reconcile must be a function reconcile(ctx, **payload)")
    params = list(inspect.signature(reconcile).parameters.values())
    if not params:
        raise ValueError(f"job {jname}: the reconcile function's first parameter must be ctx")
    takes = any(
        p.name == "effect"
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        for p in params[1:]
    )
    if takes and "effect" in sig.parameters:
        raise ValueError(
            f"job {jname}: the reconcile function's 'effect' parameter receives the effect it "
            "is asked about, so the handler's payload may not also be named 'effect'"
        )
    return takes


def _check_errors_and_schedule(
    jname: str,
    sig: inspect.Signature,
    *,
    retry_on: Iterable[Any],
    permanent_on: Iterable[Any],
    fallback: Callable[..., Any] | None,
    schedule: Any,
    schedule_options: dict[str, Any],
) -> dict[str, Any]:
    """Validate ``retry_on`` / ``permanent_on``, the fallback and the schedule of a job.

    Returns the normalised ``retry_on``, ``permanent_on`` and ``schedule`` fields; raises
    ``ValueError`` naming the job.
    """
    try:
        out: dict[str, Any] = {
            "retry_on": check_matchers(retry_on, what="retry_on"),
            "permanent_on": check_matchers(permanent_on, what="permanent_on"),
        }
    except ValueError as e:
        raise ValueError(f"job {jname}: {e}") from None
    if fallback is not None:
        if not callable(fallback):
            raise ValueError(f"job {jname}: fallback must be a function fallback(ctx, **payload)")
        check_callable(fallback, what=f"job {jname}: the fallback")
        if not list(inspect.signature(fallback).parameters):
            raise ValueError(f"job {jname}: the fallback's first parameter must be ctx")
    spec = spec_for_job(jname, schedule, **schedule_options)
    if spec is not None:
        try:
            sig.bind(None)
        except TypeError:
            raise ValueError(
                f"job {jname}: a scheduled job is enqueued without a payload, so every "
                "payload argument of its handler needs a default"
            ) from None
    out["schedule"] = spec
    return out


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a coroutine to await: an ``async def`` function, a
    ``functools.partial`` of one, a function marked with ``markcoroutinefunction`` (asgiref's
    or ``inspect``'s), or an object whose ``__call__`` is one."""
    return bool(
        iscoroutinefunction(fn)
        or (not inspect.isroutine(fn) and iscoroutinefunction(type(fn).__call__))
    )


def check_callable(fn: Callable[..., Any], *, what: str) -> None:
    """Refuse (``ValueError`` naming ``what``) a handler, reconcile function or fallback that an
    attempt could call but not run to its end: a generator function, sync or async (calling it
    runs none of its body), and a plain function that wraps an ``async def`` one (its own code
    would run around the making of the coroutine, not around its run). A plain function and an
    ``async def`` one (:func:`is_async`) pass."""
    if not callable(fn):
        raise ValueError(f"{what} must be a function")
    inner = inspect.unwrap(fn) if inspect.isroutine(fn) else fn
    looked_at = [fn, inner] if inspect.isroutine(inner) else [fn, type(inner).__call__]
    for f in looked_at:
        if inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f):
            kind = "an async generator" if inspect.isasyncgenfunction(f) else "a generator"
            raise ValueError(
                f"{what} is {kind} function: calling it runs none of its body; write a "
                "plain function or an async def that returns"
            )
    if not is_async(fn) and inner is not fn and is_async(inner):
        raise ValueError(
            f"{what} is a plain function wrapping the async def "
            f"{getattr(inner, '__qualname__', inner)!s}: the wrapper's own code would run "
            "around the making of the coroutine, not around its run; make the wrapper async "
            "def too (or, if it only returns the coroutine, mark it with "
            "inspect.markcoroutinefunction or asgiref's)"
        )


def _check_limits(jname: str, attempts: int, lease: int) -> None:
    s = tenure_settings()
    if not isinstance(attempts, int) or not 1 <= attempts <= s.MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"job {jname}: max_attempts must be 1..{s.MAX_ATTEMPTS_LIMIT}")
    if not isinstance(lease, int) or not 1 <= lease <= s.MAX_LEASE_SECONDS:
        raise ValueError(f"job {jname}: lease_seconds must be 1..{s.MAX_LEASE_SECONDS}")


def check_timeout(timeout: Any, *, what: str) -> float:
    """``timeout`` as a maximum runtime, if it is a finite number of seconds within
    ``TENURE_MAX_TIMEOUT_SECONDS``; else ``ValueError`` naming ``what``."""
    s = tenure_settings()
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= s.MAX_TIMEOUT_SECONDS
    ):
        raise ValueError(
            f"{what} (a maximum runtime) must be a number of seconds in "
            f"(0, {s.MAX_TIMEOUT_SECONDS:g}]; every attempt has one"
        )
    return float(timeout)


def get(name: str) -> JobType | None:
    """The job type registered as ``name``, if any."""
    return _REGISTRY.get(name)


def all_types() -> dict[str, JobType]:
    """Every registered job type by name."""
    return dict(_REGISTRY)


# ---------------------------------------------------------------------------------------------
# Enqueue
# ---------------------------------------------------------------------------------------------


def _check_json(value: Any, depth: int, max_depth: int, what: str = "payload") -> None:
    if depth > max_depth:
        raise EnqueueError(f"{what} nests deeper than {max_depth} levels")
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if abs(value) > 2**63 - 1:
            raise EnqueueError(f"{what} integer does not fit in 64 bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EnqueueError(f"{what} number is NaN or infinite, which JSON cannot carry")
        return
    if isinstance(value, str):
        if "\x00" in value:
            raise EnqueueError(f"{what} string contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise EnqueueError(f"{what} string is not valid UTF-8") from None
        return
    if isinstance(value, list | tuple):
        for v in value:
            _check_json(v, depth + 1, max_depth, what)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise EnqueueError(f"{what} key {k!r} is not a string")
            _check_json(k, depth + 1, max_depth, what)
            _check_json(v, depth + 1, max_depth, what)
        return
    raise EnqueueError(f"{what} value of type {type(value).__name__} is not JSON")


def check_json(value: Any, *, what: str, max_bytes: int) -> int:
    """Check ``value`` is JSON that Tenure stores as it is (no NaN, no NUL, 64-bit integers,
    string keys, at most ``TENURE_MAX_PAYLOAD_DEPTH`` deep, at most ``max_bytes`` as UTF-8);
    return its size. Raises :class:`~scheduler_core.exceptions.EnqueueError` naming ``what``."""
    _check_json(value, 0, tenure_settings().MAX_PAYLOAD_DEPTH, what)
    size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    if size > max_bytes:
        raise EnqueueError(f"{what} is {size} bytes; the limit is {max_bytes}")
    return size


def validate_payload(jt: JobType, payload: Any) -> dict[str, Any]:
    """Check a payload is a JSON object within limits that fits the handler; return it."""
    s = tenure_settings()
    if not isinstance(payload, dict):
        raise EnqueueError("payload must be a JSON object (keyword arguments)")
    _check_json(payload, 0, s.MAX_PAYLOAD_DEPTH)
    size = len(json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    if size > s.MAX_PAYLOAD_BYTES:
        raise EnqueueError(f"payload is {size} bytes; the limit is {s.MAX_PAYLOAD_BYTES}")
    try:
        jt.check_payload(payload)
    except TypeError as e:
        raise EnqueueError(f"payload does not fit {jt.name}: {e}") from None
    return payload


def _check_queue(queue: Any) -> None:
    if not isinstance(queue, str) or not queue or len(queue) > 100 or "\x00" in queue:
        raise EnqueueError("queue must be a non-empty string of at most 100 characters")


def check_queue_known(queue: str) -> None:
    """Refuse (:class:`~scheduler_core.exceptions.EnqueueError`) a per-call ``queue`` nothing
    would serve on purpose: a name is known when a registered job type routes to it, it is
    ``TENURE_DEFAULT_QUEUE`` or one of ``TENURE_BROKER_QUEUES``, or an operator gave it
    settings (``manage.py queues pause|limit``, the dashboard), which makes its row. A typo
    would otherwise leave its jobs waiting with no executor told to serve them."""
    from ..storage.drivers import driver

    s = tenure_settings()
    if queue == s.DEFAULT_QUEUE or queue in s.BROKER_QUEUES:
        return
    if any(jt.queue == queue for jt in _REGISTRY.values()):
        return
    if driver().queue_row(queue) is not None:
        return
    routed = sorted({jt.queue for jt in _REGISTRY.values()} | {s.DEFAULT_QUEUE})
    raise EnqueueError(
        f"queue {queue!r} is unknown: no job type routes to it and it has no settings; known "
        f"queues are {', '.join(routed)} (a queue becomes known with @job(queue=...) or with "
        "settings of its own: manage.py queues pause|limit)"
    )


def _due_at(run_at: Any, delay: Any) -> dt.datetime | None:
    """The ``run_at`` an enqueue writes: ``run_at``, or now plus ``delay``, never both."""
    if delay is None:
        return run_at  # type: ignore[no-any-return]
    if run_at is not None:
        raise EnqueueError("run_at and delay are exclusive: give one of them")
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise EnqueueError("delay must be a number of seconds or a timedelta")
    days = tenure_settings().MAX_RUN_AT_DAYS
    if not math.isfinite(seconds) or not 0 <= seconds <= days * 86400:
        raise EnqueueError(
            f"delay must be at least 0 and at most {days} days (TENURE_MAX_RUN_AT_DAYS)"
        )
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


def _check_options(unique_key: Any, run_at: Any, priority: Any) -> None:
    s = tenure_settings()
    if unique_key is not None:
        if not isinstance(unique_key, str) or not unique_key or len(unique_key) > 300:
            raise EnqueueError("unique_key must be a non-empty string of at most 300 characters")
        if "\x00" in unique_key:
            raise EnqueueError("unique_key contains a NUL character")
    if run_at is not None:
        if not isinstance(run_at, dt.datetime):
            raise EnqueueError("run_at must be a datetime")
        if run_at.tzinfo is None:
            raise EnqueueError("run_at must be timezone-aware")
        now = dt.datetime.now(dt.UTC)
        if run_at > now + dt.timedelta(days=s.MAX_RUN_AT_DAYS):
            raise EnqueueError(f"run_at is more than {s.MAX_RUN_AT_DAYS} days ahead")
        if run_at.year < 2000:
            raise EnqueueError("run_at is before the year 2000")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -1000 <= priority <= 1000:
        raise EnqueueError("priority must be an integer in -1000..1000")


def enqueue(
    name: str,
    payload: dict[str, Any] | None = None,
    *,
    unique_key: str | None = None,
    run_at: dt.datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    delay: Delay | None = None,
    check_queue: bool = True,
) -> Job:
    """Accept a job by handler name (see :meth:`JobType.enqueue`). ``check_queue=False`` is
    for a caller that checked ``queue`` against a configuration of its own (the
    ``django.tasks`` backend, whose ``QUEUES`` name its queues)."""
    from . import enqueue as insert

    jt = _REGISTRY.get(name) if isinstance(name, str) else None
    if jt is None:
        raise UnknownJob(f"no job is registered as {name!r}")
    payload = validate_payload(jt, {} if payload is None else payload)
    run_at = _due_at(run_at, delay)
    priority = 0 if priority is None else priority
    _check_options(unique_key, run_at, priority)
    if queue is not None:
        _check_queue(queue)
        if check_queue and queue != jt.queue:
            check_queue_known(queue)
    return insert.insert_job_of(
        jt, payload=payload, run_at=run_at, unique_key=unique_key, priority=priority, queue=queue
    )


def enqueue_many(
    name: str,
    payloads: Iterable[dict[str, Any]],
    *,
    run_at: dt.datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    delay: Delay | None = None,
) -> list[int]:
    """Accept many jobs of one type in one statement, joining the caller's transaction; return
    their ids in payload order. The per-call options are :meth:`JobType.enqueue`'s.

    Every payload is validated as :func:`enqueue` validates one, before anything is written:
    one bad payload raises :class:`~scheduler_core.exceptions.EnqueueError` and writes
    nothing. There are no unique keys here; a job that must be accepted once is enqueued alone.
    """
    from . import enqueue as insert

    jt = _REGISTRY.get(name) if isinstance(name, str) else None
    if jt is None:
        raise UnknownJob(f"no job is registered as {name!r}")
    checked = [validate_payload(jt, p) for p in payloads]
    run_at = _due_at(run_at, delay)
    priority = 0 if priority is None else priority
    _check_options(None, run_at, priority)
    if queue is not None:
        _check_queue(queue)
        if queue != jt.queue:
            check_queue_known(queue)
    return insert.insert_jobs(
        jt.options(queue=queue, priority=priority, run_at=run_at), checked, sender=jt
    )
