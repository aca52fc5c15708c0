"""Each injected failure maps to the documented class (table-driven, no database)."""

from __future__ import annotations

import datetime as dt
import email.message
import socket
from urllib.error import HTTPError, URLError

import pytest

from scheduler_core.domain.classify import (
    FailureClass,
    PayloadMismatch,
    check_matchers,
    classify,
    http_status_class,
    retry_after_of,
)
from scheduler_core.exceptions import Indeterminate, Permanent, Transient

T, P, I = FailureClass.TRANSIENT, FailureClass.PERMANENT, FailureClass.INDETERMINATE  # noqa: E741


class WrappedClientError(Exception):
    """A client library's own error, raised ``from`` the network error underneath."""


def _wrapped(cause: BaseException) -> BaseException:
    try:
        raise WrappedClientError("request failed") from cause
    except WrappedClientError as e:
        return e


def _http(status: int, retry_after: str | None = None) -> HTTPError:
    headers = email.message.Message()
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return HTTPError("http://dest.invalid/x", status, "reply", headers, None)


MATRIX: list[tuple[str, BaseException, bool, FailureClass]] = [
    # (what happened, exception, raised while an effect's outcome was unknown, class)
    ("handler raised Transient", Transient("busy"), False, T),
    ("handler raised Permanent", Permanent("bad card"), False, P),
    ("handler raised Indeterminate", Indeterminate("lost reply"), False, I),
    ("payload does not fit the handler", PayloadMismatch("unexpected kwarg"), False, P),
    ("connection refused before sending", ConnectionRefusedError(111, "refused"), False, T),
    ("name resolution failed before sending", socket.gaierror(-2, "unknown host"), False, T),
    ("timeout after sending", TimeoutError("read timed out"), False, I),
    ("connection reset after sending", ConnectionResetError(104, "reset"), False, I),
    ("connection aborted after sending", ConnectionAbortedError(103, "aborted"), False, I),
    ("broken pipe while sending", BrokenPipeError(32, "pipe"), False, I),
    ("wrapped refusal (raise from)", _wrapped(ConnectionRefusedError()), False, T),
    ("wrapped timeout (raise from)", _wrapped(TimeoutError()), False, I),
    ("URLError around a refusal", URLError(ConnectionRefusedError(111, "refused")), False, T),
    ("URLError around a timeout", URLError(TimeoutError("timed out")), False, I),
    ("unknown error", KeyError("x"), False, T),
    ("unknown error, effect outcome unknown", KeyError("x"), True, I),
    ("Transient after an effect's outcome became unknown", Transient("x"), True, I),
    ("refusal after an effect's outcome became unknown", ConnectionRefusedError(), True, I),
    ("Permanent after an effect's outcome became unknown", Permanent("x"), True, P),
    ("HTTP 400", _http(400), False, P),
    ("HTTP 401", _http(401), False, P),
    ("HTTP 404", _http(404), False, P),
    ("HTTP 409", _http(409), False, P),
    ("HTTP 422", _http(422), False, P),
    ("HTTP 429", _http(429, "7"), False, T),
    ("HTTP 500", _http(500), False, I),
    ("HTTP 502", _http(502), False, T),
    ("HTTP 503", _http(503), False, T),
    ("HTTP 504", _http(504), False, I),
]


@pytest.mark.parametrize(
    ("exc", "in_effect", "expected"),
    [pytest.param(e, f, c, id=w) for w, e, f, c in MATRIX],
)
def test_each_injected_failure_maps_to_its_documented_class(
    exc: BaseException, in_effect: bool, expected: FailureClass
) -> None:
    assert classify(exc, in_effect=in_effect) == expected


class QuotaExceeded(Exception):
    pass


def _is_quota(e: BaseException) -> bool:
    return "quota" in str(e)


def _broken_predicate(e: BaseException) -> bool:
    raise RuntimeError("predicate bug")


JOB_RULES: list[tuple[str, BaseException, dict[str, tuple[object, ...]], FailureClass]] = [
    ("permanent_on type", QuotaExceeded(), {"permanent_on": (QuotaExceeded,)}, P),
    ("permanent_on predicate", ValueError("quota gone"), {"permanent_on": (_is_quota,)}, P),
    ("retry_on type overrides the timeout default", TimeoutError(), {"retry_on": (OSError,)}, T),
    (
        "permanent_on wins over retry_on",
        QuotaExceeded(),
        {
            "retry_on": (QuotaExceeded,),
            "permanent_on": (QuotaExceeded,),
        },
        P,
    ),
    (
        "retry_on cannot rescue a payload mismatch",
        PayloadMismatch("x"),
        {"retry_on": (TypeError,)},
        P,
    ),
    ("raised class wins over permanent_on", Transient("x"), {"permanent_on": (Transient,)}, T),
    (
        "a broken predicate matches nothing",
        KeyError("x"),
        {"permanent_on": (_broken_predicate,)},
        T,
    ),
]


@pytest.mark.parametrize(
    ("exc", "rules", "expected"),
    [pytest.param(e, r, c, id=w) for w, e, r, c in JOB_RULES],
)
def test_job_retry_on_and_permanent_on_take_types_and_predicates(
    exc: BaseException, rules: dict[str, tuple[object, ...]], expected: FailureClass
) -> None:
    assert classify(exc, **rules) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [42, "TimeoutError", None])
def test_matchers_other_than_types_or_predicates_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="retry_on takes exception types or predicates"):
        check_matchers([bad], what="retry_on")


def test_every_5xx_but_502_and_503_is_indeterminate_and_every_other_4xx_permanent() -> None:
    for status in range(400, 600):
        expected = T if status in (408, 425, 429, 502, 503) else I if status >= 500 else P
        assert http_status_class(status) == expected, status


RETRY_AFTER: list[tuple[str, BaseException, float | None]] = [
    ("Transient(retry_after=)", Transient("slow down", retry_after=12.5), 12.5),
    ("Transient without", Transient("x"), None),
    ("HTTP 429 delta-seconds", _http(429, "30"), 30.0),
    ("HTTP 429 HTTP-date", _http(429, "Mon, 01 Jan 2035 00:01:00 GMT"), 60.0),
    ("HTTP 429 unreadable", _http(429, "soon"), None),
    ("negative retry_after ignored", Transient("x", retry_after=-3), None),
    ("NaN retry_after ignored", Transient("x", retry_after=float("nan")), None),
]


@pytest.mark.parametrize(("exc", "expected"), [pytest.param(e, v, id=w) for w, e, v in RETRY_AFTER])
def test_retry_after_is_read_from_the_failure(exc: BaseException, expected: float | None) -> None:
    now = dt.datetime(2035, 1, 1, tzinfo=dt.UTC)
    assert retry_after_of(exc, now=now) == expected
