"""Tenure as a backend of Django's task framework (``django.tasks``; on Django 5.2 the
``django-tasks`` backport): ``TASKS = {"default": {"BACKEND":
"scheduler_core.backends.TenureBackend"}}``.

Each ``@task`` function becomes a registered job type named by its module path, whose handler
(:func:`run_task`, or :func:`arun_task` for an ``async def`` task, which the attempt awaits as
it awaits an ``async def`` handler) calls it; each ``.enqueue()`` is a job accepted through the same enqueue
as ``@job`` (joining the caller's transaction on Tenure's database), claimed, fenced, retried
and recorded like any other; each result is a read of the job's record and its attempts. A
task's return value is kept as every handler's is: JSON, on the row of the attempt whose
completion was accepted, written by that fenced completion (:mod:`scheduler_core.api.results`). The field-by-field mapping and
the status of every job state are in ``docs/install.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import transaction

from .api import registry
from .conf import tenure_settings
from .db import alias
from .domain.classify import Matcher, PayloadMismatch
from .domain.modes import EffectMode
from .domain.states import State
from .exceptions import EnqueueError, Indeterminate, InvalidResult, JobCancelled, Permanent
from .runtime.context import JobContext

if TYPE_CHECKING:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_REFRESH_ATTRS, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
    from django.utils.json import normalize_json

    from .models import Attempt, Job
else:
    try:  # Django 6 and later
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import (
            TASK_REFRESH_ATTRS,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued
        from django.utils.json import normalize_json
    except ImportError:
        try:  # Django 5.2 with the backport
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import (
                TASK_REFRESH_ATTRS,
                Task,
                TaskContext,
                TaskError,
                TaskResult,
                TaskResultStatus,
            )
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued
            from django_tasks.utils import normalize_json
        except ImportError as missing:
            raise ImportError(
                "scheduler_core.backends needs django.tasks (Django 6) or the django-tasks "
                "backport on Django 5.2: pip install 'tenure[tasks]'"
            ) from missing

__all__ = [
    "STATUS",
    "TaskOptions",
    "TenureBackend",
    "TenureTaskContext",
    "TenureTaskResult",
    "arun_task",
    "run_task",
    "tenure_options",
]

F = TypeVar("F", bound=Callable[..., Any])

STATUS: dict[str, TaskResultStatus] = {
    State.WAITING: TaskResultStatus.READY,
    State.LEASED: TaskResultStatus.RUNNING,
    State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.FAILED: TaskResultStatus.FAILED,
    State.INDETERMINATE: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
}
"""The result status of a job in each lifecycle state. ``django.tasks`` has no word for
indeterminate (the effect may or may not have happened) nor for cancelled: both are
``FAILED``, their last error names :class:`~scheduler_core.exceptions.Indeterminate` or
:class:`~scheduler_core.exceptions.JobCancelled`, and ``result.tenure_state`` says which.
An operator may still move a failed or indeterminate job on; a later read says so."""

OPTION_NAMES = frozenset({"effect", "max_attempts", "lease_seconds", "timeout"})
"""What a TenureBackend's ``OPTIONS`` may set for all its tasks."""

OPTIONS_ATTRIBUTE = "__tenure_options__"


@dataclass(frozen=True, kw_only=True)
class TaskOptions:
    """Tenure's options of one task function (set with :func:`tenure_options`); ``None``
    takes the backend's ``OPTIONS``, then Tenure's defaults."""

    effect: str | None = None
    """The effect mode, as ``@job(effect=...)``; ``reconcilable`` needs ``@job``."""
    max_attempts: int | None = None
    lease_seconds: int | None = None
    timeout: float | None = None
    """Maximum runtime of one attempt in seconds (``@job(timeout=...)``)."""
    retry_on: tuple[Matcher, ...] = ()
    permanent_on: tuple[Matcher, ...] = ()
    unique_key: Callable[..., str | None] | None = None
    """Called with the enqueue's arguments; the key it returns deduplicates the enqueue (an
    accepted key returns the job already accepted under it), ``None`` does not."""


def tenure_options(
    *,
    effect: str | None = None,
    max_attempts: int | None = None,
    lease_seconds: int | None = None,
    timeout: float | None = None,
    retry_on: Iterable[Matcher] = (),
    permanent_on: Iterable[Matcher] = (),
    unique_key: Callable[..., str | None] | None = None,
) -> Callable[[F], F]:
    """Give one task function Tenure's own options; put it under ``@task``::

        @task()
        @tenure_options(effect="idempotent", max_attempts=3, unique_key=lambda order: f"o-{order}")
        def send_receipt(order: int) -> str: ...

    The function is returned unchanged (``django.tasks`` wants the function itself), with the
    options attached.
    """
    options = TaskOptions(
        effect=effect,
        max_attempts=max_attempts,
        lease_seconds=lease_seconds,
        timeout=timeout,
        retry_on=tuple(retry_on),
        permanent_on=tuple(permanent_on),
        unique_key=unique_key,
    )

    def attach(func: F) -> F:
        setattr(func, OPTIONS_ATTRIBUTE, options)
        return func

    return attach


