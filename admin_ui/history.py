"""The overview's history charts: outcomes per minute over the last hour and per quarter hour
over the last day, stacked, and the queue wait p50 / p95, drawn as inline SVG on the server
(no script), filterable by queue and job type.

The figures are ``MinuteStats`` rows, which ``run_scheduler`` rolls up from the attempts of
each finished minute (:mod:`scheduler_core.services.history`), read through :mod:`scheduler_core.read.charts`.
Nothing here writes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from scheduler_core.read import charts as chart_figures
from scheduler_core.read.jobs import now as db_now

from .htmx import is_history_restore, is_htmx
from .security import dashboard_view

OUTCOMES: tuple[tuple[str, str, str], ...] = (
    ("succeeded", "Succeeded", "#1f7a4d"),
    ("retried", "Retried", "#d08a12"),
    ("failed", "Failed", "#b42318"),
    ("indeterminate", "Indeterminate", "#6b2fb3"),
)
"""The stacked series, bottom to top: key, label, colour."""

WAITS: tuple[tuple[str, str, str], ...] = (
    ("wait_p50_ms", "Queue wait p50", "#2f5bd3"),
    ("wait_p95_ms", "Queue wait p95", "#1d2330"),
)

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 720, 150, 48, 20, 8

WINDOWS: tuple[tuple[str, str, int, int], ...] = (
    ("hour", "Last hour, per minute", 60, 1),
    ("day", "Last day, per 15 minutes", 96, 15),
)
"""Each chart: key, title, number of buckets, minutes per bucket."""


@dataclass
class Bucket:
    """One bar: its start, counts by outcome, claims and the wait figures."""

    start: dt.datetime
    counts: dict[str, int] = field(default_factory=dict)
    claims: int = 0
    wait_p50_ms: float | None = None
    wait_p95_ms: float | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _nice_max(v: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten at or above ``v`` (an axis top)."""
    if v <= 0:
        return 1.0
    step = 1.0
    while step * 10 <= v:
        step *= 10
    while step < v / 10:
        step *= 10
    for m in (1, 2, 5, 10):
        if step * m >= v:
            return step * m
    return step * 10


def _buckets(rows: list[dict[str, Any]], *, end: dt.datetime, n: int, minutes: int) -> list[Bucket]:
    """Fold per-minute rows into ``n`` buckets of ``minutes`` ending at ``end`` (exclusive).

    Counts add up; a bucket's wait is the highest p50 and p95 among its minutes (and the
    queues and types in view): an upper bound, never an average that hides a slow minute.
    """
    width = dt.timedelta(minutes=minutes)
    start = end - n * width
    out = [Bucket(start=start + i * width, counts={k: 0 for k, _, _ in OUTCOMES}) for i in range(n)]
    for r in rows:
        i = int((r["minute"] - start) / width)
        if not 0 <= i < n:
            continue
        b = out[i]
        for k, _, _ in OUTCOMES:
            b.counts[k] += int(r[k] or 0)
        b.claims += int(r["claims"] or 0)
        for k, _, _ in WAITS:
            v = r[k]
            if v is not None:
                cur = getattr(b, k)
                setattr(b, k, v if cur is None else max(cur, v))
    return out


