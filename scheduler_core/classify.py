"""Failure classification: an exception (and where it happened) to a failure class. Pure."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

from .exceptions import Indeterminate, Permanent, Transient


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

# Refused before anything was sent: the destination never saw the request.
_REFUSED_BEFORE_SEND: tuple[type[BaseException], ...] = (ConnectionRefusedError,)
# May have happened after the request reached the destination.
_AMBIGUOUS_IN_FLIGHT: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)


def _matches(exc: BaseException, matchers: Iterable[Matcher]) -> bool:
    for m in matchers:
        if isinstance(m, type):
            if isinstance(exc, m):
                return True
        elif m(exc):
            return True
    return False


def classify(
    exc: BaseException,
    *,
    retry_on: Iterable[Matcher] = (),
    permanent_on: Iterable[Matcher] = (),
    in_effect: bool = False,
) -> FailureClass:
    """Classify ``exc`` raised by a handler.

    ``in_effect`` is true when the exception escaped while an effect's intent was recorded and
    not yet settled, that is, when a request may have reached the destination.

    Order: the library's own classes as raised; then the job's ``permanent_on`` and
    ``retry_on``; then defaults — a payload that does not fit the handler is permanent, a
    refused connection is transient, and any other error (timeouts and resets included) is
    indeterminate inside an effect and transient outside one.
    """
    if isinstance(exc, Permanent):
        return FailureClass.PERMANENT
    if isinstance(exc, Indeterminate):
        return FailureClass.INDETERMINATE
    if isinstance(exc, Transient):
        return FailureClass.TRANSIENT
    if _matches(exc, permanent_on):
        return FailureClass.PERMANENT
    if _matches(exc, retry_on):
        return FailureClass.TRANSIENT
    if isinstance(exc, PayloadMismatch):
        return FailureClass.PERMANENT
    if isinstance(exc, _REFUSED_BEFORE_SEND):
        return FailureClass.TRANSIENT
    if in_effect:
        return FailureClass.INDETERMINATE
    return FailureClass.TRANSIENT


def is_ambiguous_in_flight(exc: BaseException) -> bool:
    """Whether ``exc`` is the kind of network error that may come after the request landed."""
    return isinstance(exc, _AMBIGUOUS_IN_FLIGHT)
