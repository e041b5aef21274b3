"""The worker: claims due runs in batches, executes them, heartbeats their leases and reports
outcomes — one asyncio loop per process, sync tasks in a thread pool.

Wake-ups are precise: the worker knows the earliest due time of every (partition, queue)
it serves (from claim replies, from a pipelined refresh, and from the pub/sub notice that
enqueue sends when a run becomes a set's earliest) and sleeps until then. The periodic
refresh is only a safety net for lost notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import random
import signal
import socket
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.codec import unpack_payload
from duetime.common.connection import async_client, unavailable
from duetime.common.context import RunContext, set_current
from duetime.common.errors import Fatal, Retry, UnknownTask
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.models import from_ms
from duetime.common.scripts import Scripts
from duetime.common.tasks import Registry, TaskSpec

log = get_logger("duetime.worker")

MAX_ERROR = 4000
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)  # Redis unreachable
# Any error a Redis call can end with, unreachable or refused (OOM at maxmemory, READONLY after
# a failover, WRONGTYPE on a damaged key, BUSY): the worker's loops log it and go on.
ANY_REDIS_ERROR = (redis.RedisError, OSError)
KEY_HOLD_S = 5.0  # a partition/queue whose claim Redis refused is left alone this long
CLAIMS_IN_FLIGHT = 2
CLAIM_MIN_SHARE = 16


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"


@dataclass
class WorkerConfig:
    queues: list[str]
    concurrency: int = 16
    lease_ms: int = 10_000
    grace_s: float = 30.0
    refresh_s: float = 5.0  # safety net only: wake notices and claim replies carry due times
    # runs due this soon are claimed now and started at their due time (never before): the
    # claim's round trip no longer adds to start lateness
    claim_ahead_ms: int = 10
    worker_id: str = field(default_factory=default_worker_id)


@dataclass
class Execution:
    ctx: RunContext
    partition: int
    task: asyncio.Task[None] | None = None
    released: bool = False
    cancel_requested: bool = False

    @property
    def token(self) -> str:
        return f"{self.ctx.worker_id}:{self.ctx.fence}"


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    head = f"{type(exc).__name__}: {exc}"
    return (head + "\n" + text[-MAX_ERROR:]) if len(text) > 0 else head


class Worker:
    def __init__(
        self, registry: Registry, url: str, keys: Keyspace, config: WorkerConfig
    ) -> None:
        self.registry, self.url, self.keys, self.cfg = registry, url, keys, config
        self.id = config.worker_id
        self.client: aredis.Redis = async_client(url)
        self.scripts = Scripts(self.client)
        self.pool = ThreadPoolExecutor(max_workers=config.concurrency,
                                       thread_name_prefix="duetime-task")
        from duetime.worker.clock import ServerClock

        self.clock = ServerClock()
        self.inflight: dict[str, Execution] = {}
        self.next_due: dict[tuple[int, str], float] = {}
        self._wake_seq = 0
        self._last_wake: dict[tuple[int, str], tuple[int, float]] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._reports: asyncio.Queue[tuple[str, Execution, list[Any]] | None] = asyncio.Queue()
        self._bg: list[asyncio.Task[None]] = []
        self._debug = log.is_enabled_for(logging.DEBUG)
        self.processed = 0
        self._claims: set[asyncio.Task[None]] = set()
        self._reserved = 0  # slots promised to claims in flight
        self._hold_until = 0.0  # monotonic time before which nothing is claimed
        self._claim_backoff = 0.1
        self._key_hold: dict[tuple[int, str], float] = {}  # key -> monotonic time to retry

    # -- lifecycle ------------------------------------------------------------------
    def stop(self) -> None:
        if not self._stopping.is_set():
            log.info("worker stopping", worker_id=self.id, inflight=len(self.inflight))
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        try:
            await self.clock.sync(self.client)
            await self._refresh_heads()
        except REDIS_ERRORS as exc:
            raise unavailable(self.url, exc) from None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                loop.add_signal_handler(sig, self.stop)
        log.info("worker started", worker_id=self.id, queues=self.cfg.queues,
                 concurrency=self.cfg.concurrency, lease_ms=self.cfg.lease_ms,
                 partitions=self.keys.partitions)
        self._bg = [
            asyncio.create_task(self._listen(), name="listen"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
        ]
        reporter = asyncio.create_task(self._report_loop(), name="report")
        # claim only once wake notices can reach us (a notice sent earlier would be lost)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), 10)
        try:
            await self._claim_loop()
            await self._drain()
            self._reports.put_nowait(None)
            await reporter
        finally:
            reporter.cancel()
            for t in self._bg:
                t.cancel()
            await asyncio.gather(*self._bg, return_exceptions=True)
            await self._deregister()
            self.pool.shutdown(wait=False, cancel_futures=True)
            await self.client.aclose()
            log.info("worker stopped", worker_id=self.id, processed=self.processed)

    # -- due-time knowledge ---------------------------------------------------------
    def _note_due(self, key: tuple[int, str], due: float) -> None:
        """A notice that `key` has a run due at `due` (server ms)."""
        self._wake_seq += 1
        self._last_wake[key] = (self._wake_seq, due)
        cur = self.next_due.get(key)
        if cur is None or due < cur:
            self.next_due[key] = due
            self._wake.set()

    def _set_due(self, key: tuple[int, str], due: float | None, since_seq: int) -> None:
        """Authoritative head read at the server; notices newer than the read still count."""
        w = self._last_wake.get(key)
        if w is not None and w[0] > since_seq and (due is None or w[1] < due):
            due = w[1]
        if due is None:
            self.next_due.pop(key, None)
        else:
            self.next_due[key] = due

    async def _refresh_heads(self) -> None:
        seq = self._wake_seq
        pipe = self.client.pipeline(transaction=False)
        order = []
        for p in range(self.keys.partitions):
            for q in self.cfg.queues:
                pipe.zrange(self.keys.due(p, q), 0, 0, withscores=True)
                pipe.zrange(self.keys.retry(p, q), 0, 0, withscores=True)
                order.append((p, q))
        res = await pipe.execute(raise_on_error=False)
        for i, key in enumerate(order):
            due, retry = res[2 * i], res[2 * i + 1]
            for r in (due, retry):
                if isinstance(r, Exception):
                    self._refused(key, "reading due times", r)
            heads = [s for part in (due, retry) if isinstance(part, list) for _, s in part]
            self._set_due(key, min(heads) if heads else None, seq)

    async def _listen(self) -> None:
        """Pub/sub wake-ups; reconnects forever, refreshing after each (re)subscription, so a
        notice sent while unsubscribed is made up for by reading the heads."""
        queues = set(self.cfg.queues)
        delay = 0.1
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.keys.wake_channel)
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        await self._refresh_heads()
                        self._subscribed.set()
                        delay = 0.1
                        continue
                    if msg["type"] != "message":
                        continue
                    p, q, due = msg["data"].decode().split("|")
                    if q in queues:
                        self._note_due((int(p), q), float(due))
            except asyncio.CancelledError:
                await pubsub.aclose()
                raise
            except ANY_REDIS_ERROR as exc:
                log.warning("wake channel lost; reconnecting", error=str(exc), retry_in=delay)
                await pubsub.aclose()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- claiming -------------------------------------------------------------------
    def _due_now(self) -> list[tuple[int, str]]:
        now = self.clock.now_ms() + self.cfg.claim_ahead_ms
        rank = {q: i for i, q in enumerate(self.cfg.queues)}
        if self._key_hold:
            t = time.monotonic()
            self._key_hold = {k: u for k, u in self._key_hold.items() if u > t}
        due = [(rank[k[1]], d, k) for k, d in self.next_due.items()
               if d <= now and k not in self._key_hold]
        due.sort()
        return [k for _, _, k in due]

    async def _claim_loop(self) -> None:
        """Claims run as tasks, up to CLAIMS_IN_FLIGHT at once, each reserving the slots it
        asked for: the next claim travels while the previous batch starts and runs, so Redis
        time and Python time overlap instead of adding up."""
        last_refresh = time.monotonic()
        last_clock = time.monotonic()
        while not self._stopping.is_set():
            free = self.cfg.concurrency - len(self.inflight) - self._reserved
            hold = self._hold_until - time.monotonic()
            can_claim = free > 0 and len(self._claims) < CLAIMS_IN_FLIGHT and hold <= 0
            due = self._due_now() if can_claim else []
            if due:
                self._spawn_claim(due, free)
                continue
            try:
                if time.monotonic() - last_refresh >= self.cfg.refresh_s:
                    await self._refresh_heads()
                    last_refresh = time.monotonic()
                    continue
                if time.monotonic() - last_clock >= 60:
                    await self.clock.sync(self.client)
                    last_clock = time.monotonic()
            except ANY_REDIS_ERROR as exc:
                self._claim_failed(exc)
                continue
            timeout = self.cfg.refresh_s - (time.monotonic() - last_refresh)
            if hold > 0:
                timeout = min(timeout, hold)
            elif free > 0 and len(self._claims) < CLAIMS_IN_FLIGHT:
                dues = [d for k, d in self.next_due.items() if k not in self._key_hold]
                if dues:
                    timeout = min(timeout, (min(dues) - self.cfg.claim_ahead_ms
                                            - self.clock.now_ms()) / 1000)
                if self._key_hold:  # a held key becomes claimable again
                    timeout = min(timeout, min(self._key_hold.values()) - time.monotonic())
            self._wake.clear()
            if timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        if self._claims:
            await asyncio.gather(*self._claims, return_exceptions=True)

    def _spawn_claim(self, due: list[tuple[int, str]], free: int) -> None:
        # a claim takes at most its share of the slots, so another can be in flight meanwhile
        free = min(free, -(-self.cfg.concurrency // CLAIMS_IN_FLIGHT))
        self._reserved += free
        task = asyncio.create_task(self._claim_task(due, free))
        self._claims.add(task)
        task.add_done_callback(self._claims.discard)

    async def _claim_task(self, due: list[tuple[int, str]], free: int) -> None:
        try:
            if not await self._claim(due, free):
                # our estimate of server time ran ahead of the server's by a hair
                self._hold_until = time.monotonic() + 0.001
            else:
                self._claim_backoff = 0.1
        except REDIS_ERRORS as exc:
            self._claim_failed(exc)
        except Exception:  # noqa: BLE001 - a bug here must not turn into a hot claim loop
            log.exception("claim failed", worker_id=self.id, retry_in=self._claim_backoff)
            self._hold_until = time.monotonic() + self._claim_backoff
            self._claim_backoff = min(self._claim_backoff * 2, 5.0)
        finally:
            self._reserved -= free
            self._wake.set()

    def _refused(self, key: tuple[int, str], doing: str, exc: Exception) -> None:
        """Redis refused a call for one partition and queue: leave that key alone for a while
        and go on with the others (one damaged key must not stop the whole worker)."""
        p, q = key
        log.error("redis refused a call; skipping this partition and queue for a while",
                  doing=doing, partition=p, queue=q, key=self.keys.due(p, q), error=str(exc),
                  retry_in=KEY_HOLD_S, worker_id=self.id)
        self._key_hold[key] = time.monotonic() + KEY_HOLD_S

    def _claim_failed(self, exc: BaseException) -> None:
        """Redis is unreachable: claim nothing for a while (doubling, up to 5 s)."""
        log.warning("redis unavailable while claiming", error=str(exc),
                    retry_in=self._claim_backoff)
        self._hold_until = time.monotonic() + self._claim_backoff
        self._claim_backoff = min(self._claim_backoff * 2, 5.0)

    async def _claim(self, due: list[tuple[int, str]], free: int) -> int:
        # earliest-due keys first; at least CLAIM_MIN_SHARE runs each, so a backlog spread over
        # many partitions is claimed in a few calls rather than one call per partition
        share = max(min(free, CLAIM_MIN_SHARE), -(-free // len(due)))
        plan: list[tuple[tuple[int, str], int]] = []
        left = free
        for key in due:
            if left <= 0:
                break
            n = min(share, left)
            plan.append((key, n))
            left -= n
        seq = self._wake_seq
        pipe = self.client.pipeline(transaction=False)
        for (p, q), n in plan:
            keys, args = tr.claim(self.keys, p, q, self.id, n, self.cfg.lease_ms,
                                  self.cfg.claim_ahead_ms)
            await self.scripts.claim(keys=keys, args=args, client=pipe)
        # per-call errors come back as values: the runs other calls claimed must still start
        results = await pipe.execute(raise_on_error=False)
        now = self.clock.now_ms()
        claimed = 0
        for ((p, q), _), res in zip(plan, results, strict=True):
            if isinstance(res, Exception):
                self._refused((p, q), "claiming", res)
                continue
            reply = tr.parse_claim(res)
            self._set_due((p, q), reply.next_due_ms, seq)
            for c in reply.runs:
                self._start(p, q, c, now)
            claimed += len(reply.runs)
            if reply.runs:
                metrics.child(metrics.CLAIMED, q).inc(len(reply.runs))
            if reply.missed:
                metrics.MISSED.inc(reply.missed)
            if reply.skipped:
                metrics.SKIPPED.inc(reply.skipped)
        return claimed

    def _start(self, p: int, queue: str, c: tr.Claimed, now: float) -> None:
        ctx = RunContext(
            run_id=c.run_id, task=c.task, queue=queue, attempt=c.attempt, fence=c.fence,
            worker_id=self.id, idempotency_key=c.key or c.run_id,
            scheduled_at=from_ms(c.due_ms), schedule=c.schedule,
        )
        ex = Execution(ctx, p)
        self.inflight[c.run_id] = ex
        if self._debug:
            log.debug("run started", run_id=c.run_id, task=c.task, attempt=c.attempt,
                      worker_id=self.id, schedule=c.schedule, queue=queue, fence=c.fence)
        # claimed ahead of its due time: wait for it, plus the clock estimate's error bound, so
        # it never starts before its due time on the server's clock
        wait_s = (c.ready_ms + self.clock.error_ms - now) / 1000
        ex.task = asyncio.create_task(self._execute(ex, c.payload, c.timeout_ms, c.ready_ms,
                                                    wait_s, c.damaged))

    # -- execution ------------------------------------------------------------------
    async def _execute(self, ex: Execution, payload: bytes, timeout_ms: int, ready_ms: float,
                       wait_s: float, damaged: str = "") -> None:
        ctx = ex.ctx
        outcome, mode, err, delay_ms = "succeeded", "", "", 0
        started = time.perf_counter()
        try:
            if wait_s > 0:
                await asyncio.sleep(wait_s)
                started = time.perf_counter()
            delay = max(0.0, (self.clock.now_ms() - ready_ms) / 1000)
            metrics.child(metrics.QUEUE_DELAY, ctx.queue).observe(delay)
            if ctx.attempt == 1:
                # a first attempt is claimable from its scheduled time: lateness = queue delay
                metrics.child(metrics.START_LATENESS, ctx.queue).observe(delay)
            if damaged:
                raise Fatal(damaged)
            spec = self.registry.get(ctx.task)
            try:
                args, kwargs = unpack_payload(payload)
            except Exception as exc:  # noqa: BLE001 - it will never decode: no retry
                raise Fatal(f"payload unreadable (not duetime's msgpack [args, kwargs]): "
                            f"{exc!r}") from None
            await self._call(spec, ctx, args, kwargs, timeout_ms / 1000 or None)
        except UnknownTask as exc:
            outcome, mode, err = "dead", "fatal", f"{exc}; worker {self.id} cannot run it"
        except Retry as exc:
            outcome, mode, err = "retry", "retry", str(exc)
            delay_ms = int((exc.delay or 0) * 1000)
        except Fatal as exc:
            outcome, mode, err = "dead", "fatal", _error_text(exc)
        except TimeoutError:
            outcome, mode = "failed", "error"
            err = f"TimeoutError: task exceeded its timeout of {timeout_ms / 1000:g}s"
            ctx.mark_lost()
        except asyncio.CancelledError:
            # released at shutdown, stopped on a cancel request, or lease lost (another
            # worker may own the run: report nothing)
            if ex.released:
                outcome = "released"
            elif ex.cancel_requested:
                outcome, mode, err = "cancelled", "cancel", "cancelled on request while running"
            else:
                outcome = "lease_lost"
        except Exception as exc:  # noqa: BLE001 - any task error is a retryable failure
            outcome, mode, err = "failed", "error", _error_text(exc)
        finally:
            self.inflight.pop(ctx.run_id, None)
            self._wake.set()
        elapsed = time.perf_counter() - started
        metrics.child(metrics.EXECUTION, ctx.task).observe(elapsed)
        metrics.child(metrics.RUNS_FINISHED, ctx.task, outcome).inc()
        self.processed += 1
        if outcome in ("released", "lease_lost"):
            return
        if outcome == "succeeded":
            if self._debug:
                log.debug("run succeeded", run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                          worker_id=self.id, schedule=ctx.schedule, duration_s=round(elapsed, 6))
            self._reports.put_nowait(("complete", ex, []))
        else:
            log.info("run failed", run_id=ctx.run_id, task=ctx.task, attempt=ctx.attempt,
                     worker_id=self.id, schedule=ctx.schedule, mode=mode,
                     error=err.splitlines()[0] if err else "")
            self._reports.put_nowait(("fail", ex, [err, mode, delay_ms]))

    async def _call(self, spec: TaskSpec, ctx: RunContext, args: list[Any],
                    kwargs: dict[str, Any], timeout: float | None) -> None:
        set_current(ctx)
        if spec.is_async:
            await asyncio.wait_for(spec.fn(*args, **kwargs), timeout)
            return
        cv = contextvars.copy_context()
        fut = asyncio.get_running_loop().run_in_executor(self.pool, _run_in, cv, spec.fn,
                                                         args, kwargs)
        # a thread cannot be killed: on timeout the task is told through lease_lost
        await asyncio.wait_for(asyncio.shield(fut), timeout)

    # -- reporting (batched: one pipeline per flush) ----------------------------------
    async def _report_loop(self) -> None:
        """Sends every report waiting at the moment as one pipeline; None ends the loop.
        Reports Redis refused go again with a later batch, after a pause (doubling up to 5 s);
        at shutdown they are tried a few more times, then given up (the reaper recovers runs
        whose outcome was never recorded)."""
        carry: list[tuple[str, Execution, list[Any]]] = []
        pause, done, last_tries = 0.05, False, 5
        while not done or (carry and last_tries > 0):
            batch: list[tuple[str, Execution, list[Any]] | None] = []
            with contextlib.suppress(TimeoutError):
                batch.append(await asyncio.wait_for(self._reports.get(), pause if carry else None))
            while not self._reports.empty():
                batch.append(self._reports.get_nowait())
            if None in batch:
                done = True
            real = carry + [b for b in batch if b is not None]
            if done and carry:
                last_tries -= 1
            carry = await self._flush(real) if real else []
            pause = min(pause * 2, 5.0) if carry else 0.05
        if carry:
            log.error("outcomes not recorded: Redis refused them until shutdown",
                      runs=[ex.ctx.run_id for _, ex, _ in carry][:20], count=len(carry),
                      worker_id=self.id)

    async def _flush(self, batch: list[tuple[str, Execution, list[Any]]]
                     ) -> list[tuple[str, Execution, list[Any]]]:
        """Successes are acknowledged with one complete.lua call per partition; failures and
        releases one call each; everything in one pipeline, retried until Redis answers.
        Returns the reports of calls Redis refused (OOM, READONLY, ...), to be sent again."""
        successes: dict[int, list[Execution]] = {}
        others: list[tuple[str, Execution, list[Any]]] = []
        for kind, ex, extra in batch:
            if kind == "complete":
                successes.setdefault(ex.partition, []).append(ex)
            else:
                others.append((kind, ex, extra))
        delay = 0.05
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                for p, exs in successes.items():
                    keys, args = tr.complete(self.keys, p, [(ex.ctx.run_id, ex.ctx.fence) for ex in exs])
                    await self.scripts.complete(keys=keys, args=args, client=pipe)
                for kind, ex, extra in others:
                    await self._report_call(pipe, kind, ex, extra)
                results = await pipe.execute(raise_on_error=False)
                break
            except REDIS_ERRORS as exc:
                # keep the outcomes: a late report is still judged by its fence
                log.warning("cannot report outcomes; retrying", error=str(exc), retry_in=delay,
                            pending=len(batch))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        judged: list[tuple[str, Execution, Any]] = []
        refused: list[tuple[str, Execution, list[Any]]] = []
        errors: list[str] = []
        for exs, res in zip(successes.values(), results, strict=False):
            if isinstance(res, Exception):
                refused += [("complete", ex, []) for ex in exs]
                errors.append(str(res))
                continue
            judged += [("complete", ex, r) for ex, r in zip(exs, res, strict=True)]
        for item, res in zip(others, results[len(successes):], strict=True):
            kind, ex, _ = item
            if isinstance(res, Exception):
                refused.append(item)
                errors.append(str(res))
                continue
            judged.append((kind, ex, res if isinstance(res, bytes) else res[0]))
        if refused:
            log.error("redis refused outcome reports; sending them again", count=len(refused),
                      error=errors[0], worker_id=self.id)
        for kind, ex, res in judged:
            if kind == "fail" and res in (b"retrying", b"dead"):
                metrics.child(metrics.RETRIES if res == b"retrying" else metrics.DEAD_LETTERS,
                              ex.ctx.task).inc()
            elif res in (b"stale", b"missing"):
                metrics.LATE_REJECTED.inc()
                log.warning("late result rejected", run_id=ex.ctx.run_id, task=ex.ctx.task,
                            attempt=ex.ctx.attempt, worker_id=self.id, report=kind,
                            fence=ex.ctx.fence, schedule=ex.ctx.schedule)
        return refused

    async def _report_call(self, pipe: Any, kind: str, ex: Execution, extra: list[Any]) -> None:
        k, p, run_id, q, fence = self.keys, ex.partition, ex.ctx.run_id, ex.ctx.queue, ex.ctx.fence
        if kind == "fail":
            err, mode, delay_ms = extra
            keys, args = tr.fail(k, p, q, run_id, fence, err, mode, delay_ms, random.random())
        else:
            keys, args = tr.release(k, p, q, run_id, fence)
        await getattr(self.scripts, kind)(keys=keys, args=args, client=pipe)

    # -- leases -----------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        interval = self.cfg.lease_ms / 3000
        while True:
            try:
                await self._heartbeat()
            except ANY_REDIS_ERROR as exc:
                # the leases stay as they were; the next beat tries again (a beat every third
                # of the lease leaves room for two failed ones)
                log.warning("heartbeat failed", error=str(exc), worker_id=self.id)
            await asyncio.sleep(interval)

    async def _heartbeat(self) -> None:
        by_partition: dict[int, list[Execution]] = {}
        for ex in list(self.inflight.values()):
            by_partition.setdefault(ex.partition, []).append(ex)
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        groups = []
        for p, exs in by_partition.items():
            held = [(ex.ctx.run_id, ex.token) for ex in exs]
            keys, args = tr.heartbeat(k, p, self.cfg.lease_ms, held)
            await self.scripts.heartbeat(keys=keys, args=args, client=pipe)
            groups.append(exs)
        now = time.time()
        pipe.zadd(k.workers, {self.id: int(now * 1000)})
        pipe.hset(k.worker(self.id), mapping={
            "queues": ",".join(self.cfg.queues), "concurrency": self.cfg.concurrency,
            "inflight": len(self.inflight), "pid": os.getpid(), "host": socket.gethostname(),
            "last_seen": int(now * 1000), "processed": self.processed,
        })
        pipe.pexpire(k.worker(self.id), self.cfg.lease_ms * 3)
        results = await pipe.execute(raise_on_error=False)
        metrics.INFLIGHT.set(len(self.inflight))
        for exs, res in zip(groups, results, strict=False):
            if isinstance(res, Exception):  # not extended, not lost either: tried next beat
                log.warning("heartbeat refused", error=str(res), partition=exs[0].partition,
                            runs=len(exs), worker_id=self.id)
                continue
            for ex, status in zip(exs, res, strict=True):
                if self.inflight.get(ex.ctx.run_id) is not ex:
                    continue
                if status == 0:
                    self._lease_lost(ex)
                elif status == 2 and not ex.cancel_requested:
                    self._cancel(ex)

    def _cancel(self, ex: Execution) -> None:
        log.info("cancel requested; stopping the run", run_id=ex.ctx.run_id, task=ex.ctx.task,
                 attempt=ex.ctx.attempt, worker_id=self.id, schedule=ex.ctx.schedule)
        ex.cancel_requested = True
        self._interrupt(ex)

    def _lease_lost(self, ex: Execution) -> None:
        metrics.LEASES_LOST.inc()
        log.warning("lease lost; stopping the run", run_id=ex.ctx.run_id, task=ex.ctx.task,
                    attempt=ex.ctx.attempt, worker_id=self.id, schedule=ex.ctx.schedule)
        self._interrupt(ex)

    def _interrupt(self, ex: Execution) -> None:
        """Async tasks are cancelled; a sync task's thread can only be told (lease_lost)."""
        ex.ctx.mark_lost()
        spec = self.registry.find(ex.ctx.task)
        if ex.task is not None and spec is not None and spec.is_async:
            ex.task.cancel()

    # -- shutdown ---------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let in-flight runs finish within the grace period, then release the rest."""
        pending = [ex.task for ex in self.inflight.values() if ex.task is not None]
        if pending:
            log.info("waiting for in-flight runs", count=len(pending), grace_s=self.cfg.grace_s)
            await asyncio.wait(pending, timeout=self.cfg.grace_s)
        leftovers = list(self.inflight.values())
        for ex in leftovers:
            ex.released = True
            ex.ctx.mark_lost()
            if ex.task is not None:
                ex.task.cancel()
        if leftovers:
            await asyncio.gather(*(ex.task for ex in leftovers if ex.task),
                                 return_exceptions=True)
            log.info("releasing unfinished runs", count=len(leftovers))
        for ex in leftovers:
            self._reports.put_nowait(("release", ex, []))

    async def _deregister(self) -> None:
        try:
            await self.client.zrem(self.keys.workers, self.id)
            await self.client.delete(self.keys.worker(self.id))
        except REDIS_ERRORS:
            pass


def _run_in(cv: contextvars.Context, fn: Callable[..., Any], args: list[Any],
            kwargs: dict[str, Any]) -> Any:
    return cv.run(fn, *args, **kwargs)
