"""Handler-start reports for the pickup-latency workload: one UDP datagram per job start.

Every system's handler calls :func:`started` with the sequence number its job carries; the
enqueuing process listens on ``BENCH_PING_PORT`` and pairs each start with the moment the
enqueue of that sequence number returned. UDP on the loopback costs a few microseconds and
never blocks the handler.
"""

from __future__ import annotations

import os
import socket
import time

_sock: socket.socket | None = None


def started(seq: int) -> None:
    """Report that the handler of job ``seq`` has started (wall clock, this machine)."""
    global _sock
    port = int(os.environ.get("BENCH_PING_PORT", "0"))
    if not port or seq < 0:
        return
    if _sock is None:
        _sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _sock.sendto(f"{seq} {time.time():.6f}".encode(), ("127.0.0.1", port))
