"""``{% queues_summary %}``: the overview's queues section (paused queues with who, when and
why, and limited ones), read from :mod:`scheduler_core.read.queues` at render time with the
per-queue counts the overview's one scan already took."""

from __future__ import annotations

from typing import Any

from django import template

from scheduler_core.read.queues import queue_overview

register = template.Library()


@register.inclusion_tag("admin_ui/queues_summary.html")
def queues_summary(rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The queues an operator paused or limited, by name, from ``rows`` (the overview's
    :func:`scheduler_core.read.queues.queue_overview`, read once; read here without them)."""
    rows = queue_overview() if rows is None else rows
    configured = [
        r
        for r in rows
        if r["paused"] or r["max_leased"] is not None or r["max_per_second"] is not None
    ]
    return {"configured": configured}
