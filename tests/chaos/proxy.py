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
  host: the client sees connection errors);
- `halfopen`: the peer vanished without a FIN or an RST (a host that lost power, a NAT or
  firewall that forgot the flow): bytes are read and dropped in both directions and every
  socket stays open; new connections are accepted and dropped alike. Healing does not revive
  the connections that were half-open (their peer is gone for good): they stay silent until
  the client gives up on them; new connections work again;
- `reset_reply`: the next reply from the server on each connection is forwarded in part (at
  most `cut_at` bytes), then both sides are closed with an RST (SO_LINGER 0): a reset in the
  middle of a reply. Connections opened meanwhile get the same; `pass` ends it.

Independent of the mode, `latency(lo, hi)` delays every chunk in each direction by a time
drawn uniformly from [lo, hi] seconds (a network's latency with jitter), order preserved: a
chunk is never delivered before the one read ahead of it (as netem does with its default
reordering off). It applies to every connection of the link, present and future.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import selectors
import socket
import struct
import threading
import time
from concurrent.futures import Future
from typing import Any

from duetime.embedded import free_port

MODES = ("pass", "slow", "stall", "down", "halfopen", "reset_reply")
CHUNK = 65536


class Link:
    """One listening port forwarding to `target_port`; its connections obey one mode."""

    def __init__(self, hub: ProxyHub, target_port: int, port: int,
                 host: str = "127.0.0.1") -> None:
        self.hub, self.target_port, self.port, self.host = hub, target_port, port, host
        self.mode, self.delay = "pass", 0.0
        self.changed: asyncio.Event | None = None  # set (and replaced) on every mode change
        self.conns: set[asyncio.StreamWriter] = set()
        self.server: asyncio.base_events.Server | None = None
        self.accepted = 0
        self.lat: tuple[float, float] = (0.0, 0.0)  # s, every chunk, both directions
        self.cut_at = 0  # bytes of a reply forwarded before `reset_reply` resets
        self.resets = 0  # connections `reset_reply` reset mid-reply
        self.dead: set[asyncio.StreamWriter] = set()  # half-open for good (their peer vanished)
        self._rnd = random.Random(port)
        # half-open detection: when a client first sent bytes that went nowhere, per
        # connection; and, once it gave the connection up, how long after that it took
        self._unanswered: dict[asyncio.StreamWriter, float] = {}
        self.detections: list[float] = []

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

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

    def half_open(self) -> None:
        self.set("halfopen")

    def reset_reply(self, cut_at: int = 1) -> None:
        """Reset each connection after at most `cut_at` bytes of its next reply."""
        self.cut_at = max(1, cut_at)
        self.set("reset_reply")

    def latency(self, lo: float, hi: float | None = None) -> None:
        """Delay every chunk by uniform(lo, hi) seconds (0, 0: none), order kept."""
        hi = lo if hi is None else hi
        if not 0 <= lo <= hi:
            raise ValueError(f"latency needs 0 <= lo <= hi, got {lo}, {hi}")
        self.lat = (lo, hi)

    # -- inside the loop ----------------------------------------------------------------
    async def _set(self, mode: str, delay: float) -> None:
        self.mode, self.delay = mode, delay
        if mode == "down":
            for w in list(self.conns | self.dead):
                w.transport.abort()
            self.conns.clear()
            self.dead.clear()
        if mode == "halfopen":  # every open connection loses its peer, idle ones too
            self.dead |= self.conns
        old, self.changed = self.changed, asyncio.Event()
        if old is not None:
            old.set()

    async def _start(self) -> None:
        self.changed = asyncio.Event()
        self.server = await asyncio.start_server(self._accept, self.host, self.port,
                                                 reuse_address=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "down":
            writer.transport.abort()
            return
        if self.mode == "halfopen":  # the host is gone: what the client sends goes nowhere
            await self._black_hole(reader, writer)
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:  # the server is down: the client sees a reset, as it would directly
            writer.transport.abort()
            return
        pair = {writer, up_w}
        self.conns |= pair
        if self.mode == "halfopen":  # the link went half-open while the upstream connected
            self.dead |= pair
        try:
            await asyncio.gather(self._pump(reader, up_w, pair, False, writer),
                                 self._pump(up_r, writer, pair, True, writer))
        finally:
            for w in pair:
                if w not in self.dead:
                    w.transport.abort()
            self.conns -= pair

    async def _black_hole(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        """Read and drop until the client closes; never answer, never close."""
        self.dead.add(writer)
        try:
            await self._drain_forever(reader, writer)
        finally:
            self.dead.discard(writer)
            self._given_up(writer)
            writer.transport.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    pair: set[asyncio.StreamWriter], reply: bool,
                    client: asyncio.StreamWriter) -> None:
        """src → dst, chunk by chunk, through the link's mode; `reply`: server → client."""
        q: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(q, dst, pair))
        last_due = 0.0
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
                if self.mode == "halfopen" or pair & self.dead:
                    self.dead |= pair  # this connection's peer vanished: for good
                    if not reply:
                        self._unanswered.setdefault(client, time.monotonic())
                    await self._drain_forever(src, None if reply else client)
                    return
                if self.mode == "slow" and self.delay > 0:
                    await asyncio.sleep(self.delay)
                if self.mode == "reset_reply" and reply:
                    await q.put((last_due, data[:self.cut_at]))
                    await q.put(None)
                    await sender
                    self.resets += 1
                    for w in pair:
                        _rst(w)
                    return
                lo, hi = self.lat
                due = time.monotonic() + (self._rnd.uniform(lo, hi) if hi > 0 else 0.0)
                last_due = max(due, last_due)  # never ahead of the chunk before it
                await q.put((last_due, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not sender.done():
                await q.put(None)
                with contextlib.suppress(Exception):
                    await sender
            if not reply:  # the client closed it (at last, if half-open): it is over
                self.dead -= pair
                self._given_up(client)
            if not pair & self.dead:
                for w in pair:  # one side ended: end the other, as a real connection would
                    w.transport.abort()

    async def _send(self, q: asyncio.Queue[tuple[float, bytes] | None],
                    dst: asyncio.StreamWriter, pair: set[asyncio.StreamWriter]) -> None:
        try:
            while (item := await q.get()) is not None:
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if pair & self.dead or self.mode == "halfopen":
                    continue  # the peer vanished: what was in flight is lost
                dst.write(data)
                await dst.drain()
        except OSError:
            pass

    async def _drain_forever(self, src: asyncio.StreamReader,
                             client: asyncio.StreamWriter | None) -> None:
        """A half-open connection: read what comes and drop it, until its side closes; what a
        client sends is noted (`client`) as unanswered from then on."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while await src.read(CHUNK):
                if client is not None:
                    self._unanswered.setdefault(client, time.monotonic())

    def _given_up(self, client: asyncio.StreamWriter) -> None:
        """The client closed a connection: if it had sent bytes that went nowhere, it found
        the connection half-open this long after the first of them."""
        t0 = self._unanswered.pop(client, None)
        if t0 is not None:
            self.detections.append(time.monotonic() - t0)


def _rst(w: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN: SO_LINGER on, timeout 0."""
    sock = w.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


class ProxyHub:
    """Owns the loop thread; `link(target_port)` opens a new listener on a free port.

    `precise`: the loop waits with select(2), whose timeout is in microseconds, instead of
    epoll, whose timeout is in whole milliseconds rounded up: on the default loop a latency of
    0.5 ms each way is about 1.2 ms (a 1 ms round trip measured 2.4 ms), on the precise one
    0.6 ms (1.25 ms). select(2) cannot watch a file descriptor numbered 1024 or more, so it is
    for a process that opens few (a benchmark), not for the test suite's."""

    def __init__(self, precise: bool = False) -> None:
        self.loop: asyncio.AbstractEventLoop = (
            asyncio.SelectorEventLoop(selectors.SelectSelector()) if precise
            else asyncio.new_event_loop())
        self.thread = threading.Thread(target=self.loop.run_forever, name="chaos-proxy",
                                       daemon=True)
        self.thread.start()
        self.links: list[Link] = []

    def call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(10)

    def link(self, target_port: int, host: str = "127.0.0.1") -> Link:
        """A new listener on `host` (a free port) forwarding to the server on loopback."""
        link = Link(self, target_port, free_port(), host)
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
