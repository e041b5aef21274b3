"""ServerClock.wait_until, the hold of a run claimed ahead of its due time, on a controlled
clock: it never returns before the server clock has surely reached the instant (estimate +
error bound), whatever the pauses do; the last stretch goes to the fine timer. The fine
timers (the loop's timerfd on Linux, the helper thread elsewhere) on the real monotonic clock:
a waiter is never released before its instant, and waiters of one instant are released
together."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable

import pytest
from duetime.worker import clock as clock_module
from duetime.worker.clock import FINE_S, FineTimer, ServerClock

Sleep = Callable[[float], Awaitable[None]]


@pytest.fixture(params=["thread", "timerfd"])
def fine(request: pytest.FixtureRequest) -> Sleep:
    """A fresh fine timer of each kind."""
    if request.param == "thread":
        return FineTimer().sleep
    if clock_module._TFD is None:
        pytest.skip(f"no timerfd on {sys.platform}: the worker uses the helper thread there")
    return clock_module._LoopFineTimers(clock_module._TFD).sleep


def test_the_default_fine_timer_on_linux_is_the_loops_timerfd() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("timerfd is Linux's")
    assert clock_module._TFD is not None
    assert isinstance(clock_module.fine_sleep.__self__,  # type: ignore[attr-defined]
                      clock_module._LoopFineTimers)
    assert ServerClock()._fine == clock_module.fine_sleep


class Controlled:
    """A wall clock the test moves: each pause advances it by `step(asked)` seconds."""

    def __init__(self, t: float, step) -> None:
        self.t, self.step = t, step
        self.coarse: list[float] = []
        self.fine: list[float] = []

    def wall(self) -> float:
        return self.t

    async def pause(self, s: float) -> None:
        self.coarse.append(s)
        self.t += self.step(s)

    async def fine_pause(self, s: float) -> None:
        self.fine.append(s)
        self.t += self.step(s)


def clock_on(c: Controlled, offset_ms: float, error_ms: float) -> ServerClock:
    clock = ServerClock(wall=c.wall, pause=c.pause, fine=c.fine_pause)
    clock.offset_ms, clock.error_ms = offset_ms, error_ms
    return clock


@pytest.mark.parametrize("step", [
    lambda s: s,  # each pause exactly as long as asked
    lambda s: max(s / 3, 0.0001),  # pauses ending early (a loop woken by something else)
    lambda s: max(s - 0.0004, 0.00001),  # each one 0.4 ms short
    lambda s: s + 0.001,  # each one 1 ms late (the loop's timer rounds up to a millisecond)
])
def test_wait_until_never_returns_before_the_instant_plus_the_error_bound(step):
    c = Controlled(1_000.0, step)
    clock = clock_on(c, offset_ms=250.0, error_ms=0.3)
    target = 1_000_000.0 + 250.0 + 40.0  # 40 ms from now on the server's clock
    asyncio.run(clock.wait_until(target))
    assert clock.now_ms() >= target + 0.3  # never early, by the error bound
    assert c.coarse  # the loop's timer for the bulk,
    assert all(s <= FINE_S for s in c.fine)  # the fine timer only for the last stretch
    assert c.coarse[0] == pytest.approx((40.3 / 1000) - FINE_S)


def test_wait_until_returns_at_once_for_an_instant_passed():
    c = Controlled(50.0, lambda s: s)
    clock = clock_on(c, offset_ms=0.0, error_ms=0.1)
    asyncio.run(clock.wait_until(50_000.0 - 5))  # 5 ms ago
    assert c.coarse == c.fine == []


def test_wait_until_an_instant_within_the_error_bound_still_waits_for_it():
    """Due 0.2 ms ago by the estimate, but the estimate may be 0.5 ms fast: hold 0.3 ms."""
    c = Controlled(50.0, lambda s: s)
    clock = clock_on(c, offset_ms=0.0, error_ms=0.5)
    asyncio.run(clock.wait_until(50_000.0 - 0.2))
    assert c.coarse == [] and c.fine == [pytest.approx(0.0003)]
    assert clock.now_ms() >= 50_000.0 - 0.2 + 0.5


def test_fine_timer_never_releases_a_waiter_before_its_instant(fine: Sleep) -> None:
    async def main() -> list[tuple[float, float]]:
        async def one(s: float) -> tuple[float, float]:
            at = time.monotonic() + s
            await fine(s)
            return at, time.monotonic()
        # pushed latest first: each new one is earlier than what the timer is armed for
        return await asyncio.gather(*(one(0.004 - i * 0.0005) for i in range(8)))

    for at, woke in asyncio.run(main()):
        assert woke >= at


def test_fine_timer_releases_a_herd_of_one_instant_together(fine: Sleep) -> None:
    async def main() -> int:
        at = time.monotonic() + 0.003
        futs = [fine(at - time.monotonic()) for _ in range(2000)]
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert time.monotonic() >= at
        return len(futs)

    assert asyncio.run(main()) == 2000


def test_fine_timer_survives_a_cancelled_waiter(fine: Sleep) -> None:
    async def main() -> None:
        gone = asyncio.ensure_future(fine(0.002))
        kept = asyncio.ensure_future(fine(0.002))
        gone.cancel()
        await asyncio.wait_for(kept, 30)
        assert gone.cancelled()

    asyncio.run(main())


def test_fine_timer_serves_one_loop_after_another_without_keeping_their_fds(fine: Sleep) -> None:
    """Every `asyncio.run` is a loop of its own: each gets its waits, and the timerfds of the
    loops that closed are closed (a worker's tests run hundreds of loops in one process)."""
    async def waits() -> None:
        at = time.monotonic() + 0.001
        await asyncio.gather(fine(0.002), fine(0.001))
        assert time.monotonic() >= at

    asyncio.run(waits())
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(50):
        asyncio.run(waits())
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds + 1  # the newest loop's, at most
