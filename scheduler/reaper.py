"""The reaper: finds runs whose lease expired and hands them to `reap.lua` (retry with
backoff, `uncertain` for non-idempotent tasks, or dead-letter), one call per partition.

Several reapers may run at once: each transition is atomic and re-checked in the script,
so a second reaper finds nothing left to do.
"""

from __future__ import annotations

import random
import threading

import redis

from common import metrics
from common import transitions as tr
from common.connection import server_time_ms, sync_client, unavailable
from common.keys import Keyspace
from common.logs import get as get_logger
from common.scripts import Scripts

log = get_logger("duetime.reaper")

BATCH = 500


class Reaper:
    def __init__(self, url: str, keys: Keyspace, tick_s: float = 0.5,
                 retention_ms: int = 24 * 3600 * 1000) -> None:
        self.url, self.keys, self.tick_s, self.retention_ms = url, keys, tick_s, retention_ms
        self.next_wake_ms: int | None = None  # earliest lease expiry or deadline seen
        self.client = sync_client(url)
        self.scripts = Scripts(self.client)
        self.stopping = threading.Event()

    def reap_once(self) -> int:
        """One pass over every partition (pipelined); returns how many runs were reaped."""
        k = self.keys
        total = 0
        wake: int | None = None
        pending = list(range(k.partitions))
        while pending:
            pipe = self.client.pipeline(transaction=False)
            for p in pending:
                keys, args = tr.reap(k, p, BATCH, random.random(), self.retention_ms)
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

    def run(self) -> None:
        log.info("reaper started", tick_s=self.tick_s, partitions=self.keys.partitions)
        backoff = 0.1
        while not self.stopping.is_set():
            try:
                self.reap_once()
                backoff = 0.1
                self.stopping.wait(self._sleep_s())
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("redis unavailable; reaper retrying",
                            error=str(unavailable(self.url, exc)), retry_in=backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
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


