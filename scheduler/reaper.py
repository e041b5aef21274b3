"""The reaper: finds runs whose lease expired and hands them to `reap.lua` (retry with
backoff, `uncertain` for non-idempotent tasks, or dead-letter), one call per partition.

Several reapers may run at once: each transition is atomic and re-checked in the script,
so a second reaper finds nothing left to do.
"""

from __future__ import annotations

import random
import threading

import redis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms, sync_client, unavailable
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.scripts import Scripts

log = get_logger("duetime.reaper")

BATCH = 500
SWEEP_MS = 10_000  # the retention sweep (every partition's reap.lua) at most this often


class Reaper:
    def __init__(self, url: str, keys: Keyspace, tick_s: float = 0.5,
                 retention_ms: int = 24 * 3600 * 1000) -> None:
        self.url, self.keys, self.tick_s, self.retention_ms = url, keys, tick_s, retention_ms
        self.next_wake_ms: int | None = None  # earliest lease expiry or deadline seen
        self._swept_ms = 0
        self.client = sync_client(url)
        self.scripts = Scripts(self.client)
        self.stopping = threading.Event()

    def reap_once(self) -> int:
        """One pass (pipelined); returns how many runs were reaped. reap.lua runs only for
        partitions with an expired lease or a passed deadline (read from the two index heads,
        plain reads), and for all of them once per SWEEP_MS for the retention sweep: an idle
        reaper costs two reads per partition per tick, not a script call."""
        k = self.keys
        total = 0
        wake: int | None = None
        now = server_time_ms(self.client)
        retention = 0
        if now - self._swept_ms >= SWEEP_MS:
            pending, retention, self._swept_ms = list(range(k.partitions)), self.retention_ms, now
        else:
            pending, wake = self._due_partitions(now)
        while pending:
            pipe = self.client.pipeline(transaction=False)
            for p in pending:
                keys, args = tr.reap(k, p, BATCH, random.random(), retention)
                self.scripts.reap(keys=keys, args=args, client=pipe)
            results = pipe.execute()
            again = []
            for p, (n, missed, deleted, nxt) in zip(pending, results, strict=True):
                total += n
                if nxt >= 0 and (wake is None or nxt < wake):
                    wake = nxt
                if missed:
                    metrics.MISSED.inc(missed)
                    log.info("runs missed their starting deadline", count=missed, partition=p)
                if n >= BATCH or missed >= BATCH or deleted >= BATCH:
                    again.append(p)
            pending = again
        if total:
            metrics.REAPED.labels("recovered").inc(total)
            log.info("reaped expired leases", count=total)
        self.next_wake_ms = wake
        return total

    def _due_partitions(self, now: int) -> tuple[list[int], int | None]:
        """Partitions whose earliest lease expiry or starting deadline has passed, and the
        earliest of those times still ahead."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.zrange(k.leases(p), 0, 0, withscores=True)
            pipe.zrange(k.deadlines(p), 0, 0, withscores=True)
        heads = pipe.execute()
        due, wake = [], None
        for p in range(k.partitions):
            times = [int(score) for _, score in heads[2 * p] + heads[2 * p + 1]]
            if any(t <= now for t in times):
                due.append(p)
            for t in times:
                if t > now and (wake is None or t < wake):
                    wake = t
        return due, wake

    def run(self) -> None:
        log.info("reaper started", tick_s=self.tick_s, partitions=self.keys.partitions)
        backoff = 0.1
        while not self.stopping.is_set():
            metrics.health.beat("reaper")
            try:
                self.reap_once()
                metrics.health.ready("reaper")
                backoff = 0.1
                metrics.REFUSING_WRITES.set(0)
                self.stopping.wait(self._sleep_s())
            except redis.exceptions.OutOfMemoryError as exc:
                # reap.lua is refused as a whole at maxmemory while heartbeats (allow-oom) go
                # on extending leases: nothing is expired that a live worker could keep
                metrics.REFUSING_WRITES.set(1)
                metrics.health.ready("reaper", False, "redis is at maxmemory and refuses writes")
                log.error("redis is at maxmemory and refuses writes; recovery waits (heartbeats "
                          "still extend leases)", error=str(exc), retry_in=backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                metrics.health.ready("reaper", False, str(unavailable(self.url, exc)))
                log.warning("redis unavailable; reaper retrying",
                            error=str(unavailable(self.url, exc)), retry_in=backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except redis.RedisError as exc:
                # refused (OOM at maxmemory, READONLY after a failover, a damaged key): the
                # process stays up and tries again, rather than crash-looping under a supervisor
                metrics.health.ready("reaper", False, f"redis refused a call: {exc}")
                log.error("redis refused a call; reaper retrying", error=str(exc),
                          retry_in=backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        metrics.health.ready("reaper", False, "stopping")
        log.info("reaper stopped")

    def _sleep_s(self) -> float:
        """Until the earliest lease expiry or deadline (on the server clock), at most a tick:
        a dead worker's run is recovered right when its lease ends, not a tick later."""
        if self.next_wake_ms is None:
            return self.tick_s
        ahead = (self.next_wake_ms - server_time_ms(self.client)) / 1000 + 0.002
        return min(self.tick_s, max(0.005, ahead))

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        self.client.close()


