"""Wake-ups (PostgreSQL ``NOTIFY``): sent once an enqueue has committed, in a transaction of
their own, never for an enqueue that rolled back; from a thread of their own in a process that
started one (the broker-less executor), its own floors learning them at the commit."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from scheduler_core import job
from scheduler_core.storage import floors, pg_wakeups
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
    assert "could not send the wake-ups" in caplog.text
    connection.close()
    [lease] = driver().claim(executor="t:1:wakeups", queues=["wakeups"], limit=1)
    assert lease.job_id == j.pk


def test_a_process_with_a_wakeup_thread_learns_at_the_commit_and_sends_after_it(
    listener: Any,
) -> None:
    """With :meth:`start_wakeup_sender` (as ``run_executor`` starts it) the committing thread
    does not send: this process's floors learn the job as the transaction commits, and the
    wake-up reaches other processes from the sender's thread; after the sender stops, the
    committing thread sends again."""
    floors.forget()
    driver().start_wakeup_sender()
    try:
        with transaction.atomic():
            ok.enqueue(n=1, priority=3)
            assert ("wakeups", 3) not in floors.FLOORS._floors
            assert _heard(listener, timeout=0.2) == []
        assert ("wakeups", 3) in floors.FLOORS._floors
        assert _heard(listener) == [("wakeups", 3)]
    finally:
        driver().stop_wakeup_sender()
    ok.enqueue(n=2, priority=4)
    assert _heard(listener) == [("wakeups", 4)]


def test_stopping_the_wakeup_thread_sends_what_waits(listener: Any) -> None:
    driver().start_wakeup_sender()
    ok.enqueue(n=1, priority=1)
    ok.enqueue(n=2, priority=2)
    driver().stop_wakeup_sender()
    # Sent apart or together (the second may fall within the first's gap), never lost.
    assert sorted(set(_heard(listener))) == [("wakeups", 1), ("wakeups", 2)]


def test_the_listener_passes_over_the_wakeups_of_its_own_process_and_hears_others() -> None:
    """A process with a wake-up thread learns its own wake-ups as it announces them (its
    floors, and ``on_wakeup``, which wakes ``run_executor``'s loop at once): when they come
    back from the server its listener passes them over; another process's it hears."""
    announced: list[str] = []
    heard: list[tuple[str, int]] = []
    listening = threading.Event()
    stop = threading.Event()

    def listen() -> None:
        for woken in driver().listen(stop.is_set):
            listening.set()
            if woken is not None:
                heard.append((woken[0], woken[1]))

    driver().start_wakeup_sender(on_wakeup=announced.append)
    t = threading.Thread(target=listen, daemon=True)
    t.start()
    try:
        assert listening.wait(10)
        ok.enqueue(n=1, priority=5)
        assert announced == ["wakeups"]
        end = time.monotonic() + 5
        while driver()._sent_from is None and time.monotonic() < end:
            time.sleep(0.01)
        assert driver()._sent_from is not None
        # As another process sends it: from a session that is not the wake-up thread's.
        driver().send_wakeups([("wakeups", 6, driver().now())])
        while ("wakeups", 6) not in heard and time.monotonic() < end:
            time.sleep(0.01)
        assert heard == [("wakeups", 6)]
    finally:
        stop.set()
        t.join(5)
        driver().stop_wakeup_sender()


def test_the_wakeup_thread_opens_a_new_session_after_one_fails(
    listener: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A send that fails is logged and its session closed: the next wake-up goes out on a new
    session, not the dead one."""
    driver().start_wakeup_sender()
    try:
        ok.enqueue(n=1, priority=1)
        assert _heard(listener) == [("wakeups", 1)]
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [driver()._sent_from])
        ok.enqueue(n=2, priority=2)
        end = time.monotonic() + 5
        while "could not send the wake-ups" not in caplog.text and time.monotonic() < end:
            time.sleep(0.01)
        assert "could not send the wake-ups" in caplog.text
        ok.enqueue(n=3, priority=3)
        assert _heard(listener, timeout=2.0) == [("wakeups", 3)]
    finally:
        driver().stop_wakeup_sender()
