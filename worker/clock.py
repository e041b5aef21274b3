"""The worker's estimate of the Redis server clock (the only clock that decides due times),
and the wait that holds a run claimed ahead until its due time on that clock.

Why the wait is not a plain `asyncio.sleep`: the event loop's selector takes its timeout in
whole milliseconds, rounded up (epoll), so a timer fires anywhere from 0 to 1 ms (plus the
kernel's timer slack) after its instant. A run held that way starts up to a millisecond late
for no reason of its own. `wait_until` sleeps on the loop until FINE_S before the instant,
then hands the last stretch to one helper thread (`FineTimer`), whose wait has the kernel's
resolution (tens of microseconds), and which wakes the loop at the instant. Every waiter
re-reads the clock after each pause, so no pause however wrong can start a run early.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import threading
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aredis

SYNC_SAMPLES = 8  # TIME round trips per sync; the shortest one's midpoint is kept
FINE_S = 0.002  # the last stretch of a hold is waited on the fine timer, not on the loop


class FineTimer:
    """One daemon thread waking coroutines at sub-millisecond instants (monotonic clock).

    Waiters due at the same time are woken by one call into their loop, so a herd released
    at one instant costs one thread wake-up, not one per run. The thread starts with the first
    wait (and again in a forked child, which has none) and idles on a condition meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:  # the thread did not survive the fork; its lock may be held
        self._cond = threading.Condition()
        self._heap, self._thread = [], None

    def sleep(self, seconds: float) -> Awaitable[None]:
        """A future done about `seconds` from now (never before, by the monotonic clock)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        at = time.monotonic() + seconds
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), loop, fut))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="duetime-fine-timer",
                                                daemon=True)
                self._thread.start()
            elif self._heap[0][3] is fut:  # earlier than what the thread waits for
                self._cond.notify()
        return fut

    def _run(self) -> None:
        cond, heap = self._cond, self._heap
        while True:
            with cond:
                while not heap:
                    cond.wait()
                left = heap[0][0] - time.monotonic()
                if left > 0:
                    cond.wait(left)
                    continue
                now = time.monotonic()
                due: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
                while heap and heap[0][0] <= now:
                    _, _, loop, fut = heapq.heappop(heap)
                    due.setdefault(loop, []).append(fut)
            for loop, futs in due.items():
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                    loop.call_soon_threadsafe(_release, futs)


def _release(futs: list[asyncio.Future[None]]) -> None:
    for fut in futs:
        if not fut.done():  # a cancelled waiter's future is done already
            fut.set_result(None)


_FINE = FineTimer()


class ServerClock:
    def __init__(self, wall: Callable[[], float] = time.time,
                 pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 fine: Callable[[float], Awaitable[None]] = _FINE.sleep) -> None:
        self.offset_ms = 0.0  # server - local
        self.error_ms = 0.0  # bound on the estimate's error: half the round trip it came from
        # the clock and the two pauses wait_until uses (a test controls all three)
        self._wall, self._pause, self._fine = wall, pause, fine

    async def sync(self, client: aredis.Redis, samples: int = SYNC_SAMPLES) -> None:
        """Keep the sample with the shortest round trip: its midpoint is the best estimate,
        and half its round trip bounds the error (a busy machine stretches some round trips,
        so a few more samples make a short one likely)."""
        best: tuple[float, float] | None = None
        wall = self._wall
        for _ in range(samples):
            t0 = wall()
            sec, usec = await client.time()
            t1 = wall()
            rtt = t1 - t0
            offset = (sec * 1000 + usec / 1000) - (t0 + t1) * 500
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        assert best is not None
        self.offset_ms = best[1]
        self.error_ms = best[0] * 500

    def now_ms(self) -> float:
        return self._wall() * 1000 + self.offset_ms

    def wait_s(self, server_ms: float) -> float:
        """How long until the server clock has surely reached `server_ms` (<= 0: it has): the
        estimate must pass it by the error bound, so a start is never early on the server."""
        return (server_ms + self.error_ms - self.now_ms()) / 1000

    async def wait_until(self, server_ms: float) -> None:
        """Return once the server clock has surely reached `server_ms` (see `wait_s`): on the
        loop's own timer while more than FINE_S is left, then on the fine timer. The clock is
        read again after every pause, so a pause that ends early only costs another pause."""
        while (left := self.wait_s(server_ms)) > 0:
            if left > FINE_S:
                await self._pause(left - FINE_S)
            else:
                await self._fine(left)
