"""The storage operations around the attempts: the reaper's reads and releases, the hints a
dispatcher takes, the executor registry (started, beats, stopped, live consumers, earlier
owners in flight), the count snapshot, and the operator's transitions and facts."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, DurationField, Exists, ExpressionWrapper, F, Max, OuterRef, Q

from ..conf import executor_stale_seconds, tenure_settings
from ..domain import states
from ..domain.outcomes import Decision, Kind
from ..models import (
    Attempt,
    CountSnapshot,
    Effect,
    EffectEvent,
    Executor,
    Job,
    OpenAttempt,
    Queue,
)
from .clock import DbNow
from .core import DriverCore
from .records import (
    IN_FLIGHT_OUTCOMES,
    InFlightOwner,
    Lease,
    with_note,
)

log = logging.getLogger("tenure.storage")


class Bookkeeping(DriverCore):
    """Reaper, hints, executors and operators, for :class:`~scheduler_core.storage.base.Driver`."""

    def expired_leases(self, grace: float, *, since: datetime | None = None) -> Any:
        """The leased jobs whose lease expired more than ``grace`` seconds ago (and not before
        ``since``, when given), oldest expiry first, locked ``SKIP LOCKED`` on PostgreSQL (call
        inside a transaction)."""
        qs = (
            Job.objects.using(self.alias)
            # A bound the leases index can stop at: with the wall clock as a mere filter, every
            # sweep read the whole index, and under a held snapshot that is an entry for every
            # job leased since (the reaper's write re-checks the expiry with the wall clock).
            .filter(state=states.State.LEASED, lease_expires_at__lt=DbNow(-grace, search=True))
            .order_by("lease_expires_at")
        )
        if since is not None:
            # And one it can start from: every lease that expired before the last sweep's
            # bound was read by that sweep, and the entries below are, under a held snapshot,
            # the old versions of every job leased since (services.reaper.LeaseWalk).
            qs = qs.filter(lease_expires_at__gte=since)
        if self.skips_locked_rows:
            qs = qs.select_for_update(skip_locked=True)
        return qs

    def close_stray_attempts(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Close as ``superseded`` up to ``limit`` open attempts that are not their job's
        current one (the job is not leased under the attempt's fence); returns each one closed
        (``id``, ``job_id``, ``fence``, ``number``).

        Tenure's own writes never leave one: a claim opens the attempt in the statement that
        leases the job, and whatever ends the lease closes it in the same transaction. Rows
        written by hand or a defect can, and the claim passes over a job beside one (the
        database's rule of one open attempt would refuse its new attempt). Found through the
        table of open attempts (migration 0017), a few rows, not by reading every attempt. Closing it changes no job
        and is safe whoever still runs it: every write of such an attempt is fenced on the job
        and already refused, and fences only grow, so it can never become current again. The
        condition is restated in the write itself, so a row that changed meanwhile is kept."""
        current = Job.objects.using(self.alias).filter(
            pk=OuterRef("job_id"), state=states.State.LEASED, fence=OuterRef("fence")
        )
        opened = OpenAttempt.objects.using(self.alias).values("attempt_id")
        stray = (
            Attempt.objects.using(self.alias)
            .filter(pk__in=opened, finished_at__isnull=True)
            .exclude(Exists(current))
        )
        found = stray.order_by("id").values("id", "job_id", "fence", "number")[:limit]
        # One write a row (there are none, or a few): each reports exactly what it closed.
        return [
            dict(r)
            for r in list(found)
            if stray.filter(pk=r["id"]).update(finished_at=DbNow(), outcome="superseded")
        ]

    def release_unstarted(self, lease: Lease, *, why: str) -> None:
        """Give back a claimed attempt whose handler never started (a Celery chain's queued job):
        the job waits again at once, the attempt is not spent, and its kind is kept. Nothing of
        this attempt can have happened, so no effect rule is asked; effects an earlier attempt
        left unsettled stay as the ledger has them. Fenced."""
        decision = Decision(
            transition=states.RELEASE, reason=why, spend_attempt=False, next_kind=Kind(lease.kind)
        )
        self.finish(lease, decision, outcome="released")

    def take_due_hints(
        self, *, limit: int = 500, queues: frozenset[str] | None = None
    ) -> list[tuple[int, str]]:
        """Pick due waiting jobs of ``queues`` (None: every queue) whose hint is missing, was sent
        for an earlier due time (before a retry), or is old, and mark them hinted now.

        "Old" grows with the wait: a hint is sent again once ``REDISPATCH_AFTER_SECONDS`` have
        passed and at least as long as the job had been due when its last hint went, so a job
        that stays unclaimed gets hints at due + 10 s, 20 s, 40 s, 80 s … (a bounded number,
        however long it waits), never one per round. Returns ``(job_id, queue)`` pairs to publish.
        Two dispatchers may both pick a job; the second hint is absorbed by the claim.
        """
        if queues is not None and not queues:
            return []
        resend = tenure_settings().REDISPATCH_AFTER_SECONDS
        with transaction.atomic(using=self.alias):
            waited_at_last_hint = ExpressionWrapper(
                F("hinted_at") - F("run_at"), output_field=DurationField()
            )
            since_last_hint = ExpressionWrapper(
                DbNow() - F("hinted_at"), output_field=DurationField()
            )
            qs = (
                Job.objects.using(self.alias)
                .filter(state=states.State.WAITING, run_at__lte=DbNow())
                .annotate(waited=waited_at_last_hint, since=since_last_hint)
                .filter(
                    Q(hinted_at__isnull=True)
                    | Q(hinted_at__lt=F("run_at"))
                    | (Q(hinted_at__lt=DbNow(-resend)) & Q(since__gt=F("waited")))
                )
                .order_by("-priority", "run_at", "id")
            )
            if queues is not None:
                qs = qs.filter(queue__in=sorted(queues))
            # A paused queue's jobs are claimed by no one: a hint would only be dropped. Once
            # resumed, their hints are old, so the next round sends them.
            qs = qs.exclude(Exists(Queue.objects.filter(name=OuterRef("queue"), paused=True)))
            if self.skips_locked_rows:
                qs = qs.select_for_update(skip_locked=True, of=("self",))
            picked = list(qs.values_list("id", "queue")[:limit])
            if picked:
                Job.objects.using(self.alias).filter(
                    pk__in=[p[0] for p in picked], state=states.State.WAITING
                ).update(hinted_at=DbNow())
        return picked

    def executor_started(
        self, executor_id: str, *, transport: str, queues: Sequence[str], concurrency: int
    ) -> None:
        """Register a live executor."""
        Executor.objects.using(self.alias).update_or_create(
            id=executor_id,
            defaults={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "transport": transport,
                "queues": ",".join(queues),
                "concurrency": concurrency,
                "active": 0,
                "started_at": DbNow(),
                "heartbeat_at": DbNow(),
                "stopped_at": None,
            },
        )

    def executor_beat(self, executor_id: str, *, active: int) -> None:
        """Refresh an executor's liveness row."""
        Executor.objects.using(self.alias).filter(pk=executor_id).update(
            heartbeat_at=DbNow(), active=active
        )

    def executor_stopped(self, executor_id: str) -> None:
        """Mark an executor stopped."""
        Executor.objects.using(self.alias).filter(pk=executor_id).update(
            stopped_at=DbNow(), active=0
        )

    def in_flight_owners(self, job_id: int, *, limit: int = 20) -> list[InFlightOwner]:
        """The job's earlier owners that may still be in flight (see :class:`InFlightOwner`),
        newest first: attempts the reaper ended (their lease ran out, or their maximum runtime)
        or that their executor released unfinished inside an effect, unless their executor is
        known gone. An
        executor is known gone once it recorded its own stop, and not before
        ``TENURE_REAP_GRACE_SECONDS`` after the attempt ended: a process recording its stop
        may still be on its way out."""
        # A released attempt can still send only what it had started: an intent it left
        # unsettled (one released before its handler began, or between effects, cannot).
        left_unsettled = EffectEvent.objects.using(self.alias).filter(
            attempt_id=OuterRef("pk"), event=EffectEvent.LEFT_UNSETTLED
        )
        ended = list(
            Attempt.objects.using(self.alias)
            .filter(job_id=job_id, outcome__in=IN_FLIGHT_OUTCOMES)
            .filter(Q(outcome="lease_expired") | Exists(left_unsettled))
            .order_by("-fence")
            .values(
                "number",
                "fence",
                "executor",
                "outcome",
                "heartbeat_at",
                "finished_at",
            )[:limit]
        )
        if not ended:
            return []
        rows = {
            e.id: e
            for e in Executor.objects.using(self.alias).filter(
                id__in={a["executor"] for a in ended}
            )
        }
        grace = dt.timedelta(seconds=tenure_settings().REAP_GRACE_SECONDS)
        now = self.now()
        out = []
        for a in ended:
            ex = rows.get(a["executor"])
            # The reaper ended its attempts only after the lease and the grace ran out; a
            # released attempt's handler may run on from the moment of release.
            clear_at = a["finished_at"] or now
            if a["outcome"] == "released":
                clear_at += grace
            if ex is not None and ex.stopped_at is not None and clear_at <= now:
                continue
            out.append(
                InFlightOwner(
                    attempt=a["number"],
                    fence=a["fence"],
                    executor=a["executor"],
                    last_heartbeat=a["heartbeat_at"],
                    reaped_at=a["finished_at"],
                    executor_last_seen=ex.heartbeat_at if ex is not None else None,
                    ended=IN_FLIGHT_OUTCOMES[a["outcome"]],
                    clear_at=clear_at,
                )
            )
        return out

    def refresh_count_snapshot(self, *, older_than: float) -> bool:
        """Recount succeeded and cancelled jobs per (queue, type) into :class:`CountSnapshot` if
        the last count is older than ``older_than`` seconds; returns whether it recounted.

        The count is one scan of the job table; replacing the rows is one transaction, so the
        dashboard sees the old snapshot or the new one, never a mix.
        """
        last = CountSnapshot.objects.using(self.alias).aggregate(t=Max("taken_at"))["t"]
        if last is not None and not self._older_than(last, older_than):
            return False
        rows = (
            Job.objects.using(self.alias)
            .filter(state__in=[states.State.SUCCEEDED, states.State.CANCELLED])
            .values("queue", "name", "state")
            .annotate(n=Count("id"))
        )
        with transaction.atomic(using=self.alias):
            taken = self.now()
            CountSnapshot.objects.using(self.alias).all().delete()
            CountSnapshot.objects.using(self.alias).bulk_create(
                CountSnapshot(
                    queue=r["queue"], name=r["name"], state=r["state"], n=r["n"], taken_at=taken
                )
                for r in rows
            )
        return True

    def live_consumer_queues(self, transport: str) -> frozenset[str]:
        """The broker queues that live executors of ``transport`` consume, from their
        liveness rows (beaten within ``conf.executor_stale_seconds()``, not stopped); a
        scheduler's row (``transport="scheduler"``) consumes nothing."""
        rows = (
            Executor.objects.using(self.alias)
            .filter(
                transport=transport,
                stopped_at__isnull=True,
                heartbeat_at__gt=DbNow(-executor_stale_seconds()),
            )
            .exclude(transport="scheduler")
            .values_list("queues", flat=True)
        )
        return frozenset(q for row in rows for q in row.split(",") if q)

    def operator_transition(
        self,
        job_id: int,
        *,
        expected_version: int,
        transition: states.Transition,
        fields: dict[str, Any],
    ) -> bool:
        """An operator's transition of one job: written only while the job still has
        ``expected_version`` and a state the transition leaves; whether it was."""
        fields = {**fields, "updated_at": DbNow(), "version": F("version") + 1}
        n = (
            Job.objects.using(self.alias)
            .filter(pk=job_id, version=expected_version, state__in=list(transition.sources))
            .update(state=transition.target, **fields)
        )
        return bool(n == 1)

    def record_operator_fact(
        self, effect: Effect, *, effect_state: str, actor: str, reason: str
    ) -> None:
        """Settle one ledger row with a fact an operator verified, with its history entry."""
        note = f"operator {actor} verified {effect_state}: {reason}"
        Effect.objects.using(self.alias).filter(pk=effect.pk).update(
            state=effect_state,
            in_doubt=False,
            note=with_note(effect.note, note),
            updated_at=DbNow(),
        )
        self._event(
            effect.pk,
            None,
            EffectEvent.OPERATOR,
            effect_state,
            in_doubt=False,
            note=reason,
            actor=actor,
        )
