"""The worker: claims due runs in batches, executes them, heartbeats their leases and reports
outcomes — one asyncio loop per process, sync tasks in a thread pool.

This module wires the parts and owns the lifecycle (start, stop, drain, shutdown):
  due.DueTimes       what is due when, per (partition, queue)
  wake.WakeListener  pub/sub notices that a run became a set's earliest
  claims.Claimer     sleeps until something is due, claims it, starts it
  execution.Executor runs attempts, one at a time per run, and turns endings into reports
  reporter.Reporter  sends outcomes in batches; counts what the scripts decided
  leases.LeaseKeeper heartbeats; stops attempts whose lease is lost or run is cancelled

Wake-ups are precise: the worker knows the earliest due time of every (partition, queue) it
serves and sleeps until then; the periodic refresh is only a safety net for lost notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import signal
from typing import Any

import redis
import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common.connection import async_client, process_kw, unavailable
from duetime.common.context import set_worker_context
from duetime.common.errors import WorkerStartFailed
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.loops import end as end_tasks
from duetime.common.scripts import Scripts
from duetime.common.tasks import Registry, WorkerContext
from duetime.worker.checkpoints import Checkpoints
from duetime.worker.claims import Claimer
from duetime.worker.clock import ServerClock
from duetime.worker.config import WorkerConfig, default_worker_id
from duetime.worker.due import DueTimes
from duetime.worker.errors import REDIS_ERRORS
from duetime.worker.execution import Execution, Executor
from duetime.worker.isolation import ProcessPool
from duetime.worker.leases import LeaseKeeper
from duetime.worker.reporter import Reporter
from duetime.worker.unknown import UnknownTasks
from duetime.worker.wake import WakeListener

log = get_logger("duetime.worker")

SUBSCRIBE_WAIT_S = 10.0
GC_YOUNG_THRESHOLD = 20_000  # allocations between young-generation collections (default 700)

__all__ = ["Worker", "WorkerConfig", "default_worker_id"]


def tune_gc() -> None:
    """The garbage collector tuned for a process that is a worker (`duetime worker`): what was
    built at start-up (imports, the app, the registry) is frozen out of every later collection,
    and young collections come every GC_YOUNG_THRESHOLD allocations rather than 700. Each run
    makes a few dozen short-lived objects (its claim, context, task, report), so by default a
    young collection ran every few runs and scanned the runs in flight each time (about a tenth
    of the worker's CPU in `bench.throughput`); reference cycles are still collected."""
    gc.freeze()
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), *older)


