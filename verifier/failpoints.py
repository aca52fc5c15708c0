"""The verifier's hooks (:class:`scheduler_core.hooks.Hooks`): named crash points for fault tests,
armed by ``TENURE_FAILPOINTS``, and the event log ``TENURE_EVENT_LOG`` names. The verifier app
installs them at start-up when either is set (:mod:`verifier.apps`).


``TENURE_FAILPOINTS="after_claim=kill,before_effect=stop,after_effect=sleep:5"`` makes the
process act at those points: ``kill`` (SIGKILL itself), ``stop`` (SIGSTOP itself, to be
resumed by SIGCONT from outside), ``sleep:N`` (sleep N seconds) or ``raise`` (raise
:class:`FailpointError`). Points: ``after_claim``, ``before_effect``, ``after_effect``,
``before_complete``, ``in_commit``, ``before_group_commit`` (an executor's write of several
completions together, before its statement is sent). This is a testing facility; production never sets it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any

from scheduler_core.hooks import POINTS, Hooks

log = logging.getLogger("tenure.failpoints")


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
    _act(name, parse(spec).get(name))


def _act(name: str, action: str | None) -> None:
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


def log_event(kind: str, **fields: Any) -> None:
    """Append one JSON line to the file ``TENURE_EVENT_LOG`` names, if set: what an executor
    saw (claims, attempt ends, refusals), kept outside the database the checker reads."""
    path = os.environ.get("TENURE_EVENT_LOG")
    if not path:
        return
    line = json.dumps(
        {"event": kind, "pid": os.getpid(), "t": round(time.time(), 3), **fields}, default=str
    )
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as e:
        log.warning("could not append to the event log %s: %s", path, e)


class VerifierHooks(Hooks):
    """Failpoints from ``TENURE_FAILPOINTS`` (parsed once) and the event log."""

    def __init__(self, spec: str) -> None:
        self.armed = parse(spec) if spec else {}

    def failpoint(self, name: str) -> None:
        action = self.armed.get(name)
        if action is not None:
            _act(name, action)

    def event(self, kind: str, **fields: Any) -> None:
        log_event(kind, **fields)
