"""Execution: runs claimed attempts (async tasks on the loop, sync tasks in a thread pool),
turns how each ended into a report, and stops attempts whose lease is lost.

The life of one attempt: `start_batch` makes its Execution (`_begin`) and hands `_attempt` to
the runners (worker/runners.py: reused asyncio tasks, the attempt in a contextvars context of
its own); `_attempt` decodes it, runs the body, and turns how it ended into one report for the
reporter. `interrupt` cancels it where it waits.

A run claimed ahead of its due time is held (`_hold`) with every other run due at the same
instant: one task per instant waits for it (`_release`), then queues them all at once, their
payloads decoded while they waited. A body that returns without waiting leaves its
bookkeeping (out of `inflight`, counted, handed to the reporter) to `_settle_deferred`, which
does it for all such attempts once the ones queued with it have started: a herd of thousands
due at one instant starts every body before it reports any, at a few microseconds each.

In-flight state is kept per attempt, (run id, fence): a run can be claimed again while an
older attempt of it still executes here (its lease lapsed while the worker was stalled, and
the reaper retried it). Two attempts of one run never execute at once in one worker: the new
attempt holds its lease and waits for the old task body to end. If that body returned (and
never saw `lease_lost`), the work is done: the new attempt is acknowledged with that success
instead of doing the work a second time. Otherwise the new attempt runs the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import operator
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from duetime.common import metrics
from duetime.common.codec import pack_not_stored, pack_result, unpack_payload
from duetime.common.context import RunContext, set_current
from duetime.common.errors import Continue, Fatal, InvalidInput, RateLimited, Retry, UnknownTask
from duetime.common.logs import get as get_logger
from duetime.common.logs import run_binder
from duetime.common.models import from_ms
from duetime.common.names import check_name
from duetime.common.outcomes import FailMode, Outcome
from duetime.common.retrycost import ATTEMPT_ENDINGS
from duetime.common.tasks import Registry, TaskSpec
from duetime.common.time.parse import DELAY, duration_ms
from duetime.common.transitions import Claimed
from duetime.worker.checkpoints import Checkpoints
from duetime.worker.clock import ServerClock
from duetime.worker.config import WorkerConfig
from duetime.worker.errors import REDIS_ERRORS, frames_text, log_message, record_text
from duetime.worker.isolation import ProcessPool
from duetime.worker.middleware import attempt_hooks
from duetime.worker.reporter import Reporter
from duetime.worker.runners import Attempt, Runners
from duetime.worker.unknown import UnknownTasks

log = get_logger("duetime.worker")
# RunContext's first fields, in order: `_begin` passes them by position, once per run
_CONTEXT_FIELDS = ("run_id", "task", "queue", "attempt", "fence", "worker_id", "idempotency_key",
                   "scheduled_at", "schedule", "interval_start", "interval_end")
assert tuple(f.name for f in fields(RunContext))[:len(_CONTEXT_FIELDS)] == _CONTEXT_FIELDS
Held = tuple["Execution", Attempt, contextvars.Context]  # an attempt queued for the runners
_HELD = operator.itemgetter(0)  # (Held, Claimed) -> Held: a herd's queue built in C, not a loop
LEASE_LOST, UNRECORDED = Outcome.LEASE_LOST.value, Outcome.UNRECORDED.value
SUCCEEDED, FAILED, INTERRUPTED = ATTEMPT_ENDINGS
# the log fields of an attempt (structlog's context variables, common/logs.py): the worker's
# once per claimed batch, the run's in the attempt's own task, as its body starts
bind_worker = run_binder("worker_id")
bind_run = run_binder("run_id", "task", "attempt", "schedule")


@dataclass(slots=True, eq=False)
class Execution:
    """One attempt in this worker, from its claim until its report is handed to the reporter."""

    ctx: RunContext
    partition: int
    owner: str = ""  # the task's owner as this worker's code declares it ('' if none)
    # monotonic time its lease was last known good: the claim, then each heartbeat's sending.
    # A lease not renewed for a whole lease length may have expired (leases.py)
    renewed_at: float = field(default_factory=time.monotonic)
    bare: bool = False  # its claim said: no schedule, batch or limit slot (Claimed.bare)
    # (the five fields above come first: `_begin` passes them by position, once per run)
    runner: asyncio.Task[None] | None = None  # the task executing it, while it does (runners.py)
    cancels: int = 0  # cancellations sent to its runner for it (the runner takes them back)
    stopped: bool = False  # interrupted before a runner started it: it stops as it starts
    released: bool = False  # given back at shutdown
    cancel_requested: bool = False
    lost: bool = False  # its lease is known lost: no more heartbeats for it
    superseded: bool = False  # a later attempt of the run, claimed here, takes over its result
    after: Execution | None = None  # an older attempt whose body still runs here: wait for it
    in_body: bool = False  # the task body is executing (or queued for a thread)
    body_ok: bool | None = None  # the body returned (True) or raised (False)
    body_done: asyncio.Event | None = None  # made when a later attempt waits for this body
    result: bytes = b""  # the task's return value, packed to be stored on the run ('' = none)
    report_fault: str = ""  # what the first failed send of its report met ('' = none)
    hooked: Any = None  # its middleware state, once before_attempt ran (worker/middleware.py)
    # (task spec, args, kwargs) decoded while it was held for its due time (Executor._prepare)
    prepared: tuple[TaskSpec, list[Any], dict[str, Any]] | None = None
    bound: bool = False  # its context already names the run (current_run, log fields)
    # the due time (ms) it is held for, with others (Executor._hold); cleared just after its
    # group is released (Executor._after_release)
    held_at: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.ctx.run_id, self.ctx.fence)

    @property
    def token(self) -> str:
        return f"{self.ctx.worker_id}:{self.ctx.fence}"


def _bind(ctx: RunContext) -> None:
    """The calling context names the run: `current_run()` and the log fields."""
    set_current(ctx)
    bind_run(ctx.run_id, ctx.task, ctx.attempt, ctx.schedule)


class _TimedOut(Exception):  # noqa: N818 - internal signal, never leaves this module
    """The task exceeded its own timeout (unlike a TimeoutError the task itself raised)."""


class _NotStarted(Exception):  # noqa: N818 - internal signal, never leaves this module
    """Redis did not answer what the attempt needs before its body starts (its checkpoint):
    nothing ran, so the run goes back to its queue without spending an attempt."""


class Executor:
    def __init__(self, registry: Registry, clock: ServerClock, reporter: Reporter,
                 cfg: WorkerConfig, on_free: Callable[[], None]) -> None:
        self.registry, self.clock, self.reporter, self.cfg = registry, clock, reporter, cfg
        self.worker_id = cfg.worker_id
        self._on_free = on_free  # a slot is free: the claim loop may claim again
        self.pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="duetime-task")
        # the asyncio tasks attempts execute in (worker/runners.py)
        self.runners = Runners(on_error=self.failed)
        self.inflight: dict[tuple[str, int], Execution] = {}  # (run id, fence) -> attempt
        self._bodies: dict[str, Execution] = {}  # run id -> the attempt whose body runs here
        self._waiting: dict[str, Execution] = {}  # run id -> the attempt waiting for that body
        self.processed = 0
        self._owners: dict[str, str] = {}  # task -> its owner ('' if none), for the cost counts
        self._debug = log.is_enabled_for(logging.DEBUG)
        # runs of tasks not registered here: handed back while some worker knows them (the
        # Worker sets it; None: dead-lettered at once, as a bare Executor always did)
        self.unknown: UnknownTasks | None = None
        # child processes of tasks declared isolation="process" (the Worker sets it)
        self.processes: ProcessPool | None = None
        # checkpoints and continuations (worker/checkpoints.py; the Worker sets it; None: a
        # bare Executor, whose tasks cannot checkpoint)
        self.checkpoints: Checkpoints | None = None
        # the app's middleware (worker/middleware.py); None without any: nothing of it runs
        self.hooks = attempt_hooks(registry, self.worker_id, _TimedOut, reporter)
        # task -> the body seconds of its successful attempts not counted yet: counted in bulk
        # as the reporter's next flush begins (count_successes), before their outcome is sent
        self._succeeded: dict[str, list[float]] = {}
        reporter.before_flush = self.count_successes
        # runs claimed ahead of their due time, by that time (ready ms): each group is held by
        # one task (`_release`) and started at once, not by a timer and a runner per run
        self._holds: dict[float, dict[Execution, tuple[Held, Claimed]]] = {}  # in claim order
        self._hold_tasks: dict[float, asyncio.Task[None]] = {}  # ready ms -> its `_release`
        # successes whose body returned without waiting, their bookkeeping not done yet: done
        # in bulk right after the runs started with them (`_settle_deferred`), so a batch or a
        # herd starts every body before any of it. (execution, body seconds)
        self._deferred: list[tuple[Execution, float]] = []
        self._quiet = contextvars.Context()  # no run's log fields: for the bulk bookkeeping
        # called at the end of each claimed batch's attempts (the Worker sets it: Claimer.poke)
        self.on_batch_end: Callable[[], None] | None = None

    # -- starting -------------------------------------------------------------------------
    def start_batch(self, p: int, queue: str, runs: list[Claimed], now_ms: float) -> None:
        """Start the runs of one claim reply: each attempt is handed to the runners
        (worker/runners.py), which execute it in a contextvars context of its own, as a task
        of its own would, without making one per run. What is the same for the whole batch is
        done once: the worker's log field (each run's context is a copy of this one), the time
        the leases were taken, and the start delays of the runs that start at once, observed
        in bulk (the others, held for their due time or an earlier attempt, observe theirs when
        they start)."""
        bind_worker(self.worker_id)
        renewed = time.monotonic()
        early_ms = self.clock.error_ms - now_ms  # + a run's ready time: how long it waits
        submit, context = self.runners.submit, contextvars.copy_context
        hooks = self.hooks
        now: list[Claimed] = []  # the runs that start at once: their delays observed in bulk
        due_ms, scheduled_at = -1.0, None  # runs of a batch often share their due ms: one datetime
        # a first claim's checkpoints, bound if it ever writes one (Checkpoints.later)
        later = self.checkpoints.later(p) if self.checkpoints is not None else None
        for c in runs:
            if c.due_ms != due_ms:
                due_ms, scheduled_at = c.due_ms, from_ms(c.due_ms)
            ex = self._begin(p, queue, c, renewed, scheduled_at, later)
            # claimed ahead of its due time: it waits for it, plus the clock estimate's error
            # bound, so it never starts before its due time on the server's clock
            wait_s = (c.ready_ms + early_ms) / 1000
            if ex.after is not None:  # an earlier attempt still runs here: it waits for both
                observed = False
            elif wait_s > 0:  # held with the runs due at the same time, started with them
                attempt = self._attempt(ex, c, 0.0, True) if hooks is None else \
                    hooks.execute(ex, self._execute(ex, c, 0.0, True))
                self._hold(c, (ex, attempt, context()))
                continue
            else:
                observed = True
                now.append(c)
            if hooks is None:
                submit(ex, self._attempt(ex, c, wait_s, observed), context())
            else:
                submit(ex, hooks.execute(ex, self._execute(ex, c, wait_s, observed)), context())
        if now:
            _observe_delays(queue, now, now_ms)
        if self.on_batch_end is not None:
            submit(_Marker(), self._batch_end(self.on_batch_end), self._quiet.copy())

    async def _batch_end(self, then: Callable[[], None]) -> None:
        """Queued after a claimed batch's attempts: once they ran (or waited), the successes
        among them are settled and `then` (Claimer.poke) sends the next claim for their
        slots before the next batch's attempts run; then this yields, so the claim goes out
        now. Never raises: it is no attempt of a run."""
        try:
            self._settle_deferred()
            then()
        except Exception:  # noqa: BLE001 - the worker's own fault: logged, the loop goes on
            log.exception("worker failed at the end of a claimed batch", worker_id=self.worker_id)
        await asyncio.sleep(0)

    def _prepare(self, ex: Execution, c: Claimed, context: contextvars.Context) -> None:
        """What a held attempt would do first at its due time, done while it waits: its task
        found and its payload decoded (`Execution.prepared`), its checkpoints bound, and its
        own context made the run's (`_bind`: a herd of thousands spends none of its start on
        it). Only when all of it goes through and needs no Redis (a first claim): anything
        else, an error included, is met at the due time as it always was."""
        spec = self.registry.find(c.task)
        if c.damaged or spec is None or spec.fn is None or ex.ctx.fence != 1:
            return
        try:
            args, kwargs = unpack_payload(c.payload)
        except Exception:  # noqa: BLE001 - raised again, and judged, at its due time
            return
        ex.prepared = (spec, args, kwargs)  # a first claim: its checkpoints bind when written
        if self.hooks is None:  # middleware's before_attempt runs before the run is named
            context.run(_bind, ex.ctx)
            ex.bound = True

    def _hold(self, c: Claimed, held: Held) -> None:
        """Hold an attempt until its due time (`c.ready_ms`), with every other one due then:
        one task waits for each instant (`_release`), however many runs are due at it."""
        ex = held[0]
        self._prepare(ex, c, held[2])
        self.runners.hold(1)  # counted as live: a drain waits for it as for a running one
        at = c.ready_ms
        group = self._holds.get(at)
        if group is None:
            group = self._holds[at] = {}
            task = asyncio.get_running_loop().create_task(self._release(at, group),
                                                          name="duetime-hold")
            self._hold_tasks[at] = task
            task.add_done_callback(functools.partial(self._hold_ended, at))
        group[ex] = (held, c)
        ex.held_at = at

    def _hold_ended(self, at: float, task: asyncio.Task[None]) -> None:
        """The `_release` task of `at` ended: forgotten, unless a later group of the same
        instant (held between that release and now) has its own task there already."""
        if self._hold_tasks.get(at) is task:
            del self._hold_tasks[at]

    def _unhold(self, ex: Execution) -> None:
        """A held attempt stopped before its due time (a lost lease, a cancel request, the
        drain): it starts now, out of its group, and stops as it starts."""
        at, ex.held_at = ex.held_at, None
        group = self._holds.get(at) if at is not None else None
        item = group.pop(ex, None) if group is not None else None
        if item is not None:
            self.runners.submit_held([item[0]])
        if group is not None and not group and at is not None:  # nobody left to release
            del self._holds[at]
            task = self._hold_tasks.pop(at, None)
            if task is not None:
                task.cancel()

    async def _release(self, ready_ms: float,
                       group: dict[Execution, tuple[Held, Claimed]]) -> None:
        """Start the attempts of `group`, held for `ready_ms`, once the server clock has surely
        reached it (ServerClock.wait_until: never before): all queued in one go, so their
        bodies start one right after the other (a herd of thousands costs no task step, timer
        or metric per run before the last body started); the rest of the release (their start
        delays, `held_at` cleared) is done after that, in `_after_release`. Cancelled (the
        worker is draining), they start at once: each stops as it starts. Cancelled because
        its group emptied (`_unhold`), it releases nothing: a newer group held for the same
        instant meanwhile is that group's own task's to release, at the instant."""
        try:
            await self.clock.wait_until(ready_ms)
        finally:
            if self._holds.get(ready_ms) is group:
                del self._holds[ready_ms]
                self.runners.submit_held(list(map(_HELD, group.values())))
                asyncio.get_running_loop().call_soon(
                    self._after_release, group, self.clock.now_ms(), context=self._quiet)

    @staticmethod
    def _after_release(group: dict[Execution, tuple[Held, Claimed]], now_ms: float) -> None:
        """After a released group's bodies started: each is no longer held (until now a
        stale `held_at` only sent `_unhold` looking for a group that is gone), and their
        start delays are observed, by queue."""
        by_queue: dict[str, list[Claimed]] = {}
        for ex, (_, c) in group.items():
            ex.held_at = None
            by_queue.setdefault(ex.ctx.queue, []).append(c)
        for queue, runs in by_queue.items():
            _observe_delays(queue, runs, now_ms)

    def start(self, p: int, queue: str, c: Claimed, now_ms: float) -> None:
        """Start one claimed run (a batch of one)."""
        self.start_batch(p, queue, [c], now_ms)

    def _begin(self, p: int, queue: str, c: Claimed, renewed_at: float,
               scheduled_at: datetime | None,
               later: Callable[[RunContext], None] | None = None) -> Execution:
        """The attempt's in-flight state, in `inflight` from its claim on; `scheduled_at` is
        `c.due_ms` as a datetime (made by the caller, once for the runs that share it);
        `later` binds a first claim's checkpoints when it writes one (Checkpoints.later)."""
        # by position (_CONTEXT_FIELDS, checked at import): a third cheaper than by keyword
        ctx = RunContext(
            c.run_id, c.task, queue, c.attempt, c.fence, self.worker_id, c.key or c.run_id,
            scheduled_at, c.schedule,
            from_ms(c.interval_start) if c.interval_start else None,
            from_ms(c.interval_end) if c.interval_end else None,
            _bind_later=later if c.fence == 1 else None,
        )
        owner = self._owners.get(c.task)
        if owner is None:
            owner = self._owner(c.task)
        ex = Execution(ctx, p, owner, renewed_at, c.bare)
        self.inflight[(c.run_id, c.fence)] = ex
        if self._bodies:
            prev = self._bodies.get(c.run_id)
            if prev is not None:
                self._follow(ex, prev)
        if self._debug:
            log.debug("run started", run_id=c.run_id, task=c.task, attempt=c.attempt,
                      worker_id=self.worker_id, schedule=c.schedule, queue=queue, fence=c.fence)
        return ex

    def _follow(self, ex: Execution, prev: Execution) -> None:
        """`ex` is a new attempt of a run whose older attempt `prev` still executes here: the
        run was claimed again, so prev's lease is gone. ex keeps its own lease and waits."""
        ctx = ex.ctx
        older = self._waiting.get(ctx.run_id)
        if older is not None:  # claimed a third time meanwhile: the waiting one lost its lease
            self.lose(older, "the run was claimed again")
        self._waiting[ctx.run_id] = ex
        ex.after = prev
        if prev.body_done is None:
            prev.body_done = asyncio.Event()
        if self.inflight.get(prev.key) is prev and not prev.lost:
            # its lease lapsed (a stalled worker, Redis refusing heartbeats); the run is still
            # this worker's, under the new fence: the body goes on and ex takes its result
            prev.lost = prev.superseded = True
            metrics.LEASES_LOST.inc()
            log.warning("lease lost; the run was claimed again by this worker", run_id=ctx.run_id,
                        task=ctx.task, attempt=prev.ctx.attempt, worker_id=self.worker_id,
                        schedule=ctx.schedule, fence=prev.ctx.fence)
        else:
            prev.superseded = True
        log.warning("run claimed again while an earlier attempt still runs here; waiting for it",
                    run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt, worker_id=self.worker_id,
                    schedule=ctx.schedule, running_attempt=prev.ctx.attempt)

    # -- executing ------------------------------------------------------------------------
    async def _execute(self, ex: Execution, c: Claimed, wait_s: float, observed: bool) -> None:
        """With middleware: the attempt, a failure of the worker's own code handled (`failed`)
        before the after_attempt hooks that wrap this see it ended. Without middleware, the
        runner calls `failed` itself (worker/runners.py): one coroutine less per run."""
        try:
            await self._attempt(ex, c, wait_s, observed)
        except Exception as exc:  # noqa: BLE001 - the worker's own failure: never unlogged
            self.failed(ex, exc)

    def failed(self, ex: Execution, exc: Exception) -> None:
        """Nothing raised in an attempt is ever lost. A failure of the worker's own code
        before the outcome was handed to the reporter is logged with the run id and reported
        as the attempt's failure (a retry, with that error on the attempt); after the
        hand-over, it is logged and the outcome handed over stands."""
        ctx = ex.ctx
        handed = ex.key in self.reporter.unsent
        log.error("worker failed while executing an attempt", run_id=ctx.run_id,
                  task=ctx.task, attempt=ctx.attempt, worker_id=self.worker_id,
                  schedule=ctx.schedule, error=f"{type(exc).__name__}: {str(exc)[:300]}",
                  outcome_reported=handed, traceback=frames_text(exc))
        if handed or ex.lost or ex.superseded:
            return
        try:
            self.reporter.fail(ex, f"worker error while executing the attempt: "
                                   f"{type(exc).__name__}: {str(exc)[:500]}", "error", 0)
        except Exception as again:  # noqa: BLE001 - the lease lapses; the reaper retries
            log.error("attempt outcome could not be handed to the reporter; the run is "
                      "retried when its lease expires", run_id=ctx.run_id, task=ctx.task,
                      attempt=ctx.attempt, worker_id=self.worker_id,
                      error=f"{type(again).__name__}: {str(again)[:300]}")

    async def _attempt(self, ex: Execution, c: Claimed, wait_s: float, observed: bool) -> None:
        """One attempt from its claim to its report: wait for its due time (or an earlier
        attempt of the run still executing here), decode, run the body, then turn how it ended
        into a report. `observed`: its start delay was observed with its batch's."""
        ctx = ex.ctx
        report: str | None = "complete"
        mode: FailMode = "error"
        err, exc_type, delay_ms, frames = "", "", 0, ""
        limited: RateLimited | None = None
        not_started = False  # Redis did not answer before the body started (_NotStarted)
        continued: Continue | None = None
        ran = False
        deferred = False  # a success whose bookkeeping is left to _settle_deferred
        started = 0.0  # when its body began (perf_counter): read only once `ran`
        try:
            if ex.stopped:  # interrupted before it started: as if cancelled right away
                raise asyncio.CancelledError
            if wait_s > 0:  # claimed ahead: held to its due time (sub-ms, worker/clock.py)
                await self.clock.wait_until(c.ready_ms)
            if ex.after is not None and await self._after_previous(ex):
                return  # the earlier attempt's success stands for this one (reported there)
            started = time.perf_counter()
            if not observed:
                self._observe_delay(c, ctx.queue)
            prepared = ex.prepared
            if prepared is not None:  # decoded while it was held for its due time (_prepare)
                spec, args, kwargs = prepared
            else:
                if c.damaged:
                    raise Fatal(c.damaged)
                spec = self.registry.get(ctx.task)
                try:
                    args, kwargs = unpack_payload(c.payload)
                except Exception as exc:  # noqa: BLE001 - it will never decode: no retry
                    raise Fatal(f"payload unreadable (not duetime's msgpack [args, kwargs]): "
                                f"{exc!r}") from None
                # current_run().checkpoint_state of a later claim: the run's checkpoint, read
                # from Redis (a first claim has none: bound if it writes one, `_begin`; a
                # bare Executor's tasks cannot checkpoint)
                if self.checkpoints is not None and ctx.fence != 1:
                    try:
                        await self.checkpoints.prepare(ex)
                    except REDIS_ERRORS as exc:
                        raise _NotStarted(f"{type(exc).__name__}: {exc}") from None
            ran = True
            timeout = c.timeout_ms / 1000 or None
            fn = spec.fn
            if self.hooks is None and spec.is_async and spec.isolation != "process" \
                    and fn is not None:
                # _call's async path, inline: one coroutine less on every run's path
                self._enter_body(ex)
                ok = False
                try:
                    if timeout is None:
                        value = await fn(*args, **kwargs)
                    else:
                        value = await _within(timeout, fn(*args, **kwargs))
                    ok = True
                finally:
                    self._body_ended(ex, ok)
            elif self.hooks is None:
                value = await self._call(ex, spec, args, kwargs, timeout)
            else:  # middleware: before_attempt, then the body (worker/middleware.py)
                value = await self.hooks.around(
                    ex, c, args, kwargs, lambda: self._call(ex, spec, args, kwargs, timeout))
            if value is not None and spec.store_result:
                ex.result = self._pack(ex, value)
            if self.hooks is None and self.runners.pulling(ex):
                # the body returned without waiting: the rest is bookkeeping, done in bulk once
                # the attempts queued after this one have started too (_settle_deferred)
                deferred = True
                self._defer(ex, time.perf_counter() - started)
                return
        except _NotStarted as exc:  # nothing ran: back to its queue, no attempt spent
            # handback.lua, not release.lua: the body never started, so a non-idempotent run
            # goes back too (a release would make it uncertain), and no attempt entry is written
            report, not_started = "handback", True
            log.warning("run given back: redis did not answer before its body started",
                        run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                        worker_id=self.worker_id, error=str(exc)[:300])
        except UnknownTask as exc:
            report, mode, exc_type = "fail", "fatal", "UnknownTask"
            err = f"{exc}; worker {self.worker_id} cannot run it"
            if self.unknown is not None and not _valid_task_name(ctx.task):
                # no worker can ever publish a task by this name (empty, or a character a name
                # refuses): a damaged record, dead-lettered now instead of handed back for the
                # rolling deploy's grace period
                err = f"{exc}; the run's task name is not a valid task name (damaged record?)"
            elif self.unknown is not None:  # a rolling deploy: back for a worker that knows it
                try:
                    reason = await self.unknown.verdict(ctx.task, c.due_ms)
                except asyncio.CancelledError:  # stopping meanwhile: it goes back all the same
                    reason = None
                if reason is None:
                    report = "handback"
                else:
                    err = f"{reason}; worker {self.worker_id} cannot run it"
        except RateLimited as exc:  # back-pressure: back to its queue, its scope held
            report, limited = "rate_limited", exc
        except Continue as exc:  # the same run again, from its checkpoint (checkpoints.py)
            report, continued = "continue", exc
        except Retry as exc:
            report, mode, err, exc_type = "fail", "retry", str(exc), type(exc).__name__
            delay_ms, bad = _retry_delay_ms(exc)
            if bad:  # a Retry subclass that skipped Retry.__init__: a plain failure
                mode, err = "error", f"{err} ({bad})"
        except Fatal as exc:
            report, mode, err, exc_type = "fail", "fatal", record_text(exc), type(exc).__name__
            frames = frames_text(exc)
        except _TimedOut:
            report, exc_type = "fail", "TimeoutError"
            err = f"TimeoutError: task exceeded its timeout of {c.timeout_ms / 1000:g}s"
            ctx.mark_lost()
        except asyncio.CancelledError:
            # lease lost (another worker may own the run: report nothing), released at
            # shutdown, or stopped on a cancel request
            if ex.lost:
                report = None
            elif ex.released:
                report = "release"
            elif ex.cancel_requested:
                report, mode, exc_type = "fail", "cancel", "CancelledError"
                err = "cancelled on request while running"
            else:  # cancelled from outside (the loop is closing): the reaper will recover it
                report = None
            if ex.after is not None and self._waiting.get(ctx.run_id) is ex:
                self.interrupt(ex.after)  # the run stops here: so does the body it waited for
        except Exception as exc:  # noqa: BLE001 - any task error is a retryable failure
            report, err, exc_type = "fail", record_text(exc), type(exc).__name__
            frames = frames_text(exc)
        finally:
            if not deferred:
                del self.inflight[(ctx.run_id, ctx.fence)]
                if self._waiting and self._waiting.get(ctx.run_id) is ex:
                    del self._waiting[ctx.run_id]
                self._on_free()
        if report == "handback":  # nothing ran: no attempt, no cost
            if not not_started:
                assert self.unknown is not None
                self.unknown.handed_back += 1
                log.info("run of a task this worker does not know handed back",
                         run_id=ctx.run_id, task=ctx.task, worker_id=self.worker_id,
                         queue=ctx.queue)
            self.reporter.hand_back(ex)
            return
        try:
            self.processed += 1
            elapsed = time.perf_counter() - started if ran else 0.0
            if report == "complete" and ran:  # counted in bulk (count_successes)
                seconds = self._succeeded.get(ctx.task)
                if seconds is None:
                    seconds = self._succeeded[ctx.task] = []
                seconds.append(elapsed)
            else:
                if ran:
                    metrics.child(metrics.EXECUTION, ctx.task).observe(elapsed)
                self._cost(ex, report, mode, elapsed)
        except Exception as exc:  # noqa: BLE001 - counting must not change the outcome
            log.error("worker failed counting an attempt; its outcome is reported as decided",
                      run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                      worker_id=self.worker_id, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            if report == "fail":
                err = f"{err} (and the worker failed counting it: {type(exc).__name__}: {exc})"
        if report is None or ex.superseded:
            # nothing to report: the lease was lost (a later attempt claimed here may report),
            # or the loop is being torn down (the reaper will recover the run)
            label = LEASE_LOST if ex.lost or ex.superseded else UNRECORDED
            metrics.child(metrics.RUNS_FINISHED, ctx.task, label).inc()
            return
        if report == "complete":
            if self._debug:
                log.debug("run succeeded", run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                          worker_id=self.worker_id, schedule=ctx.schedule,
                          duration_s=round(time.perf_counter() - started, 6))
            self.reporter.complete(ex)
        elif report == "release":
            self.reporter.release(ex)
        elif report == "rate_limited":
            self._rate_limited(ex, limited)
        elif report == "continue" and continued is not None:
            self.reporter.continue_run(ex, getattr(continued, "state_bytes", None),
                                       _continue_delay_ms(continued))
        else:
            # the exception's type, and its message bounded (or withheld: it may quote arguments)
            text = log_message(err, self.cfg.log_error_text)
            extra = {"error": text} if text is not None else {}
            if frames:
                extra["traceback"] = frames
            log.warning("run failed", run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                        worker_id=self.worker_id, schedule=ctx.schedule, mode=mode,
                        error_type=exc_type, **extra)
            self.reporter.fail(ex, err, mode, delay_ms)

    def _defer(self, ex: Execution, elapsed: float) -> None:
        """Leave a success's bookkeeping to `_settle_deferred`, called once the attempts that
        run in this step of the loop have (the next step: a batch's, or a herd's)."""
        if not self._deferred:
            asyncio.get_running_loop().call_soon(self._settle_deferred, context=self._quiet)
        self._deferred.append((ex, elapsed))

    def _settle_deferred(self) -> None:
        """The bookkeeping of successes whose body returned without waiting, as `_attempt`
        does it for the others (in the same order: out of `inflight`, counted, handed to the
        reporter), for all of them at once: so a claimed batch, or a herd released at its
        instant, starts every body before it reports any, and frees its slots in one wake-up.
        A failure here is the worker's own, handled per attempt as in `_attempt` (`failed`)."""
        if not self._deferred:  # settled already (at a batch's end)
            return
        done, self._deferred = self._deferred, []
        inflight, succeeded, debug = self.inflight, self._succeeded, self._debug
        try:
            for ex, elapsed in done:
                ctx = ex.ctx
                try:
                    del inflight[(ctx.run_id, ctx.fence)]
                    if self._waiting and self._waiting.get(ctx.run_id) is ex:
                        del self._waiting[ctx.run_id]
                    self.processed += 1
                    seconds = succeeded.get(ctx.task)
                    if seconds is None:
                        seconds = succeeded[ctx.task] = []
                    seconds.append(elapsed)
                    if ex.superseded:  # a later attempt claimed here reports for it
                        metrics.child(metrics.RUNS_FINISHED, ctx.task, LEASE_LOST).inc()
                        continue
                    if debug:
                        log.debug("run succeeded", run_id=ctx.run_id, task=ctx.task,
                                  attempt=ctx.attempt, worker_id=self.worker_id,
                                  schedule=ctx.schedule, duration_s=round(elapsed, 6))
                    self.reporter.complete(ex)
                except Exception as exc:  # noqa: BLE001 - the worker's own failure: never lost
                    self.failed(ex, exc)
        finally:
            self._on_free()

    def _observe_delay(self, c: Claimed, queue: str) -> None:
        """The start delay of a run that waited before it started (start_batch observes the
        others, in bulk)."""
        delay = max(0.0, (self.clock.now_ms() - c.ready_ms) / 1000)
        if c.limited_by:
            # a limit held it back on purpose: its wait is not the queue's delay
            metrics.child(metrics.LIMITED_DELAY, queue).observe(delay)
        else:
            metrics.child(metrics.QUEUE_DELAY, queue).observe(delay)
        if c.attempt == 1 and not c.limited_by:
            # a first attempt is claimable from its scheduled time: lateness = queue delay
            metrics.child(metrics.START_LATENESS, queue).observe(delay)

    def _rate_limited(self, ex: Execution, exc: RateLimited | None) -> None:
        """RateLimited: the run given back and its scope held (rate_limited.lua)."""
        assert exc is not None
        ctx = ex.ctx
        metrics.child(metrics.RATE_LIMITED, ctx.task, exc.scope).inc()
        log.info("run rate limited: given back, its scope held", run_id=ctx.run_id,
                 task=ctx.task, attempt=ctx.attempt, worker_id=self.worker_id, scope=exc.scope,
                 retry_after_ms=exc.retry_after_ms)
        self.reporter.rate_limited(ex, exc.retry_after_ms, exc.scope)

    def _owner(self, task: str) -> str:
        owner = self._owners.get(task)
        if owner is None:
            spec = self.registry.find(task)
            owner = self._owners[task] = (spec.owner or "") if spec is not None else ""
        return owner

    def count_successes(self) -> None:
        """Count the successful attempts gathered since the last call, once per task: their
        execution times (one bulk histogram observation), the succeeded attempts and the
        retry-cost ledger, as `_cost` does for each other ending, one attempt at a time."""
        if not self._succeeded:
            return
        done, self._succeeded = self._succeeded, {}
        for task, seconds in done.items():
            owner = self._owner(task)
            metrics.observe_many(metrics.child(metrics.EXECUTION, task), seconds)
            metrics.child(metrics.ATTEMPTS, task, owner, SUCCEEDED).inc(len(seconds))
            self.reporter.ledger.add(task, owner, SUCCEEDED, 0.0, len(seconds))

    def _cost(self, ex: Execution, report: str | None, mode: FailMode, elapsed: float) -> None:
        """Count the attempt for the cost of retries (metrics, and `<ns>:cost` through the
        reporter): succeeded (the body returned), failed, or interrupted (lease lost,
        cancelled, released); time spent on the ones that did not succeed."""
        task, owner = ex.ctx.task, ex.owner
        if report in ("complete", "continue"):  # a continuation's slice of work was done
            ending = SUCCEEDED
        elif report == "fail" and mode != "cancel":
            ending = FAILED
        else:
            ending = INTERRUPTED
        metrics.child(metrics.ATTEMPTS, task, owner, ending).inc()
        if ending != SUCCEEDED:
            metrics.child(metrics.FAILED_ATTEMPT_SECONDS, task, owner).inc(elapsed)
        self.reporter.ledger.add(task, owner, ending, elapsed)

    async def _after_previous(self, ex: Execution) -> bool:
        """Wait for the earlier attempt's body; True when its success stands for `ex` (then
        reported here), False when `ex` must run the task itself."""
        prev, ctx = ex.after, ex.ctx
        assert prev is not None and prev.body_done is not None
        await prev.body_done.wait()
        if prev.body_ok and not prev.ctx.lost_seen:
            log.info("late success of an earlier attempt completes this one", run_id=ctx.run_id,
                     task=ctx.task, attempt=ctx.attempt, worker_id=self.worker_id,
                     schedule=ctx.schedule, earlier_attempt=prev.ctx.attempt)
            ex.result = prev.result
            self.reporter.complete(ex)
            return True
        log.info("earlier attempt ended without a usable result; running this one",
                 run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt, worker_id=self.worker_id,
                 schedule=ctx.schedule, earlier_attempt=prev.ctx.attempt)
        return False

    def _pack(self, ex: Execution, value: Any) -> bytes:
        """The return value as stored on the run; one that cannot be stored (too large, not
        msgpack) is said in the log (never its content) and the run succeeds with the reason
        stored in its place: `wait` raises ResultNotStored saying why, never returns None."""
        try:
            return pack_result(value, self.cfg.max_result)
        except Exception as exc:  # noqa: BLE001 - InvalidInput, or a failing __str__/default
            why = str(exc) if isinstance(exc, InvalidInput) else f"{type(exc).__name__}: {exc}"
            log.warning("result not stored", run_id=ex.ctx.run_id, task=ex.ctx.task,
                        attempt=ex.ctx.attempt, worker_id=self.worker_id, why=why[:200])
            return pack_not_stored(why)

    async def _call(self, ex: Execution, spec: TaskSpec, args: list[Any], kwargs: dict[str, Any],
                    timeout: float | None) -> Any:
        """Run the task body; → its return value. While it runs, `_bodies` names its attempt: a
        later attempt of the run claimed meanwhile waits for it (`_follow`)."""
        assert spec.fn is not None  # a task registered with this worker has its function
        self._enter_body(ex)
        if spec.isolation == "process":
            return await self._isolated(ex, spec, args, kwargs, timeout)
        if spec.is_async:
            ok = False
            try:
                if timeout is None:
                    value = await spec.fn(*args, **kwargs)
                else:
                    value = await _within(timeout, spec.fn(*args, **kwargs))
                ok = True
            finally:
                self._body_ended(ex, ok)
            return value
        cv = contextvars.copy_context()
        fut = asyncio.get_running_loop().run_in_executor(self.pool, _run_in, cv, spec.fn, args, kwargs)
        try:
            if timeout is None:
                value = await asyncio.shield(fut)
            else:
                value = await _within(timeout, asyncio.shield(fut))
        except BaseException:
            # a thread cannot be killed: after a timeout (the task is told through lease_lost)
            # or a cancellation the body counts as running here until its thread returns
            if fut.done():
                self._body_ended(ex, False)
            else:
                fut.add_done_callback(lambda f: self._thread_ended(ex, f))
            raise
        self._body_ended(ex, True)
        return value

    async def _isolated(self, ex: Execution, spec: TaskSpec, args: list[Any],
                        kwargs: dict[str, Any], timeout: float | None) -> None:
        """Process isolation (worker/isolation.py): the body runs in a child process, killed
        past the timeout, the memory cap, or when the attempt is stopped; it has ended (the
        child is idle or gone) when this returns or raises. The result, packed in the child,
        is stored as it came (→ None: nothing left for _attempt to pack)."""
        ok = False
        try:
            if self.processes is None:
                raise Fatal(f"task {spec.name!r} runs in a child process, but this worker has "
                            "no process pool (it was built without Worker)")
            result, why = await self.processes.call(ex.ctx, spec.name, args, kwargs, timeout,
                                                    spec.store_result)
            if why is not None:
                log.warning("result not stored", run_id=ex.ctx.run_id, task=ex.ctx.task,
                            attempt=ex.ctx.attempt, worker_id=self.worker_id, why=why[:200])
                ex.result = pack_not_stored(why)
            elif result is not None and spec.store_result:
                ex.result = result
            ok = True
        finally:
            self._body_ended(ex, ok)

    def _thread_ended(self, ex: Execution, fut: Any) -> None:
        """A sync body that outlived its attempt (timeout, cancellation) returned at last: a
        later attempt waiting for it may take its result."""
        ok = not fut.cancelled() and fut.exception() is None
        if ok and fut.result() is not None and self.registry.find(ex.ctx.task) is not None \
                and self.registry.get(ex.ctx.task).store_result:
            ex.result = self._pack(ex, fut.result())
        self._body_ended(ex, ok)

    def _enter_body(self, ex: Execution) -> None:
        """The body is about to run, in the attempt's context: `current_run()` and the log
        fields are the run's, and `_bodies` names its attempt (a later attempt of the run
        claimed meanwhile waits for it, `_follow`)."""
        ctx = ex.ctx
        if not ex.bound:
            _bind(ctx)
        self._bodies[ctx.run_id] = ex
        ex.in_body = True

    def _body_ended(self, ex: Execution, ok: bool) -> None:
        ex.in_body = False
        ex.body_ok = ok
        if self._bodies.get(ex.ctx.run_id) is ex:
            del self._bodies[ex.ctx.run_id]
        if ex.body_done is not None:
            ex.body_done.set()

    # -- stopping attempts ----------------------------------------------------------------
    def lose(self, ex: Execution, why: str) -> None:
        """The lease of `ex` is lost: stop it (once), and say so."""
        if ex.lost:
            return
        ex.lost = True
        metrics.LEASES_LOST.inc()
        ctx = ex.ctx
        log.warning("lease lost; stopping the run", run_id=ctx.run_id, task=ctx.task,
                    attempt=ctx.attempt, worker_id=self.worker_id, schedule=ctx.schedule,
                    fence=ctx.fence, why=why)
        self.interrupt(ex)

    def cancel(self, ex: Execution) -> None:
        ctx = ex.ctx
        log.info("cancel requested; stopping the run", run_id=ctx.run_id, task=ctx.task,
                 attempt=ctx.attempt, worker_id=self.worker_id, schedule=ctx.schedule)
        ex.cancel_requested = True
        self.interrupt(ex)

    def interrupt(self, ex: Execution) -> None:
        """An attempt not yet in its body, or in an async body, is cancelled; a sync task's
        thread cannot be: it is told through lease_lost."""
        ex.ctx.mark_lost()
        if not ex.in_body or self._is_async(ex):
            self._cancel(ex)

    def _cancel(self, ex: Execution) -> None:
        """Cancel the attempt where it waits: its runner is only ever suspended inside it (one
        not started yet stops as it starts; one ended is left alone)."""
        if ex.runner is not None:
            ex.cancels += 1
            ex.runner.cancel()
        else:
            ex.stopped = True
            if ex.held_at is not None:  # held for its due time: stopped now, not then
                self._unhold(ex)

    def _is_async(self, ex: Execution) -> bool:
        """An async body, or one in a child process (killed when cancelled): stoppable."""
        spec = self.registry.find(ex.ctx.task)
        return spec is not None and (spec.is_async or spec.isolation == "process")

    # -- shutdown -------------------------------------------------------------------------
    async def drain(self, grace_s: float) -> None:
        """Let in-flight attempts finish within the grace period, then release the rest."""
        if self.inflight:
            log.info("waiting for in-flight runs", count=len(self.inflight), grace_s=grace_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.runners.ended(), grace_s)
        leftovers = list(self.inflight.values())
        for ex in leftovers:
            ex.released = True
            ex.ctx.mark_lost()
            self._cancel(ex)  # a sync body too: its attempt stops waiting for the thread
        for task in list(self._hold_tasks.values()):  # held ones start (and stop) now
            task.cancel()
        if leftovers:
            await self.runners.ended()
            log.info("releasing unfinished runs", count=len(leftovers))

    def shutdown(self) -> None:
        for task in list(self._hold_tasks.values()):
            task.cancel()
        self.runners.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.processes is not None:
            self.processes.close()


class _Marker:
    """What the runners need of an Execution, for `_batch_end` (not an attempt of a run)."""

    __slots__ = ("runner", "cancels")

    def __init__(self) -> None:
        self.runner: asyncio.Task[None] | None = None
        self.cancels = 0


def _observe_delays(queue: str, runs: list[Claimed], now_ms: float) -> None:
    """The start delays of runs starting now (`now_ms`, server clock), in bulk: the queue's
    delay and, for first attempts, the start lateness; a run a limit held back on purpose
    counts as limited instead."""
    delays: list[float] = []
    limited: list[float] = []
    firsts: list[float] = []
    for c in runs:
        delay = (now_ms - c.ready_ms) / 1000
        if delay < 0:
            delay = 0.0
        if c.limited_by:  # a limit held it back on purpose: not the queue's delay
            limited.append(delay)
        else:
            delays.append(delay)
            if c.attempt == 1:  # claimable from its scheduled time: lateness = delay
                firsts.append(delay)
    for metric, values in ((metrics.QUEUE_DELAY, delays), (metrics.LIMITED_DELAY, limited),
                           (metrics.START_LATENESS, firsts)):
        if values:
            metrics.observe_many(metrics.child(metric, queue), values)


def _valid_task_name(name: str) -> bool:
    """Whether `name` is one `@app.task` would accept (common/names.py)."""
    try:
        check_name("task", name)
    except InvalidInput:
        return False
    return True


def _retry_delay_ms(exc: Retry) -> tuple[int, str]:
    """The delay a Retry asks for, in ms, and '' (or why it cannot be used). Retry() parses
    it when made; a subclass that never called Retry.__init__ is read with the same parser."""
    ms = getattr(exc, "delay_ms", None)
    if isinstance(ms, int) and not isinstance(ms, bool):
        return ms, ""
    delay = getattr(exc, "delay", None)
    if delay is None:
        return 0, ""
    try:
        return duration_ms(DELAY.parse(delay, "Retry(delay=...)")), ""
    except InvalidInput as bad:
        return 0, str(bad)


def _continue_delay_ms(exc: Continue) -> int:
    """The delay a Continue asks for, in ms (0 for a subclass that skipped its __init__)."""
    ms = getattr(exc, "delay_ms", 0)
    return ms if isinstance(ms, int) and not isinstance(ms, bool) and ms >= 0 else 0


async def _within(timeout: float, aw: Any) -> Any:
    """Await `aw` for at most `timeout` s; _TimedOut when the time ran out (a TimeoutError
    the task raised itself stays a TimeoutError: a failure like any other)."""
    try:
        async with asyncio.timeout(timeout) as cm:
            return await aw
    except TimeoutError:
        if cm.expired():
            raise _TimedOut() from None
        raise


def _run_in(cv: contextvars.Context, fn: Callable[..., Any], args: list[Any],
            kwargs: dict[str, Any]) -> Any:
    return cv.run(fn, *args, **kwargs)

