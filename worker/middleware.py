"""The worker's side of middleware (common/middleware.py): `before_attempt` and
`after_attempt` around each attempt's task body, `on_dead` / `on_uncertain` when this worker's
report ended the run so.

Made only when the app has middleware with worker hooks (`attempt_hooks` returns None
otherwise): a worker without middleware runs none of this. The executor's call sites are two:
`around` wraps the task body (worker/execution.py `_attempt`), `execute` wraps the whole
attempt (`Executor.start_batch`); the reporter calls `ended` with what a script decided.

When each hook runs, and why there:
- `before_attempt(run)`: in the attempt's own context (its runner task, worker/runners.py),
  just before the body starts (after the wait for its due time, the payload decoded), so a
  context it sets (a tracing span) is the body's: an async body runs in that context, a sync
  body's thread gets a copy of it.
  One that raises fails the attempt with its error; the body does not run.
- `after_attempt(run, outcome, error)`: in the same task, once the attempt's outcome was handed
  to the reporter: its lease is renewed until the outcome is recorded, so a slow hook can never
  let the lease lapse nor change what is reported. Called for every attempt `before_attempt`
  was called for (an attempt refused before its body, a damaged record, a payload that does
  not decode, a task this worker does not know, gets neither; its dead letter reaches
  `on_dead`).
- `on_dead(run)`, `on_uncertain(run)`: when the reply of this worker's report says so, in a
  task of their own, after that attempt's `after_attempt` ended. Deaths the reaper decides (a
  lease that expired on the last attempt) happen in the scheduler's process, which runs no
  middleware: those are seen in the events stream, `duetime dead` and the dead-letter metric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from duetime.common import middleware as mw
from duetime.common.middleware import Chain, RunInfo, decode_headers
from duetime.common.outcomes import Outcome
from duetime.common.tasks import Registry
from duetime.common.transitions import Claimed

if TYPE_CHECKING:
    from duetime.worker.execution import Execution
    from duetime.worker.reporter import Reporter


@dataclass(slots=True, eq=False)
class Hooked:
    """One attempt's middleware state (Execution.hooked)."""

    info: RunInfo
    ok: bool = False  # the body returned
    error: BaseException | None = None  # what the body (or a before_attempt hook) raised
    # after_attempt has run (made only when on_dead / on_uncertain hooks wait for it)
    done: asyncio.Event | None = None


class AttemptHooks:
    def __init__(self, chain: Chain, worker_id: str, timed_out: type[BaseException]) -> None:
        self.chain, self.worker_id, self._timed_out = chain, worker_id, timed_out
        self._before, self._after = chain.hooks["before_attempt"], chain.hooks["after_attempt"]
        self._ends = chain.has("on_dead", "on_uncertain")
        self._pending: set[asyncio.Task[None]] = set()  # on_dead / on_uncertain calls running

    def info(self, ex: Execution, c: Claimed | None, args: Any = (), kwargs: Any = None) -> RunInfo:
        ctx = ex.ctx
        return RunInfo(
            run_id=ctx.run_id, task=ctx.task, queue=ctx.queue, attempt=ctx.attempt,
            schedule=ctx.schedule, tenant=(c.tenant or None) if c is not None else None,
            owner=ex.owner or None, headers=decode_headers(c.headers if c is not None else None),
            idempotency_key=ctx.idempotency_key, scheduled_at=ctx.scheduled_at,
            worker_id=self.worker_id, args=args, kwargs=kwargs if kwargs is not None else {})

    async def around(self, ex: Execution, c: Claimed, args: Any, kwargs: Any,
                     body: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """before_attempt, then the task body; what either raised is kept for after_attempt."""
        st = ex.hooked = Hooked(self.info(ex, c, args, kwargs))
        if self._ends:
            st.done = asyncio.Event()
        try:
            if self._before:
                await self.chain.acall("before_attempt", ex.ctx.run_id, ex.ctx.task, st.info,
                                       reraise=True)
            value = await body()
        except BaseException as exc:
            st.error = exc
            raise
        st.ok = True
        return value

    async def execute(self, ex: Execution, attempt: Coroutine[Any, Any, None]) -> None:
        """The attempt's task: the attempt, then its after_attempt hooks (once its outcome was
        handed over), in the same task, so a context before_attempt set is theirs too."""
        try:
            await attempt
        finally:
            st = ex.hooked
            if st is not None:
                try:
                    if self._after:
                        outcome, error = self._outcome(ex, st)
                        await self.chain.acall("after_attempt", ex.ctx.run_id, ex.ctx.task,
                                               st.info, outcome, error)
                finally:
                    if st.done is not None:
                        st.done.set()

    def _outcome(self, ex: Execution, st: Hooked) -> tuple[str, BaseException | None]:
        err = st.error
        if ex.lost or ex.superseded:
            return mw.LEASE_LOST, err
        if st.ok:
            return mw.SUCCEEDED, None
        if isinstance(err, asyncio.CancelledError):
            if ex.released:
                return mw.RELEASED, None
            if ex.cancel_requested:
                return mw.CANCELLED, None
            return mw.INTERRUPTED, None
        if isinstance(err, self._timed_out):
            return mw.FAILED, TimeoutError("task exceeded its timeout")
        return mw.FAILED, err

    # -- what the scripts decided --------------------------------------------------------
    def ended(self, ex: Execution, label: str, error: str | None) -> None:
        """The reporter's reply for `ex` was dead or uncertain: the hooks, in a task of their
        own (the reporter never waits for them), after this attempt's after_attempt."""
        hook = "on_dead" if label == Outcome.DEAD else "on_uncertain"
        if not self.chain.hooks[hook]:
            return
        task = asyncio.get_running_loop().create_task(self._ended(ex, hook, error))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _ended(self, ex: Execution, hook: str, error: str | None) -> None:
        st = ex.hooked
        if st is not None:
            if st.done is not None:
                await st.done.wait()
            info = st.info
        else:
            info = self.info(ex, None)
        info.error = error
        await self.chain.acall(hook, ex.ctx.run_id, ex.ctx.task, info)

    async def drain(self) -> None:
        """At shutdown, after the last report: the on_dead / on_uncertain calls still running."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


def attempt_hooks(registry: Registry, worker_id: str, timed_out: type[BaseException],
                  reporter: Reporter) -> AttemptHooks | None:
    """The worker's hooks, wired to the reporter; None when no middleware has worker hooks."""
    chain = registry.middleware
    if not chain.for_worker:
        return None
    hooks = AttemptHooks(chain, worker_id, timed_out)
    if chain.has("on_dead", "on_uncertain"):
        reporter.on_ended = hooks.ended
    return hooks
