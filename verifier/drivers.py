"""The verifier's negative controls as storage drivers (``TENURE_DRIVER`` in its executors' and
workers' environment only): each switches off one guard of PostgreSQL's driver, so the checker
can show that it notices what the guard prevents.

* :class:`FenceOff` — every attempt write ignores the fence (the ORM's guard and the completion
  statement's): a stale attempt's writes land (with ``synchronous_commit`` off on the run's
  cluster, the checker must report lost and doubled work).
* :class:`Forgetful` — the ledger forgets an unknown outcome, as it did before it was sticky:
  when an attempt that sent nothing settles its effect ``not_applied`` over an earlier unknown
  outcome, the row becomes ``not_applied`` and no longer in doubt, so the job's decisions see
  no unsettled effect and hand over to a fallback that cannot share the key (I13 must fail).
* :class:`WholeJob` — reconcile answered for the whole job, as it was before it was asked per
  effect: the reconcile attempt sees no effect to ask about, so the function is asked once
  about the job, and an ``applied`` answer settles every effect of unknown outcome applied and
  completes the job; a second effect never sent stays unsent (I15 must fail).
* :class:`MaxAgeFails` — a job that reaches its ``max_age`` with an effect unknown or applied
  ends ``failed``, as it did before the ledger's rule (I14 must fail).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler_core.domain import states
from scheduler_core.domain.outcomes import Decision
from scheduler_core.models import Effect
from scheduler_core.storage.postgres import PostgresDriver
from scheduler_core.storage.records import Failure, Lease


class FenceOff(PostgresDriver):
    """PostgreSQL's driver without the fence in any attempt write's guard."""

    fence_match = "true"

    def _fence_of(self, lease: Lease) -> dict[str, Any]:
        return {}


class Forgetful(PostgresDriver):
    """PostgreSQL's driver whose ledger forgets an unknown outcome."""

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
        after = super().effect_settle(
            lease, key, state, destination_ref=destination_ref, note=note, name=name
        )
        if state != Effect.NOT_APPLIED or after != Effect.UNKNOWN:
            return after
        Effect.objects.using(self.alias).filter(
            key=key, fence=lease.fence, state=Effect.UNKNOWN
        ).update(state=Effect.NOT_APPLIED, in_doubt=False)
        return Effect.NOT_APPLIED


class WholeJob(PostgresDriver):
    """PostgreSQL's driver whose reconcile settles the whole job from one answer."""

    def unsettled_effects(self, job_id: int) -> list[Effect]:
        # Read only by the reconcile attempt in the processes that run jobs (the operator's
        # process runs the shipped driver): with nothing listed, the function is asked about
        # the job as a whole.
        return []

    def finish(
        self,
        lease: Lease,
        decision: Decision,
        *,
        outcome: str,
        failure: Failure | None = None,
        expired_for: float | None = None,
        result: Any = None,
    ) -> None:
        if decision.transition == states.COMPLETE and outcome == "reconciled_applied":
            Effect.objects.using(self.alias).filter(
                job_id=lease.job_id, state__in=(Effect.INTENDED, Effect.UNKNOWN)
            ).update(state=Effect.APPLIED, in_doubt=False)
        super().finish(
            lease,
            decision,
            outcome=outcome,
            failure=failure,
            expired_for=expired_for,
            result=result,
        )


class MaxAgeFails(PostgresDriver):
    """PostgreSQL's driver that ends a job ``failed`` at its ``max_age`` whatever its ledger
    holds."""

    def finish(
        self,
        lease: Lease,
        decision: Decision,
        *,
        outcome: str,
        failure: Failure | None = None,
        expired_for: float | None = None,
        result: Any = None,
    ) -> None:
        if (
            decision.transition.target == states.State.INDETERMINATE
            and "maximum age" in decision.reason
        ):
            by_reaper = decision.transition.name.startswith("reap_")
            decision = replace(decision, transition=states.REAP_FAIL if by_reaper else states.FAIL)
        super().finish(
            lease,
            decision,
            outcome=outcome,
            failure=failure,
            expired_for=expired_for,
            result=result,
        )