def _chart(key: str, title: str, buckets: list[Bucket], minutes: int) -> dict[str, Any]:
    """The SVG geometry of one window: stacked bars of outcomes, and the wait lines."""
    inner_w = WIDTH - PAD_LEFT
    inner_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    n = len(buckets)
    slot = inner_w / n
    bar_w = max(1.0, slot * 0.8)
    top = _nice_max(max((b.total for b in buckets), default=0))
    bars = []
    for i, b in enumerate(buckets):
        x = PAD_LEFT + i * slot + (slot - bar_w) / 2
        y = float(HEIGHT - PAD_BOTTOM)
        parts = []
        for k, label, colour in OUTCOMES:
            v = b.counts[k]
            if not v:
                continue
            h = v / top * inner_h
            y -= h
            parts.append(
                {
                    "key": k,
                    "label": label,
                    "colour": colour,
                    "n": v,
                    "y": round(y, 2),
                    "h": round(h, 2),
                }
            )
        summary = ", ".join(f"{b.counts[k]} {label.lower()}" for k, label, _ in OUTCOMES)
        waits = "; ".join(
            f"{label.lower().replace('queue wait ', 'wait ')} {getattr(b, k):.0f} ms"
            for k, label, _ in WAITS
            if getattr(b, k) is not None
        )
        bars.append(
            {
                "x": round(x, 2),
                "w": round(bar_w, 2),
                "start": b.start,
                "total": b.total,
                "claims": b.claims,
                "parts": parts,
                "title": f"{b.start:%H:%M} UTC: {summary}; {b.claims} claims"
                + (f"; {waits}" if waits else ""),
            }
        )
    wait_top = _nice_max(
        max(
            (getattr(b, k) or 0.0 for b in buckets for k, _, _ in WAITS),
            default=0.0,
        )
    )
    lines = []
    for k, label, colour in WAITS:
        # A line joins only neighbouring buckets that have a figure (a gap stays a gap); each
        # figure is also a dot, so a lone minute shows.
        segments: list[list[tuple[float, float]]] = []
        dots = []
        prev = -2
        for i, b in enumerate(buckets):
            v = getattr(b, k)
            if v is None:
                continue
            pt = (
                round(PAD_LEFT + i * slot + slot / 2, 1),
                round(HEIGHT - PAD_BOTTOM - (v / wait_top) * inner_h, 1),
            )
            if i != prev + 1 or not segments:
                segments.append([])
            segments[-1].append(pt)
            dots.append({"x": pt[0], "y": pt[1], "title": f"{b.start:%H:%M} UTC: {v:.0f} ms"})
            prev = i
        lines.append(
            {
                "key": k,
                "label": label,
                "colour": colour,
                "segments": [
                    " ".join(f"{x},{y}" for x, y in seg) for seg in segments if len(seg) > 1
                ],
                "dots": dots,
            }
        )
    ticks = [
        {"x": round(PAD_LEFT + i * slot, 1), "label": f"{buckets[i].start:%H:%M}"}
        for i in range(0, n, max(1, n // 6))
    ]
    return {
        "key": key,
        "title": title,
        "minutes": minutes,
        "width": WIDTH,
        "height": HEIGHT,
        "pad_left": PAD_LEFT,
        "base_y": HEIGHT - PAD_BOTTOM,
        "top_y": PAD_TOP,
        "label_y": HEIGHT - 5,
        "count_top": int(top),
        "wait_top": int(wait_top),
        "bars": bars,
        "lines": lines,
        "ticks": ticks,
        "total": sum(b.total for b in buckets),
        "has_waits": any(line["dots"] for line in lines),
    }


def charts(params: Any) -> dict[str, Any]:
    """The history block's context: both windows for the queue and job type chosen in
    ``params`` (``hq``, ``ht``; empty: all), and the queues and types there are to choose."""
    queue = str(params.get("hq", "") or "")
    name = str(params.get("ht", "") or "")
    now = db_now()
    end = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    day_start = end - dt.timedelta(days=1)
    rows, queues, types = chart_figures.minute_figures(
        since=day_start,
        queue=queue,
        name=name,
        summed=[k for k, _, _ in OUTCOMES] + ["claims"],
        peaked=[k for k, _, _ in WAITS],
    )
    # A quarter-hour chart's buckets start on the quarter hour.
    quarter_end = end.replace(minute=end.minute - end.minute % 15) + dt.timedelta(minutes=15)
    drawn = []
    for key, title, n, minutes in WINDOWS:
        b_end = end if minutes == 1 else quarter_end
        drawn.append(_chart(key, title, _buckets(rows, end=b_end, n=n, minutes=minutes), minutes))
    return {
        "history": {
            "charts": drawn,
            "queue": queue,
            "name": name,
            "queues": queues,
            "types": types,
            "legend": [{"label": label, "colour": c} for _, label, c in OUTCOMES + WAITS],
            "empty": not rows,
        }
    }


@dashboard_view()
def history_view(request: HttpRequest) -> HttpResponse:
    """The history block alone (polled by the overview), or as a page of its own."""
    context = {**charts(request.GET), "nav": "overview"}
    template = "admin_ui/history.html"
    if is_htmx(request) and not is_history_restore(request):
        template = "admin_ui/history_charts.html"
    return render(request, template, context)
