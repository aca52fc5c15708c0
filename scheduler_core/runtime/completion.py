"""Committing an attempt's end and knowing it committed: a transaction whose ``COMMIT`` reply is
lost is read back (the transaction's id where the driver has one, else a row it wrote), never
guessed; and :class:`NextClaim`, the claim of a thread's next job made in its completion's
transaction."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import InterfaceError, OperationalError

import scheduler_core.hooks as hooks

from ..domain import states
from ..models import Attempt, Job
from ..storage.drivers import driver
from ..storage.records import Lease

log = logging.getLogger("tenure.executor")


def complete_read_back(
    lease: Lease,
    fn: Callable[[], int | None],
    *,
    tries: int = 3,
    xid_from_fn: bool = False,
    probe: Callable[[], Lease] | None = None,
) -> None:
    """Run ``fn`` (ending with the fenced completion) in one transaction and commit it; when
    the connection breaks on the way, read the outcome back, never guess.

    Where the driver has transaction ids (PostgreSQL), the transaction's id is known before ``COMMIT`` (taken first, or, with
    ``xid_from_fn``, returned by ``fn``'s completion statement itself, which saves a round
    trip), so after a break during ``COMMIT`` the read-back waits until the server has decided
    that transaction (``txid_status``) before reading the attempt's row; a decided row then
    says whether the completion landed. ``in_commit`` is the failpoint between the
    completion's write and ``COMMIT``. ``probe`` names the attempt to read back when ``fn``
    completes several (one whose completion the statement matched).
    """
    for n in range(tries):
        xid: list[int] = []
        try:
            with driver().atomic():
                if not xid_from_fn:
                    xid.extend(_xid())
                got = fn()
                if xid_from_fn and got is not None:
                    xid.append(got)
                hooks.failpoint("in_commit")
            return
        except (OperationalError, InterfaceError):
            driver().connection.close()
            outcome = _read_back(probe() if probe else lease, xid[0] if xid else None)
            if outcome == "succeeded":
                log.warning("job %s: connection lost at commit; read back: committed", lease.job_id)
                return
            if outcome != "leased" or n == tries - 1:
                raise
            time.sleep(0.2 * 2**n)


def commit_and_read_back(
    fn: Callable[[], int | None],
    *,
    landed: Callable[[], bool],
    xid_from_fn: bool = False,
    tries: int = 3,
    patience: float = 30.0,
) -> None:
    """Run ``fn`` in one transaction and commit it; return once the commit is known to have
    landed, and raise the database's error once every try is known to have rolled back or
    when that cannot be told within ``patience`` seconds.

    For transactions whose outcome is not one attempt's completion (a Celery chain's batch of
    completions with the claims made in the same statement, or a claim alone): what the
    caller learned from ``fn``'s statements stands only when this returns. When the
    connection breaks after ``fn`` returned, the outcome is read back: on PostgreSQL by the
    transaction's id (taken first, or returned by ``fn`` with ``xid_from_fn``) and
    ``txid_status``, waiting while the server says it is in progress, and a "committed"
    confirmed by ``landed`` (after a crash the server can give an id its log never recorded
    to a later transaction, whose commit would otherwise be taken for this one's); elsewhere
    ``landed`` alone reads a row the transaction wrote. A break before ``fn`` returned sent no ``COMMIT``: that
    try rolled back and is made again. ``in_commit`` is the failpoint between the writes and
    ``COMMIT``.
    """

    def decided(xid: int | None) -> str:
        deadline = time.monotonic() + patience
        delay = 0.05
        while True:
            try:
                if xid is None:
                    return "committed" if landed() else "aborted"
                status = driver().transaction_status(xid)
                if status == "in progress":
                    raise _Undecided
                if status == "committed" and not landed():
                    # A server that crashed gives the ids its log never recorded to later
                    # transactions: "committed" may be another's. A row ours wrote says.
                    return "aborted"
                # None: the server no longer knows the transaction, too old to tell.
                return str(status) if status in ("committed", "aborted") else "unknown"
            except (OperationalError, InterfaceError, _Undecided) as e:
                log.info("transaction %s: reading the outcome back: %r; asking again", xid, e)
                driver().connection.close()
                if time.monotonic() > deadline:
                    return "unknown"
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    for n in range(tries):
        xid: list[int] = []
        written = False
        try:
            with driver().atomic():
                if not xid_from_fn:
                    xid.extend(_xid())
                got = fn()
                if xid_from_fn and got is not None:
                    xid.append(got)
                written = True
                hooks.failpoint("in_commit")
            return
        except (OperationalError, InterfaceError):
            driver().connection.close()
            verdict = decided(xid[0] if xid else None) if written else "aborted"
            log.warning("connection lost at commit; read back: %s", verdict)
            if verdict == "committed":
                return
            if verdict == "unknown" or n == tries - 1:
                raise
            time.sleep(0.2 * 2**n)


def _xid() -> list[int]:
    """This transaction's id where the driver has one (assigned now; the completion writes
    anyway)."""
    xid = driver().transaction_id()
    return [] if xid is None else [xid]


def _read_back(lease: Lease, xid: int | None = None, *, patience: float = 30.0) -> str:
    """``succeeded`` if this attempt's completion committed, ``leased`` if the job is still
    this attempt's, ``other`` if someone else moved it, ``unknown`` if the database could not
    be asked within ``patience`` seconds."""
    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            if xid is not None and driver().transaction_status(xid) == "in progress":
                # The server has not yet finished (or noticed the end of) that transaction.
                raise _Undecided
            outcome = (
                Attempt.objects.using(driver().alias)
                .filter(pk=lease.attempt_id)
                .values_list("outcome", flat=True)
                .first()
            )
            if outcome == "succeeded":
                return "succeeded"
            mine = (
                Job.objects.using(driver().alias)
                .filter(pk=lease.job_id, fence=lease.fence, state=states.State.LEASED)
                .exists()
            )
            return "leased" if mine else "other"
        except (OperationalError, InterfaceError, _Undecided) as e:
            log.info("job %s: reading the outcome back: %r; asking again", lease.job_id, e)
            driver().connection.close()
            if time.monotonic() > deadline:
                return "unknown"
            time.sleep(delay)
            delay = min(1.0, delay * 2)


class _Undecided(Exception):
    """The transaction being read back is still in progress on the server."""


class NextClaim:
    """Claim the executor's next job inside a successful attempt's completion transaction.

    One commit then ends one job and leases the next (one commit per job instead of two),
    with the same ownership decision as :func:`scheduler_core.storage.base.Driver.claim`: the claimed rows
    commit with the completion or not at all. ``got`` holds the new leases only once that
    transaction is known to have committed (read back when the connection broke during
    ``COMMIT``); a rolled-back or undecided transaction leaves it empty. ``wanted`` says how
    many jobs to claim when the completion is written (0 once a stop was requested).
    """

    def __init__(self, *, executor: str, queues: Sequence[str], wanted: Callable[[], int]) -> None:
        self.executor = executor
        self.queues = list(queues)
        self._wanted = wanted
        self._pending: list[Lease] = []
        self.got: list[Lease] = []

    def claim_in_transaction(self) -> None:
        """Run the claim inside the open completion transaction (each try starts afresh)."""
        self._pending = []
        n = self._wanted()
        if n > 0:
            self._pending = driver().claim(executor=self.executor, queues=self.queues, limit=n)

    def complete_and_claim(self, lease: Lease, *, result: Any = None) -> int | None:
        """Write ``lease``'s completion (with its ``result``) and the claim in one statement
        (:func:`scheduler_core.storage.base.Driver.complete_and_claim`); returns the transaction's id."""
        self._pending = []
        xid, self._pending = driver().complete_and_claim(
            lease,
            executor=self.executor,
            queues=self.queues,
            limit=self._wanted(),
            result=result,
        )
        return xid

    def committed(self) -> None:
        """The completion transaction committed: its claims stand."""
        self.got, self._pending = self._pending, []
