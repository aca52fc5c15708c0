"""The storage layer's contract: :class:`Driver`, the named operations every database's driver
implements (``storage/postgres.py``, ``storage/sqlite.py``), assembled from the parts that own
them — the core (connections, vendor claims and completions, fenced writes:
:mod:`.core`), the installation and effect keys (:mod:`.installation`), the effect ledger
(:mod:`.ledger`), the reaper, hints, executors and operators
(:mod:`.bookkeeping`), the console's history (:mod:`.history`) and queue pause and limits
(:mod:`.queues`). The values a driver hands out are in :mod:`.records`.

A driver is the one place that writes a job's state, fence and lease. Each write names a
transition from :mod:`scheduler_core.domain.states`; the transition's source states become the
write's ``WHERE state IN (...)`` guard, and every write made on behalf of an attempt also
carries ``fence = <the attempt's fence>``. A write that matches no row raises
:class:`~scheduler_core.exceptions.StaleAttempt` (the caller stops and records the refusal with
:meth:`Driver.record_stale`); nothing is ever read and then written unconditionally. Lease
times come from the database's clock (:mod:`scheduler_core.storage.clock`), never a worker's.

The operations written with Django's ORM, which says the same thing on every database, are
defined once in those parts; the ones whose SQL differs are abstract there and written by each
driver. Nothing here decides policy: what follows an attempt (retry, park, fail) arrives as a
:class:`~scheduler_core.domain.outcomes.Decision` made above, by the runtime and the services.
"""

from __future__ import annotations

from .bookkeeping import Bookkeeping
from .history import HistoryOps
from .ledger import LedgerOps
from .queues import QueueOps


class Driver(LedgerOps, Bookkeeping, HistoryOps, QueueOps):
    """The named operations on one database alias, for one vendor.

    Every operation runs on ``alias``. Those with ``lease`` are fenced writes on behalf of
    that attempt; the others name what they touch. Vendor drivers override the operations
    marked *vendor* (abstract in :class:`~scheduler_core.storage.core.DriverCore`) and set the
    capability flags.
    """
