"""Runs held for their due time, grouped by instant (worker/execution.py `_hold`, `_release`,
`_hold_ended`), driven on an event loop with a clock the test moves: no server, no sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from duetime.common.codec import pack_payload
from duetime.common.keys import Keyspace
from duetime.common.transitions import Claimed
from duetime.worker.clock import ServerClock
from duetime.worker.config import WorkerConfig
from duetime.worker.execution import Executor
from duetime.worker.reporter import Reporter

import duetime

AT = 1_000_000.0  # the instant both runs are due at (server ms)


async def _steps(n: int = 1) -> None:
    """Let the loop take `n` steps. No time passes: nothing here waits on a timer or a
    socket, so what a step does is fixed, whatever the machine's load."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _steps_until(cond: Callable[[], object], limit: int = 100) -> None:
    """Let the loop take steps until `cond()` holds; a bound on the steps, not on time."""
    for _ in range(limit):
        if cond():
            return
        await _steps()
    raise AssertionError(f"not after {limit} steps of the loop")


def _executor(app: duetime.App, clock: ServerClock) -> Executor:
    """An executor with no server behind it: its runs report to a reporter nobody flushes."""
    return Executor(app.registry, clock, Reporter(None, None, Keyspace("holds"), "w"),  # type: ignore[arg-type]
                    WorkerConfig(queues=["default"], concurrency=4), on_free=lambda: None)


def _clock(wall: list[float], pauses: list[asyncio.Future[None]]) -> ServerClock:
    """A server clock reading `wall` (seconds), whose every wait ends only when the test
    resolves the future it appends to `pauses`."""

    async def pause(_: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        pauses.append(fut)
        await fut

    return ServerClock(wall=lambda: wall[0], pause=pause, fine=pause)


def _claimed(run_id: str) -> Claimed:
    return Claimed(run_id, 1, 1, "holds.t", pack_payload([], {}), AT, 0, True, None, None, AT)


def test_a_group_held_again_at_an_instant_just_released_keeps_its_own_release_task() -> None:
    """A run held for an instant whose group was just released (the clock estimate moved
    back by a resync, say) makes a new group and a new release task at that instant. The
    ended task of the first group must not take the new one out of the executor's table:
    a drain cancels the tasks in that table, so a task missing from it would go on waiting
    while the worker stops."""
    app = duetime.App()
    wall = [0.0]  # seconds, local; the server clock is this (offset 0)
    pauses: list[asyncio.Future[None]] = []
    holder: list[Executor] = []
    seen: list[Any] = []

    @app.task(name="holds.t")
    async def body() -> None:
        run_id = duetime.current_run().run_id
        if run_id == "r1":  # the first group's body: the clock steps back, r2 is held at AT
            wall[0] = 0.0
            holder[0].start_batch(0, "default", [_claimed("r2")], 0.0)
            seen.append(holder[0]._hold_tasks.get(AT))

    async def main() -> None:
        ex = _executor(app, _clock(wall, pauses))
        holder.append(ex)
        ex.start_batch(0, "default", [_claimed("r1")], 0.0)
        first = ex._hold_tasks[AT]
        await _steps_until(lambda: pauses)  # the first release task waits for the instant
        wall[0] = AT / 1000 + 1.0  # the instant has passed
        pauses.pop().set_result(None)
        await _steps_until(lambda: first.done() and seen)  # the release, r1's body, its end
        await _steps(3)  # and the first task's done callback
        [second] = seen  # r2's release task, made in r1's body
        assert second is not None and second is not first and not second.done()
        assert ex._hold_tasks.get(AT) is second  # still known: a drain would cancel it
        ex.shutdown()  # cancels the held group's task, as a drain does
        await _steps_until(second.done)

    asyncio.run(main())


def test_a_group_held_where_a_cancelled_one_emptied_is_not_released_before_its_instant() -> None:
    """The only run held for an instant is cancelled (its group empties, its release task is
    cancelled), and in the same step another run is held for that instant (a new group, a
    new task). The cancelled task must not release the new group as it ends: that would
    start the new run before its due time. It waits for the instant with its own task."""
    app = duetime.App()
    wall = [0.0]  # well before AT, and it stays there: no pause is ever ended
    pauses: list[asyncio.Future[None]] = []
    started: list[str] = []

    @app.task(name="holds.t")
    async def body() -> None:
        started.append(duetime.current_run().run_id)

    async def main() -> None:
        ex = _executor(app, _clock(wall, pauses))
        ex.start_batch(0, "default", [_claimed("r1")], 0.0)
        first = ex._hold_tasks[AT]
        await _steps_until(lambda: pauses)  # r1's release task waits for the instant
        ex.cancel(ex.inflight[("r1", 1)])  # its group empties; its task is cancelled
        ex.start_batch(0, "default", [_claimed("r2")], 0.0)  # a new group at the same instant
        await _steps_until(first.done)
        await _steps(5)  # what the old code did next: the cancelled task released r2
        assert started == []  # r1 stopped as it started; r2 still waits for AT
        assert [e.ctx.run_id for e in ex._holds[AT]] == ["r2"]
        second = ex._hold_tasks[AT]
        assert not second.done()
        ex.shutdown()
        await _steps_until(second.done)

    asyncio.run(main())
