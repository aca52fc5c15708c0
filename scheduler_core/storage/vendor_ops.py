"""The operations each database's driver writes in its own SQL (claims, completions, wake-ups,
inserts and retention, connection settings, what the database says of itself, index and table
upkeep), as every driver's base declares them: abstract (``NotImplementedError``), or the answer
of a database without the capability (no transaction ids, no notifications, nothing to upkeep).
:class:`~scheduler_core.storage.core.DriverCore` extends it; the contract that states every
operation is :mod:`.contract`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db.models import Q

from ..domain.options import JobOptions
from ..domain.payload_search import PayloadQuery
from ..models import Job
from .records import Compaction, IndexSize, Lease, PageUse, TableSpace


class VendorOps:
    """The operations marked *vendor*: each database's driver writes its own."""

    # -- connections and transactions (vendor) -------------------------------------------------

    def now(self) -> datetime:
        """*Vendor.* The database's clock (an aware datetime)."""
        raise NotImplementedError

    def transaction_id(self) -> int | None:
        """*Vendor.* This transaction's id, assigned now (None without the capability)."""
        return None

    def timeline(self) -> int | None:
        """*Vendor.* The timeline the database server writes on now (a promoted standby starts
        a new one; fences handed out on it start above every earlier one's); None where the
        database has no timelines (SQLite)."""
        return None

    def record_timeline(self) -> int | None:
        """*Vendor.* Record the current timeline, with the database's now, if it is not
        recorded yet (``StoreTimeline``); returns it (None: no timelines)."""
        return None

    def transaction_status(self, xid: int) -> str | None:
        """*Vendor.* ``committed``, ``aborted`` or ``in progress`` for transaction ``xid``
        (None: too old to tell, or no such capability)."""
        return None

    def configure_executor_connection(self, connection: Any) -> None:
        """*Vendor.* Settings an executor's connection needs, applied as it opens (the
        server ends an executor's idle transactions; hot statements planned once)."""

    def limit_handler_idle(self, lease: Lease | None = None) -> None:
        """*Vendor.* Inside a ``transactional`` handler's transaction (the attempt of
        ``lease``): the limits the database puts on how the handler may hold it — on
        PostgreSQL, it may work between statements for longer than an executor's own
        transactions may idle; on SQLite, how long it may hold the one write lock."""

    # -- claims and completions (vendor) -------------------------------------------------------

    def claim(
        self,
        *,
        executor: str,
        queues: Sequence[str] = ("default",),
        limit: int = 1,
        job_id: int | None = None,
    ) -> list[Lease]:
        """*Vendor.* Claim up to ``limit`` due waiting jobs (or exactly ``job_id``) in one
        statement: each claimed job's fence grows by one, its lease runs from the database's
        clock, and an Attempt row is written in the same transaction."""
        raise NotImplementedError

    def complete(self, lease: Lease, *, result: Any = None) -> int | None:
        """*Vendor.* Mark ``lease``'s job succeeded (fenced): :meth:`finish`'s writes for
        ``COMPLETE``, refused past the attempt's deadline or while the ledger holds an effect
        that may or may not have happened. ``result`` (JSON the caller checked; None: none) is
        kept on the attempt's row by the same fenced write, so only an accepted completion
        leaves one. Returns the transaction's id where the driver has one (to read the outcome
        back after a lost ``COMMIT`` reply)."""
        raise NotImplementedError

    def complete_many_and_claim(
        self,
        leases: Sequence[Lease],
        *,
        executor: str,
        queues: Sequence[str],
        limit: int,
        results: Mapping[int, Any] | None = None,
    ) -> tuple[int | None, set[int], list[Lease]]:
        """*Vendor.* :meth:`complete` each of ``leases`` (with its result in ``results``, by
        attempt id) and :meth:`claim` up to ``limit`` more jobs in the caller's transaction:
        one commit for many completions. Each completion is fenced on its own; a refused one
        is left out (the caller asks :meth:`refusal` why once the rest has committed). Returns
        the transaction's id (None without one), the ids of the jobs completed and the new
        leases, which stand only if the transaction commits."""
        raise NotImplementedError

    def claim_limited_queue(
        self, queue: str, *, executor: str, limit: int, job_id: int | None = None
    ) -> list[Lease]:
        """*Vendor.* :meth:`claim` of ``queue``'s due jobs (or exactly ``job_id`` of it)
        without the gate that keeps paused and limited queues out of the plain claim: only
        :meth:`claim_within_limits` calls it, holding the queue's row and with ``limit`` what
        the limits allow."""
        raise NotImplementedError

    # -- wake-ups (vendor) ---------------------------------------------------------------------

    def notify(self, queue: str, priority: int, due_at: datetime) -> None:
        """*Vendor.* Once the caller's transaction commits, tell listening executors a job of
        ``queue`` waits (nothing if it rolls back, or where the database has no
        notifications)."""

    def listen(self, stop: Callable[[], bool]) -> Iterator[tuple[str, int, datetime] | None]:
        """*Vendor.* Wake-ups as ``(queue, priority, due time)``, on a connection of their
        own; yields None at least every second so the caller can look at ``stop``. Ends at
        once where the database has no notifications (executors poll)."""
        return iter(())

    def woken(self, queue: str, priority: int, due_at: datetime) -> None:
        """*Vendor.* This process learned that a job of ``queue`` waits (a wake-up): where
        the driver seeks claims from per-process floors, lower them to it."""

    def forget_floors(self) -> None:
        """*Vendor.* Drop what this process learned about where claims start (tests)."""

    def start_wakeup_sender(self, on_wakeup: Callable[[str], None] | None = None) -> None:
        """*Vendor.* From now on, send this process's wake-ups from a thread of its own, so
        the thread that committed goes on at once, and have ``on_wakeup`` called with the
        queue of each wake-up this process announces, as it announces it (nothing where the
        database has no notifications)."""

    def stop_wakeup_sender(self) -> None:
        """*Vendor.* Send the wake-ups not yet sent, then stop that thread: wake-ups are sent
        from the committing thread again."""

    # -- enqueue and retention (vendor) --------------------------------------------------------

    def insert_job(
        self,
        options: JobOptions,
        *,
        unique_key: str | None = None,
        schedule_id: int | None = None,
        hinted: bool = False,
    ) -> Job | None:
        """*Vendor.* Insert one waiting job of the spec ``options`` (its columns by
        ``records.row_values``; ``run_at`` None for the database's now) in the caller's
        transaction; None when its ``unique_key`` is taken already (nothing written)."""
        raise NotImplementedError

    def insert_jobs(
        self, options: JobOptions, payloads: Sequence[dict[str, Any]], *, hinted: bool = False
    ) -> list[tuple[int, datetime]]:
        """*Vendor.* Insert one waiting job per payload (the spec ``options`` with each payload)
        in one statement in the caller's transaction; ``(id, run_at)`` of each, in payload
        order."""
        raise NotImplementedError

    def prune_finished(self, state: str, older_than: float, *, limit: int = 1000) -> int:
        """*Vendor.* Delete up to ``limit`` jobs in ``state`` (succeeded or failed) last changed
        more than ``older_than`` seconds ago by the database's clock, with their attempts and
        ledger rows, keeping jobs an operator acted on and jobs whose ledger holds an effect
        that may or may not have happened. Returns how many jobs were deleted."""
        raise NotImplementedError

    # -- what the database itself says (vendor) ------------------------------------------------

    def database_pressure(self) -> dict[str, Any]:
        """*Vendor.* The oldest snapshot vacuum must respect and the job table's dead rows
        (empty where the database keeps no old row versions)."""
        return {}

    def estimated_jobs(self) -> int:
        """*Vendor.* The database's estimate of the job table's rows (-1: none kept)."""
        return -1

    # -- index upkeep (vendor; :mod:`scheduler_core.services.indexes` decides) ----------------

    def index_sizes(self, tables: Sequence[str], *, counted: bool = False) -> list[IndexSize]:
        """*Vendor.* The B-tree indexes of ``tables`` that vacuum can empty but not shrink, with
        what their entries need; empty where the database reuses freed pages itself. With
        ``counted``, an index over all its table's rows has them counted instead of estimated
        (a read of each table)."""
        return []

    def drop_unfinished_rebuilds(self, tables: Sequence[str]) -> list[str]:
        """*Vendor.* Drop the invalid copies failed rebuilds left on ``tables``; their names."""
        return []

    def rebuild_index(self, name: str) -> int:
        """*Vendor.* Rebuild index ``name`` without blocking writes; its size after, in bytes."""
        raise NotImplementedError

    def try_upkeep_lock(self) -> bool:
        """*Vendor.* Take the lock one index upkeep holds at a time, if free."""
        return False

    def release_upkeep_lock(self) -> None:
        """*Vendor.* Release the lock :meth:`try_upkeep_lock` took."""

    # -- table compaction (vendor; :mod:`scheduler_core.services.tables` decides) ------------

    def table_space(self, table: str) -> TableSpace | None:
        """*Vendor.* The bytes ``table``'s heap takes and an estimate of what its rows need, from
        the server's statistics (None when it has none yet); None where the database reuses
        freed pages itself."""
        return None

    def page_use(self, table: str) -> PageUse | None:
        """*Vendor.* Vacuum ``table``, then read where its rows are, page by page (one read of
        the table); None where the database reuses freed pages itself, or while another
        vacuum of the table holds it past ``lock_timeout`` (the next look reads it)."""
        return None

    def compact_table(self, table: str, cut_page: int) -> Compaction:
        """*Vendor.* Move ``table``'s rows at or past page ``cut_page`` into the free space
        before it, every value unchanged, then vacuum it so the emptied pages are given back
        (``vacuum_refused`` when another vacuum held the table past ``lock_timeout``: the
        rows stay moved and a later vacuum gives the pages back)."""
        raise NotImplementedError

    # -- reads for the console (vendor) --------------------------------------------------------

    def payload_contains(self, query: PayloadQuery) -> Q:
        """*Vendor.* The condition on ``Job`` that its payload contains ``query``'s fragment
        (:mod:`scheduler_core.domain.payload_search`: every leaf present with an equal value,
        a number never equal to a string)."""
        raise NotImplementedError
