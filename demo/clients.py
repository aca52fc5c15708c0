"""How the demo jobs call their destinations, and what each failure means.

The classification is the effect protocol's, made concrete for HTTP and SMTP:

* nothing was sent (connection refused, connect timeout, 503) — :class:`Transient`;
* the request was sent and no answer came (read timeout, reset, 500/502/504, SMTP
  disconnect after DATA) — :class:`Indeterminate`: the effect may have happened;
* the destination says another request with the key is in flight (409 ``in_flight``) or
  asks to slow down (429) — :class:`Transient`, retried later under the same key;
* the destination refuses the fencing token (409 ``stale_fence``) — :class:`StaleAttempt`:
  a newer attempt exists, this one stops;
* the request itself is wrong (other 4xx, 422 key reused, refused recipient) —
  :class:`Permanent`.

Addresses come from the settings ``DEMO_PAY_URL`` and ``DEMO_SMTP`` or the environment
variables of the same names (defaults: ``http://127.0.0.1:8765`` and ``127.0.0.1:8025``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import smtplib
import socket
from email.message import EmailMessage
from typing import Any
from urllib.parse import quote, urlparse

from django.conf import settings

from scheduler_core import Indeterminate, Permanent, StaleAttempt, Transient


def _setting(name: str, default: str) -> str:
    return str(getattr(settings, name, None) or os.environ.get(name) or default)


def pay_url() -> str:
    """Base URL of the demo payment provider."""
    return _setting("DEMO_PAY_URL", "http://127.0.0.1:8765").rstrip("/")


def smtp_address() -> tuple[str, int]:
    """``(host, port)`` of the demo SMTP sink."""
    host, _, port = _setting("DEMO_SMTP", "127.0.0.1:8025").rpartition(":")
    return host or "127.0.0.1", int(port)


def _call(
    ctx: Any,
    method: str,
    path: str,
    *,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    timeout: float,
    base_url: str = "",
) -> dict[str, Any]:
    """One HTTP request to the provider (at ``base_url``, default :func:`pay_url`), its
    failures classified (see the module docstring)."""
    url = urlparse(base_url.rstrip("/") or pay_url())
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=timeout)
    try:
        try:
            conn.connect()
        except (ConnectionRefusedError, TimeoutError, socket.gaierror) as e:
            raise Transient(f"provider unreachable, nothing sent: {e}") from e
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": "application/json", **headers}
        try:
            conn.request(method, url.path + path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
            raise Indeterminate(f"sent, no answer ({type(e).__name__}: {e})") from e
    finally:
        conn.close()
    try:
        payload = json.loads(raw or b"{}")
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    status = resp.status
    if status in (200, 201):
        return payload
    code = str(payload.get("error", ""))
    detail = f"provider answered {status} {code}: {payload.get('message', '')}"
    if status == 409 and code == "stale_fence":
        raise StaleAttempt(ctx.job_id, ctx.fence, "destination_fence")
    if status == 409 or status == 503:
        raise Transient(detail, retry_after=_retry_after(resp))
    if status == 429:
        raise Transient(detail, retry_after=_retry_after(resp) or 1.0)
    if status >= 500:
        raise Indeterminate(detail)
    raise Permanent(detail)


def _retry_after(resp: http.client.HTTPResponse) -> float | None:
    try:
        return float(resp.getheader("Retry-After") or "")
    except ValueError:
        return None


def _slow(slow_reply: float) -> dict[str, str]:
    return {"X-Demo-Slow-Reply": str(slow_reply)} if slow_reply > 0 else {}


def _charge_headers(key: str, fence: int, slow_reply: float, unavailable: bool) -> dict[str, str]:
    headers = {"Idempotency-Key": key, "Fencing-Token": str(fence), **_slow(slow_reply)}
    if unavailable:
        headers["X-Demo-Unavailable"] = "1"
    return headers


def charge(
    ctx: Any,
    *,
    key: str,
    fence: int,
    body: dict[str, Any],
    timeout: float,
    slow_reply: float,
    unavailable: bool = False,
    base_url: str = "",
) -> dict[str, Any]:
    """Idempotent, fenced charge: ``key`` as the idempotency key, ``fence`` as the token.

    For fault tests, ``unavailable`` asks the provider to answer 503 without applying anything,
    and ``base_url`` sends the request elsewhere than :func:`pay_url` (an address where
    nothing listens: the connection is refused)."""
    headers = _charge_headers(key, fence, slow_reply, unavailable)
    return _call(
        ctx,
        "POST",
        "/demo/pay/charge/",
        headers=headers,
        body=body,
        timeout=timeout,
        base_url=base_url,
    )


def second_charge(
    ctx: Any,
    *,
    key: str,
    fence: int,
    body: dict[str, Any],
    timeout: float,
    slow_reply: float,
    unavailable: bool = False,
) -> dict[str, Any]:
    """Idempotent, fenced charge at the second provider, which keeps keys of its own: ``key``
    is deduplicated only against what the second provider itself received."""
    headers = _charge_headers(key, fence, slow_reply, unavailable)
    return _call(ctx, "POST", "/demo/pay2/charge/", headers=headers, body=body, timeout=timeout)


def transfer(
    ctx: Any, *, key: str, fence: int, body: dict[str, Any], timeout: float, slow_reply: float
) -> dict[str, Any]:
    """Fenced, not deduplicated transfer, referenced by ``key``."""
    headers = {"Reference": key, "Fencing-Token": str(fence), **_slow(slow_reply)}
    return _call(ctx, "POST", "/demo/pay/transfer/", headers=headers, body=body, timeout=timeout)


def lookup(ctx: Any, *, key: str, fence: int, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the provider whether the effect ``key`` was applied (raises its fence)."""
    path = f"/demo/pay/lookup/?reference={quote(key)}"
    headers = {"Fencing-Token": str(fence)}
    return _call(ctx, "GET", path, headers=headers, body=None, timeout=timeout)


def send_mail(
    *, key: str, to: str, subject: str, text: str, timeout: float, slow_reply: float
) -> str:
    """Send one message whose ``Message-ID`` is derived from the effect key; returns it."""
    msg = EmailMessage()
    # A Message-ID's left part may not hold ':', and '=' is in no key of the tenure2 format.
    message_id = f"<{key.replace(':', '=')}@tenure.demo>"
    msg["Message-ID"] = message_id
    msg["X-Effect-Key"] = key
    msg["From"] = "tenure@localhost"
    msg["To"] = to
    msg["Subject"] = subject
    for name, value in _slow(slow_reply).items():
        msg[name] = value
    msg.set_content(text)
    host, port = smtp_address()
    try:
        smtp = smtplib.SMTP(host, port, timeout=timeout)
    except (ConnectionRefusedError, TimeoutError, socket.gaierror) as e:
        raise Transient(f"SMTP server unreachable, nothing sent: {e}") from e
    try:
        smtp.send_message(msg)
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as e:
        raise Permanent(f"refused: {e}") from e
    except (TimeoutError, smtplib.SMTPServerDisconnected, ConnectionError) as e:
        raise Indeterminate(f"no acknowledgement after sending ({type(e).__name__})") from e
    finally:
        with contextlib.suppress(OSError):
            smtp.close()
    return message_id
