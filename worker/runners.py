"""Runners: the asyncio tasks attempts execute in, reused from one attempt to the next, so a
claimed batch does not cost an asyncio task (its scheduling, its registration) per run.

An attempt is queued when claimed; one runner at a time, the *puller*, takes attempts off the
queue and executes them one after the other. While an attempt only computes (a body that
returns without awaiting anything that waits), the next one starts right after it, in the same
step of the event loop: a batch of no-op runs is one task's work. The moment an attempt waits
(I/O, a sleep, its due time, a thread), its runner stops pulling and another runner takes over
the queue (woken if idle, made if none is, never more than the worker's concurrency since
every queued attempt holds a slot): attempts run side by side exactly when they wait, as
one task each would.

What a task of its own gave each attempt, a runner gives it too:
- its own `contextvars` context: every step of the attempt runs in a context made for it
  (`current_run()`, the log fields, whatever the body sets), never the runner's nor another
  attempt's (`InContext`);
- cancellation: the attempt's runner is cancelled, and the cancellation is delivered where
  the attempt waits (a runner is only ever suspended inside the attempt it executes); once
  the attempt ended, the runner takes the cancellations it was sent back (`Task.uncancel`),
  so the next attempt starts with none pending, and `asyncio.timeout` in a body works on the
  runner as it did on a task of its own;
- `asyncio.current_task()` in a body is its runner: the same task for each attempt it
  executes (a body that kept per-task state keyed by it would see it reused).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any

Attempt = Coroutine[Any, Any, None]
_UNSTARTED: Any = object()  # InContext's `first` when the caller took no step of the coroutine


class InContext:
    """`await InContext(coro, context, on_wait)`: run `coro` to its end with each step in
    `context`; `on_wait()` is called the first time it waits (yields to the event loop).
    What the awaiting task is sent or thrown (a wake-up, a cancellation) goes to `coro`, as
    `await coro` would pass it. With `first`, the caller took coro's first step itself (in
    `context`), which waited and yielded `first`, and called on_wait: this goes on from there."""

    __slots__ = ("coro", "context", "on_wait", "first")

    def __init__(self, coro: Attempt, context: contextvars.Context,
                 on_wait: Callable[[], None], first: Any = _UNSTARTED) -> None:
        self.coro, self.context, self.on_wait, self.first = coro, context, on_wait, first

    def __await__(self) -> Generator[Any, Any, None]:
        run, send, throw = self.context.run, self.coro.send, self.coro.throw
        yielded = self.first
        if yielded is _UNSTARTED:  # (a wait may yield None: asyncio.sleep(0) does)
            try:
                yielded = run(send, None)
            except StopIteration:
                return
            self.on_wait()
        while True:
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # noqa: BLE001 - handed to the attempt, as await does
                value, error = None, exc
            try:
                yielded = run(send, value) if error is None else run(throw, error)
            except StopIteration:
                return


class Runners:
    """The queue of attempts and the runners executing them (see the module's docstring)."""

    def __init__(self, on_error: Callable[[Any, Exception], None]) -> None:
        # what an attempt raised (not a cancellation): the worker's own failure, never lost
        self._on_error = on_error
        self._queue: collections.deque[tuple[Any, Attempt, contextvars.Context]] = \
            collections.deque()
        self._idle: list[asyncio.Future[None]] = []  # idle runners, each awaiting its wake-up
        self._tasks: set[asyncio.Task[None]] = set()
        self._puller: asyncio.Task[None] | None = None  # the runner taking from the queue
        self.live = 0  # attempts queued or executing
        self._ended = asyncio.Event()  # set whenever live falls to 0

    def submit(self, ex: Any, attempt: Attempt, context: contextvars.Context) -> None:
        """Queue `attempt` (of Execution `ex`), to run in `context`."""
        self._queue.append((ex, attempt, context))
        self.live += 1
        if self._puller is None:
            self._wake()

    def hold(self, n: int) -> None:
        """`n` attempts will be submitted later (`submit_held`): they count as live from now,
        so `ended` waits for them too (attempts held for their due time, worker/execution.py)."""
        self.live += n

    def submit_held(self, items: list[tuple[Any, Attempt, contextvars.Context]]) -> None:
        """Queue attempts counted by `hold`, in one go: the puller then runs them one after
        the other, as long as none waits."""
        if items:
            self._queue.extend(items)
            if self._puller is None:
                self._wake()

    def pulling(self, ex: Any) -> bool:
        """The attempt of `ex` has not waited yet: its runner is still the one pulling the
        queue (the next queued attempt starts only once it has ended or waited)."""
        return ex.runner is not None and ex.runner is self._puller

    async def ended(self) -> None:
        """Until no attempt is queued or executing."""
        while self.live:
            self._ended.clear()
            await self._ended.wait()

    def close(self) -> None:
        """Stop the runners (at shutdown: every attempt has ended)."""
        for task in list(self._tasks):
            task.cancel()

    def _wake(self) -> None:
        """A runner becomes the puller: an idle one, else a new one."""
        while self._idle:
            fut = self._idle.pop()
            if not fut.done():
                fut.set_result(None)
                self._puller = _PENDING
                return
        task = asyncio.get_running_loop().create_task(self._run(), name="duetime-runner")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._puller = _PENDING

    def _waited(self) -> None:
        """The puller's attempt waits: another runner takes over the queue."""
        self._puller = None
        if self._queue:
            self._wake()

    async def _run(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            if self._puller is _PENDING or self._puller is None:
                self._puller = me
            if self._puller is not me or not queue:
                if self._puller is me:
                    self._puller = None
                fut = loop.create_future()
                self._idle.append(fut)
                await fut  # a cancellation here (shutdown, the loop closing) ends the runner
                continue
            ex, attempt, context = queue.popleft()
            ex.runner = me
            try:
                try:  # its first step, taken here: most attempts end in it (no InContext)
                    yielded = context.run(attempt.send, None)
                except StopIteration:
                    pass
                else:  # it waits: another runner takes over the queue, this one goes on
                    self._waited()
                    await InContext(attempt, context, self._waited, yielded)
            except asyncio.CancelledError:
                if not ex.cancels:  # not sent to the attempt: the runner itself is stopped
                    raise
            except Exception as exc:  # noqa: BLE001 - handed on, with the attempt it ended
                self._on_error(ex, exc)
            finally:
                ex.runner = None
                self.live -= 1
                if not self.live:
                    self._ended.set()
            while ex.cancels:  # the attempt's own cancellations, delivered: not the runner's
                ex.cancels -= 1
                if me.cancelling():
                    me.uncancel()
            if me.cancelling():  # cancelled from outside meanwhile (the loop is closing)
                raise asyncio.CancelledError


class _Pending:
    """A runner was woken to pull: the first to run claims the queue."""


_PENDING: Any = _Pending()
