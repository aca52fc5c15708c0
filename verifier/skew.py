"""Run ``manage.py`` under an offset wall clock: ``LD_PRELOAD=<libfaketime> FAKETIME=+5m
FAKETIME_DONT_FAKE_MONOTONIC=1 python -m verifier.skew manage.py run_executor ...``.

The verifier offsets worker clocks with ``faketime``'s preload library and leaves the monotonic
clock alone: an offset wall clock must change nothing, because leases are judged by the
database's clock. The preload library of Debian's ``faketime`` 0.9.10
mistranslates absolute monotonic deadlines in ``clock_nanosleep``, which Python's
``time.sleep`` uses, so this launcher routes ``time.sleep`` through a timed wait on an event
(a relative wait that library leaves alone) before handing over to ``manage.py``.
"""

from __future__ import annotations

import runpy
import sys
import threading
import time


def _sleep(seconds: float) -> None:
    """``time.sleep`` by a timed wait on an event that is never set."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


def main() -> None:
    """Patch ``time.sleep`` and run the script named by the first argument."""
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m verifier.skew manage.py <command> ...")
    time.sleep = _sleep  # type: ignore[assignment]  # same behaviour, narrower signature
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
