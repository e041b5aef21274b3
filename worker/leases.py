"""The lease keeper: renews the leases of this worker's attempts every third of the lease,
in one pipeline with the worker's own record, and stops attempts whose lease is lost or whose
run is to be cancelled."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.outage import Outage, bounded
from duetime.common.scripts import Scripts
from duetime.worker.config import WorkerConfig
from duetime.worker.errors import ANY_REDIS_ERROR, REDIS_ERRORS
from duetime.worker.execution import Execution, Executor

log = get_logger("duetime.worker")

LOST, HELD, CANCEL = 0, 1, 2  # heartbeat.lua's answer per attempt


class LeaseKeeper:
    def __init__(self, client: aredis.Redis, scripts: Scripts, keys: Keyspace, cfg: WorkerConfig,
                 executor: Executor) -> None:
        self.client, self.scripts, self.keys, self.cfg = client, scripts, keys, cfg
        self.executor = executor
        self.interval_s = cfg.lease_ms / 3000  # leaves room for two failed beats per lease
        self.outage = Outage("heartbeat", log, cap_s=min(2.0, self.interval_s),
                             worker_id=cfg.worker_id)

    async def run(self) -> None:
        while True:
            # liveness: the worker's event loop turns (this loop is one of its tasks);
            # readiness: its heartbeats reach Redis
            metrics.health.beat("worker")
            try:
                await self.beat()
                self.outage.ok()
                metrics.health.ready("worker")
                wait = self.interval_s
            except REDIS_ERRORS as exc:
                # the leases stay as they were; try again soon, never later than a beat
                metrics.health.ready("worker", False, f"cannot reach Redis: {bounded(exc)}")
                wait = min(self.interval_s, self.outage.failed(exc))
            except ANY_REDIS_ERROR as exc:
                metrics.health.ready("worker", False, f"redis refused a heartbeat: {bounded(exc)}")
                log.warning("heartbeat refused", error=bounded(exc), worker_id=self.cfg.worker_id)
                wait = self.interval_s
            await asyncio.sleep(wait)

    async def beat(self) -> None:
        """One heartbeat: every attempt whose lease this worker still holds, per partition."""
        ex_ = self.executor
        by_partition: dict[int, list[Execution]] = {}
        for ex in ex_.inflight.values():
            if not ex.lost:
                by_partition.setdefault(ex.partition, []).append(ex)
        k, cfg = self.keys, self.cfg
        pipe = self.client.pipeline(transaction=False)
        groups = []
        for p, exs in by_partition.items():
            keys, args = tr.heartbeat(k, p, cfg.lease_ms, [(ex.ctx.run_id, ex.token) for ex in exs])
            await self.scripts.heartbeat(keys=keys, args=args, client=pipe)
            groups.append(exs)
        now_ms = int(time.time() * 1000)
        pipe.zadd(k.workers, {cfg.worker_id: now_ms})
        pipe.hset(k.worker(cfg.worker_id), mapping={
            "queues": ",".join(cfg.queues), "concurrency": cfg.concurrency,
            "inflight": len(ex_.inflight), "pid": os.getpid(), "host": socket.gethostname(),
            "last_seen": now_ms, "processed": ex_.processed,
        })
        pipe.pexpire(k.worker(cfg.worker_id), cfg.lease_ms * 3)
        results = await pipe.execute(raise_on_error=False)
        metrics.INFLIGHT.set(len(ex_.inflight))
        for exs, res in zip(groups, results, strict=False):
            if isinstance(res, Exception):  # not extended, not lost either: tried next beat
                log.warning("heartbeat refused", error=bounded(res), partition=exs[0].partition,
                            runs=len(exs), worker_id=cfg.worker_id)
                continue
            for ex, status in zip(exs, res, strict=True):
                if ex.lost or ex_.inflight.get(ex.key) is not ex:
                    continue  # ended, or found lost, while the beat travelled
                if status == LOST:
                    ex_.lose(ex, "the heartbeat found the lease gone (expired and reaped, or "
                                 "claimed by another worker)")
                elif status == CANCEL and not ex.cancel_requested:
                    ex_.cancel(ex)

    async def deregister(self) -> None:
        try:
            await self.client.zrem(self.keys.workers, self.cfg.worker_id)
            await self.client.delete(self.keys.worker(self.cfg.worker_id))
        except ANY_REDIS_ERROR:
            pass
