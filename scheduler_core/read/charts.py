"""The read side of the console's history charts: the per-minute figures ``run_scheduler`` rolls
up (``MinuteStats``), summed per minute for a queue and job type. No writes here."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Max, Sum

from ..models import MinuteStats


def minute_figures(
    *, since: dt.datetime, queue: str, name: str, summed: list[str], peaked: list[str]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Per minute from ``since`` on, oldest first: each ``summed`` field's sum and each
    ``peaked`` field's maximum over the queue ``queue`` and job type ``name`` (empty: all);
    and the queues and job types that have figures in that time."""
    # The watermark row (no queue, no type) carries no figures.
    rows_qs = MinuteStats.objects.filter(minute__gte=since).exclude(queue="")
    known = rows_qs.values_list("queue", "name").distinct()
    queues = sorted({q for q, _ in known})
    types = sorted({t for _, t in known})
    if queue:
        rows_qs = rows_qs.filter(queue=queue)
    if name:
        rows_qs = rows_qs.filter(name=name)
    # Aggregates may not take a field's own name: summed as t_<field>, then named back.
    aggs: dict[str, Any] = {f"t_{k}": Sum(k) for k in summed}
    aggs.update({f"t_{k}": Max(k) for k in peaked})
    rows = [
        {"minute": r["minute"], **{k.removeprefix("t_"): v for k, v in r.items() if k != "minute"}}
        for r in rows_qs.values("minute").annotate(**aggs).order_by("minute")
    ]
    return rows, queues, types
