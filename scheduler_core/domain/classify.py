"""Failure classification: an exception (and where it happened) to a failure class. Pure.

The defaults, in the order :func:`classify` applies them (first match wins):

1. ``Permanent`` raised: permanent.
2. ``Indeterminate`` raised, or anything else once an effect's outcome became unknown in
   this attempt: indeterminate.
3. ``Transient`` raised: transient.
4. The payload does not fit the handler (:class:`PayloadMismatch`): permanent.
5. The job's ``permanent_on`` matches: permanent; then its ``retry_on``: transient.
6. An HTTP error reply (``urllib.error.HTTPError``): by status, :func:`http_status_class`.
7. Refused before anything was sent (``ConnectionRefusedError``, ``socket.gaierror``):
   transient.
8. A timeout or reset after the request may have been sent (``TimeoutError``,
   ``ConnectionResetError``, ``ConnectionAbortedError``, ``BrokenPipeError``): indeterminate.
9. Any other error: transient, bounded.

"Bounded" means the attempts budget and the maximum age of
:class:`~scheduler_core.domain.retry.RetryPolicy` end it: an unknown error is retried, never forever.
Network errors are also recognised when they are the explicit cause (``raise ... from``) of
the exception the handler let escape, so a client library's wrapper is classified by what
actually happened.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import enum
import math
import socket
from collections.abc import Callable, Iterable, Iterator
from urllib.error import HTTPError, URLError

from ..exceptions import Indeterminate, Permanent, Transient


class FailureClass(enum.StrEnum):
    """What a failure says about the work and its effect."""

    TRANSIENT = "transient"
    """Nothing happened; trying again later may succeed."""
    PERMANENT = "permanent"
    """Nothing will succeed by trying again."""
    INDETERMINATE = "indeterminate"
    """The effect may or may not have happened."""


class PayloadMismatch(TypeError):
    """The stored payload does not fit the handler's signature (permanent by default)."""


Matcher = type[BaseException] | Callable[[BaseException], bool]
"""An exception type (matches instances and subclasses) or a predicate on the exception."""

# Refused before anything was sent: the destination never saw the request.
_REFUSED_BEFORE_SEND: tuple[type[BaseException], ...] = (ConnectionRefusedError, socket.gaierror)
# May have happened after the request reached the destination.
_AMBIGUOUS_IN_FLIGHT: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)
_CAUSE_DEPTH = 5


def check_matchers(matchers: Iterable[object], *, what: str) -> tuple[Matcher, ...]:
    """Validate ``retry_on`` / ``permanent_on`` values; raise ``ValueError`` on a bad one."""
    out: list[Matcher] = []
    for m in matchers:
        is_type = isinstance(m, type) and issubclass(m, BaseException)
        is_predicate = callable(m) and not isinstance(m, type)
        if not (is_type or is_predicate):
            raise ValueError(f"{what} takes exception types or predicates, not {m!r}")
        out.append(m)  # type: ignore[arg-type]
    return tuple(out)


def _matches(exc: BaseException, matchers: Iterable[Matcher]) -> bool:
    for m in matchers:
        if isinstance(m, type):
            if isinstance(exc, m):
                return True
        else:
            try:
                if m(exc):
                    return True
            except Exception:  # a predicate that breaks says nothing about the failure
                continue
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its explicit causes (``raise ... from``) and a URLError's reason."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    for _ in range(_CAUSE_DEPTH):
        if cur is None or id(cur) in seen:
            return
        seen.add(id(cur))
        yield cur
        if isinstance(cur, URLError) and isinstance(cur.reason, BaseException):
            cur = cur.reason
        else:
            cur = cur.__cause__


def http_status_class(status: int) -> FailureClass:
    """The class of an HTTP reply status from a destination.

    * 408, 425, 429, 502 and 503: transient — the request was not processed (the server said
      so, or a gateway could not reach it).
    * 500 and 504, and any other 5xx: indeterminate — the server or an upstream may have
      acted before failing.
    * any other 4xx (400, 401, 403, 404, 409, 422, ...): permanent — the same request will be
      refused again; an operator must change something.
    * anything else: transient.
    """
    if status in (408, 425, 429, 502, 503):
        return FailureClass.TRANSIENT
    if 500 <= status <= 599:
        return FailureClass.INDETERMINATE
    if 400 <= status <= 499:
        return FailureClass.PERMANENT
    return FailureClass.TRANSIENT


def classify(
    exc: BaseException,
    *,
    retry_on: Iterable[Matcher] = (),
    permanent_on: Iterable[Matcher] = (),
    in_effect: bool = False,
) -> FailureClass:
    """Classify ``exc`` raised by a handler (the table in this module's docstring).

    ``in_effect`` is true when an effect's outcome became unknown in this attempt, that is,
    when a request may have reached the destination: every failure but ``Permanent`` is then
    indeterminate, so the job's effect mode decides whether a re-run is safe.
    """
    if isinstance(exc, Permanent):
        return FailureClass.PERMANENT
    if isinstance(exc, Indeterminate) or in_effect:
        # Once an effect's outcome is unknown, no later error can make a re-run safe: only
        # the job's effect mode may decide that (``outcomes.after_failure``).
        return FailureClass.INDETERMINATE
    if isinstance(exc, Transient):
        return FailureClass.TRANSIENT
    # Before the job's own matchers: a payload that does not fit never will, whatever
    # ``retry_on`` says about TypeError.
    if isinstance(exc, PayloadMismatch):
        return FailureClass.PERMANENT
    if _matches(exc, permanent_on):
        return FailureClass.PERMANENT
    if _matches(exc, retry_on):
        return FailureClass.TRANSIENT
    for e in _chain(exc):
        if isinstance(e, HTTPError):
            return http_status_class(e.code)
        if isinstance(e, _REFUSED_BEFORE_SEND):
            return FailureClass.TRANSIENT
        if isinstance(e, _AMBIGUOUS_IN_FLIGHT):
            return FailureClass.INDETERMINATE
    return FailureClass.TRANSIENT


def is_ambiguous_in_flight(exc: BaseException) -> bool:
    """Whether ``exc`` (or its explicit cause) is a network error that may come after the
    request landed."""
    return any(isinstance(e, _AMBIGUOUS_IN_FLIGHT) for e in _chain(exc))


def is_refused_before_send(exc: BaseException) -> bool:
    """Whether ``exc`` (or its explicit cause) says the request was never sent."""
    return any(isinstance(e, _REFUSED_BEFORE_SEND) for e in _chain(exc))


def retry_after_of(exc: BaseException, *, now: dt.datetime | None = None) -> float | None:
    """Seconds the failure asks to wait before the next attempt, if it says.

    ``Transient(retry_after=...)`` (any :class:`~scheduler_core.exceptions.JobError`), or an
    HTTP error reply's ``Retry-After`` header: delta-seconds, or an HTTP date when ``now`` is
    given. Anything unreadable, negative or not finite is ignored.
    """
    for e in _chain(exc):
        value = getattr(e, "retry_after", None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) if math.isfinite(value) and value >= 0 else None
        if isinstance(e, HTTPError) and e.headers is not None:
            raw = e.headers.get("Retry-After")
            if raw is None:
                return None
            raw = raw.strip()
            if raw.isdigit():
                return float(raw)
            if now is None:
                return None
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                return None
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            return max(0.0, (when - now).total_seconds())
    return None
