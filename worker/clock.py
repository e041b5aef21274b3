"""The worker's estimate of the Redis server clock (the only clock that decides due times),
and the wait that holds a run claimed ahead until its due time on that clock.

Why the wait is not a plain `asyncio.sleep`: the event loop's selector takes its timeout in
whole milliseconds, rounded up (epoll), so a timer fires anywhere from 0 to 1 ms (plus the
kernel's timer slack) after its instant. A run held that way starts up to a millisecond late
for no reason of its own. `wait_until` sleeps on the loop until FINE_S before the instant,
then waits the last stretch on a fine timer, whose wait has the kernel's resolution (tens of
microseconds). On Linux that is a timerfd the loop itself watches (`LoopFineTimer`): the
loop's own thread wakes at the instant. Elsewhere it is one helper thread (`FineTimer`) that
wakes the loop, a hand-over that cost about 0.12 ms more per start at the median and put a
second thread's scheduling between a run and its start (`bench.hold_timer`). Every waiter
re-reads the clock after each pause, so no pause however wrong can start a run early.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import math
import os
import sys
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


class _TimerFd:
    """timerfd_create/settime from libc (ctypes: Python's own `os.timerfd_*` came in 3.13), on
    CLOCK_MONOTONIC, the clock of `time.monotonic` on Linux."""

    CLOCK_MONOTONIC, TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1

    class _Spec(ctypes.Structure):  # struct itimerspec: it_interval (sec, nsec), it_value
        _fields_ = [("i_sec", ctypes.c_long), ("i_nsec", ctypes.c_long),
                    ("v_sec", ctypes.c_long), ("v_nsec", ctypes.c_long)]

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        # settime returns at once: called holding the GIL, the loop's thread does not hand it
        # to another thread and wait (up to the 5 ms switch interval) to take it back
        self._settime = ctypes.PyDLL(None, use_errno=True).timerfd_settime

    def create(self) -> int:
        fd = int(self._libc.timerfd_create(self.CLOCK_MONOTONIC,
                                           self.TFD_NONBLOCK | self.TFD_CLOEXEC))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        return fd

    def arm(self, fd: int, at: float) -> None:
        """Fire once when the monotonic clock reaches `at` (at once if it has)."""
        ns = max(1, int(at * 1e9))  # 0 would disarm it
        spec = self._Spec(0, 0, ns // 1_000_000_000, ns % 1_000_000_000)
        if self._settime(fd, self.TFD_TIMER_ABSTIME, ctypes.byref(spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime")


def _timerfd() -> _TimerFd | None:
    """The timerfd calls where the platform has them (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        tfd = _TimerFd()
        os.close(tfd.create())
    except (OSError, AttributeError):
        return None
    return tfd


class LoopFineTimer:
    """The fine timer of one event loop, on Linux: a timerfd the loop watches, armed for its
    earliest waiter. The loop's own thread wakes at the instant and releases every waiter
    due by then in one go (a herd at one instant costs one wake-up); no thread hands over.
    Only that loop's coroutines use it, so it needs no lock."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tfd: _TimerFd) -> None:
        self.loop, self._tfd = loop, tfd
        self.fd = tfd.create()
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._armed_at = math.inf
        loop.add_reader(self.fd, self._fire)

    def sleep(self, seconds: float) -> Awaitable[None]:
        """A future done about `seconds` from now (never before, by the monotonic clock)."""
        fut: asyncio.Future[None] = self.loop.create_future()
        at = time.monotonic() + seconds
        heapq.heappush(self._heap, (at, next(self._seq), fut))
        if at < self._armed_at:
            self._armed_at = at
            self._tfd.arm(self.fd, at)
        return fut

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)  # the expiry count: the timer is disarmed until armed again
        except BlockingIOError:
            return
        heap, now = self._heap, time.monotonic()
        while heap and heap[0][0] <= now:
            fut = heapq.heappop(heap)[2]
            if not fut.done():  # a cancelled waiter's future is done already
                fut.set_result(None)
        self._armed_at = heap[0][0] if heap else math.inf
        if heap:
            self._tfd.arm(self.fd, self._armed_at)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a closed loop has no readers left to remove
            self.loop.remove_reader(self.fd)
        os.close(self.fd)


class _LoopFineTimers:
    """One LoopFineTimer per event loop, made at its first wait. The timers of loops that
    have closed since (every `asyncio.run` closes its own) are closed when another loop's
    is made, and a forked child closes those it inherited."""

    def __init__(self, tfd: _TimerFd) -> None:
        self._tfd = tfd
        self._timers: dict[asyncio.AbstractEventLoop, LoopFineTimer] = {}
        os.register_at_fork(after_in_child=self._after_fork)

    def sleep(self, seconds: float) -> Awaitable[None]:
        loop = asyncio.get_running_loop()
        timer = self._timers.get(loop)
        if timer is None:
            for old in [t for t in self._timers.values() if t.loop.is_closed()]:
                del self._timers[old.loop]
                old.close()
            timer = self._timers[loop] = LoopFineTimer(loop, self._tfd)
        return timer.sleep(seconds)

    def _after_fork(self) -> None:
        for timer in self._timers.values():
            with contextlib.suppress(OSError):
                os.close(timer.fd)
        self._timers = {}


_TFD = _timerfd()
# the fine timer every ServerClock uses unless given one: the loop's timerfd on Linux, the
# helper thread elsewhere
fine_sleep: Callable[[float], Awaitable[None]] = (
    _LoopFineTimers(_TFD).sleep if _TFD is not None else _FINE.sleep)


class ServerClock:
    def __init__(self, wall: Callable[[], float] = time.time,
                 pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 fine: Callable[[float], Awaitable[None]] = fine_sleep) -> None:
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
