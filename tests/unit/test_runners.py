"""worker/runners.py: attempts executed in reused runner tasks keep what a task of their own
gave them: a context each, side-by-side execution when they wait, cancellation delivered to
the attempt it was meant for and taken back from the runner afterwards, `asyncio.timeout`,
and a runner cancelled from outside stops. No Redis: the runners are plain asyncio."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from duetime.worker.runners import InContext, Runners

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="")


class Ex:
    """What Runners needs of an Execution."""

    def __init__(self) -> None:
        self.runner: asyncio.Task[None] | None = None
        self.cancels = 0


def on_error(ex: Ex, exc: Exception) -> None:
    raise AssertionError(f"an attempt raised {exc!r}")


def cancel(ex: Ex) -> None:
    assert ex.runner is not None
    ex.cancels += 1
    ex.runner.cancel()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_attempts_that_never_wait_run_in_one_runner_each_in_its_own_context() -> None:
    async def main() -> None:
        runners, seen, tasks = Runners(on_error), [], set()

        async def attempt(i: int) -> None:
            assert var.get() == ""  # nothing of another attempt's context
            var.set(f"run {i}")
            seen.append((i, var.get()))
            tasks.add(asyncio.current_task())

        for i in range(50):
            runners.submit(Ex(), attempt(i), contextvars.copy_context())
        await runners.ended()
        assert seen == [(i, f"run {i}") for i in range(50)]
        assert len(tasks) == 1  # one runner did the whole batch
        assert var.get() == ""
        runners.close()

    run(main())


def test_attempts_that_wait_run_side_by_side() -> None:
    async def main() -> None:
        runners = Runners(on_error)
        started: list[int] = []
        gate = asyncio.Event()

        async def attempt(i: int) -> None:
            var.set(f"run {i}")
            started.append(i)
            await gate.wait()  # every attempt waits: all must be started meanwhile
            assert var.get() == f"run {i}"

        for i in range(20):
            runners.submit(Ex(), attempt(i), contextvars.copy_context())
        while len(started) < 20:
            await asyncio.sleep(0.001)
        assert runners.live == 20
        gate.set()
        await runners.ended()
        runners.close()

    run(main())


def test_a_cancellation_reaches_its_attempt_only_and_the_runner_goes_on() -> None:
    async def main() -> None:
        runners = Runners(on_error)
        a, b = Ex(), Ex()
        ended: dict[str, str] = {}
        waiting = asyncio.Event()

        async def first() -> None:
            try:
                waiting.set()
                await asyncio.sleep(60)
                ended["first"] = "slept"
            except asyncio.CancelledError:
                ended["first"] = "cancelled"

        async def second() -> None:
            await asyncio.sleep(0)  # had the cancellation leaked, it would land here
            with pytest.raises(TimeoutError):  # a timeout on the runner works as on a task
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(60)
            ended["second"] = "done"

        runners.submit(a, first(), contextvars.copy_context())
        await waiting.wait()
        cancel(a)
        await runners.ended()
        runners.submit(b, second(), contextvars.copy_context())
        await runners.ended()
        assert ended == {"first": "cancelled", "second": "done"}
        assert a.runner is None and b.runner is None
        runners.close()

    run(main())


def test_a_cancellation_the_attempt_lets_through_ends_it_not_the_runner() -> None:
    async def main() -> None:
        runners = Runners(on_error)
        a = Ex()
        waiting = asyncio.Event()

        async def attempt() -> None:
            waiting.set()
            await asyncio.sleep(60)

        async def after() -> None:
            ran.append(True)

        ran: list[bool] = []
        runners.submit(a, attempt(), contextvars.copy_context())
        await waiting.wait()
        cancel(a)
        await runners.ended()
        runners.submit(Ex(), after(), contextvars.copy_context())
        await runners.ended()
        assert ran == [True]
        runners.close()

    run(main())


def test_a_runner_cancelled_from_outside_stops() -> None:
    async def main() -> None:
        runners = Runners(on_error)
        a = Ex()
        waiting, out = asyncio.Event(), []

        async def attempt() -> None:
            waiting.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                out.append("cancelled")  # swallowed here: the runner must stop all the same

        runners.submit(a, attempt(), contextvars.copy_context())
        await waiting.wait()
        runner = a.runner
        assert runner is not None
        runner.cancel()  # not through the attempt: the loop closing, say
        with pytest.raises(asyncio.CancelledError):
            await runner
        assert out == ["cancelled"]

    run(main())


def test_what_an_attempt_raises_is_handed_on_and_the_runner_goes_on() -> None:
    async def main() -> None:
        raised: list[Exception] = []
        runners, a = Runners(lambda ex, exc: raised.append(exc)), Ex()

        async def breaks() -> None:
            await asyncio.sleep(0)
            raise KeyError("the worker's own bug")

        async def fine() -> None:
            raised.append(ValueError("ran"))

        runners.submit(a, breaks(), contextvars.copy_context())
        runners.submit(Ex(), fine(), contextvars.copy_context())
        await runners.ended()
        assert sorted(type(e).__name__ for e in raised) == ["KeyError", "ValueError"]
        runners.close()

    run(main())


def test_in_context_passes_values_and_errors_as_await_does() -> None:
    async def main() -> None:
        ctx = contextvars.copy_context()
        waits = []

        async def inner() -> None:
            var.set("inner")
            fut = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(fut.set_exception, KeyError("k"))
            with pytest.raises(KeyError):
                await fut
            await asyncio.sleep(0)
            assert var.get() == "inner"

        await InContext(inner(), ctx, lambda: waits.append(1))
        assert waits == [1]  # on_wait once, at the first wait
        assert ctx[var] == "inner" and var.get() == ""

    run(main())


def test_held_attempts_count_as_live_and_run_back_to_back_once_submitted() -> None:
    """`hold` counts attempts submitted later (a drain waits for them); `submit_held` queues
    them in one go and one runner runs them one after the other while none waits; `pulling`
    says an attempt has not waited yet."""
    async def main() -> None:
        runners, order, tasks = Runners(on_error), [], set()
        exs = [Ex() for _ in range(20)]
        pulled: list[bool] = []

        async def attempt(i: int) -> None:
            pulled.append(runners.pulling(exs[i]))
            order.append(i)
            tasks.add(asyncio.current_task())
            if i == 10:
                await asyncio.sleep(0)  # this one waits: it is no longer the puller's
                pulled.append(runners.pulling(exs[i]))

        runners.hold(20)
        ended = asyncio.ensure_future(runners.ended())
        await asyncio.sleep(0)
        assert not ended.done() and runners.live == 20  # nothing submitted, yet not ended
        runners.submit_held([(exs[i], attempt(i), contextvars.copy_context()) for i in range(20)])
        await asyncio.wait_for(ended, 30)
        assert order[:11] == list(range(11)) and sorted(order) == list(range(20))
        assert pulled == [True] * 20 + [False]  # the waiting one, after it waited
        assert len(tasks) == 2  # a second runner took over the queue when one waited
        assert not runners.pulling(Ex())  # an attempt not executing is no runner's
        runners.close()

    run(main())
