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
"""

from __future__ import annotations

from typing import Any

from scheduler_core.models import Effect
from scheduler_core.storage.postgres import PostgresDriver
from scheduler_core.storage.records import Lease


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
