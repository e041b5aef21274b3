"""The reporter: sends attempt outcomes to the scripts in batches and counts what the scripts
decided.

Every report waiting when a flush starts goes in one pipeline: successes as one complete.lua
call per partition, failures and releases one call each. The script's reply is the outcome
(`common.outcomes`): `duetime_runs_finished_total{outcome}` counts replies, not requests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.codec import CHECKPOINT_MAX_BYTES
from duetime.common.connection import arefresh_topology, topology_error
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.metrics import RUNS_FINISHED, child
from duetime.common.outage import TOPOLOGY_CAP_S, Outage
from duetime.common.outcomes import LABELS, FailMode, Outcome, Report
from duetime.common.retrycost import Ledger
from duetime.common.retrycost import commands as cost_commands
from duetime.common.scripts import Scripts
from duetime.worker.errors import REDIS_ERRORS
from duetime.worker.unknown import HANDBACK_FIRST_MS, HANDBACK_LONGEST_MS

if TYPE_CHECKING:
    from duetime.worker.execution import Execution

log = get_logger("duetime.worker")

# (report, execution, fail arguments: error text, mode, delay ms)
Item = tuple[Report, "Execution", tuple[Any, ...]]
REFUSED_PAUSE_S = (0.05, 5.0)  # pause after Redis refused reports: doubling from, up to
SHUTDOWN_TRIES_S = 10.0  # at shutdown, reports Redis will not take are given up after this
_NO_ARGS: tuple[Any, ...] = ()
SUCCEEDED = Outcome.SUCCEEDED.value
# what release.lua stores as an uncertain run's reason; an operator decides whether it ran
UNCERTAIN_REASON = "interrupted by worker shutdown; task is not idempotent"
COST_EVERY_S = 1.0  # retry-cost counts go to Redis at most this often (common/retrycost.py)


class Reporter:
    def __init__(self, client: aredis.Redis, scripts: Scripts, keys: Keyspace, worker_id: str) -> None:
        self.client, self.scripts, self.keys, self.worker_id = client, scripts, keys, worker_id
        # reports handed over and not taken by a flush yet (None: `close` was called); a plain
        # deque, with one future to wake the loop when it waits, since each run puts one:
        # asyncio.Queue's bookkeeping (unfinished tasks, its event, its getters) cost a
        # microsecond per run for nothing the reporter uses
        self._items: collections.deque[Item | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        # a second at most: outcomes on a failed-over primary go to its replica soon after
        self._outage = Outage("reporter", log, cap_s=1.0, worker_id=worker_id)
        self._pause = 0.0  # before the next try of reports that did not go through
        # attempts whose outcome is not recorded yet: the lease keeper renews their leases
        # until it is, or a refused report (Redis at maxmemory) would let the reaper run the
        # finished work again
        self.unsent: dict[tuple[str, int], Execution] = {}
        # attempts counted here, not yet added to `<ns>:cost`; sent with the reports
        self.ledger = Ledger()
        self._cost_at = 0.0  # monotonic time the counts last went
        self._closing = False
        self.recorded = 0  # report calls the scripts answered (burst mode: work done)
        self.on_recorded: Callable[[], None] | None = None  # called after reports were answered
        # a report's reply ended the run dead or uncertain: (execution, outcome, error text);
        # set when middleware has on_dead / on_uncertain hooks (worker/middleware.py)
        self.on_ended: Callable[[Execution, str, str | None], None] | None = None
        # the worker's count of finished attempts, written to its record (`duetime workers`)
        # with each flush of reports, so it does not lag a heartbeat behind the runs' states;
        # the record expires as the heartbeat's does (record_ttl_ms)
        self.processed: Callable[[], int] | None = None
        self.record_ttl_ms = 0
        # called as each flush begins: the executor counts the successes it gathered, so an
        # attempt is in the metrics before its outcome is recorded (Executor.count_successes)
        self.before_flush: Callable[[], None] | None = None

    def pending(self) -> bool:
        """Reports handed over whose outcome is not recorded yet."""
        return bool(self.unsent) or bool(self._items)

    # -- what the executions call ---------------------------------------------------------
    def _put(self, item: Item | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:  # the loop waits for a report: wake it (once)
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def complete(self, ex: Execution) -> None:
        self.unsent[ex.key] = ex
        self._put(("complete", ex, _NO_ARGS))

    def fail(self, ex: Execution, error: str, mode: FailMode, delay_ms: int = 0) -> None:
        self.unsent[ex.key] = ex
        self._put(("fail", ex, (error, mode, delay_ms)))

    def release(self, ex: Execution) -> None:
        self.unsent[ex.key] = ex
        self._put(("release", ex, _NO_ARGS))

    def hand_back(self, ex: Execution) -> None:
        """A run given back before its body started (handback.lua): of a task this worker does
        not know (worker/unknown.py), or one whose start Redis did not answer."""
        self.unsent[ex.key] = ex
        self._put(("handback", ex, _NO_ARGS))

    def rate_limited(self, ex: Execution, retry_after_ms: int, scope: str) -> None:
        """A run whose task raised RateLimited: given back, `scope` held (rate_limited.lua)."""
        self.unsent[ex.key] = ex
        self._put(("rate_limited", ex, (retry_after_ms, scope)))

    def continue_run(self, ex: Execution, state: bytes | None, delay_ms: int) -> None:
        """The task raised Continue: the same run again after delay_ms, from `state` (None:
        the checkpoint it has), the attempt not counted (continue_run.lua)."""
        self.unsent[ex.key] = ex
        self._put(("continue", ex, (state, delay_ms)))

    def close(self) -> None:
        """No more reports: `run` ends once the waiting ones are sent (or given up)."""
        self._put(None)

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Sends what is waiting as one pipeline. Reports that did not go through (Redis away,
        or refusing: OOM, READONLY) go again after a pause, with whatever came meanwhile; after
        `close`, they are tried for SHUTDOWN_TRIES_S more, then given up (the reaper recovers
        runs whose outcome was never recorded)."""
        carry: list[Item] = []
        closed_at: float | None = None
        while closed_at is None or (carry and time.monotonic() - closed_at < SHUTDOWN_TRIES_S):
            if carry:
                await asyncio.sleep(self._pause)
            elif self.ledger:  # counts waiting: they go within COST_EVERY_S, reports or not
                await self._arrival(COST_EVERY_S)
            else:
                await self._arrival(None)
            batch = list(self._items)
            self._items.clear()
            if None in batch and closed_at is None:
                closed_at = time.monotonic()
                self._closing = True
            items = carry + [b for b in batch if b is not None]
            if items or self._cost_due():
                try:
                    carry = await self.flush(items)
                except Exception as exc:  # noqa: BLE001 - a fault of the worker's own code
                    carry = await self._isolate(items, exc)
            else:
                carry = []
        if self.ledger:  # the last counts, once (reports given up above are not retried here)
            with contextlib.suppress(*REDIS_ERRORS):
                self._closing = True
                await self.flush([])
        if carry:
            for _, ex, _ in carry:
                self.unsent.pop(ex.key, None)
                child(RUNS_FINISHED, ex.ctx.task, Outcome.UNRECORDED.value).inc()
            log.error("outcomes not recorded: Redis did not take them before shutdown",
                      runs=[ex.ctx.run_id for _, ex, _ in carry][:20], count=len(carry),
                      worker_id=self.worker_id)

    async def _arrival(self, timeout: float | None) -> None:
        """Until a report is waiting, or `timeout` s passed (if not None). The timeout is a
        timer resolving the same future a report does: `asyncio.wait_for` would wrap it in a
        task of its own, at ~3x the cost, and the loop waits about once per flush."""
        if self._items:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _isolate(self, items: list[Item], exc: Exception) -> list[Item]:
        """A flush failed with an error that is not Redis's (a fault in duetime's own code, or
        in a value of one report): logged with the run ids, then each report is sent alone, so
        one bad report cannot hold back the others nor stop the reporter. A report that fails
        alone too goes once more in its simplest form (a success without its result, with the
        reason stored in its place; a failure with a plain error text); one that still fails
        is given up and logged: its lease lapses and the reaper retries the run."""
        log.error("outcome reports failed inside the worker; sending them one by one",
                  runs=[ex.ctx.run_id for _, ex, _ in items][:20], count=len(items),
                  error=f"{type(exc).__name__}: {str(exc)[:300]}", worker_id=self.worker_id)
        carry: list[Item] = []
        for item in items:
            kind, ex, extra = item
            sent = False
            for first in (True, False):
                attempt = item if first else self._simplest(item, exc)  # built only if needed
                if attempt is None:
                    break
                try:
                    carry += await self.flush([attempt])
                    sent = True
                    break
                except Exception as again:  # noqa: BLE001 - said below, per run
                    exc = again
            if not sent:
                self.unsent.pop(ex.key, None)
                child(RUNS_FINISHED, ex.ctx.task, Outcome.UNRECORDED.value).inc()
                log.error("outcome not recorded: it could not be sent; the run is retried when "
                          "its lease expires", run_id=ex.ctx.run_id, task=ex.ctx.task,
                          attempt=ex.ctx.attempt, report=kind, worker_id=self.worker_id,
                          error=f"{type(exc).__name__}: {str(exc)[:300]}")
        return carry

    @staticmethod
    def _simplest(item: Item, exc: Exception) -> Item | None:
        from duetime.common.codec import pack_not_stored

        kind, ex, extra = item
        why = f"the worker could not report it: {type(exc).__name__}: {str(exc)[:200]}"
        if kind == "complete":
            ex.result = pack_not_stored(why)
            return item
        if kind == "fail":
            return ("fail", ex, (f"worker error while reporting the attempt: {why}",
                                 "error", extra[2] if len(extra) > 2 else 0))
        return None

    def _cost_due(self) -> bool:
        return bool(self.ledger) and (self._closing
                                      or time.monotonic() - self._cost_at >= COST_EVERY_S)

    async def flush(self, batch: list[Item]) -> list[Item]:
        """One pipeline for the batch (and the retry-cost counts, when due); returns the
        reports to send again."""
        if self.before_flush is not None:
            try:
                self.before_flush()
            except Exception as exc:  # noqa: BLE001 - counting must not change an outcome
                log.error("worker failed counting attempts; their outcomes are reported as "
                          "decided", runs=[ex.ctx.run_id for _, ex, _ in batch][:20],
                          worker_id=self.worker_id,
                          error=f"{type(exc).__name__}: {str(exc)[:300]}")
        successes: dict[int, list[Execution]] = {}
        others: list[Item] = []
        for item in batch:
            if item[0] == "complete":
                successes.setdefault(item[1].partition, []).append(item[1])
            else:
                others.append(item)
        cost: dict[tuple[str, str], list[int]] = {}
        try:
            pipe = self.client.pipeline(transaction=False)
            n_record = 0
            if batch and self.processed is not None:
                # before the scripts: a run read as finished is already counted
                record = self.keys.worker(self.worker_id)
                pipe.hset(record, "processed", self.processed())
                pipe.pexpire(record, self.record_ttl_ms)
                n_record = 2
            for p, exs in successes.items():
                keys, args = tr.complete(self.keys, p, [
                    (ex.ctx.run_id, ex.ctx.fence, ex.result, ex.report_fault, ex.bare, ex.ctx.attempt)
                    for ex in exs])
                await self.scripts.complete(keys=keys, args=args, client=pipe)
            for item in others:
                await self._call(pipe, item)
            cost = self.ledger.take() if self._cost_due() else {}
            for cmd in cost_commands(self.keys, cost, time.time() * 1000):
                pipe.execute_command(*cmd)
            if not batch and not cost:
                return []
            self._cost_at = time.monotonic()
            results = await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            # keep the outcomes: a late report is still judged by its fence. The scripts may
            # have committed before the connection failed: the resent success records the
            # fault on its attempt (complete.lua), so it is not only in this process's log
            fault = f"the report was sent again after {type(exc).__name__}: {str(exc)[:200]}"
            for kind, ex, _ in batch:
                if kind == "complete" and not ex.report_fault:
                    ex.report_fault = fault
            log.warning("outcome reports not acknowledged; sending them again",
                        runs=[ex.ctx.run_id for _, ex, _ in batch][:20], count=len(batch),
                        error=f"{type(exc).__name__}: {str(exc)[:200]}", worker_id=self.worker_id)
            self.ledger.give_back(cost)
            self._pause = self._outage.failed(exc)
            await arefresh_topology(self.client)  # a dead primary: find its promoted replica
            return batch
        self._outage.ok()
        # a count refused (Redis at maxmemory) holds back no report: the next flush or heartbeat
        # writes it again, and the refused reports below are what gets logged
        results = results[n_record:]
        n_reports = len(successes) + len(others)
        cost_errors = [r for r in results[n_reports:] if isinstance(r, Exception)]
        if cost_errors:  # counts only: logged and dropped, never holding reports back
            log.warning("retry-cost counts not recorded", error=str(cost_errors[0])[:300],
                        worker_id=self.worker_id)
        results = results[:n_reports]
        refused: list[Item] = []
        errors: list[str] = []
        causes: list[BaseException] = []
        succeeded: dict[str, int] = {}  # task -> its runs this flush recorded as succeeded
        for exs, res in zip(successes.values(), results, strict=False):
            if isinstance(res, Exception):
                refused += [("complete", ex, _NO_ARGS) for ex in exs]
                errors.append(str(res))
                causes.append(res)
                continue
            unsent = self.unsent
            for ex, reply in zip(exs, res, strict=True):
                unsent.pop(ex.key, None)
                if reply == b"succeeded":  # the common case: counted per task, below
                    task = ex.ctx.task
                    succeeded[task] = succeeded.get(task, 0) + 1
                else:
                    self._judged("complete", ex, reply)
        for task, n in succeeded.items():
            child(RUNS_FINISHED, task, SUCCEEDED).inc(n)
        for item, res in zip(others, results[len(successes):], strict=True):
            if isinstance(res, Exception):
                refused.append(item)
                errors.append(str(res))
                causes.append(res)
                continue
            self.unsent.pop(item[1].key, None)
            self._judged(item[0], item[1], tr.status(res),
                         item[2][0] if item[0] == "fail" else None)
            if item[0] == "fail":
                self._auto_paused(item[1], res)
        if refused:
            lo, hi = REFUSED_PAUSE_S
            if all(topology_error(e) for e in causes):  # CLUSTERDOWN until a promotion, MOVED
                hi = TOPOLOGY_CAP_S
                if self._pause == 0.0:  # once per incident
                    log.warning("outcome reports wait for a failover; sending them again",
                                count=len(refused), error=errors[0][:300], worker_id=self.worker_id)
                await arefresh_topology(self.client)
            else:
                log.error("redis refused outcome reports; sending them again", count=len(refused),
                          error=errors[0][:300], worker_id=self.worker_id)
            self._pause = min(max(self._pause * 2, lo), hi)
        else:
            self._pause = 0.0
        if n_reports:
            self.recorded += n_reports
            if self.on_recorded is not None:
                self.on_recorded()
        return refused

    async def _call(self, pipe: Any, item: Item) -> None:
        kind, ex, extra = item
        k, p, ctx = self.keys, ex.partition, ex.ctx
        if kind == "fail":
            err, mode, delay_ms = extra
            keys, args = tr.fail(k, p, ctx.queue, ctx.run_id, ctx.fence, err, mode, delay_ms,
                                 random.random())
            await self.scripts.fail(keys=keys, args=args, client=pipe)
        elif kind == "continue":
            state, delay_ms = extra
            keys, args = tr.continue_run(k, p, ctx.queue, ctx.run_id, ctx.fence, delay_ms, state,
                                         CHECKPOINT_MAX_BYTES)
            await self.scripts.continue_run(keys=keys, args=args, client=pipe)
        elif kind == "handback":
            keys, args = tr.handback(k, p, ctx.queue, ctx.run_id, ctx.fence, self.worker_id,
                                     HANDBACK_FIRST_MS, HANDBACK_LONGEST_MS)
            await self.scripts.handback(keys=keys, args=args, client=pipe)
        elif kind == "rate_limited":
            retry_after_ms, scope = extra
            name = ctx.task if scope == "task" else ctx.queue if scope == "queue" else ""
            keys, args = tr.rate_limited(k, p, ctx.queue, ctx.run_id, ctx.fence, retry_after_ms,
                                         scope, name, self.worker_id)
            await self.scripts.rate_limited(keys=keys, args=args, client=pipe)
            if name:  # a task or queue has runs in every partition: each holds it too
                await self._hold_elsewhere(p, ctx.queue, retry_after_ms, scope, name)
        else:
            keys, args = tr.release(k, p, ctx.queue, ctx.run_id, ctx.fence)
            await self.scripts.release(keys=keys, args=args, client=pipe)

    async def _hold_elsewhere(self, p: int, queue: str, retry_after_ms: int, scope: str,
                              name: str) -> None:
        """Raise a RateLimited hold in every partition but p (its own pipeline, so the report
        pipeline keeps one reply per report). A hold is advisory: one that does not reach a
        partition is logged, and that partition's runs are only not held back."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for other in range(k.partitions):
            if other != p:
                keys, args = tr.rate_limited(k, other, queue, "", 0, retry_after_ms, scope, name,
                                             self.worker_id)
                await self.scripts.rate_limited(keys=keys, args=args, client=pipe)
        try:
            results = await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            results = [exc]
        bad = [r for r in results if isinstance(r, Exception)]
        if bad:
            log.warning("rate-limit hold not raised in every partition", scope=f"{scope}:{name}",
                        partitions=len(bad), error=str(bad[0])[:300], worker_id=self.worker_id)

    def _auto_paused(self, ex: Execution, res: Any) -> None:
        """fail.lua's third reply value: the schedule this dead run paused (guardrails)."""
        if isinstance(res, list) and len(res) > 2 and res[2]:
            metrics.AUTO_PAUSED.inc()
            log.warning("schedule paused by its pause_after_failures guardrail",
                        schedule=res[2].decode(errors="replace"), run_id=ex.ctx.run_id,
                        task=ex.ctx.task, worker_id=self.worker_id)

    def _judged(self, kind: Report, ex: Execution, reply: bytes, error: str | None = None) -> None:
        """Count and, when it is news, log what the script decided."""
        ctx = ex.ctx
        label = LABELS.get(reply)
        if label is None:
            log.error("unexpected script reply", reply=repr(reply)[:80], report=kind,
                      run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                      worker_id=self.worker_id, schedule=ctx.schedule)
            return
        child(RUNS_FINISHED, ctx.task, label).inc()
        if reply == b"late_succeeded":
            log.info("late success accepted", run_id=ctx.run_id, task=ctx.task,
                     attempt=ctx.attempt, worker_id=self.worker_id, schedule=ctx.schedule)
        elif label == Outcome.RETRYING:
            child(metrics.RETRIES, ctx.task).inc()
        elif label == Outcome.DEAD:
            child(metrics.DEAD_LETTERS, ctx.task, ex.owner).inc()
            log.warning("run dead-lettered", run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                        worker_id=self.worker_id, schedule=ctx.schedule, owner=ex.owner)
            if self.on_ended is not None:
                self.on_ended(ex, label, error)
        elif label == Outcome.UNCERTAIN:  # release.lua: a non-idempotent run cut off here
            log.warning("run left uncertain by worker shutdown", run_id=ctx.run_id,
                        task=ctx.task, attempt=ctx.attempt, worker_id=self.worker_id,
                        schedule=ctx.schedule, state="uncertain", reason=UNCERTAIN_REASON)
            if self.on_ended is not None:
                self.on_ended(ex, label, UNCERTAIN_REASON)
        elif label in (Outcome.STALE, Outcome.MISSING):
            metrics.LATE_REJECTED.inc()
            log.warning("late result rejected", run_id=ctx.run_id, task=ctx.task,
                        attempt=ctx.attempt, worker_id=self.worker_id, report=kind,
                        fence=ctx.fence, schedule=ctx.schedule, reply=label)


def _resolve(waiter: asyncio.Future[None]) -> None:
    """A wait's timer: the waiter returns, as when a report came (unless one did first)."""
    if not waiter.done():
        waiter.set_result(None)