class Worker:
    def __init__(self, registry: Registry, url: str, keys: Keyspace, config: WorkerConfig) -> None:
        config.validate()  # the config may have been changed since it was made
        self.registry, self.url, self.keys, self.cfg = registry, url, keys, config
        self.id = config.worker_id
        self.client: aredis.Redis = async_client(url, **process_kw())  # bounded waits
        self.scripts = Scripts(self.client)
        self.clock = ServerClock()
        self._wake = asyncio.Event()  # something for the claim loop to look at
        self._stopping = asyncio.Event()
        # set once the in-flight runs drained and the reports went: the background loops end
        # (common/loops.py; the heartbeat keeps the leases until then)
        self._closing = asyncio.Event()
        self.ready = asyncio.Event()  # running, and wake notices reach us
        self.due = DueTimes(keys, config.queues, self.id, on_earlier=self._wake.set,
                            weights=config.queue_weights)
        self.reporter = Reporter(self.client, self.scripts, keys, self.id)
        self.executor = Executor(registry, self.clock, self.reporter, config, on_free=self._wake.set)
        self.claimer = Claimer(self.client, self.scripts, keys, config, self.due, self.clock,
                               self.executor, self._wake)
        self.executor.on_batch_end = self.claimer.poke
        self.leases = LeaseKeeper(self.client, self.scripts, keys, config, self.executor)
        self.unknown = UnknownTasks(self.client, keys, registry, self.clock,
                                    config.unknown_task_grace_ms, self.id)
        self.executor.unknown = self.unknown
        # child processes for tasks declared isolation="process" (None: no such task)
        self.executor.processes = ProcessPool.for_worker(registry, config, url, keys.namespace)
        self.executor.checkpoints = Checkpoints(self.client, self.scripts, keys, self.id,
                                                config.lease_ms)
        self.reporter.processed = lambda: self.executor.processed  # published as runs finish
        self.reporter.record_ttl_ms = config.lease_ms * 3  # as the heartbeat's record
        self.listener = WakeListener(self.client, keys.wake_channel, self.due, self.id)
        self.context = WorkerContext(worker_id=self.id)  # what start hooks give tasks
        set_worker_context(self.context)

    async def _run_hooks(self, hooks: list[Any], kind: str, stop_on_error: bool) -> None:
        """Lifecycle hooks, sync or async, in registration order, with the worker's context. A
        start hook that raises stops the worker before it claims anything."""
        for hook in hooks:
            name = getattr(hook, "__qualname__", repr(hook))
            try:
                result = hook(self.context)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                if stop_on_error:
                    raise WorkerStartFailed(f"{kind} hook {name} failed: "
                                            f"{type(exc).__name__}: {exc}") from exc
                log.exception(f"{kind} hook failed", hook=name, worker_id=self.id)

    @property
    def inflight(self) -> dict[tuple[str, int], Execution]:
        return self.executor.inflight

    @property
    def processed(self) -> int:
        return self.executor.processed

    def stop(self) -> None:
        if not self._stopping.is_set():
            log.info("worker stopping", worker_id=self.id, inflight=len(self.inflight))
        self._stopping.set()
        self._wake.set()
        metrics.health.ready("worker", False, "stopping")

    async def run(self, handle_signals: bool = True, until_idle: bool = False) -> None:
        """Serve until `stop()` (SIGTERM/SIGINT when `handle_signals`), then let in-flight runs
        finish within the grace period, release the rest and report everything.

        `until_idle` (burst mode, `duetime worker --burst`): also stop, cleanly, once the worker
        is idle: no attempt of its own running or waiting for its due time, every outcome
        recorded by the scripts, and no run of its queues due now (within claim-ahead), as
        read from the due and retry sets' heads after its last report. Runs due later are not
        waited for, retries due now are (a retry's backoff makes it due later: not waited
        for); a run a limit holds back is due when the claim says the limit may free; runs
        other workers hold, and leases the reaper has yet to recover, are not waited for. A
        (partition, queue) whose reads Redis refuses is never known idle: the worker keeps
        trying it, as it would serving."""
        try:
            await self.clock.sync(self.client)
            await self.due.refresh(self.client)
        except REDIS_ERRORS as exc:
            raise unavailable(self.url, exc) from None
        try:
            await self.unknown.publish()  # before the first claim: runs of these tasks stay
        except redis.exceptions.OutOfMemoryError as exc:
            # at maxmemory the worker still starts (docs/states.md); its tasks are published
            # again every SEEN_EVERY_S, and runs it does not know are only handed back meanwhile
            log.warning("redis is at maxmemory: this worker's tasks not published yet",
                        worker_id=self.id, error=str(exc)[:200])
        except REDIS_ERRORS as exc:
            raise unavailable(self.url, exc) from None
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                    loop.add_signal_handler(sig, self.stop)
        await self._run_hooks(self.registry.on_start, "on_worker_start", stop_on_error=True)
        log.info("worker started", worker_id=self.id, queues=self.cfg.queues,
                 concurrency=self.cfg.concurrency, lease_ms=self.cfg.lease_ms,
                 partitions=self.keys.partitions)
        background = [
            asyncio.create_task(self.listener.run(self._closing), name="duetime-wake"),
            asyncio.create_task(self.leases.run(self._closing), name="duetime-heartbeat"),
            asyncio.create_task(self.unknown.run(self._closing), name="duetime-task-seen"),
        ]
        reporter = asyncio.create_task(self.reporter.run(), name="duetime-report")
        try:
            # claim only once wake notices can reach us (a notice sent earlier would be lost)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listener.subscribed.wait(), SUBSCRIBE_WAIT_S)
            self.ready.set()
            if until_idle:
                self.reporter.on_recorded = self._wake.set  # idle may follow a report
            await self.claimer.run(self._stopping, until_idle=until_idle)
            if until_idle and not self._stopping.is_set():
                log.info("worker idle; stopping (burst)", worker_id=self.id,
                         processed=self.processed)
            await self.executor.drain(self.cfg.grace_s)
            self.reporter.close()
            await reporter
            if self.executor.hooks is not None:  # on_dead / on_uncertain of the last reports
                await self.executor.hooks.drain()
        finally:
            # each loop ends on `_closing` even if the cancellation does not reach it (a Redis
            # call can swallow one: common/loops.py)
            self._closing.set()
            await end_tasks([reporter, *background], log, self.id)
            await self.leases.deregister()
            await self._run_hooks(self.registry.on_stop, "on_worker_stop", stop_on_error=False)
            self.executor.shutdown()
            await self.client.aclose()
            log.info("worker stopped", worker_id=self.id, processed=self.processed)
