"""common/loops.py: how the worker's background loops pause and end, and why a cancellation
alone cannot be trusted to end them."""

from __future__ import annotations

import asyncio
import contextlib
import sys

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
