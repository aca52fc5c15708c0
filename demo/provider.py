"""Two demo payment providers built on :mod:`scheduler_core.destinations`.

The first has three endpoints, each logging every request it receives
(:class:`~demo.models.ProviderRequest`) and every effect it applies
(:class:`~demo.models.Charge`):

* ``POST /demo/pay/charge/`` — idempotent and fenced: ``Idempotency-Key`` (the job's effect
  key) and ``Fencing-Token`` (the attempt's fence) headers, a JSON body
  ``{"invoice_id": .., "cents": ..}``. The same key and body replay the first answer.
* ``POST /demo/pay/transfer/`` — fenced but not deduplicated: ``Reference`` names the effect.
  For reconcilable jobs, which learn what happened from the lookup instead.
* ``GET /demo/pay/lookup/?reference=KEY`` with ``Fencing-Token`` — whether the effect with that
  reference was applied. The lookup raises the key's fence, so a request from an older attempt
  that arrives after it is refused: a "not applied" answer stays true.

The second provider, a fallback's destination, has one endpoint:

* ``POST /demo/pay2/charge/`` — idempotent and fenced like the first provider's charge, but
  with keys, fencing tokens and charges of its own (:class:`~demo.models.SecondCharge`): it
  deduplicates a key only against its own records, never against the first provider's. Its
  requests are logged with the endpoint name ``pay2-charge``.

For fault tests, ``X-Demo-Slow-Reply: N`` makes a provider apply the request, commit, and
only answer N seconds later — the caller times out after the effect happened; and
``X-Demo-Unavailable: 1`` makes a charge endpoint answer 503 without looking at the request —
the provider is overloaded, nothing is applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from scheduler_core.destinations import (
    FencedKeyBase,
    FenceRefused,
    IdempotencyStore,
    check_fence,
    idempotent_view,
    json_body,
)

from .models import (
    Charge,
    PaymentFence,
    PaymentKey,
    ProviderRequest,
    SecondCharge,
    SecondPaymentFence,
    SecondPaymentKey,
)

KEYS = IdempotencyStore(PaymentKey)
SECOND_KEYS = IdempotencyStore(SecondPaymentKey)
"""The second provider's idempotency keys: a store of its own, so it cannot replay (or even
know about) what the first provider answered for the same key."""


def _fence(request: HttpRequest) -> int | None:
    try:
        return int(request.headers.get("Fencing-Token", ""))
    except ValueError:
        return None


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": code, "message": message}, status=status)


def _logged(endpoint: str, key: str, fence: int | None) -> ProviderRequest:
    return ProviderRequest.objects.create(endpoint=endpoint, key=key[:300], fence=fence)


def _answer(log: ProviderRequest, response: HttpResponse, request: HttpRequest) -> HttpResponse:
    """Record how the request was answered, then (for fault tests) hold the answer back."""
    if response.get("Idempotent-Replayed"):
        outcome = "replayed"
    elif response.status_code in (200, 201):
        outcome = "applied" if response.get("X-Demo-Applied") else "answered"
    else:
        outcome = _code(response) or f"http_{response.status_code}"
    ProviderRequest.objects.filter(pk=log.pk).update(status=response.status_code, outcome=outcome)
    slow = request.headers.get("X-Demo-Slow-Reply")
    if slow:
        time.sleep(min(30.0, max(0.0, float(slow))))
    return response


def _code(response: HttpResponse) -> str:
    import json

    try:
        return str(json.loads(response.content).get("error", ""))
    except (ValueError, AttributeError):
        return ""


def _amounts(body: dict[str, Any]) -> tuple[int, int] | None:
    invoice, cents = body.get("invoice_id"), body.get("cents")
    if not isinstance(invoice, int) or not isinstance(cents, int) or cents <= 0:
        return None
    return invoice, cents


@idempotent_view(KEYS)
def _charge(request: HttpRequest) -> HttpResponse:
    """Apply one charge; runs inside the idempotency transaction."""
    key = request.headers["Idempotency-Key"]
    fence = _fence(request)
    amounts = _amounts(json_body(request))
    if fence is None or amounts is None:
        return _error(400, "bad_request", "Fencing-Token and invoice_id/cents (> 0) needed")
    check_fence(PaymentFence, key, fence)
    charge = Charge.objects.create(
        endpoint="charge", key=key, fence=fence, invoice_id=amounts[0], cents=amounts[1]
    )
    resp = JsonResponse({"charge_id": f"ch_{charge.pk}", "status": "applied"}, status=201)
    resp["X-Demo-Applied"] = "1"
    return resp


def _unavailable(request: HttpRequest) -> HttpResponse | None:
    """For fault tests: a 503 answered before anything is looked at, when asked for."""
    if request.headers.get("X-Demo-Unavailable"):
        return _error(503, "unavailable", "the provider is overloaded; nothing was applied")
    return None


def _fenced_charge(
    request: HttpRequest,
    endpoint: str,
    fences: type[FencedKeyBase],
    apply: Callable[[HttpRequest], HttpResponse],
) -> HttpResponse:
    """Log the request, answer 503 when asked to, check the fence, then ``apply`` (an
    idempotent view)."""
    key = request.headers.get("Idempotency-Key", "")
    fence = _fence(request)
    log = _logged(endpoint, key, fence)
    down = _unavailable(request)
    if down is not None:
        return _answer(log, down, request)
    if key and fence is not None:
        # Every token seen raises the key's fence, replays included, and a superseded
        # attempt is refused even when the key's answer is stored. The charge itself checks
        # again inside its own transaction.
        try:
            with transaction.atomic():
                check_fence(fences, key, fence)
        except FenceRefused as e:
            return _answer(log, _error(409, "stale_fence", str(e)), request)
    return _answer(log, apply(request), request)


@csrf_exempt
@require_POST
def charge(request: HttpRequest) -> HttpResponse:
    """Idempotent, fenced charge (see the module docstring)."""
    return _fenced_charge(request, "charge", PaymentFence, _charge)


@idempotent_view(SECOND_KEYS)
def _second_charge(request: HttpRequest) -> HttpResponse:
    """Apply one charge at the second provider; runs inside its idempotency transaction."""
    key = request.headers["Idempotency-Key"]
    fence = _fence(request)
    amounts = _amounts(json_body(request))
    if fence is None or amounts is None:
        return _error(400, "bad_request", "Fencing-Token and invoice_id/cents (> 0) needed")
    check_fence(SecondPaymentFence, key, fence)
    charge = SecondCharge.objects.create(
        key=key, fence=fence, invoice_id=amounts[0], cents=amounts[1]
    )
    resp = JsonResponse({"charge_id": f"p2_{charge.pk}", "status": "applied"}, status=201)
    resp["X-Demo-Applied"] = "1"
    return resp


@csrf_exempt
@require_POST
def second_charge(request: HttpRequest) -> HttpResponse:
    """The second provider's idempotent, fenced charge, with keys of its own (see the module
    docstring)."""
    return _fenced_charge(request, "pay2-charge", SecondPaymentFence, _second_charge)


@csrf_exempt
@require_POST
def transfer(request: HttpRequest) -> HttpResponse:
    """Fenced, not deduplicated: every accepted request is applied."""
    key = request.headers.get("Reference", "")
    fence = _fence(request)
    log = _logged("transfer", key, fence)
    amounts = _amounts(json_body(request))
    if not key or fence is None or amounts is None:
        resp = _error(400, "bad_request", "Reference, Fencing-Token and invoice_id/cents needed")
        return _answer(log, resp, request)
    try:
        with transaction.atomic():
            check_fence(PaymentFence, key, fence)
            t = Charge.objects.create(
                endpoint="transfer", key=key, fence=fence, invoice_id=amounts[0], cents=amounts[1]
            )
    except FenceRefused as e:
        return _answer(log, _error(409, "stale_fence", str(e)), request)
    resp = JsonResponse({"charge_id": f"tr_{t.pk}", "status": "applied"}, status=201)
    resp["X-Demo-Applied"] = "1"
    return _answer(log, resp, request)


@csrf_exempt
@require_GET
def lookup(request: HttpRequest) -> HttpResponse:
    """Whether the effect ``reference`` was applied; raises the key's fence (see above)."""
    key = request.GET.get("reference", "")
    fence = _fence(request)
    log = _logged("lookup", key, fence)
    if not key or fence is None:
        return _answer(
            log, _error(400, "bad_request", "reference and Fencing-Token needed"), request
        )
    try:
        with transaction.atomic():
            check_fence(PaymentFence, key, fence)
            found = Charge.objects.filter(key=key).order_by("pk").first()
    except FenceRefused as e:
        return _answer(log, _error(409, "stale_fence", str(e)), request)
    if found is None:
        return _answer(log, JsonResponse({"status": "not_applied"}), request)
    ref = f"{'ch' if found.endpoint == 'charge' else 'tr'}_{found.pk}"
    return _answer(log, JsonResponse({"status": "applied", "charge_id": ref}), request)