def _options_of(func: Callable[..., Any]) -> TaskOptions:
    found = getattr(func, OPTIONS_ATTRIBUTE, None)
    return found if isinstance(found, TaskOptions) else TaskOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class TenureTaskResult(TaskResult):  # type: ignore[type-arg,misc]
    """A ``TaskResult`` read from Tenure's record, with the job's own state."""

    tenure_state: str = ""
    """The job's lifecycle state (``waiting``, ``leased``, ``succeeded``, ``failed``,
    ``indeterminate``, ``cancelled``): what ``status`` cannot tell apart."""

    def refresh(self) -> None:
        """Read the job's record again."""
        self._take(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """Read the job's record again."""
        self._take(await self.task.get_backend().aget_result(self.id))

    def _take(self, fresh: Any) -> None:
        for attr in (*TASK_REFRESH_ATTRS, "tenure_state"):
            object.__setattr__(self, attr, getattr(fresh, attr))


@dataclass(frozen=True, slots=True, kw_only=True)
class TenureTaskContext(TaskContext):  # type: ignore[type-arg,misc]
    """What a task with ``takes_context=True`` receives as ``context``: the result so far
    and ``context.tenure``, Tenure's handler context (job id, attempt, fence, ``effect()``)."""

    tenure: JobContext


_TASKS: dict[str, Task[..., Any]] = {}
"""Every task registered in this process, by job type name (its module path)."""
_REGISTERED_WITH: dict[str, tuple[Any, ...]] = {}


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class TenureBackend(BaseTaskBackend):
    """Runs ``django.tasks`` tasks as Tenure jobs: ``run_executor`` (or the Celery or RQ
    transport, where configured) claims them under the same protocol as ``@job``.

    ``OPTIONS`` may set ``effect``, ``max_attempts``, ``lease_seconds`` and ``timeout`` for
    every task of the backend; :func:`tenure_options` sets them (and more) per task.
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def validate_task(self, task: Task[..., Any]) -> None:
        """``django.tasks``' checks, then register the task's job type in this process."""
        super().validate_task(task)
        self._register(task)

    # -- registration ----------------------------------------------------------------------
    def _register(self, task: Task[..., Any]) -> registry.JobType:
        name = task.module_path
        options = _options_of(task.func)
        chosen = {k: v for k, v in self.options.items() if k in OPTION_NAMES}
        for k in OPTION_NAMES:
            value = getattr(options, k)
            if value is not None:
                chosen[k] = value
        fingerprint = (
            tuple(sorted(chosen.items())),
            options.retry_on,
            options.permanent_on,
        )
        known = _TASKS.get(name)
        jt = registry.get(name)
        if known is not None and jt is not None and jt.func in (run_task, arun_task):
            if _REGISTERED_WITH.get(name) == fingerprint:
                return jt
            if known.func is task.func:
                raise InvalidTask(
                    f"task {name} is already registered in this process with other Tenure "
                    "options (another backend's OPTIONS); give it one set with tenure_options()"
                )
        try:
            jt = registry.job(
                name=name,
                queue=task.queue_name,
                effect=str(chosen.get("effect", "at_least_once")),
                max_attempts=chosen.get("max_attempts"),
                lease_seconds=chosen.get("lease_seconds"),
                timeout=chosen.get("timeout"),
                retry_on=options.retry_on,
                permanent_on=options.permanent_on,
            )(arun_task if registry.is_async(task.func) else run_task)
        except ValueError as e:
            raise InvalidTask(f"task {name}: {e}") from None
        _TASKS[name] = task
        _REGISTERED_WITH[name] = fingerprint
        return jt

    # -- enqueue -----------------------------------------------------------------------------
    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Accept one job for ``task(*args, **kwargs)`` in the caller's transaction on
        Tenure's database; bad input raises :class:`~scheduler_core.exceptions.EnqueueError`
        and writes nothing."""
        self.validate_task(task)
        try:
            payload = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        except (TypeError, ValueError) as e:
            raise EnqueueError(f"arguments of task {task.module_path} are not JSON: {e}") from None
        _bind(task, list(args), dict(kwargs), error=EnqueueError)
        make_key = _options_of(task.func).unique_key
        key = make_key(*args, **kwargs) if make_key is not None else None
        job = registry.enqueue(
            task.module_path,
            payload,
            unique_key=key,
            run_at=task.run_after,
            priority=task.priority,
            queue=task.queue_name,
            check_queue=False,  # validate_task checked it against this backend's QUEUES
        )
        fresh = job.attempts == 0 and job.state == State.WAITING
        result = self._result(task, job, [] if fresh else _attempts(job.pk))
        transaction.on_commit(
            lambda: task_enqueued.send(type(self), task_result=result), using=alias()
        )
        return result

    # -- results -----------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The result of job ``result_id``, read from its record and attempts now; raises
        ``TaskResultDoesNotExist`` for an id that names no job of a task."""
        from .models import Job

        if not isinstance(result_id, str) or not result_id.isdigit():
            raise TaskResultDoesNotExist(result_id)
        job = Job.objects.select_related("spec").filter(pk=int(result_id)).first()
        task = _task_named(job.name) if job is not None else None
        if job is None or task is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(task, job, _attempts(job.pk))

    def _result(self, task: Task[..., Any], job: Job, attempts: list[Attempt]) -> TenureTaskResult:
        state = str(job.state)
        errors = [
            TaskError(exception_class_path=a.error_type, traceback=a.traceback or a.message)
            for a in attempts
            if a.error_type
        ]
        if state == State.INDETERMINATE:
            errors.append(
                TaskError(
                    exception_class_path=_path(Indeterminate),
                    traceback=f"job {job.pk} is indeterminate: {job.reason or job.last_error}; "
                    "its effect may or may not have happened, and an operator decides",
                )
            )
        elif state == State.CANCELLED:
            errors.append(
                TaskError(
                    exception_class_path=_path(JobCancelled),
                    traceback=f"job {job.pk} was cancelled: {job.reason}",
                )
            )
        elif state == State.FAILED and not errors:
            errors.append(
                TaskError(
                    exception_class_path=_path(Permanent),
                    traceback=f"job {job.pk} failed: {job.last_error or job.reason}",
                )
            )
        status = STATUS[state]
        finished = job.finished_at
        if finished is None and status != TaskResultStatus.RUNNING and attempts:
            finished = attempts[-1].finished_at if status != TaskResultStatus.READY else None
        payload = job.payload if isinstance(job.payload, dict) else {}
        result = TenureTaskResult(
            task=task,
            id=str(job.pk),
            status=status,
            enqueued_at=job.created_at,
            started_at=attempts[0].claimed_at if attempts else None,
            finished_at=finished,
            last_attempted_at=attempts[-1].claimed_at if attempts else None,
            args=list(payload.get("args", [])),
            kwargs=dict(payload.get("kwargs", {})),
            backend=self.alias,
            errors=errors,
            worker_ids=[a.executor for a in attempts],
            tenure_state=state,
        )
        if status == TaskResultStatus.SUCCESSFUL:
            won = [a for a in attempts if a.outcome == "succeeded"]
            object.__setattr__(result, "_return_value", won[-1].return_value if won else None)
        return result

    # -- checks ------------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[Any]:
        """Refuse a backend Tenure could not run: ids ``tenure.E030``..``tenure.E033``."""
        found: list[Any] = []
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("scheduler_core"):
            found.append(
                checks.Error(
                    f"{where} uses TenureBackend but 'scheduler_core' is not in INSTALLED_APPS",
                    id="tenure.E030",
                )
            )
        unknown = sorted(set(self.options) - OPTION_NAMES)
        if unknown:
            found.append(
                checks.Error(
                    f"{where}['OPTIONS'] has unknown names {unknown}",
                    hint=f"TenureBackend takes {sorted(OPTION_NAMES)}.",
                    id="tenure.E031",
                )
            )
        problem = _option_problem(self.options)
        if problem:
            found.append(checks.Error(f"{where}['OPTIONS']: {problem}", id="tenure.E032"))
        bad = sorted(
            repr(q) for q in self.queues if not isinstance(q, str) or not 0 < len(q) <= 100
        )
        if bad:
            found.append(
                checks.Error(
                    f"{where}['QUEUES'] has names Tenure cannot use: {', '.join(bad)}",
                    hint="A queue name is 1..100 characters.",
                    id="tenure.E033",
                )
            )
        return found


def _option_problem(options: dict[str, Any]) -> str:
    """Why the backend-wide Tenure options are invalid, or ``""``."""
    s = tenure_settings()
    effect = options.get("effect")
    if effect is not None and effect not in registry.EFFECT_ALIASES:
        try:
            EffectMode(effect)
        except ValueError:
            return f"effect {effect!r} is not one of {', '.join(m.value for m in EffectMode)}"
        if EffectMode(effect) == EffectMode.RECONCILABLE:
            return "effect 'reconcilable' needs a reconcile function: use @job for such work"
    attempts = options.get("max_attempts")
    if attempts is not None and (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= s.MAX_ATTEMPTS_LIMIT
    ):
        return f"max_attempts must be 1..{s.MAX_ATTEMPTS_LIMIT}"
    lease = options.get("lease_seconds")
    if lease is not None and (
        isinstance(lease, bool)
        or not isinstance(lease, int)
        or not 1 <= lease <= s.MAX_LEASE_SECONDS
    ):
        return f"lease_seconds must be 1..{s.MAX_LEASE_SECONDS}"
    timeout = options.get("timeout")
    if timeout is not None:
        try:
            registry.check_timeout(timeout, what="timeout")
        except ValueError as e:
            return str(e)
    return ""


def _attempts(job_id: int) -> list[Attempt]:
    from .models import Attempt

    return list(Attempt.objects.filter(job_id=job_id).order_by("fence"))


def _task_named(name: str) -> Task[..., Any] | None:
    """The task whose job type is ``name``: registered in this process, else imported from
    its module path (as the record names it) if that is a task of a TenureBackend."""
    known = _TASKS.get(name)
    if known is not None:
        return known
    from django.utils.module_loading import import_string

    try:
        found = import_string(name)
    except ImportError:
        return None
    if isinstance(found, Task) and isinstance(found.get_backend(), TenureBackend):
        return found
    return None


def _bind(
    task: Task[..., Any], args: list[Any], kwargs: dict[str, Any], *, error: type[Exception]
) -> None:
    """Raise ``error`` unless ``args`` and ``kwargs`` fit the task function's signature."""
    leading = [None] if task.takes_context else []
    try:
        inspect.signature(task.func).bind(*leading, *args, **kwargs)
    except TypeError as e:
        raise error(f"arguments do not fit task {task.module_path}: {e}") from None


def _as_json(value: Any) -> Any:
    """``value`` as ``django.tasks`` normalises a result to JSON (tuples to lists, and so on),
    or :class:`InvalidResult` saying why it cannot be. The size is checked where every
    handler's value is (:func:`scheduler_core.api.results.checked_result`)."""
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as e:
        raise InvalidResult(
            f"the task returned a {type(value).__name__}, which is not JSON ({e}); a task's "
            "return value is stored as JSON"
        ) from None


def run_task(ctx: JobContext, *, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The handler of every plain task's job type: call the task's function with the enqueued
    arguments and return its value as JSON, which the attempt's completion keeps as the job's
    result (fenced, as for every ``@job`` handler: :mod:`scheduler_core.api.results`).

    A return value that is not JSON, or larger than ``TENURE_MAX_RETURN_VALUE_BYTES``, ends
    the job ``failed`` with that reason and no retry: the function has run, and running it
    again would return the same. ``None`` is not written (the result reads ``None`` then).
    """
    task, leading = _prepared(ctx, args, kwargs)
    return _as_json(task.call(*leading, *args, **kwargs))


async def arun_task(ctx: JobContext, *, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """:func:`run_task` for an ``async def`` task: its coroutine is awaited in the attempt's
    coroutine, so it is cancelled with it (a lost lease, the maximum runtime) and its database
    work runs on the attempt's own connection (:mod:`scheduler_core.runtime.invoke`)."""
    task, leading = await sync_to_async(_prepared)(ctx, args, kwargs)
    return _as_json(await task.acall(*leading, *args, **kwargs))


def _prepared(
    ctx: JobContext, args: list[Any], kwargs: dict[str, Any]
) -> tuple[Task[..., Any], list[Any]]:
    """The task of ``ctx``'s job and the arguments before the enqueued ones (its context)."""
    task = _TASKS.get(ctx.name)
    if task is None:
        raise Permanent(f"no django.tasks task is registered as {ctx.name!r} in this process")
    leading: list[Any] = []
    if task.takes_context:
        backend = task.get_backend()
        leading.append(
            TenureTaskContext(task_result=backend.get_result(str(ctx.job_id)), tenure=ctx)
        )
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise PayloadMismatch("a task's payload holds a list 'args' and an object 'kwargs'")
    _bind(task, list(args), dict(kwargs), error=PayloadMismatch)
    return task, leading
