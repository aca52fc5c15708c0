"""A demo SMTP sink: accepts every message and stores it (:class:`~demo.models.MailMessage`).

It deduplicates nothing — like most mail receivers — so a message sent twice is stored twice.
The demo mail job derives the ``Message-ID`` from its effect key, so a receiver that wants to
could drop repeats; counting stored messages per ``Message-ID`` shows what the sender did.

For fault tests, a message with the header ``X-Demo-Slow-Reply: N`` is stored and then
acknowledged only N seconds later: the sender times out after the final dot, not knowing the
message was accepted.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

log = logging.getLogger("tenure.demo.smtp")


def _store(mail_from: str, rcpt_tos: list[str], raw: bytes) -> None:
    from .models import MailMessage

    msg = email.message_from_bytes(raw, policy=email.policy.default)
    close_old_connections()
    try:
        MailMessage.objects.create(
            message_id=str(msg.get("Message-ID", ""))[:300],
            effect_key=str(msg.get("X-Effect-Key", ""))[:300],
            mail_from=mail_from[:300],
            rcpt_to=",".join(rcpt_tos),
            subject=str(msg.get("Subject", ""))[:300],
            raw=raw.decode("utf-8", "replace"),
        )
    finally:
        close_old_connections()


class SinkHandler:
    """aiosmtpd handler: store, then (optionally, for tests) hold the acknowledgement back."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw: bytes = envelope.original_content or envelope.content
        await sync_to_async(_store, thread_sensitive=False)(
            envelope.mail_from, list(envelope.rcpt_tos), raw
        )
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        slow = msg.get("X-Demo-Slow-Reply")
        if slow:
            await asyncio.sleep(min(30.0, max(0.0, float(str(slow)))))
        return "250 Message accepted for delivery"


def start(host: str, port: int) -> Any:
    """Start the sink on ``host:port`` in a background thread; returns the controller."""
    from aiosmtpd.controller import Controller

    controller = Controller(SinkHandler(), hostname=host, port=port)
    controller.start()
    log.info("SMTP sink listening on %s:%s", host, port)
    return controller
