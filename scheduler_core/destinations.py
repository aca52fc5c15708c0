"""Helpers for services that receive effects: fencing tokens and idempotency keys.

Tenure's ``idempotent`` and ``reconcilable`` modes are only as good as the destination. A
destination under your control gives them their guarantee with two tables, declared as
concrete models of the abstract ones below in the destination's own app:

* :class:`FencedKeyBase` and :func:`check_fence`: the highest fencing token seen per key. A
  request (or a reconcile lookup) carrying a lower token comes from an attempt whose claim has
  been superseded, and is refused — the only thing that stops a paused attempt which resumes
  between its intent and its call.
* :class:`IdempotencyRecordBase` and :class:`IdempotencyStore` (or the
  :func:`idempotent_view` decorator): the same key and the same request replay the stored
  response; the same key with a different request is refused (422); a key whose first request
  is still being processed answers 409, so the caller retries later instead of applying twice.
  Keys are kept for ``retention``; a job must stop retrying before that (``@job(max_age=...)``)
  or a late retry would be treated as new.

The effect a request makes and the stored response commit in one transaction, so a crash
between them leaves neither, and the key is free to be tried again.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, models, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

__all__ = [
    "FenceRefused",
    "FencedKeyBase",
    "IdempotencyRecordBase",
    "IdempotencyStore",
    "Started",
    "check_fence",
    "highest_token",
    "idempotent_view",
    "json_body",
    "request_fingerprint",
]


# ---------------------------------------------------------------------------------------------
# Fencing tokens
# ---------------------------------------------------------------------------------------------


class FencedKeyBase(models.Model):
    """The highest fencing token a destination has accepted for one key."""

    key = models.CharField(max_length=300, unique=True)
    highest = models.BigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    objects = models.Manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.key} fenced at {self.highest}"


class FenceRefused(Exception):
    """A request carried a fencing token lower than one already seen for its key."""

    def __init__(self, key: str, token: int, highest: int | None) -> None:
        super().__init__(f"fencing token {token} for {key} is below the highest seen ({highest})")
        self.key = key
        self.token = token
        self.highest = highest


def highest_token(model: type[FencedKeyBase], key: str) -> int | None:
    """The highest token accepted for ``key``, if any (a read; decides nothing)."""
    row = model.objects.filter(key=key).values_list("highest", flat=True).first()
    return None if row is None else int(row)


def check_fence(model: type[FencedKeyBase], key: str, token: int) -> None:
    """Accept ``token`` for ``key`` (raising the stored highest to it) or raise FenceRefused.

    Call it inside the transaction that makes the fenced write: the conditional update holds
    the key's row until that transaction ends, so no request with a lower token can write in
    between, and a refused or failed write leaves the highest token as it was. Equal tokens
    are accepted: one attempt may repeat its own request.
    """
    if not isinstance(token, int) or isinstance(token, bool) or token < 0:
        raise FenceRefused(key, -1, highest_token(model, key))
    for _ in range(2):
        if model.objects.filter(key=key, highest__lte=token).update(
            highest=token, updated_at=timezone.now()
        ):
            return
        if model.objects.filter(key=key).exists():
            break
        try:
            with transaction.atomic():
                model.objects.create(key=key, highest=token)
            return
        except IntegrityError:
            continue  # another request created it first: compare against its token
    raise FenceRefused(key, token, highest_token(model, key))


# ---------------------------------------------------------------------------------------------
# Idempotency keys
# ---------------------------------------------------------------------------------------------

IN_FLIGHT = "in_flight"
DONE = "done"


class IdempotencyRecordBase(models.Model):
    """One idempotency key: the request it was first used for and, once done, the response."""

    key = models.CharField(max_length=300, unique=True)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=12, default=IN_FLIGHT)
    claim = models.CharField(max_length=32, help_text="Which request currently holds the key.")
    status = models.IntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True, default="")
    body = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = models.Manager()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.key} [{self.state}]"


@dataclass(frozen=True, kw_only=True)
class Started:
    """What :meth:`IdempotencyStore.begin` found for a key.

    ``outcome`` is ``new`` (this request holds the key: process it, then
    :meth:`~IdempotencyStore.finish` or :meth:`~IdempotencyStore.release`), ``replay`` (done
    before: ``record`` holds the response), ``mismatch`` (the key was used for a different
    request) or ``in_flight`` (another request with the key is being processed).
    """

    outcome: str
    key: str
    claim: str = ""
    record: Any = None


class IdempotencyStore:
    """Idempotency keys kept in ``model`` (a concrete :class:`IdempotencyRecordBase`).

    ``retention``: how long a finished key answers with its stored response; after that the
    key is forgotten and a request with it is new. ``in_flight_timeout``: how long a request
    may hold a key before another request with it may take over (the first one's process
    died); a slow first request that finishes after a takeover finds its claim gone and its
    transaction, effect included, rolls back.
    """

    def __init__(
        self,
        model: type[IdempotencyRecordBase],
        *,
        retention: dt.timedelta = dt.timedelta(days=1),
        in_flight_timeout: dt.timedelta = dt.timedelta(seconds=60),
    ) -> None:
        self.model = model
        self.retention = retention
        self.in_flight_timeout = in_flight_timeout

    def begin(self, key: str, fingerprint: str, *, now: dt.datetime | None = None) -> Started:
        """Take ``key`` for a request with ``fingerprint``, or say why it cannot be taken.

        Commits on its own (call it outside the effect's transaction), so a second request
        sees the key in flight while the first is being processed.
        """
        now = now or timezone.now()
        claim = uuid.uuid4().hex
        for _ in range(3):
            try:
                with transaction.atomic():
                    self.model.objects.create(
                        key=key,
                        fingerprint=fingerprint,
                        state=IN_FLIGHT,
                        claim=claim,
                        created_at=now,
                        updated_at=now,
                    )
                return Started(outcome="new", key=key, claim=claim)
            except IntegrityError:
                pass
            rec = self.model.objects.filter(key=key).first()
            if rec is None:
                continue  # released or purged meanwhile: try to take it again
            if rec.created_at < now - self.retention:
                # Past retention the key is forgotten; remove it only if unchanged since read.
                self.model.objects.filter(pk=rec.pk, updated_at=rec.updated_at).delete()
                continue
            if rec.fingerprint != fingerprint:
                return Started(outcome="mismatch", key=key, record=rec)
            if rec.state == DONE:
                return Started(outcome="replay", key=key, record=rec)
            if rec.updated_at < now - self.in_flight_timeout:
                taken = self.model.objects.filter(
                    pk=rec.pk, state=IN_FLIGHT, claim=rec.claim
                ).update(claim=claim, updated_at=now)
                if taken:
                    return Started(outcome="new", key=key, claim=claim)
                continue
            return Started(outcome="in_flight", key=key, record=rec)
        return Started(outcome="in_flight", key=key)

    def finish(self, started: Started, *, status: int, content_type: str, body: str) -> None:
        """Store the response; call inside the transaction that made the effect.

        Raises ``RuntimeError`` when the claim was taken over meanwhile, which rolls that
        transaction (and its effect) back.
        """
        n = self.model.objects.filter(key=started.key, state=IN_FLIGHT, claim=started.claim).update(
            state=DONE,
            status=status,
            content_type=content_type[:100],
            body=body,
            updated_at=timezone.now(),
        )
        if n != 1:
            raise RuntimeError(f"idempotency key {started.key} was taken over; not applied")

    def release(self, started: Started) -> None:
        """Give the key back unanswered (the request failed and its effect rolled back)."""
        self.model.objects.filter(key=started.key, state=IN_FLIGHT, claim=started.claim).delete()

    def purge(self, *, now: dt.datetime | None = None) -> int:
        """Forget keys older than the retention window; returns how many."""
        now = now or timezone.now()
        deleted, _ = self.model.objects.filter(created_at__lt=now - self.retention).delete()
        return int(deleted)


def request_fingerprint(request: HttpRequest) -> str:
    """What makes two requests "the same": method, path and body (not headers).

    Headers such as the fencing token differ between honest retries of one request, so they
    are left out.
    """
    h = hashlib.sha256()
    h.update(request.method.encode() if request.method else b"")
    h.update(b"\0" + request.path.encode() + b"\0")
    h.update(request.body)
    return h.hexdigest()


# Responses that describe a passing condition, not the request's result: never stored.
_NOT_STORED = frozenset({408, 409, 425, 429})


class _Unstored(Exception):
    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JsonResponse:
    resp = JsonResponse({"error": code, "message": message}, status=status)
    for k, v in (headers or {}).items():
        resp[k] = v
    return resp


def idempotent_view(
    store: IdempotencyStore, *, header: str = "Idempotency-Key"
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Make a view idempotent by the key in request header ``header``.

    The view runs inside one transaction with the storing of its response: its writes and the
    stored answer commit together. A response is stored when it is 2xx or a 4xx that
    describes the request (400, 404, 422...); a 5xx, 408, 409, 425 or 429, or an exception,
    rolls the view's writes back and frees the key. A view may raise :class:`FenceRefused`,
    answered 409 ``stale_fence`` and never stored. Replays carry ``Idempotent-Replayed: true``.
    """

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            key = request.headers.get(header, "")
            if not key or len(key) > 300:
                return _error(400, "missing_key", f"{header} header of 1..300 characters needed")
            started = store.begin(key, request_fingerprint(request))
            if started.outcome == "mismatch":
                return _error(
                    422, "key_reused", "this idempotency key was used for a different request"
                )
            if started.outcome == "in_flight":
                return _error(
                    409,
                    "in_flight",
                    "a request with this key is being processed",
                    {"Retry-After": "1"},
                )
            if started.outcome == "replay":
                rec = started.record
                resp = HttpResponse(rec.body, status=rec.status, content_type=rec.content_type)
                resp["Idempotent-Replayed"] = "true"
                return resp
            try:
                with transaction.atomic():
                    response = view(request, *args, **kwargs)
                    status = response.status_code
                    if status >= 500 or status in _NOT_STORED:
                        raise _Unstored(response)
                    store.finish(
                        started,
                        status=status,
                        content_type=response.get("Content-Type", ""),
                        body=response.content.decode("utf-8", "replace"),
                    )
                return response
            except _Unstored as u:
                store.release(started)
                return u.response
            except FenceRefused as e:
                store.release(started)
                return _error(409, "stale_fence", str(e))
            except BaseException:
                store.release(started)
                raise

        return wrapped

    return wrap


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object body, or ``{}`` when it is empty or not an object."""
    try:
        value = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
