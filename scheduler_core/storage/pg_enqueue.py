"""PostgreSQL's enqueue writes: a job, a batch of jobs and a workflow's jobs, each with its spec
row (and a workflow's step rows and edges) in one statement, and a step's release, which makes
the children its success completes due in the completion's own transaction. A mixin of
:class:`~scheduler_core.storage.postgres.PostgresDriver`; the statements are in
:mod:`.pg_statements`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..domain import states
from ..domain import workflows as rules
from ..models import Job, JobSpec
from .clock import to_datetime
from .core import DriverCore
from .pg_statements import (
    DB_SET,
    INSERT_JOB,
    INSERT_WORKFLOW_JOBS,
    STEPS_SUCCEEDED,
    insert_jobs_sql,
)
from .records import SPEC_COLUMNS
from .workflows import NewStep


def _json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, allow_nan=False)


class PgEnqueue(DriverCore):
    """The enqueue writes and a step's release, for
    :class:`~scheduler_core.storage.postgres.PostgresDriver`."""

    def insert_job(self, fields: dict[str, Any]) -> Job | None:
        """One statement and one round trip, atomic on its own or joining the caller's
        transaction (``ON CONFLICT`` for a unique key, no savepoint)."""
        run_at = fields["run_at"]
        params = {
            **{
                k: fields[k] for k in ("name", "queue", "priority", "max_attempts", "lease_seconds")
            },
            "timeout_seconds": fields["timeout_seconds"],
            "unique_key": fields["unique_key"],
            "effect": fields["effect"],
            "schedule_id": fields["schedule_id"],
            "payload": json.dumps(fields["payload"], ensure_ascii=False, allow_nan=False),
            "run_at": run_at,
            "hint": fields["hinted"],
            "trace_context": _json_or_null(fields.get("trace_context")),
            "workflow_id": fields.get("workflow_id"),
        }
        with self.connection.cursor() as cur:
            cur.execute(INSERT_JOB[fields["unique_key"] is not None], params)
            cols = [c[0] for c in cur.description]
            row = cur.fetchone()
        if row is None:
            return None
        known = {
            k: v
            for k, v in fields.items()
            if k not in DB_SET and k not in SPEC_COLUMNS and k not in ("hinted", "trace_context")
        }
        job = Job(**known, **dict(zip(cols, row, strict=True)), state=states.State.WAITING)
        job.spec = JobSpec(
            job=job,
            **{k: fields.get(k) for k in SPEC_COLUMNS},
            trace_context=fields.get("trace_context"),
        )
        for row_obj in (job, job.spec):
            row_obj._state.adding = False
            row_obj._state.db = self.alias
        return job

    def insert_jobs(
        self, fields: dict[str, Any], payloads: Sequence[dict[str, Any]]
    ) -> list[tuple[int, datetime]]:
        sql = insert_jobs_sql(hinted=bool(fields["hinted"]))
        params = [
            json.dumps(list(payloads), ensure_ascii=False, allow_nan=False),
            fields["name"],
            fields["queue"],
            fields["priority"],
            fields["run_at"],
            fields["max_attempts"],
            fields["lease_seconds"],
            fields["effect"],
            fields["timeout_seconds"],
            fields.get("workflow_id"),
            _json_or_null(fields.get("trace_context")),
        ]
        with self.atomic(), self.connection.cursor() as cur:
            cur.execute(sql, params)
            return sorted((int(i), to_datetime(at)) for i, at in cur.fetchall())

    def steps_succeeded(self, job_ids: Sequence[int]) -> list[int]:
        """A step's release and the children it makes due
        in one statement (one round trip in the completion's transaction, not two). The
        children's counts go down as there; a child counted to zero becomes due if it is
        still a blocked step (tested on the row as it is after any concurrent write, as by
        itself), its job rows found by key (:data:`.pg_statements.STEPS_SUCCEEDED` says
        why)."""
        if not job_ids:
            return []
        parents = list(job_ids)
        with self.connection.cursor() as cur:
            cur.execute(
                STEPS_SUCCEEDED,
                [
                    parents,
                    parents,
                    states.State.WAITING.value,
                    self.connection.ops.adapt_datetimefield_value(rules.BLOCKED_AT),
                ],
            )
            rows = cur.fetchall()
        return self._announce_due(rows)

    def insert_workflow_jobs(
        self,
        workflow_id: int,
        steps: Sequence[NewStep],
        *,
        trace_context: dict[str, str] | None = None,
    ) -> list[int]:
        """One statement: every step's job and spec rows, its step row and the edges (each
        job id drawn first, in the steps' order, so the rows pair up by position)."""
        if not steps:
            return []
        rows = [
            {
                "n": i,
                "name": p.job_type,
                "queue": p.queue,
                "priority": p.priority,
                "blocked": bool(p.parents),
                "max_attempts": p.max_attempts,
                "lease_seconds": p.lease_seconds,
                "timeout_seconds": p.timeout_seconds,
                "effect": p.effect,
                "hinted": p.hinted,
                "payload": p.payload,
                "step": p.name,
                "pending": len(p.parents),
            }
            for i, p in enumerate(steps)
        ]
        edges = [(parent, i) for i, p in enumerate(steps) for parent in p.parents]
        with self.connection.cursor() as cur:
            cur.execute(
                INSERT_WORKFLOW_JOBS,
                [
                    json.dumps(rows, ensure_ascii=False, allow_nan=False),
                    self.connection.ops.adapt_datetimefield_value(rules.BLOCKED_AT),
                    rules.WAITING_FOR_PARENTS,
                    workflow_id,
                    _json_or_null(trace_context),
                    workflow_id,
                    workflow_id,
                    [p for p, _ in edges],
                    [c for _, c in edges],
                ],
            )
            got = dict(cur.fetchall())
        return [int(got[i]) for i in range(len(steps))]
