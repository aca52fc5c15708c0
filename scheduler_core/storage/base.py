"""The assembly of the driver's parts: :class:`Driver`, the base both databases' drivers
(``storage/postgres.py``, ``storage/sqlite.py``) extend. What a driver offers and must do, its
fencing rules included, is stated once in :mod:`.contract` (:class:`~.contract.StorageDriver`);
this class puts together the parts that implement it — the core (connections, vendor claims
and completions, fenced writes: :mod:`.core`), the installation and effect keys
(:mod:`.installation`), the effect ledger (:mod:`.ledger`), the reaper, hints, executors and
operators (:mod:`.bookkeeping`), the console's history (:mod:`.history`), queue pause and
limits (:mod:`.queues`) and workflows (:mod:`.workflows`). The values a driver hands out are in
:mod:`.records`; each database's statements are in ``pg_statements.py`` and
``sqlite_statements.py``.

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
