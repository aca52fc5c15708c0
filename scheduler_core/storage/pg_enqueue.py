"""PostgreSQL's enqueue writes: a job, a batch of jobs and a workflow's jobs, each with its spec
row (and a workflow's step rows and edges) in one statement, and a step's release, which makes
the children its success completes due in the completion's own transaction. A mixin of
:class:`~scheduler_core.storage.postgres.PostgresDriver`; the statements are in
:mod:`.pg_statements`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..domain import states
from ..domain import workflows as rules
from ..domain.options import JobOptions
from ..models import Job
from ..models import JobSpec as JobSpecRow
from .clock import to_datetime
from .core import DriverCore
from .pg_statements import (
    DB_SET,
    INSERT_JOB,
    INSERT_WORKFLOW_JOBS,
    STEPS_SUCCEEDED,
    insert_jobs_sql,
)
from .records import JOB_OPTION_COLUMNS, JSON_COLUMNS, SPEC_COLUMNS, row_values
from .workflows import NewStep


def _encoded(values: dict[str, Any]) -> dict[str, Any]:
    """The job spec's column values as PostgreSQL's placeholders take them: its JSON columns as
    text (NULL stays NULL), the rest as they are."""
    return {
        c: (None if v is None else _json(v)) if c in JSON_COLUMNS else v for c, v in values.items()
    }


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class PgEnqueue(DriverCore):
    """The enqueue writes and a step's release, for
    :class:`~scheduler_core.storage.postgres.PostgresDriver`."""

    def insert_job(
        self,
        options: JobOptions,
        *,
        unique_key: str | None = None,
        schedule_id: int | None = None,
        hinted: bool = False,
    ) -> Job | None:
        """One statement and one round trip, atomic on its own or joining the caller's
        transaction (``ON CONFLICT`` for a unique key, no savepoint)."""
        values = row_values(options)
        params = {
            **_encoded(values),
            "unique_key": unique_key,
            "schedule_id": schedule_id,
            "hint": hinted,
        }
        with self.connection.cursor() as cur:
            cur.execute(INSERT_JOB[unique_key is not None], params)
            cols = [c[0] for c in cur.description]
            row = cur.fetchone()
        if row is None:
            return None
        # The rows as written, without reading them back: what the database set comes back
        # from the statement, the rest is the spec's.
        job = Job(
            **{c: values[c] for c in JOB_OPTION_COLUMNS if c not in DB_SET},
            unique_key=unique_key,
            schedule_id=schedule_id,
            **dict(zip(cols, row, strict=True)),
            state=states.State.WAITING,
        )
        job.spec = JobSpecRow(job=job, **{c: values[c] for c in SPEC_COLUMNS})
        for row_obj in (job, job.spec):
            row_obj._state.adding = False
            row_obj._state.db = self.alias
        return job

    def insert_jobs(
        self, options: JobOptions, payloads: Sequence[dict[str, Any]], *, hinted: bool = False
    ) -> list[tuple[int, datetime]]:
        params = _encoded({c: v for c, v in row_values(options).items() if c != "payload"})
        params["payloads"] = _json(list(payloads))
        with self.atomic(), self.connection.cursor() as cur:
            cur.execute(insert_jobs_sql(hinted=hinted), params)
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
                [parents, self.connection.ops.adapt_datetimefield_value(rules.BLOCKED_AT)],
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
                **row_values(
                    replace(p.options, workflow_id=workflow_id, trace_context=trace_context)
                ),
                # A step with parents is not due until its last parent succeeds; the recordset
                # reads the due time from its text.
                "run_at": rules.BLOCKED_AT.isoformat() if p.parents else None,
                "n": i,
                "blocked": bool(p.parents),
                "hinted": p.hinted,
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
                    _json(rows),
                    rules.WAITING_FOR_PARENTS,
                    workflow_id,
                    workflow_id,
                    [p for p, _ in edges],
                    [c for _, c in edges],
                ],
            )
            got = dict(cur.fetchall())
        return [int(got[i]) for i in range(len(steps))]
