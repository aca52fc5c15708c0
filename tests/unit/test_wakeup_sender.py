"""The wake-up thread of a process (``pg_wakeups._Sender``): wake-ups announced while one is
sent, or within :data:`~scheduler_core.storage.pg_wakeups.SEND_GAP_SECONDS` of the last send, go
out together, one per queue and priority with the earliest due time; the first after a quiet
spell goes at once; stopping sends what waits; a send that fails does not end the thread."""

from __future__ import annotations

import datetime as dt
import threading
import time

from scheduler_core.storage.pg_wakeups import SEND_GAP_SECONDS, _Sender

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


class Recorder:
    """A send that records each batch and when it came."""

    def __init__(self, fail_first: bool = False) -> None:
        self.batches: list[tuple[float, list[tuple[str, int, dt.datetime]]]] = []
        self.fail_first = fail_first
        self.sent = threading.Event()

    def __call__(self, batch: list[tuple[str, int, dt.datetime]]) -> None:
        self.batches.append((time.monotonic(), sorted(batch)))
        self.sent.set()
        if self.fail_first and len(self.batches) == 1:
            raise RuntimeError("the database went away")

    def wait(self, n: int, timeout: float = 5.0) -> None:
        end = time.monotonic() + timeout
        while len(self.batches) < n and time.monotonic() < end:
            time.sleep(0.001)
        assert len(self.batches) >= n, self.batches


def test_wakeups_announced_together_go_out_as_one_per_queue_and_priority() -> None:
    rec = Recorder()
    sender = _Sender(rec)
    try:
        # Held: the thread cannot take any until all are announced (the lock is reentrant).
        with sender._cv:
            sender.put("q", 0, at(5))
            sender.put("q", 0, at(3))
            sender.put("q", 0, at(4))
            sender.put("q", 1, at(9))
            sender.put("other", 0, at(7))
        rec.wait(1)
        time.sleep(SEND_GAP_SECONDS * 3)
        assert [b for _, b in rec.batches] == [
            [("other", 0, at(7)), ("q", 0, at(3)), ("q", 1, at(9))]
        ]
    finally:
        sender.stop()


def test_the_first_wakeup_goes_at_once_and_the_next_waits_for_the_gap() -> None:
    rec = Recorder()
    sender = _Sender(rec)
    try:
        put = time.monotonic()
        sender.put("q", 0, at(1))
        rec.wait(1)
        first = rec.batches[0][0]
        assert first - put < 1.0
        sender.put("q", 0, at(2))
        sender.put("q", 0, at(1.5))
        rec.wait(2)
        (second, batch) = rec.batches[1]
        assert second - first >= SEND_GAP_SECONDS
        assert batch == [("q", 0, at(1.5))]
    finally:
        sender.stop()


def test_stopping_sends_what_waits_and_ends_the_thread() -> None:
    rec = Recorder()
    sender = _Sender(rec)
    with sender._cv:
        sender.put("q", 0, at(1))
        sender.put("q", 2, at(2))
    sender.stop()
    assert not sender._thread.is_alive()
    assert sorted(w for _, b in rec.batches for w in b) == [("q", 0, at(1)), ("q", 2, at(2))]


def test_a_send_that_fails_leaves_the_thread_sending() -> None:
    rec = Recorder(fail_first=True)
    sender = _Sender(rec)
    try:
        sender.put("q", 0, at(1))
        rec.wait(1)
        sender.put("q", 0, at(2))
        rec.wait(2)
        assert rec.batches[1][1] == [("q", 0, at(2))]
        assert sender._thread.is_alive()
    finally:
        sender.stop()
