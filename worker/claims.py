"""The claim loop: sleeps until the earliest known due time (or a wake-up), then claims due
runs in batches and hands them to the executor.

Claims run as tasks, up to CLAIMS_IN_FLIGHT at once, each reserving the slots it asked for:
the next claim travels while the previous batch starts and runs, so Redis time and Python
time overlap instead of adding up. While Redis is unreachable the loop makes no call at all
until its back-off ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.outage import Outage, bounded
from duetime.common.scripts import Scripts
from duetime.worker.clock import ServerClock
from duetime.worker.config import WorkerConfig
from duetime.worker.due import DueTimes, Key
from duetime.worker.errors import ANY_REDIS_ERROR, REDIS_ERRORS
from duetime.worker.execution import Executor

log = get_logger("duetime.worker")

CLAIMS_IN_FLIGHT = 2
CLAIM_MIN_SHARE = 16
CLOCK_SYNC_S = 60.0
EARLY_HOLD_S = 0.001  # a claim found nothing due: our estimate of server time ran ahead by a hair


class Claimer:
    def __init__(self, client: aredis.Redis, scripts: Scripts, keys: Keyspace, cfg: WorkerConfig,
                 due: DueTimes, clock: ServerClock, executor: Executor, wake: asyncio.Event) -> None:
        self.client, self.scripts, self.keys, self.cfg = client, scripts, keys, cfg
        self.due, self.clock, self.executor, self.wake = due, clock, executor, wake
        self.outage = Outage("claim loop", log, worker_id=cfg.worker_id)
        self._claims: set[asyncio.Task[None]] = set()
        self._reserved = 0  # slots promised to claims in flight
        self._hold_until = 0.0  # monotonic time before which no Redis call is made
        self._bug_backoff = 0.1
        self._share = -(-cfg.concurrency // CLAIMS_IN_FLIGHT)

    async def run(self, stopping: asyncio.Event) -> None:
        cfg, due, clock = self.cfg, self.due, self.clock
        last_refresh = last_clock = time.monotonic()
        while not stopping.is_set():
            hold = self._hold_until - time.monotonic()
            if hold > 0:
                await self._sleep(hold)
                continue
            free = cfg.concurrency - len(self.executor.inflight) - self._reserved
            can_claim = free > 0 and len(self._claims) < CLAIMS_IN_FLIGHT
            keys = due.due_now(clock.now_ms() + cfg.claim_ahead_ms) if can_claim else []
            if keys:
                self._spawn(keys, free)
                continue
            try:
                if time.monotonic() - last_refresh >= cfg.refresh_s:
                    await due.refresh(self.client)
                    last_refresh = time.monotonic()
                    self.outage.ok()
                    continue
                if time.monotonic() - last_clock >= CLOCK_SYNC_S:
                    await clock.sync(self.client)
                    last_clock = time.monotonic()
                    continue  # slots may have freed meanwhile: look again before sleeping
            except REDIS_ERRORS as exc:
                self._hold(self.outage.failed(exc))
                continue
            except ANY_REDIS_ERROR as exc:
                log.error("redis refused a call of the claim loop", error=bounded(exc),
                          worker_id=cfg.worker_id)
                self._hold(1.0)
                continue
            timeout = cfg.refresh_s - (time.monotonic() - last_refresh)
            if can_claim:
                earliest = due.earliest()
                if earliest is not None:
                    timeout = min(timeout, (earliest - cfg.claim_ahead_ms - clock.now_ms()) / 1000)
                release = due.next_release()
                if release is not None:  # a held key becomes claimable again
                    timeout = min(timeout, release - time.monotonic())
            if timeout > 0:
                await self._sleep(timeout)
        if self._claims:
            await asyncio.gather(*self._claims, return_exceptions=True)

    async def _sleep(self, timeout: float) -> None:
        """Until a wake-up (a due time came in, a slot or claim ended, stop) or the timeout."""
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    def _hold(self, seconds: float) -> None:
        self._hold_until = time.monotonic() + seconds

    def _spawn(self, keys: list[Key], free: int) -> None:
        # a claim takes at most its share of the slots, so another can be in flight meanwhile
        free = min(free, self._share)
        self._reserved += free
        task = asyncio.create_task(self._claim_task(keys, free))
        self._claims.add(task)
        task.add_done_callback(self._claims.discard)

    async def _claim_task(self, keys: list[Key], free: int) -> None:
        try:
            claimed = await self.claim(keys, free)
            self.outage.ok()
            self._bug_backoff = 0.1
            if not claimed:
                self._hold(EARLY_HOLD_S)
        except REDIS_ERRORS as exc:
            self._hold(self.outage.failed(exc))
        except Exception:  # noqa: BLE001 - a bug here must not turn into a hot claim loop
            log.exception("claim failed", worker_id=self.cfg.worker_id, retry_in=self._bug_backoff)
            self._hold(self._bug_backoff)
            self._bug_backoff = min(self._bug_backoff * 2, 5.0)
        finally:
            self._reserved -= free
            self.wake.set()

    async def claim(self, keys: list[Key], free: int) -> int:
        """One pipelined claim over `keys` (fair order, see DueTimes.due_now) for up to `free`
        runs; returns how many were claimed and started. Each key gets at least CLAIM_MIN_SHARE, so a
        backlog spread over many partitions is claimed in a few calls, not one per partition."""
        share = max(min(free, CLAIM_MIN_SHARE), -(-free // len(keys)))
        plan: list[tuple[Key, int]] = []
        left = free
        for key in keys:
            if left <= 0:
                break
            n = min(share, left)
            plan.append((key, n))
            left -= n
        seq = self.due.seq
        cfg = self.cfg
        for key, _ in plan:
            self.due.served(key)
        pipe = self.client.pipeline(transaction=False)
        for (p, q), n in plan:
            ks, args = tr.claim(self.keys, p, q, cfg.worker_id, n, cfg.lease_ms, cfg.claim_ahead_ms)
            await self.scripts.claim(keys=ks, args=args, client=pipe)
        # per-call errors come back as values: the runs other calls claimed must still start
        results = await pipe.execute(raise_on_error=False)
        now = self.clock.now_ms()
        claimed = 0
        start = self.executor.start
        for ((p, q), _), res in zip(plan, results, strict=True):
            if isinstance(res, Exception):
                self.due.refuse((p, q), "claiming", res)
                continue
            reply = tr.parse_claim(res)
            self.due.set((p, q), reply.next_due_ms, seq)
            self.due.account((p, q), len(reply.runs))
            for c in reply.runs:
                start(p, q, c, now)
            claimed += len(reply.runs)
            if reply.runs:
                metrics.child(metrics.CLAIMED, q).inc(len(reply.runs))
            if reply.missed:
                metrics.MISSED.inc(reply.missed)
            if reply.skipped:
                metrics.SKIPPED.inc(reply.skipped)
            if reply.held_concurrency:
                metrics.child(metrics.RUNS_LIMITED, "concurrency").inc(reply.held_concurrency)
            if reply.held_rate:
                metrics.child(metrics.RUNS_LIMITED, "rate").inc(reply.held_rate)
        return claimed
