"""How long-lived asyncio loops pause and end: the worker's background loops (wake listener,
heartbeat, task publisher), and the async client's wait for a run (`await_result`,
duetime/client/runs.py), which has no closing event of its own: its caller's cancellation is
what ends it, so it looks for one swallowed after each Redis call (`cancelled`).

They end when the worker closes them (`Worker.run`, once the in-flight runs drained and the
reports went), and a cancellation alone is not a sure way to say so. On Python 3.11,
`asyncio.wait_for` returns the awaited call's result, not CancelledError, when a cancellation
reaches it in the moment between that call finishing and wait_for resuming -- and redis-py
sends a command through `asyncio.wait_for` when the client has a socket timeout, as the
worker's has (`process_kw`; duetime's connections skip it only for a write that cannot wait,
common/connection.py). A loop whose cancellation was lost so went on as if nothing had
happened (a 30 s sleep, the next PING) and the worker's shutdown, waiting for it, waited until
the next cancellation: the one of the test harness after 60 s, or none.

So each loop also watches the event `Worker.run` sets as it closes them (`closing`): its pauses
end at once when it is set (`pause`), its long waits on Redis are bounded (the socket timeout,
a 1 s read), and after one of them it looks at the event, and at whether its task was sent a
cancellation that the call swallowed (`cancelled`). `end` cancels the loops and waits for
them; one still running after END_WAIT_S is named in the log and cancelled again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

END_WAIT_S = 5.0  # a loop not ended this long after its cancellation is cancelled again


def cancelled() -> None:
    """Raise CancelledError when the current task was cancelled but what it awaited returned
    anyway (the cancellation swallowed on the way: `asyncio.wait_for` on Python 3.11)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def pause(closing: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds`, or less if `closing` is set meanwhile; → whether it is (the loop ends).
    A cancellation the task was sent, now or before (swallowed), raises CancelledError."""
    cancelled()
    if not closing.is_set() and seconds > 0:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await closing.wait()
    return closing.is_set()


async def end(tasks: list[asyncio.Task[Any]], log: Any, worker_id: str) -> None:
    """Cancel `tasks` and wait until every one has ended (what they raised is dropped, as
    `gather(..., return_exceptions=True)` would). One still running END_WAIT_S after its
    cancellation lost it: it is logged by name and cancelled again, until it ends."""
    for t in tasks:
        t.cancel()
    pending = {t for t in tasks if not t.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=END_WAIT_S)
        for t in pending:
            log.warning("a worker task did not end when cancelled; cancelling it again",
                        task=t.get_name(), waited_s=END_WAIT_S, worker_id=worker_id)
            t.cancel()
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" at exit


# a timer that fires this much after its time found the loop held (a task body that blocked
# it, a long pause), not a slow server: what arrived meanwhile is read before it runs
HELD_LOOP_S = 1.0


class HeldLoopTimer:
    """Cancels `task` once `bound` seconds passed on a loop free to run it: the timeout of a
    wait on Redis (a reply, a heartbeat). A timer that fires more than HELD_LOOP_S late was
    held up with the loop; asyncio handles the sockets' readiness before the timers of the
    same turn, so a reply that arrived while the loop was held is already on its way to its
    reader, and the timer is armed again for `bound` from now instead of throwing that reply
    away (`asyncio.timeout` counts wall time: it would)."""

    __slots__ = ("_loop", "_task", "_bound", "_handle", "fired")

    def __init__(self, task: asyncio.Task[Any], bound: float) -> None:
        self._loop, self._task, self._bound, self.fired = task.get_loop(), task, bound, False
        self._handle = self._arm()

    def _arm(self) -> asyncio.TimerHandle:
        due = self._loop.time() + self._bound
        return self._loop.call_at(due, self._expire, due)

    def _expire(self, due: float) -> None:
        if self._loop.time() - due > HELD_LOOP_S:
            self._handle = self._arm()
            return
        self.fired = True
        self._task.cancel()

    def timed_out(self) -> bool:
        """After a CancelledError: was it this timer's (and no other cancellation pending)?"""
        return self.fired and self._task.uncancel() == 0

    def cancel(self) -> None:
        self._handle.cancel()


@contextlib.asynccontextmanager
async def loop_timeout(seconds: float) -> AsyncIterator[None]:
    """`asyncio.timeout(seconds)` counting only time the loop was free (HeldLoopTimer):
    TimeoutError when the block had `seconds` of a free loop and did not finish."""
    task = asyncio.current_task()
    assert task is not None, "loop_timeout is for a task's own waits"
    timer = HeldLoopTimer(task, seconds)
    try:
        yield
    except asyncio.CancelledError:
        if timer.timed_out():
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()
