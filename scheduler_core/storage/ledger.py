"""The effect ledger's named operations: the fenced intent and settlement of an attempt's
effects (under the keys :mod:`.installation` makes), reconciliation, and the reads of what a
job's ledger holds unsettled or applied."""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections, transaction
from django.db.models import F

from ..domain import outcomes
from ..domain.modes import EffectMode
from ..exceptions import (
    Indeterminate,
    StaleAttempt,
)
from ..models import (
    Effect,
    EffectEvent,
)
from .clock import DbNow
from .installation import InstallationOps
from .records import (
    Lease,
    with_note,
)

log = logging.getLogger("tenure.storage")


class LedgerOps(InstallationOps):
    """The effect ledger, for :class:`~scheduler_core.storage.base.Driver`."""

    def has_unsettled_effect(self, job_id: int) -> bool:
        """Whether an effect of the job may or may not have happened: its intent was recorded and
        no outcome since, or an attempt's outcome was unknown and no stated fact (a
        reconciliation's answer, the destination's acknowledgement, an operator's verified fact)
        has settled it. Every decision that asks "may this effect have happened?" asks this."""
        return bool(self.unsettled_of_job(job_id).exists())

    def ledger_summary(self, job_id: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The names of the job's effects that may or may not have happened (intended or
        unknown), and of those recorded applied, in one read: what the ledger's rule for a
        job's end state (:func:`scheduler_core.domain.outcomes.final`) needs."""
        rows = (
            Effect.objects.using(self.alias)
            .filter(job_id=job_id, state__in=[Effect.INTENDED, Effect.UNKNOWN, Effect.APPLIED])
            .order_by("name")
            .values_list("name", "state")
        )
        unsettled: list[str] = []
        applied: list[str] = []
        for name, state in rows:
            (applied if state == Effect.APPLIED else unsettled).append(name)
        return tuple(unsettled), tuple(applied)

    def unsettled_effects(self, job_id: int) -> list[Effect]:
        """The job's ledger rows that may or may not have happened, by name."""
        return list(self.unsettled_of_job(job_id).order_by("name"))

    def _in_job_transaction(self, lease: Lease) -> bool:
        """Whether this is a transactional job's attempt, running inside its own transaction."""
        return lease.effect == EffectMode.TRANSACTIONAL and connections[self.alias].in_atomic_block

    def effect_intend(self, lease: Lease, name: str) -> Effect:
        """Record the intent to perform effect ``name`` before the external call (fenced).

        Refused (:class:`StaleAttempt`) when the attempt no longer owns the job or its lease has
        expired by the database's clock, so a paused attempt cannot start a new effect, and
        (:class:`AttemptOverrun`) past the attempt's maximum runtime, and
        (:class:`~scheduler_core.exceptions.JobCancelled`) once an operator asked the attempt to
        stop: the statement's guard says ``cancel_requested_at IS NULL``. Returns the ledger row;
        a row already ``applied`` is returned unchanged for the caller to skip.

        An earlier intent whose outcome is not known (``intended`` or ``unknown``) is followed
        according to the job's mode: ``idempotent`` starts again under the same key;
        ``at_least_once`` starts again and the row records that a duplicate is possible and why;
        ``reconcilable`` and ``at_most_once`` refuse with
        :class:`~scheduler_core.exceptions.Indeterminate`, so only a reconcile attempt or an
        operator who checked the destination can unblock the effect. Starting again keeps the row
        ``in_doubt``: what this attempt then learns cannot erase the earlier unknown.

        A transactional job inside its transaction writes nothing here: its effect is a write in
        that same transaction, recorded ``applied`` by :func:`effect_settle` and committed with the
        completion or not at all. The ownership check then reads without locking, so an attempt
        paused mid-transaction holds no lock its replacement needs.
        """
        if self._in_job_transaction(lease):
            live = self._mine(lease).filter(
                lease_expires_at__gt=DbNow(),
                deadline_at__gt=DbNow(),
                cancel_requested_at__isnull=True,
            )
            if not live.exists():
                raise self._refused_intent(lease, "effect_intent")
            existing = (
                Effect.objects.using(self.alias).filter(job_id=lease.job_id, name=name).first()
            )
            return existing or Effect(
                key=self._new_key(lease.job_id, name),
                job_id=lease.job_id,
                name=name,
                state=Effect.INTENDED,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
            )
        with transaction.atomic(using=self.alias):
            self.assert_current(lease, "effect_intent", not_cancelled=True)
            row = Effect.objects.using(self.alias).filter(job_id=lease.job_id, name=name).first()
            if row is None:
                row = Effect.objects.using(self.alias).create(
                    key=self._new_key(lease.job_id, name),
                    job_id=lease.job_id,
                    name=name,
                    state=Effect.INTENDED,
                    attempt_id=lease.attempt_id,
                    fence=lease.fence,
                    created_at=DbNow(),
                    updated_at=DbNow(),
                )
                self._event(row.pk, lease, EffectEvent.INTENDED, Effect.INTENDED, in_doubt=False)
                row.refresh_from_db()
                return row
            if row.state == Effect.APPLIED:
                return row
            mode = EffectMode(lease.effect)
            unsettled = row.unsettled
            note = row.note
            cause = ""
            if unsettled:
                if mode in (EffectMode.AT_MOST_ONCE, EffectMode.RECONCILABLE):
                    raise Indeterminate(
                        f"effect {row.key} was left {row.state} by fence {row.fence}; a "
                        f"{mode.value} job does not start it again until it is settled"
                    )
                if mode == EffectMode.AT_LEAST_ONCE:
                    cause = (
                        f"duplicate possible: attempt {lease.number} (fence {lease.fence}) starts "
                        f"the effect again after fence {row.fence} left it {row.state}"
                    )
                else:
                    cause = (
                        f"attempt {lease.number} (fence {lease.fence}) retries under the same key "
                        f"after fence {row.fence} left it {row.state}"
                    )
                note = with_note(note, cause)
            in_doubt = row.in_doubt or unsettled
            Effect.objects.using(self.alias).filter(pk=row.pk).update(
                state=Effect.INTENDED,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
                intents=F("intents") + 1,
                in_doubt=in_doubt,
                duplicate_possible=row.duplicate_possible
                or (unsettled and mode == EffectMode.AT_LEAST_ONCE),
                note=note,
                updated_at=DbNow(),
            )
            self._event(
                row.pk, lease, EffectEvent.INTENDED, Effect.INTENDED, in_doubt=in_doubt, note=cause
            )
            row.refresh_from_db()
            return row

    def effect_settle(
        self,
        lease: Lease,
        key: str,
        state: str,
        *,
        destination_ref: str = "",
        note: str = "",
        name: str = "",
    ) -> str:
        """Record what this attempt learned of an effect (``applied``, ``not_applied`` or
        ``unknown``), fenced; returns the row's state afterwards.

        The answer is sticky: once an attempt's outcome was unknown (``in_doubt``), a later
        attempt that sent nothing (``not_applied``) leaves the row ``unknown``, since the earlier
        request may still have landed. Only a stated fact settles it: ``applied`` here (the
        destination acknowledged the request, a replay included), a reconciliation's answer
        (:func:`reconciled`) or an operator's verified fact. Every step is kept in the ledger's
        history (:class:`~scheduler_core.models.EffectEvent`).

        Inside a transactional job's transaction only ``applied`` is written (the row is created
        then), since any other outcome rolls the whole transaction back.
        """
        if self._in_job_transaction(lease):
            if state != Effect.APPLIED:
                return state
            fields: dict[str, Any] = {
                "state": Effect.APPLIED,
                "in_doubt": False,
                "attempt_id": lease.attempt_id,
                "fence": lease.fence,
                "destination_ref": destination_ref[:300],
                "note": note[:2000],
                "updated_at": DbNow(),
            }
            row_id = (
                Effect.objects.using(self.alias)
                .filter(key=key)
                .values_list("pk", flat=True)
                .first()
            )
            if row_id is not None:
                Effect.objects.using(self.alias).filter(pk=row_id).update(**fields)
            else:
                if not name:
                    raise ValueError("a transactional effect's first outcome needs its name")
                # A concurrent stale attempt's row would make this insert fail: its transaction
                # rolls back whole, as it must.
                row_id = (
                    Effect.objects.using(self.alias)
                    .create(key=key, job_id=lease.job_id, name=name, created_at=DbNow(), **fields)
                    .pk
                )
            self._event(
                row_id, lease, EffectEvent.APPLIED, Effect.APPLIED, in_doubt=False, note=note
            )
            return Effect.APPLIED
        with transaction.atomic(using=self.alias):
            self.assert_current(lease, "effect_outcome", lease_valid=False)
            row = (
                Effect.objects.using(self.alias)
                .filter(key=key, fence=lease.fence)
                .exclude(state=Effect.APPLIED)
                .first()
            )
            if row is None:
                raise StaleAttempt(lease.job_id, lease.fence, "effect_outcome")
            event = {
                Effect.APPLIED: EffectEvent.APPLIED,
                Effect.NOT_APPLIED: EffectEvent.NOT_SENT,
                Effect.UNKNOWN: EffectEvent.UNKNOWN,
            }[state]
            in_doubt = state == Effect.UNKNOWN or (state == Effect.NOT_APPLIED and row.in_doubt)
            if state == Effect.APPLIED:
                in_doubt = False
            after = Effect.UNKNOWN if in_doubt else state
            if state == Effect.NOT_APPLIED and in_doubt:
                note = with_note(
                    note,
                    f"attempt {lease.number} (fence {lease.fence}) sent nothing, but an earlier "
                    "outcome is still unknown: the effect may have happened",
                )
            fields = {"state": after, "in_doubt": in_doubt, "updated_at": DbNow()}
            if destination_ref:
                fields["destination_ref"] = destination_ref[:300]
            if note:
                fields["note"] = with_note(row.note, note)
            Effect.objects.using(self.alias).filter(pk=row.pk, fence=lease.fence).update(**fields)
            self._event(row.pk, lease, event, after, in_doubt=in_doubt, note=note)
        return after

    def reconciled(self, lease: Lease, answer: outcomes.Reconciliation, *, name: str) -> bool:
        """Record a reconcile attempt's answer about effect ``name`` (fenced): a stated fact, so
        it settles that ledger row, and only that one (``unknown`` changes nothing). Returns
        whether the row was settled (False: it was not unsettled any more)."""
        state = {
            outcomes.Reconciliation.APPLIED: Effect.APPLIED,
            outcomes.Reconciliation.NOT_APPLIED: Effect.NOT_APPLIED,
        }.get(answer)
        if state is None:
            return False
        with transaction.atomic(using=self.alias):
            self.assert_current(lease, "effect_outcome", lease_valid=False)
            pk = self.unsettled_of_job(lease.job_id).filter(name=name).values_list("pk", flat=True)
            row = pk.first()
            if row is None:
                return False
            Effect.objects.using(self.alias).filter(pk=row).update(
                state=state,
                in_doubt=False,
                note=f"reconciled by attempt {lease.number}",
                updated_at=DbNow(),
            )
            self._event(
                row,
                lease,
                EffectEvent.RECONCILED,
                state,
                in_doubt=False,
                note=f"the destination's lookup answered {answer.value}",
            )
        return True
