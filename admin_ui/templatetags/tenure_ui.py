"""Small formatting helpers for the dashboard's templates: a timestamp with its age, and a
payload excerpt. Nothing here reads the database."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

PAYLOAD_EXCERPT_CHARS = 90


def age(when: dt.datetime, now: dt.datetime) -> str:
    """How long ago (or how far ahead) ``when`` is: "3 min ago", "in 2 h", "just now"."""
    seconds = (now - when).total_seconds()
    future = seconds < 0
    s = abs(seconds)
    if s < 10:
        return "just now"
    if s < 60:
        text = f"{int(s)} s"
    elif s < 3600:
        text = f"{int(s // 60)} min"
    elif s < 86400:
        text = f"{int(s // 3600)} h"
    else:
        text = f"{int(s // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


@register.simple_tag
def when(value: dt.datetime | None, empty: str = "—") -> SafeString:
    """A timestamp as the dashboard shows it: absolute UTC that never wraps, its age beside
    it, and the ISO 8601 instant as the ``datetime`` and title attributes."""
    if value is None:
        return format_html('<span class="when muted">{}</span>', empty)
    utc = value.astimezone(dt.UTC)
    return format_html(
        '<time class="when" datetime="{}" title="{}"><span class="mono">{}</span> '
        '<span class="age">{}</span></time>',
        utc.isoformat(),
        utc.isoformat(),
        utc.strftime("%Y-%m-%d %H:%M:%S"),
        age(utc, dt.datetime.now(dt.UTC)),
    )


@register.filter
def payload_excerpt(payload: Any) -> str:
    """The payload as compact JSON, cut to a line."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    if len(text) > PAYLOAD_EXCERPT_CHARS:
        return text[: PAYLOAD_EXCERPT_CHARS - 1] + "…"
    return text


@register.filter
def payload_full(payload: Any) -> str:
    """The whole payload as indented JSON, for the list's disclosure (its row keeps the line)."""
    return json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False)
