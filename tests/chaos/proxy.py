"""A loopback TCP proxy the chaos harness controls: it sits between one duetime process and
the server, so a test can cut, stall or slow that process's connections while the others
keep theirs.

One asyncio loop in a daemon thread serves every listener of a `ProxyHub`; the control
methods are called from the test's thread and return once the loop applied them.

Modes of a `Link` (one listener):
- `pass`: bytes flow as they come;
- `slow`: every chunk waits `delay` seconds before it is forwarded (order kept);
- `stall`: bytes are held, not dropped, until the mode changes (a network pause: the client
  sees no error, only silence; data held when the link heals is forwarded then);
- `down`: open connections are reset and new ones are reset at once (a cut cable or a dead
  host: the client sees connection errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

from duetime.embedded import free_port

MODES = ("pass", "slow", "stall", "down")
CHUNK = 65536


class Link:
    """One listening port forwarding to `target_port`; its connections obey one mode."""

    def __init__(self, hub: ProxyHub, target_port: int, port: int) -> None:
        self.hub, self.target_port, self.port = hub, target_port, port
        self.mode, self.delay = "pass", 0.0
        self.changed: asyncio.Event | None = None  # set (and replaced) on every mode change
        self.conns: set[asyncio.StreamWriter] = set()
        self.server: asyncio.base_events.Server | None = None
        self.accepted = 0

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # -- control (any thread) ----------------------------------------------------------
    def set(self, mode: str, delay: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"proxy mode must be one of {MODES}, got {mode!r}")
        self.hub.call(self._set(mode, delay))

    def heal(self) -> None:
        self.set("pass")

    def cut(self) -> None:
        self.set("down")

    def stall(self) -> None:
        self.set("stall")

    def slow(self, delay: float) -> None:
        self.set("slow", delay)

    # -- inside the loop ----------------------------------------------------------------
    async def _set(self, mode: str, delay: float) -> None:
        self.mode, self.delay = mode, delay
        if mode == "down":
            for w in list(self.conns):
                w.transport.abort()
            self.conns.clear()
        old, self.changed = self.changed, asyncio.Event()
        if old is not None:
            old.set()

    async def _start(self) -> None:
        self.changed = asyncio.Event()
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port,
                                                 reuse_address=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "down":
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:  # the server is down: the client sees a reset, as it would directly
            writer.transport.abort()
            return
        pair = {writer, up_w}
        self.conns |= pair
        try:
            await asyncio.gather(self._pump(reader, up_w, pair), self._pump(up_r, writer, pair))
        finally:
            for w in pair:
                w.transport.abort()
            self.conns -= pair

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    pair: set[asyncio.StreamWriter]) -> None:
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    break
                while self.mode == "stall":
                    assert self.changed is not None
                    await self.changed.wait()
                if self.mode == "down" or not pair <= self.conns:
                    break
                if self.mode == "slow" and self.delay > 0:
                    await asyncio.sleep(self.delay)
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in pair:  # one side ended: end the other, as a real connection would
                w.transport.abort()


class ProxyHub:
    """Owns the loop thread; `link(target_port)` opens a new listener on a free port."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="chaos-proxy",
                                       daemon=True)
        self.thread.start()
        self.links: list[Link] = []

    def call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(10)

    def link(self, target_port: int) -> Link:
        link = Link(self, target_port, free_port())
        self.call(link._start())
        self.links.append(link)
        return link

    def close(self) -> None:
        async def shut() -> None:
            for link in self.links:
                await link._set("down", 0.0)
                if link.server is not None:
                    link.server.close()
            # end the connections' tasks here, not when the garbage collector finds them
            # pending (its "Task was destroyed" log lands in whatever test runs then)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            self.call(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def __enter__(self) -> ProxyHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
