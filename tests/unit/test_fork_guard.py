"""A fork waits for the heartbeat thread's database work under way (``FORK_GUARD``): a child
forked while another thread was inside the database driver could inherit its locks held and
hang at its first database call (RQ's work horses are forked beside the worker's heartbeat)."""

from __future__ import annotations

import os
import threading
import time

from scheduler_core.runtime.heartbeat import FORK_GUARD


def test_a_fork_waits_for_the_beat_under_way_and_the_child_can_take_the_guard() -> None:
    held = threading.Event()

    def beat() -> None:
        with FORK_GUARD:  # as the heartbeat thread holds it around a tick
            held.set()
            time.sleep(0.5)

    t = threading.Thread(target=beat)
    t.start()
    held.wait(5)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: the guard is free in it, whatever the parent's thread did
        got = FORK_GUARD.acquire(timeout=2)
        os._exit(0 if got else 3)
    waited = time.monotonic() - started
    _, status = os.waitpid(pid, 0)
    t.join()
    assert waited >= 0.3, f"the fork did not wait for the beat ({waited:.3f}s)"
    assert os.waitstatus_to_exitcode(status) == 0
    assert FORK_GUARD.acquire(timeout=1)  # and the parent's is free again
    FORK_GUARD.release()
