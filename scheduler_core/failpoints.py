"""Named crash points for fault tests (off unless ``TENURE_FAILPOINTS`` is set).

``TENURE_FAILPOINTS="after_claim=kill,before_effect=stop,after_effect=sleep:5"`` makes the
process act at those points: ``kill`` (SIGKILL itself), ``stop`` (SIGSTOP itself, to be
resumed by SIGCONT from outside), ``sleep:N`` (sleep N seconds) or ``raise`` (raise
:class:`FailpointError`). Points: ``after_claim``, ``before_effect``, ``after_effect``,
``before_complete``, ``in_commit``, ``before_group_commit`` (an executor's write of several
completions together, before its statement is sent). This is a testing facility; production never sets it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("tenure.failpoints")

POINTS = (
    "after_claim",
    "before_effect",
    "after_effect",
    "before_complete",
    "in_commit",
    "before_group_commit",
)


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


def parse(spec: str) -> dict[str, str]:
    """Parse ``name=action,...``; unknown names or actions raise ``ValueError``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = part.partition("=")
        if name not in POINTS:
            raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(POINTS)}")
        if not (action in ("kill", "stop", "raise") or action.startswith("sleep:")):
            raise ValueError(f"failpoint {name}: unknown action {action!r}")
        if action.startswith("sleep:"):
            float(action[6:])
        out[name] = action
    return out


def hit(name: str) -> None:
    """Act if ``name`` is armed in ``TENURE_FAILPOINTS``; otherwise do nothing."""
    spec = os.environ.get("TENURE_FAILPOINTS")
    if not spec:
        return
    action = parse(spec).get(name)
    if action is None:
        return
    log.warning("failpoint %s: %s (pid %s)", name, action, os.getpid())
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        # Sent to this thread, not the process: a process-directed SIGSTOP may be taken by
        # another thread, and this one would run on (and, say, commit) before the stop lands.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif action == "raise":
        raise FailpointError(f"failpoint {name}")
    else:
        time.sleep(float(action[6:]))
