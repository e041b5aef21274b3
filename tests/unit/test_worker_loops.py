"""common/loops.py: how the worker's background loops pause and end, and why a cancellation
alone cannot be trusted to end them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from duetime.common import loops

from tests.recorder import Recorder


def test_wait_for_on_this_python_loses_a_cancellation_that_meets_a_finished_call():
    """The mechanism: redis-py sends each command through `asyncio.wait_for` (the worker's
    client has a socket timeout). Before Python 3.12, a cancellation that reaches wait_for
    when the awaited call has just finished is lost: wait_for returns the call's result."""

    async def main() -> object:
        sent = asyncio.get_running_loop().create_future()

        async def command() -> object:
            return await asyncio.wait_for(sent, 5)

        task = asyncio.create_task(command())
        await asyncio.sleep(0)  # the task waits in wait_for
        sent.set_result("sent")  # the send finished ...
        task.cancel()  # ... and the worker's shutdown cancels the loop in the same step
        try:
            result = await task
        except asyncio.CancelledError:
            return asyncio.CancelledError
        assert task.cancelling() == 1  # cancelled, yet it returned
        return result

    outcome = asyncio.run(main())
    assert outcome == ("sent" if sys.version_info < (3, 12) else asyncio.CancelledError)


def test_pause_ends_when_closing_is_set():
    async def main() -> bool:
        closing = asyncio.Event()
        asyncio.get_running_loop().call_soon(closing.set)
        return await asyncio.wait_for(loops.pause(closing, 3600), 30)

    assert asyncio.run(main()) is True


def test_pause_waits_its_time_when_not_closing():
    async def main() -> bool:
        return await loops.pause(asyncio.Event(), 0.01)

    assert asyncio.run(main()) is False


def test_pause_raises_for_a_cancellation_a_call_swallowed_before_it():
    async def main() -> None:
        async def loop() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # a Redis call that returned
                await asyncio.Event().wait()  # although its task was cancelled
            await loops.pause(asyncio.Event(), 3600)  # the loop's next pause ends it

        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)

    asyncio.run(main())


def test_end_cancels_again_a_task_that_lost_its_cancellation_and_names_it(monkeypatch):
    monkeypatch.setattr(loops, "END_WAIT_S", 0.01)
    log = Recorder()

    async def main() -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        async def deaf() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # lost, as in a Redis call
                await asyncio.Event().wait()
            await asyncio.Event().wait()  # no `closing` watched: only a new cancellation ends it

        async def fails() -> None:
            raise RuntimeError("boom")

        tasks = [asyncio.create_task(deaf(), name="deaf"), asyncio.create_task(fails())]
        await asyncio.sleep(0)
        await asyncio.wait_for(loops.end(tasks, log, "w1"), 30)
        return tasks[0], tasks[1]

    deaf, fails = asyncio.run(main())
    assert deaf.cancelled()
    assert isinstance(fails.exception(), RuntimeError)  # dropped by end, as gather would
    lines = log.events("a worker task did not end when cancelled; cancelling it again")
    assert [(e["task"], e["worker_id"]) for e in lines] == [("deaf", "w1")]


# loop_timeout: a timeout that counts only time the loop was free. The loop is held with
# time.sleep on purpose: that is the fault (a task body blocking the worker's loop).
BOUND_S = 0.2
HOLD_S = BOUND_S + loops.HELD_LOOP_S + 0.5  # past the bound, and by more than a late timer


def reply_during_the_hold(fut: asyncio.Future[Any], value: Any) -> None:
    """`fut` gets `value` while the loop is held, as a reply arrives on a socket then: from
    outside the loop, so it is handled in the same turn as the timers that fell due."""
    loop = fut.get_loop()
    threading.Timer(0.05, loop.call_soon_threadsafe, (fut.set_result, value)).start()


def reply_across_a_hold(bound: Callable[[float], Any]) -> str:
    """A wait bounded by `bound(BOUND_S)` whose reply comes while the loop is held past the
    bound; → the reply, or "timed out"."""
    async def main() -> str:
        reply = asyncio.get_running_loop().create_future()

        async def wait() -> str:
            async with bound(BOUND_S):
                return await reply

        task = asyncio.create_task(wait())
        await asyncio.sleep(0)  # it waits for its reply
        reply_during_the_hold(reply, "renewed")  # the reply comes while the loop is held
        time.sleep(HOLD_S)  # past the bound
        try:
            return await task
        except TimeoutError:
            return "timed out"

    return asyncio.run(main())


def test_loop_timeout_lets_a_wait_that_ended_while_the_loop_was_held_finish():
    assert reply_across_a_hold(loops.loop_timeout) == "renewed"


def test_asyncio_timeout_throws_that_reply_away():
    """Why loop_timeout exists: the same sequence under asyncio.timeout."""
    assert reply_across_a_hold(asyncio.timeout) == "timed out"


def test_loop_timeout_still_times_out_a_wait_with_no_end():
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):  # on a free loop
            async with loops.loop_timeout(BOUND_S):
                await loop.create_future()
        free = loop.time() - start

        async def wait() -> None:
            async with loops.loop_timeout(BOUND_S):
                await loop.create_future()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0)
        time.sleep(HOLD_S)  # held: the timer fires late and arms again ...
        back = loop.time()
        with pytest.raises(TimeoutError):  # ... then expires on a free loop
            await task
        return free, loop.time() - back

    free, after_the_hold = asyncio.run(main())
    assert free >= BOUND_S and after_the_hold >= BOUND_S


def test_loop_timeout_leaves_another_cancellation_a_cancellation():
    async def main() -> None:
        async def wait() -> None:
            async with loops.loop_timeout(BOUND_S):
                await asyncio.get_running_loop().create_future()

        task = asyncio.create_task(wait())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_heartbeat_that_came_back_while_the_loop_was_held_counts(monkeypatch):
    """The lease keeper's beat is bounded by loop_timeout: a beat whose renewals came back
    while a task body held the loop past the bound is a success, not a failure followed by
    the attempts stopped as lost (a worker that was itself stalled renews first)."""
    from duetime.worker.leases import LeaseKeeper

    outcomes: list[str] = []
    keeper = LeaseKeeper.__new__(LeaseKeeper)
    keeper.interval_s = BOUND_S
    keeper.expire_unrenewed = lambda: float("inf")  # type: ignore[method-assign]

    class Seen:
        def ok(self) -> None:
            outcomes.append("ok")

        def failed(self, exc: BaseException) -> float:
            outcomes.append(f"failed: {type(exc).__name__}")
            return BOUND_S

    keeper.outage = Seen()  # type: ignore[assignment]

    async def main() -> None:
        closing = asyncio.Event()
        reply = asyncio.get_running_loop().create_future()

        async def beat() -> None:
            await reply
            closing.set()  # one beat is enough

        monkeypatch.setattr(keeper, "beat", beat)
        task = asyncio.create_task(keeper.run(closing))
        await asyncio.sleep(0)  # the beat waits for its reply
        reply_during_the_hold(reply, None)
        time.sleep(HOLD_S)
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert outcomes == ["ok"]
