"""Wake-ups (PostgreSQL ``NOTIFY``): sent once an enqueue has committed, in a transaction of
their own, never for an enqueue that rolled back."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from scheduler_core import job
from scheduler_core.storage import pg_wakeups
from scheduler_core.storage.drivers import driver

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@job(name="tests.wakeups.ok", queue="wakeups")
def ok(ctx: Any, *, n: int = 0) -> None:
    """Nothing."""


@pytest.fixture
def listener() -> Any:
    conn = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    conn.execute(f"LISTEN {pg_wakeups.WAKEUP_CHANNEL}")
    yield conn
    conn.close()


def _heard(conn: Any, timeout: float = 0.5) -> list[tuple[str, int]]:
    out = []
    for n in conn.notifies(timeout=timeout):
        woken = pg_wakeups.read_wakeup(n.payload)
        assert woken is not None
        out.append((woken[0], woken[1]))
    return out


def test_the_wakeup_follows_the_commit_of_the_enqueue(listener: Any) -> None:
    with transaction.atomic():
        ok.enqueue(n=1, priority=3)
        # Nothing is sent while the enqueue's transaction is open.
        assert _heard(listener, timeout=0.2) == []
    assert _heard(listener) == [("wakeups", 3)]


def test_an_enqueue_rolled_back_wakes_nobody(listener: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ok.enqueue(n=1)
        raise RuntimeError("rolled back")
    assert _heard(listener, timeout=0.3) == []


def test_an_enqueue_in_autocommit_wakes_at_once(listener: Any) -> None:
    ok.enqueue(n=1)
    ok.enqueue_many([{"n": 2}, {"n": 3}])
    assert _heard(listener) == [("wakeups", 0), ("wakeups", 0)]


def test_a_wakeup_that_cannot_be_sent_leaves_the_committed_job_to_polling(
    listener: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The job has committed when its wake-up is sent: a failure to send is logged, not
    raised into the enqueuer, and the job is still claimed."""
    pid = connection.cursor().connection.info.backend_pid

    def end_session() -> None:
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])

    with transaction.atomic():
        # Registered first, so it runs first once the enqueue has committed: the server ends
        # this session, and the wake-up finds it gone.
        transaction.on_commit(end_session)
        j = ok.enqueue(n=1)
    assert "could not send the wake-up" in caplog.text
    connection.close()
    [lease] = driver().claim(executor="t:1:wakeups", queues=["wakeups"], limit=1)
    assert lease.job_id == j.pk
