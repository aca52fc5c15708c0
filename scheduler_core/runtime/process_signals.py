"""The signals of Tenure's long-running commands (``run_executor``, ``run_scheduler``): SIGTERM
and SIGINT ask the process to stop, SIGUSR1 writes every thread's stack to its error output.

A Python signal handler runs in the main thread between two of that thread's bytecodes, so it
may run while the main thread holds a lock. ``threading.Event.wait()`` holds its event's lock
in stretches; a handler that called ``set()`` on the event the main thread was waiting on could
interrupt it in such a stretch and then wait for that lock forever: the process would ignore
every later SIGTERM and need SIGKILL (the likely cause of a scheduler that once did not stop
within 60 s of SIGTERM; a process with such a handler hung in 17 of 30 seeded signals).
So the handler here takes no lock: it writes the signal's number to a pipe, and a thread of its
own reads the pipe and makes the stop request, outside any handler
(``tests/process/test_process_signals.py``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("tenure.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that ask the process to stop (the running attempts get their grace)."""

STACKS_SIGNAL = signal.SIGUSR1
"""The signal that writes every thread's stack to the process's error output, and nothing else."""


class StopOnSignal:
    """Calls ``on_stop`` from a thread of its own each time a stop signal arrives."""

    def __init__(self, on_stop: Callable[[], None]) -> None:
        self._on_stop = on_stop
        self._read, self._write = os.pipe()
        # A full pipe drops the byte rather than blocking the handler: a stop is on its way.
        os.set_blocking(self._write, False)

    def install(self) -> None:
        """Handle the stop signals and the stacks signal (call from the main thread)."""
        threading.Thread(target=self._watch, name="tenure-signals", daemon=True).start()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        # Written by the interpreter's own C handler, which runs even when the main thread
        # is stuck in a lock or a statement: what an operator needs to see in that case.
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # A full pipe: earlier stop requests are waiting to be read.
        with contextlib.suppress(OSError):
            os.write(self._write, bytes([signum]))

    def _watch(self) -> None:
        while True:
            got = os.read(self._read, 64)
            if not got:
                return
            try:
                self._on_stop()
            except Exception:
                log.exception("the stop request failed")
