"""The run's own Redis broker: a private ``redis-server`` on its own port, without persistence,
so a restart loses every message it held, as a crashed broker without a disk would.

The nemesis restarts it (messages lost: the dispatcher must re-send hints for due jobs) and
duplicates messages, both those waiting in the queue and those a worker holds unacknowledged,
so one job's hint is delivered several times (the claim must absorb every copy).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from .cluster import free_port

BROKER_QUEUE = "broker"
"""The queue of the verifier's broker twins (see :mod:`verifier.job_types`)."""
UNACKED_KEY = "unacked"
"""Where the Redis transport keeps delivered, unacknowledged messages (a hash by tag)."""


class RedisBroker:
    """A throw-away ``redis-server`` on ``127.0.0.1:port`` with no persistence."""

    def __init__(self, root: Path, *, port: int = 0) -> None:
        self.root = root
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL the run's Celery processes use."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server empty and wait until it answers."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.wait_up()

    def client(self) -> Any:
        """A Redis client for the nemesis (short timeouts: the server may be down)."""
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2
        )

    def wait_up(self, timeout: float = 20.0) -> float:
        """Seconds waited until the server answers ``PING``."""
        begun = time.monotonic()
        while True:
            try:
                if self.client().ping():
                    return time.monotonic() - begun
            except Exception:
                if time.monotonic() - begun > timeout:
                    raise
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill the server (SIGKILL: nothing is saved, nothing flushed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, down_for: float) -> dict[str, Any]:
        """Kill the server, keep it down ``down_for`` seconds, start it empty; what was lost."""
        held = self.backlog()
        self.stop()
        time.sleep(down_for)
        self.start()
        return {"lost_messages": held, "down_for": round(down_for, 3)}

    def backlog(self) -> int:
        """Messages held right now (queued plus delivered and unacknowledged); -1 if unknown."""
        try:
            r = self.client()
            queued = sum(int(r.llen(k)) for k in self._queues(r))
            return queued + int(r.hlen(UNACKED_KEY))
        except Exception:
            return -1

    @staticmethod
    def _queues(r: Any) -> list[bytes]:
        # Kombu keeps each queue as a list under the queue's own name.
        return [k for k in r.keys("*") if r.type(k) == b"list"]

    def duplicate(self, queue: str, copies: int) -> dict[str, Any]:
        """Publish ``copies`` extra copies of every message of ``queue`` waiting or delivered
        and unacknowledged; returns how many copies were added."""
        import json

        r = self.client()
        bodies: list[bytes] = list(r.lrange(queue, 0, -1))
        for raw in r.hvals(UNACKED_KEY):
            # Each unacknowledged entry is ``[message, exchange, routing_key]``.
            with contextlib.suppress(ValueError, TypeError, IndexError):
                entry = json.loads(raw)
                if entry[2] == queue:
                    bodies.append(json.dumps(entry[0]).encode())
        added = 0
        for body in bodies:
            for _ in range(copies):
                r.lpush(queue, _fresh_tag(body))
                added += 1
        return {"messages": len(bodies), "copies_added": added}


def _fresh_tag(body: bytes) -> bytes:
    """A copy of a message with a delivery tag of its own (a copy sharing its original's tag
    would be acknowledged together with it, hiding the duplicate delivery)."""
    import json
    import uuid

    try:
        msg = json.loads(body)
        msg["properties"]["delivery_tag"] = str(uuid.uuid4())
        return json.dumps(msg).encode()
    except (ValueError, KeyError, TypeError):
        return body
