"""TCP proxies between each executor and PostgreSQL, able to cut a link or lose replies.

One asyncio loop in a background thread serves every link. A link is in one of three modes:

* ``pass`` — bytes flow both ways.
* ``hold`` — a partition: nothing is read from either side, so requests and replies wait in
  the kernel's buffers; new connections are accepted but get no answer. Healing lets the
  held bytes through, late, as a healed network would — a paused request arrives after its
  lease has gone.
* ``drop`` — replies are lost: the client's bytes reach the server (a ``COMMIT`` commits) but
  whatever the server answers is thrown away, so the client cannot know the outcome. Healing
  resets every connection that lost a reply; the client must read the outcome back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class _Pipe:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    lost_reply: bool = False


@dataclass
class _Link:
    name: str
    target: tuple[str, int]
    port: int = 0
    mode: str = "pass"
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    pipes: set[_Pipe] = field(default_factory=set)
    server: asyncio.AbstractServer | None = None
    dropped_bytes: int = 0


class ProxyServer:
    """Every link's proxy, on one event loop in a daemon thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy")
        self._thread.daemon = True
        self._links: dict[str, _Link] = {}

    def start(self) -> None:
        """Start the loop."""
        self._thread.start()

    def close(self) -> None:
        """Close every link and stop the loop."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- control (called from other threads) ---------------------------------------------
    def add_link(self, name: str, target: tuple[str, int]) -> int:
        """Open a proxy to ``target``; returns the local port clients should use."""
        return int(self._call(self._add(name, target)))

    def set_mode(self, name: str, mode: str) -> dict[str, Any]:
        """Put link ``name`` in ``pass``, ``hold`` or ``drop`` mode; returns its figures."""
        if mode not in ("pass", "hold", "drop"):
            raise ValueError(f"unknown link mode {mode!r}")
        return dict(self._call(self._set_mode(name, mode)))

    def reset(self, name: str) -> int:
        """Abort every connection of a link (both sides see a reset); returns how many."""
        return int(self._call(self._reset(name)))

    # -- loop side ------------------------------------------------------------------------
    async def _add(self, name: str, target: tuple[str, int]) -> int:
        link = _Link(name=name, target=target)
        link.flowing.set()

        async def accept(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._serve(link, r, w)

        link.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        link.port = int(link.server.sockets[0].getsockname()[1])
        self._links[name] = link
        return link.port

    async def _serve(
        self, link: _Link, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        pipe = _Pipe(client=cwriter, lost_reply=link.mode == "drop")
        link.pipes.add(pipe)
        try:
            await link.flowing.wait()
            try:
                sreader, swriter = await asyncio.open_connection(*link.target)
            except OSError:
                return  # the database is down: the client sees its connection closed
            pipe.server = swriter
            await asyncio.gather(
                self._pump(link, pipe, creader, swriter, reply=False),
                self._pump(link, pipe, sreader, cwriter, reply=True),
                return_exceptions=True,
            )
        finally:
            link.pipes.discard(pipe)
            for w in (cwriter, pipe.server):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()

    async def _pump(
        self,
        link: _Link,
        pipe: _Pipe,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        *,
        reply: bool,
    ) -> None:
        try:
            while True:
                await link.flowing.wait()
                data = await src.read(65536)
                if not data:
                    break
                # A partition that began while this read waited holds the bytes until it heals.
                await link.flowing.wait()
                if reply and (link.mode == "drop" or pipe.lost_reply):
                    pipe.lost_reply = True
                    link.dropped_bytes += len(data)
                    continue
                dst.write(data)
                await dst.drain()
        finally:
            # One side ended: end the other, as a real connection would.
            with contextlib.suppress(Exception):
                if dst.can_write_eof():
                    dst.write_eof()
                dst.close()

    async def _set_mode(self, name: str, mode: str) -> dict[str, Any]:
        link = self._links[name]
        before = link.mode
        link.mode = mode
        figures: dict[str, Any] = {"link": name, "from": before, "to": mode}
        if mode == "hold":
            link.flowing.clear()
        else:
            link.flowing.set()
        if mode == "drop":
            for p in link.pipes:
                p.lost_reply = True
        if mode == "pass" and before == "drop":
            # A stream that lost bytes cannot continue: reset it; the client reconnects.
            lost = [p for p in link.pipes if p.lost_reply]
            for p in lost:
                self._abort(p)
            figures.update(reset=len(lost), dropped_bytes=link.dropped_bytes)
            link.dropped_bytes = 0
        figures["connections"] = len(link.pipes)
        return figures

    @staticmethod
    def _abort(pipe: _Pipe) -> None:
        for w in (pipe.client, pipe.server):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.transport.abort()

    async def _reset(self, name: str) -> int:
        link = self._links[name]
        pipes = list(link.pipes)
        for p in pipes:
            self._abort(p)
        return len(pipes)

    async def _close_all(self) -> None:
        for link in self._links.values():
            link.flowing.set()
            if link.server is not None:
                link.server.close()
            for p in list(link.pipes):
                self._abort(p)
