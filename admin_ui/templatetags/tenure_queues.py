"""``{% queues_summary %}``: the overview's queues section (paused queues with who, when and
why, and limited ones), read from :mod:`scheduler_core.read.queues` at render time so the
overview's own view needs nothing new."""

from __future__ import annotations

from typing import Any

from django import template

from scheduler_core.read.queues import queue_overview

register = template.Library()


@register.inclusion_tag("admin_ui/queues_summary.html")
def queues_summary() -> dict[str, Any]:
    """The queues an operator paused or limited, by name."""
    rows = queue_overview()
    configured = [
        r
        for r in rows
        if r["paused"] or r["max_leased"] is not None or r["max_per_second"] is not None
    ]
    return {"configured": configured}
