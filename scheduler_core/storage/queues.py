"""Queues an operator configured: the claim within a queue's limits, and the queue rows' reads
and fenced-by-version writes. The claim's gate for paused or limited queues is in each
database's claim statement (``open_queue`` in :mod:`.pg_statements` and
:mod:`.sqlite_statements`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from ..domain import queues as queue_limits
from ..domain import states
from ..models import (
    Job,
    Queue,
)
from .clock import DbNow
from .core import DriverCore
from .records import (
    Lease,
)

log = logging.getLogger("tenure.storage")


class QueueOps(DriverCore):
    """Queue pause and limits, for :class:`~scheduler_core.storage.base.Driver`."""

    def limited_queues(self, queues: Sequence[str], *, job_id: int | None = None) -> list[str]:
        """Of ``queues`` (or, with ``job_id``, that waiting job's queue), those claimed within
        limits (not paused, with a limit), by name. Drivers whose claim statement cannot say it
        (PostgreSQL's does: ``pg_statements.LIMITED_QUEUE``) ask this after a claim that came
        back short."""
        qs = Queue.objects.using(self.alias).filter(paused=False)
        qs = qs.filter(Q(max_leased__isnull=False) | Q(max_per_second__isnull=False))
        if job_id is not None:
            qs = qs.filter(
                name__in=Job.objects.using(self.alias)
                .filter(pk=job_id, state=states.State.WAITING)
                .values("queue")
            )
        else:
            qs = qs.filter(name__in=list(queues))
        return sorted(qs.values_list("name", flat=True))

    def claim_within_limits(
        self, names: Sequence[str], *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """Claim up to ``limit`` jobs of the limited queues ``names`` (or exactly ``job_id``),
        each within its limits, in one transaction (the caller's, if one is open).

        Each queue's row is locked first (``FOR UPDATE`` on PostgreSQL; SQLite's write lock
        is held already), so claimers of a limited queue take turns: the leased jobs are
        counted after the lock, by a statement that sees every claim committed before it, and
        the token bucket is read and written under it, refilled by the database's clock
        (:func:`scheduler_core.domain.queues.allowance`). Queues paused or freed of their limits
        since are skipped: the plain claim takes the latter."""
        if limit < 1 or not names:
            return []
        got: list[Lease] = []
        with self.atomic():
            rows = list(
                Queue.objects.using(self.alias)
                .select_for_update()
                .filter(name__in=sorted(set(names)), paused=False)
                .filter(Q(max_leased__isnull=False) | Q(max_per_second__isnull=False))
                .order_by("name")
            )
            if not rows:
                return []
            now = self.now()
            for q in rows:
                want = limit - len(got)
                if want < 1:
                    break
                leased = 0
                if q.max_leased is not None:
                    # By the queue's own index of leases (0016): the leases index holds every
                    # queue's, and under a held snapshot an entry of every job leased since.
                    leased = (
                        Job.objects.using(self.alias)
                        .filter(queue=q.name, state=states.State.LEASED)
                        .count()
                    )
                allowed = queue_limits.allowance(
                    want=want,
                    max_leased=q.max_leased,
                    leased=leased,
                    max_per_second=q.max_per_second,
                    tokens=q.tokens,
                    tokens_at=q.tokens_at,
                    now=now,
                )
                taken = []
                if allowed.jobs > 0:
                    taken = self.claim_limited_queue(
                        q.name, executor=executor, limit=allowed.jobs, job_id=job_id
                    )
                if q.max_per_second is not None:
                    Queue.objects.using(self.alias).filter(pk=q.name).update(
                        tokens=queue_limits.after_claim(allowed.tokens, len(taken)), tokens_at=now
                    )
                got.extend(taken)
        return got

    def queue_row(self, name: str, *, lock: bool = False) -> Queue | None:
        """The operator's settings row of queue ``name`` (None: the queue has none, so no
        pause and no limits); ``lock`` holds it until the transaction ends."""
        qs = Queue.objects.using(self.alias).filter(pk=name)
        if lock:
            qs = qs.select_for_update()
        return qs.first()

    def queue_rows(self) -> list[Queue]:
        """Every queue's settings row, by name."""
        return list(Queue.objects.using(self.alias).order_by("name"))

    def write_queue(
        self, name: str, *, expected_version: int | None, fields: dict[str, Any]
    ) -> bool:
        """Write an operator's change of queue ``name``'s settings: only while its row still
        has ``expected_version`` (0: the queue has no row yet, which this creates; None: any
        version); whether it was written. The version grows by one with each change, and the
        row stays once made, so a page that saw an older version is always refused. Changing
        the rate limit refills its bucket (full from now)."""
        fields = {**fields, "updated_at": DbNow()}
        if "max_per_second" in fields:
            fields.update(tokens=0.0, tokens_at=None)
        qs = Queue.objects.using(self.alias).filter(pk=name)
        if expected_version == 0:
            if qs.exists():
                return False
            try:
                with transaction.atomic(using=self.alias):
                    Queue.objects.using(self.alias).create(name=name, version=1, **fields)
            except IntegrityError:
                return False  # made meanwhile by another operator
            return True
        if expected_version is not None:
            qs = qs.filter(version=expected_version)
        return bool(qs.update(version=F("version") + 1, **fields) == 1)
