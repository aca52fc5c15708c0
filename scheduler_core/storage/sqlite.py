"""SQLite's driver: the embedded default's claims, completions, enqueues and retention. The
statements it sends are named in :mod:`.sqlite_statements`; what every driver offers is stated
in :mod:`.contract`.

Every write transaction begins ``IMMEDIATE`` (the connection's ``transaction_mode``), so it
holds the database's one write lock from its first statement: a claim's conditional
``UPDATE`` can never be overtaken between its read and its write, and claimers, completions
and the reaper are serialised by SQLite itself (no ``SKIP LOCKED``, no transaction ids to read
back, no notifications: executors poll). A reader holds no old row versions here (SQLite
updates in place), so there are no claim floors to seek from.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import IntegrityError, models
from django.db.models import BooleanField, Exists, Min, OuterRef, Q
from django.db.models.expressions import RawSQL

from ..domain import states
from ..domain import workflows as rules
from ..domain.options import JobOptions
from ..domain.outcomes import Decision
from ..domain.payload_search import PayloadQuery
from ..exceptions import EffectsUnsettled, JobCancelled, StaleAttempt
from ..models import Attempt, AuditEntry, Effect, EffectEvent, Job
from ..models import JobSpec as JobSpecRow
from .base import (
    Driver,
)
from .clock import DbNow, to_datetime
from .records import (
    JOB_OPTION_COLUMNS,
    JSON_COLUMNS,
    PRUNABLE,
    SPEC_COLUMNS,
    Lease,
    leases_from_rows,
    named_rows,
    row_values,
)
from .sqlite_hold import WATCH
from .sqlite_statements import (
    DATABASE_LIST,
    INSERT_JOB_SPEC,
    NOW,
    RENEW_LEASE,
    SQLITE_NOW,
    attempt_insert_sql,
    claim_sql,
    insert_jobs_sql,
    make_due_sql,
    payload_leaf_sql,
    steps_succeeded_sql,
)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class SqliteDriver(Driver):
    """Tenure's operations on a SQLite database."""

    vendor = "sqlite"
    one_writer = True
    now_sql = SQLITE_NOW

    @classmethod
    def read_identity(cls, connection: Any) -> dict[str, str]:
        """The database file's real path and inode: a copy elsewhere has another path, and a
        copy or backup put in the file's place another inode. One written into the same file (as
        ``cp`` onto it or ``.restore`` does) keeps both and is not told apart. An in-memory
        database has neither."""
        with connection.cursor() as cur:
            cur.execute(DATABASE_LIST)
            files = {str(r["name"]): str(r["file"] or "") for r in named_rows(cur)}
        path = files.get("main", "")
        if not path:
            return {"vendor": "sqlite"}
        real = os.path.realpath(path)
        try:
            inode = str(os.stat(real).st_ino)
        except OSError:
            return {"vendor": "sqlite", "file": real}
        return {"vendor": "sqlite", "file": real, "inode": inode}

    def now(self) -> datetime:
        with self.connection.cursor() as cur:
            cur.execute(NOW, [])
            return to_datetime(cur.fetchone()[0])  # type: ignore[no-any-return]

    def atomic(self, *, savepoint: bool = True) -> AbstractContextManager[Any]:
        """A transaction (or savepoint); a ``transactional`` handler's, taken back past its
        bound, ends in :class:`~scheduler_core.exceptions.WriteLockHeldTooLong`
        (:mod:`.sqlite_hold`)."""
        return WATCH.atomic(super().atomic(savepoint=savepoint), self.connection)

    def limit_handler_idle(self, lease: Lease | None = None) -> None:
        """Bound how long the ``transactional`` handler about to run in this transaction (the
        attempt of ``lease``) may hold the database's one write lock: a share of the shortest
        lease of the other attempts running now; none with no other attempt running, which
        the hold could starve of a renewal (:mod:`.sqlite_hold`)."""
        others = JobSpecRow.objects.using(self.alias).filter(job__state=states.State.LEASED)
        if lease is not None:
            others = others.exclude(job_id=lease.job_id)
        shortest = others.aggregate(shortest=Min("lease_seconds"))["shortest"]
        if shortest:
            WATCH.begin(self.connection, shortest_lease=float(shortest))

    def payload_contains(self, query: PayloadQuery) -> Q:
        """Each leaf read with ``json_extract``: no index, the payloads are read (the embedded
        default's tables are small)."""
        parts = [payload_leaf_sql(path, value) for path, value in query.leaves]
        sql = " AND ".join(f"({p})" for p, _ in parts)
        params = [x for _, ps in parts for x in ps]
        # The leaves name the spec's table: the condition asks for a join to it.
        return Q(spec__isnull=False) & Q(RawSQL(sql, params, output_field=BooleanField()))

    def claim(
        self,
        *,
        executor: str,
        queues: Sequence[str] = ("default",),
        limit: int = 1,
        job_id: int | None = None,
    ) -> list[Lease]:
        """The claim's ``UPDATE`` and the claimed jobs' Attempt rows, in one transaction.

        A claim that comes back short of ``limit`` then asks whether any of ``queues`` is
        limited (one read of ``tenure_queue``) and takes what their limits allow, in the same
        transaction (:meth:`Driver.claim_within_limits`); a full claim asks nothing more."""
        if limit < 1:
            return []
        with self.atomic():
            leases = self._claim(executor=executor, queues=queues, limit=limit, job_id=job_id)
            if len(leases) < limit:
                limited = self.limited_queues(queues, job_id=job_id)
                if limited:
                    leases += self.claim_within_limits(
                        limited, executor=executor, limit=limit - len(leases), job_id=job_id
                    )
        return leases

    def claim_limited_queue(
        self, queue: str, *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """The claim of one queue (or one job of it) without the gate, in one transaction."""
        with self.atomic():
            return self._claim(
                executor=executor, queues=[queue], limit=limit, job_id=job_id, gate=False
            )

    def _claim(
        self,
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        job_id: int | None,
        gate: bool = True,
    ) -> list[Lease]:
        """The claim's two statements, in the caller's transaction."""
        if limit < 1:
            return []
        by_id = job_id is not None
        sql = claim_sql(by_id=by_id, nqueues=len(queues), gate=gate)
        sent = time.monotonic()
        # Placeholders in text order: the WHERE comes after the SET.
        params: list[Any] = [executor, *([job_id] if by_id else queues), limit]
        with self.connection.cursor() as cur:
            cur.execute(sql, params)
            rows = named_rows(cur)
            if not rows:
                return []
            ids = [r["id"] for r in rows]
            cur.execute(attempt_insert_sql(len(ids)), ids)
            attempt_of = {r["job_id"]: r["id"] for r in named_rows(cur)}
        claimed = [{**r, "attempt_id": attempt_of[r["id"]]} for r in rows]
        return leases_from_rows(claimed, executor=executor, sent=sent)

    def complete(self, lease: Lease, *, result: Any = None) -> int | None:
        """:meth:`Driver.finish` with ``COMPLETE`` (no transaction id to return)."""
        self.finish(lease, Decision(transition=states.COMPLETE), outcome="succeeded", result=result)
        return None

    def complete_many_and_claim(
        self,
        leases: Sequence[Lease],
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        results: Mapping[int, Any] | None = None,
    ) -> tuple[int | None, set[int], list[Lease]]:
        """Each completion, then the claim, in the caller's transaction (SQLite's one write
        lock makes them one commit as surely as one statement would)."""
        matched: set[int] = set()
        for lease in leases:
            try:
                self.complete(lease, result=(results or {}).get(lease.attempt_id))
                matched.add(lease.job_id)
            except (StaleAttempt, EffectsUnsettled, JobCancelled):
                pass  # left out; the caller asks why once the rest has committed
        got = self.claim(executor=executor, queues=queues, limit=limit) if limit > 0 else []
        return None, matched, got

    def renew_lease(self, lease: Lease) -> list[dict[str, Any]]:
        """:data:`.sqlite_statements.RENEW_LEASE`, the renewal with SQLite's clock."""
        with self.connection.cursor() as cur:
            cur.execute(
                RENEW_LEASE,
                [f"{float(lease.lease_seconds):+.6f} seconds", lease.job_id, lease.fence],
            )
            return named_rows(cur)

    def steps_succeeded(self, job_ids: Sequence[int]) -> list[int]:
        """The release (its children count the steps off), then the children it brought to
        zero become due at the database's now: two statements."""
        if not job_ids:
            return []
        # One statement whatever the fan-out; a child two of these parents share counts both.
        # Concurrent completions of a fan-in's parents queue on the child's row, and each
        # subtracts from what the one before it left, so exactly one sees zero.
        with self.connection.cursor() as cur:
            cur.execute(steps_succeeded_sql(len(job_ids)), [*job_ids, *job_ids])
            ready = sorted(int(j) for j, pending in cur.fetchall() if pending <= 0)
        if not ready:
            return []
        with self.connection.cursor() as cur:
            cur.execute(
                make_due_sql(len(ready)),
                [
                    *ready,
                    states.State.WAITING.value,
                    self.connection.ops.adapt_datetimefield_value(rules.BLOCKED_AT),
                ],
            )
            rows = cur.fetchall()
        return self._announce_due(rows)

    def insert_job(
        self,
        options: JobOptions,
        *,
        unique_key: str | None = None,
        schedule_id: int | None = None,
        hinted: bool = False,
    ) -> Job | None:
        """The ORM's insert; a taken ``unique_key`` is found by the unique index (a savepoint
        keeps the caller's transaction usable)."""
        values = row_values(options)
        job_values = {c: values[c] for c in JOB_OPTION_COLUMNS}
        job_values.update(
            run_at=values["run_at"] if values["run_at"] is not None else DbNow(),
            unique_key=unique_key,
            schedule_id=schedule_id,
            state=states.State.WAITING,
            created_at=DbNow(),
            updated_at=DbNow(),
            hinted_at=DbNow() if hinted else None,
        )
        with self.atomic():
            try:
                with self.atomic():
                    job = Job(**job_values)
                    # The model's own save() refuses every writer but this layer.
                    models.Model.save(job, force_insert=True, using=self.alias)
            except IntegrityError:
                if unique_key is None:
                    raise
                return None
            JobSpecRow.objects.using(self.alias).create(
                job=job, **{c: values[c] for c in SPEC_COLUMNS}
            )
            job.refresh_from_db()
        return job

    def insert_jobs(
        self, options: JobOptions, payloads: Sequence[dict[str, Any]], *, hinted: bool = False
    ) -> list[tuple[int, datetime]]:
        values = {c: self._param(c, v) for c, v in row_values(options).items()}
        params = [*(values[c] for c in JOB_OPTION_COLUMNS), _json(list(payloads))]
        with self.atomic(), self.connection.cursor() as cur:
            cur.execute(insert_jobs_sql(hinted=hinted), params)
            got = sorted((int(i), to_datetime(at)) for i, at in cur.fetchall())
            # One statement inserted the jobs in the payloads' order, each id above the last.
            cur.executemany(
                INSERT_JOB_SPEC,
                [
                    [job_id, *({**values, "payload": _json(p)}[c] for c in SPEC_COLUMNS)]
                    for (job_id, _), p in zip(got, payloads, strict=True)
                ],
            )
            return got

    def _param(self, column: str, value: Any) -> Any:
        """One column of the job spec as a placeholder of SQLite's raw statements takes it:
        JSON as text, a datetime as Django stores one (None stays None)."""
        if value is None:
            return None
        if column in JSON_COLUMNS:
            return _json(value)
        if isinstance(value, datetime):
            return self.connection.ops.adapt_datetimefield_value(value)
        return value

    def prune_finished(self, state: str, older_than: float, *, limit: int = 1000) -> int:
        """The jobs to delete, then their ledger history, ledger rows, attempts and the jobs,
        in one transaction."""
        if state not in PRUNABLE:
            raise ValueError(f"only finished jobs are pruned, not {state!r}")
        if older_than <= 0 or limit < 1:
            return 0
        with self.atomic():
            ids = list(
                Job.objects.using(self.alias)
                .filter(state=state, updated_at__lt=DbNow(-older_than))
                .exclude(
                    pk__in=AuditEntry.objects.using(self.alias)
                    .filter(job__isnull=False)
                    .values("job")
                )
                .exclude(Exists(self.unsettled_of_job(OuterRef("pk"))))
                .exclude(Exists(self.unfinished_children(OuterRef("pk"))))
                .order_by("updated_at", "id")
                .values_list("id", flat=True)[:limit]
            )
            if not ids:
                return 0
            self.forget_steps(ids)
            EffectEvent.objects.using(self.alias).filter(effect__job_id__in=ids).delete()
            Effect.objects.using(self.alias).filter(job_id__in=ids).delete()
            Attempt.objects.using(self.alias).filter(job_id__in=ids).delete()
            JobSpecRow.objects.using(self.alias).filter(job_id__in=ids).delete()
            n, _ = Job.objects.using(self.alias).filter(pk__in=ids, state=state).delete()
            return len(ids) if n else 0
