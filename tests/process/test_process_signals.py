"""The long-running commands' signals: a stop signal is taken whenever it arrives, and SIGUSR1
writes every thread's stack without stopping anything (``runtime/process_signals.py``)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.process

MODULE = ROOT / "scheduler_core" / "runtime" / "process_signals.py"

# A process whose main thread does nothing but wait on the event the stop sets, with a zero
# timeout, so that it holds the event's lock for a large part of its time: where a signal
# handler set the event itself, a SIGTERM would often find that lock held by the very thread
# it interrupted, and the process would hang. The module is loaded from its file: it needs
# nothing but the standard library.
CHILD = textwrap.dedent(
    """
    import importlib.util, sys, threading
    spec = importlib.util.spec_from_file_location("process_signals", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stop = threading.Event()
    module.StopOnSignal(stop.set).install()
    print("ready", flush=True)
    while not stop.wait(0):
        pass
    print("stopped", flush=True)
    """
)


def test_a_stop_signal_at_any_moment_stops_a_process_waiting_on_the_stop() -> None:
    rng = random.Random(15)
    for i in range(30):
        p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(MODULE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            assert p.stdout is not None
            assert p.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0, 0.05))
            p.send_signal(rng.choice([signal.SIGTERM, signal.SIGINT]))
            try:
                out, _ = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"iteration {i}: the process did not stop within 10 s of the signal")
            assert p.returncode == 0, out
            assert out == b"stopped\n"
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("command", "ready"),
    [
        (["run_scheduler", "--interval", "0.1"], b" ready "),
        (["run_executor", "--concurrency", "2"], b"concurrency=2"),
    ],
)
def test_sigusr1_writes_every_threads_stack_and_the_command_goes_on_until_sigterm(
    spawn: Any, tmp_path: Path, command: list[str], ready: bytes
) -> None:
    p = spawn(*command, log="command.log")
    log = tmp_path / "command.log"
    wait_until(lambda: ready in log.read_bytes(), timeout=60)
    p.send_signal(signal.SIGUSR1)
    # Each thread's stack opens with this header. "Current thread" names the thread the kernel
    # gave the signal to, which is not always one with Python state: not asserted.
    try:
        wait_until(lambda: b"(most recent call first)" in log.read_bytes(), timeout=30)
    except AssertionError:
        pytest.fail(f"no stacks within 30 s (exit code {p.poll()}); the log:\n{log.read_text()}")
    stacks = log.read_bytes()
    assert b'File "' in stacks and b"process_signals.py" in stacks  # the signal watcher's own
    time.sleep(0.5)
    assert p.poll() is None, "SIGUSR1 stopped the command"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0
