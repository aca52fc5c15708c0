"""The console's history: finished attempts rolled up per minute, queue and job type into
``MinuteStats`` (counts and queue-wait percentiles), its watermark and its pruning; the
rules of the roll-up every driver shares."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max

from ..domain import states
from ..models import (
    Attempt,
    MinuteStats,
)
from .core import DriverCore

log = logging.getLogger("tenure.storage")


ROLLUP_COUNTS = ("succeeded", "failed", "indeterminate", "retried", "claims")
"""The counted columns of a ``MinuteStats`` row."""


ALL_STATES = tuple(st.value for st in states.State)
"""Every job state, so the base driver's rollup can bound its read of the state index by
``updated_at`` (SQLite's state index holds every row; PostgreSQL's rollup reads each state
through its own index instead)."""


ROLLUP_MARGIN = timedelta(seconds=60)
"""How much earlier than an attempt's claim or end its job's ``updated_at`` may be: the two
are stamped by separate statements of one transaction."""


WAIT_UNKNOWN_STATES = (states.State.WAITING.value, states.State.CANCELLED.value)
"""A job in these states no longer carries its latest claim's due time (``run_at``)."""


_ROLLUP_DIRECT = {"succeeded", "failed", "indeterminate", "retried"}


def rollup_outcome(outcome: str, latest: bool, job_state: str) -> str | None:
    """What an ended attempt counts as in the history: ``succeeded``, ``failed``,
    ``indeterminate`` or ``retried``, or None (snoozed, released, cancelled).

    An attempt's own outcome says so when it ended the job or retried it; one ended by the
    reaper (``lease_expired``) or a reconcile lookup counts as what its job became when it is
    still the job's latest attempt, else as retried (another attempt followed it)."""
    if outcome in _ROLLUP_DIRECT:
        return outcome
    if outcome == "lease_expired" or outcome.startswith("reconciled_"):
        if latest and job_state in ("succeeded", "failed", "indeterminate"):
            return job_state
        return "retried" if not latest or job_state == "waiting" else None
    return None


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` (sorted), interpolated linearly between the closest
    ranks as PostgreSQL's ``percentile_cont`` is; None when empty."""
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


class HistoryOps(DriverCore):
    """The per-minute history, for :class:`~scheduler_core.storage.base.Driver`."""

    def minute_rollup(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """The per-(minute, queue, job type) figures of ``[start, end)`` (whole minutes): the
        attempts that ended in each minute by what they meant (:func:`rollup_outcome`), the
        claims made in it and their queue wait p50 and p95 in milliseconds.

        The queue wait is the claim time less the due time; the due time is the job's
        ``run_at``, which stays the due time of its latest claim until the job waits again,
        so it is measured over the claims that are still their job's latest (as
        ``/metrics``' claim latency is). Minutes and groups with nothing are left out.

        This implementation reads the rows and computes the percentiles here (SQLite);
        PostgreSQL's does it in one statement.
        """
        out: dict[tuple[datetime, str, str], dict[str, Any]] = {}

        def row(at: datetime, queue: str, name: str) -> dict[str, Any]:
            minute = at.replace(second=0, microsecond=0)
            return out.setdefault(
                (minute, queue, name),
                {
                    "minute": minute,
                    "queue": queue,
                    "name": name,
                    **{k: 0 for k in ROLLUP_COUNTS},
                    "waits": [],
                },
            )

        # Only jobs written since the range began can have an attempt claimed or ended in it
        # (a claim and an end write the job's updated_at, which only grows): the job table's
        # (state, updated_at) index bounds what is read, not the whole attempt table.
        attempts = Attempt.objects.using(self.alias).filter(
            job__state__in=ALL_STATES, job__updated_at__gte=start - ROLLUP_MARGIN
        )
        for e in attempts.filter(finished_at__gte=start, finished_at__lt=end).values(
            "finished_at", "outcome", "fence", "job__fence", "job__state", "job__queue", "job__name"
        ):
            kind = rollup_outcome(e["outcome"], e["fence"] == e["job__fence"], e["job__state"])
            if kind is not None and e["finished_at"] is not None:
                row(e["finished_at"], e["job__queue"], e["job__name"])[kind] += 1
        for a in attempts.filter(claimed_at__gte=start, claimed_at__lt=end).values(
            "claimed_at",
            "fence",
            "job__fence",
            "job__state",
            "job__run_at",
            "job__queue",
            "job__name",
        ):
            r = row(a["claimed_at"], a["job__queue"], a["job__name"])
            r["claims"] += 1
            if a["fence"] == a["job__fence"] and a["job__state"] not in WAIT_UNKNOWN_STATES:
                wait = (a["claimed_at"] - a["job__run_at"]).total_seconds() * 1000.0
                r["waits"].append(max(0.0, wait))
        rows = []
        for r in out.values():
            waits = sorted(r.pop("waits"))
            r["wait_p50_ms"] = percentile(waits, 0.50)
            r["wait_p95_ms"] = percentile(waits, 0.95)
            rows.append(r)
        return sorted(rows, key=lambda r: (r["minute"], r["queue"], r["name"]))

    def save_minute_stats(self, rows: Sequence[dict[str, Any]], *, through: datetime) -> None:
        """Write ``rows`` (from :meth:`minute_rollup`), replacing any row of the same minute,
        queue and type (so a minute rolled up twice counts once), and move the watermark to
        ``through`` (the end of the range), in one transaction."""
        fields = [*ROLLUP_COUNTS, "wait_p50_ms", "wait_p95_ms"]
        objs = [
            MinuteStats(
                minute=r["minute"], queue=r["queue"], name=r["name"], **{f: r[f] for f in fields}
            )
            for r in rows
        ]
        # The watermark: a row with no queue or type at the end of the range rolled up.
        objs.append(MinuteStats(minute=through, queue="", name=""))
        with transaction.atomic(using=self.alias):
            MinuteStats.objects.using(self.alias).filter(queue="", name="").exclude(
                minute=through
            ).delete()
            MinuteStats.objects.using(self.alias).bulk_create(
                objs,
                update_conflicts=True,
                unique_fields=["minute", "queue", "name"],
                update_fields=fields,
            )

    def history_watermark(self) -> datetime | None:
        """The end of the last range rolled up into ``MinuteStats`` (None: none yet)."""
        return (  # type: ignore[no-any-return]
            MinuteStats.objects.using(self.alias)
            .filter(queue="", name="")
            .aggregate(t=Max("minute"))["t"]
        )

    def prune_minute_stats(self, before: datetime) -> int:
        """Delete the history rows of minutes before ``before``; how many."""
        n, _ = MinuteStats.objects.using(self.alias).filter(minute__lt=before).delete()
        return int(n)
