"""The lease keeper: renews the leases of this worker's attempts every third of the lease,
in one pipeline with the worker's own record, and stops attempts whose lease is lost or whose
run is to be cancelled.

A lease is kept from the claim until the attempt's outcome is recorded, not only while the
task body runs: a report Redis refuses for a while (at maxmemory) must not let the lease lapse
and the finished work run again. And when the lease could not be renewed for a whole lease
length (Redis unreachable, a stalled link), the worker stops believing it owns the run: the
lease may have expired and the reaper given the run to another worker, so the attempt is
stopped as lost (a sync task is told through `lease_lost`) at that moment, not whenever Redis
answers again. A worker that was itself stalled renews first: a lease nobody reaped meanwhile
is still its own."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.connection import FORMAT
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.loops import cancelled, loop_timeout, pause
from duetime.common.outage import Outage, bounded
from duetime.common.scripts import Scripts
from duetime.worker.checkpoints import progress_arg
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

    async def run(self, closing: asyncio.Event) -> None:
        """Heartbeats until `closing` (common/loops.py): set once the in-flight runs drained
        and their reports went, so the leases are kept through the shutdown's grace period."""
        while not closing.is_set():
            # liveness: the worker's event loop turns (this loop is one of its tasks);
            # readiness: its heartbeats reach Redis
            metrics.health.beat("worker")
            try:
                # a stalled link fails the beat; a loop held by a task body does not (the
                # renewals that came back meanwhile count: the worker renews first)
                async with loop_timeout(self.interval_s):
                    await self.beat()
                self.outage.ok()
                metrics.health.ready("worker")
                wait = self.interval_s
            except (*REDIS_ERRORS, TimeoutError) as exc:
                # the leases stay as they were; try again soon, never later than a beat
                metrics.health.ready("worker", False, f"cannot reach Redis: {bounded(exc)}")
                wait = min(self.interval_s, self.outage.failed(exc))
            except ANY_REDIS_ERROR as exc:
                metrics.health.ready("worker", False, f"redis refused a heartbeat: {bounded(exc)}")
                log.warning("heartbeat refused", error=bounded(exc), worker_id=self.cfg.worker_id)
                wait = self.interval_s
            # the worker is stopping: a cancellation that reached a Redis call can come out of
            # it as a connection error, or as the call's success (common/loops.py); swallowed
            # here, it would keep this loop (and the worker's shutdown, which waits for it) going
            cancelled()
            next_expiry = self.expire_unrenewed()
            await pause(closing, max(0.01, min(wait, next_expiry - time.monotonic())))

    def expire_unrenewed(self) -> float:
        """Stop the attempts whose lease was not renewed for a whole lease length; → when the
        next one will have gone that long (monotonic time)."""
        ex_, lease_s = self.executor, self.cfg.lease_ms / 1000
        now, soonest = time.monotonic(), float("inf")
        for ex in list(ex_.inflight.values()):
            if ex.lost:
                continue
            expires = ex.renewed_at + lease_s
            if expires <= now:
                ex_.lose(ex, f"the lease was not renewed for {lease_s:g}s (Redis unreachable or "
                             "refusing): it may have expired and the run been given to another "
                             "worker")
            else:
                soonest = min(soonest, expires)
        return soonest

    async def beat(self) -> None:
        """One heartbeat: every attempt whose lease this worker still holds, per partition."""
        ex_ = self.executor
        by_partition: dict[int, list[Execution]] = {}
        for ex in ex_.inflight.values():
            if not ex.lost:
                by_partition.setdefault(ex.partition, []).append(ex)
        for ex in ex_.reporter.unsent.values():  # finished; the outcome not recorded yet
            if not ex.lost and not ex.superseded and ex_.inflight.get(ex.key) is not ex:
                by_partition.setdefault(ex.partition, []).append(ex)
        k, cfg = self.keys, self.cfg
        pipe = self.client.pipeline(transaction=False)
        groups = []
        sent: list[list[int]] = []  # per group, the progress sequence each run's beat carries
        for p, exs in by_partition.items():
            progress = [progress_arg(ex) for ex in exs]  # rides on the beat (checkpoints.py)
            keys, args = tr.heartbeat(k, p, cfg.lease_ms, [
                (ex.ctx.run_id, ex.token, body) for ex, (body, _) in zip(exs, progress, strict=True)])
            await self.scripts.heartbeat(keys=keys, args=args, client=pipe)
            groups.append(exs)
            sent.append([seq for _, seq in progress])
        now_ms = int(time.time() * 1000)
        pipe.zadd(k.workers, {cfg.worker_id: now_ms})
        pipe.hset(k.worker(cfg.worker_id), mapping={
            "queues": ",".join(cfg.queues), "concurrency": cfg.concurrency,
            "inflight": len(ex_.inflight), "pid": os.getpid(), "host": socket.gethostname(),
            "last_seen": now_ms, "processed": ex_.processed,
            # the newest namespace format this worker reads: duetime migrate moves a namespace
            # on only when every live worker reads the new one
            "formats": FORMAT,
        })
        pipe.pexpire(k.worker(cfg.worker_id), cfg.lease_ms * 3)
        sent_at = time.monotonic()  # a renewed lease runs from no earlier than this
        results = await pipe.execute(raise_on_error=False)
        metrics.INFLIGHT.set(len(ex_.inflight))
        for exs, seqs, res in zip(groups, sent, results, strict=False):
            if isinstance(res, Exception):  # not extended, not lost either: tried next beat
                log.warning("heartbeat refused", error=bounded(res), partition=exs[0].partition,
                            runs=len(exs), worker_id=cfg.worker_id)
                continue
            for ex, seq, status in zip(exs, seqs, res, strict=True):
                if status != LOST:
                    ex.renewed_at = sent_at
                if seq:
                    ex.ctx.progress_delivered(seq)
                if ex.lost or ex_.inflight.get(ex.key) is not ex:
                    continue  # ended (its report may be waiting), or found lost, meanwhile
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
