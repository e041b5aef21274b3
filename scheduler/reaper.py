"""The reaper: finds runs whose lease expired and hands them to `reap.lua` (retry with
backoff, `uncertain` for non-idempotent tasks, or dead-letter), one call per partition.

On a cluster each node's partitions are read, reaped and relayed on their own (scheduler/
shards.py): a dead primary holds back only its own partitions' recovery.

Several reapers may run at once: each transition is atomic and re-checked in the script,
so a second reaper finds nothing left to do.
"""

from __future__ import annotations

import random
import threading
import time

import redis
from duetime.common import metrics
from duetime.common import retention as retention_mod
from duetime.common import transitions as tr
from duetime.common.connection import (
    process_kw,
    server_time_ms,
    sync_client,
)
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.outage import Outage
from duetime.common.scripts import Scripts
from duetime.scheduler.notices import (
    DAMAGED_RETRY_MS,
    SAFETY_S,
    Heads,
    Listener,
    about_a_key,
    backed_off,
    head_ms,
    report_health,
)
from duetime.scheduler.relay import relay_pass
from duetime.scheduler.shards import Shards, node_time_ms

log = get_logger("duetime.reaper")

BATCH = 500
SWEEP_MS = 60_000  # the retention sweep (every partition's reap.lua) at most this often


class Reaper:
    """Sleeps until the earliest lease expiry or starting deadline of any partition (`Heads`,
    kept by reading the index heads and by the scripts' notices), then calls reap.lua for the
    partitions that are due. Idle, it sends nothing but a retention sweep a minute and a read
    of the heads every SAFETY_S."""

    def __init__(self, url: str, keys: Keyspace, tick_s: float = 0.5,
                 retention_ms: int = 24 * 3600 * 1000) -> None:
        self.url, self.keys, self.tick_s, self.retention_ms = url, keys, tick_s, retention_ms
        self.heads = Heads()
        self._swept_ms = 0
        self._read_all_at = 0.0
        self._offset_ms: float | None = None  # server clock - local monotonic clock
        self.client = sync_client(url, **process_kw())  # bounded waits
        self.scripts = Scripts(self.client)
        self.stopping = threading.Event()
        self.outage = Outage("reaper", log, cap_s=None)
        self.shards = Shards(self.client, keys, "reaper", log)
        self.relays = Shards(self.client, keys, "dependency relay", log)
        # partitions whose dependency lists a relay notice (kind r) named since the last pass;
        # every partition is read at the safety read, which covers a notice lost while the
        # subscription was away or sent by a script of an older version
        self._relay_told: set[int] = set()
        self._relay_lock = threading.Lock()
        self._relayed_all_at = float("-inf")

    def _now_ms(self) -> int:
        if self._offset_ms is None:
            self._sync_clock()
        return int(time.monotonic() * 1000 + (self._offset_ms or 0))

    def _sync_clock(self, node: str = "") -> int:
        """The server's clock now (on a cluster, the clock of `node`, which is being acted on)."""
        now = node_time_ms(self.client, node) if node else server_time_ms(self.client)
        self._offset_ms = now - time.monotonic() * 1000
        return now

    def _read_heads(self) -> None:
        """Every partition's heads, each node's in its own pipeline (a dead node's are read
        again after its back-off: its partitions keep the heads known before)."""
        read = self.shards.run(range(self.keys.partitions), self._read_group_heads)
        if read or not self.shards.cluster:
            self._read_all_at = time.monotonic()

    def _read_group_heads(self, node: str, partitions: list[int]) -> None:
        k = self.keys
        mark = self.heads.mark()
        pipe = self.client.pipeline(transaction=False)
        for p in partitions:
            pipe.zrange(k.leases(p), 0, 0, withscores=True)
            pipe.zrange(k.deadlines(p), 0, 0, withscores=True)
        heads = pipe.execute(raise_on_error=False)
        for i, p in enumerate(partitions):
            leases, deadlines = heads[2 * i], heads[2 * i + 1]
            if isinstance(leases, Exception) or isinstance(deadlines, Exception):
                # a damaged index: reap.lua names it (and refuses the call) without writing
                # anything, so that partition is simply tried again soon
                self._damaged(p, leases if isinstance(leases, Exception) else deadlines)
                continue
            # a +-inf score is read as now: reap.lua repairs it
            times = [head_ms(score) or 0 for _, score in leases + deadlines]
            self.heads.set(p, min(times) if times else None, mark)

    def _damaged(self, p: int, exc: BaseException) -> None:
        """One partition's keys are damaged (a key of the wrong type): the others go on, this
        one is tried again DAMAGED_RETRY_MS later (not in a loop), the key named in the log."""
        if not about_a_key(exc):
            raise exc  # the server, not this partition: the loop backs off
        log.error("damaged key: lease recovery of one partition waits until it is repaired; "
                  "the others go on", partition=p, error=str(exc), fix="duetime doctor names it")
        self.heads.set(p, self._now_ms() + DAMAGED_RETRY_MS, self.heads.mark())

    def reap_once(self) -> int:
        """One pass (pipelined, per node) over the partitions with an expired lease or a passed
        deadline (all of them for the retention sweep); returns how many runs were reaped.
        Nothing is sent when nothing is due."""
        k = self.keys
        if time.monotonic() - self._read_all_at >= SAFETY_S:
            self._read_heads()
        now = self._now_ms()
        retention = 0
        if now - self._swept_ms >= SWEEP_MS:
            pending, retention = list(range(k.partitions)), self.retention_ms
        else:
            pending = self.heads.ready(now)
        if not pending:
            return 0
        if retention:
            self._swept_ms = now
            self.sync_retention()
        done = self.shards.run(pending, lambda node, ps: self._reap_group(node, ps, retention))
        total = sum(done.values())
        if total:
            metrics.REAPED.labels("recovered").inc(total)
            log.info("reaped expired leases", count=total)
        return total

    def _reap_group(self, node: str, pending: list[int], retention: int) -> int:
        """reap.lua for `pending` (partitions of one node), again for those that had more."""
        k = self.keys
        self._sync_clock(node)  # acting: judge by the server's clock itself
        total = 0
        while pending:
            mark = self.heads.mark()
            pipe = self.client.pipeline(transaction=False)
            for p in pending:
                keys, args = tr.reap(k, p, BATCH, random.random(), retention,
                                     retention_mod.DEAD_MS, retention_mod.UNCERTAIN_MS)
                self.scripts.reap(keys=keys, args=args, client=pipe)
            results = pipe.execute(raise_on_error=False)
            again = []
            for p, res in zip(pending, results, strict=True):
                if isinstance(res, Exception):
                    self._damaged(p, res)
                    continue
                n, missed, deleted, nxt, *rest = tr.counts(res)
                examined = rest[1] if len(rest) > 1 else 0
                total += n
                if rest and rest[0]:
                    metrics.AUTO_PAUSED.inc(rest[0])
                    log.warning("schedules paused by their pause_after_failures guardrail",
                                count=rest[0], partition=p)
                self.heads.set(p, nxt if nxt >= 0 else None, mark)
                if missed:
                    metrics.MISSED.inc(missed)
                    log.info("runs missed their starting deadline", count=missed, partition=p)
                if n >= BATCH or missed >= BATCH or deleted >= BATCH or examined >= BATCH:
                    again.append(p)
            pending = again
        return total

    def told_relay(self, p: int) -> None:
        """A relay notice for partition `p` (the Listener's thread): read its lists next pass."""
        with self._relay_lock:
            self._relay_told.add(p)

    def relay_once(self) -> int:
        """Carry dependency notices and link requests between partitions (scheduler/relay.py
        `relay_pass`; docs/workloads.md). Reads the lists of the partitions a relay notice
        named, and every partition's at the safety read (`SAFETY_S`): an idle namespace
        costs no list reads per tick. Read again next pass: a partition whose list was read
        full (a pass takes at most RELAY_BATCH of each), one with an entry the server refused
        to apply or remove, and those of a node that did not answer."""
        with self._relay_lock:
            told, self._relay_told = self._relay_told, set()
        if time.monotonic() - self._relayed_all_at >= SAFETY_S:
            self._relayed_all_at = time.monotonic()
            told = set(range(self.keys.partitions))
        if not told:
            return 0
        try:
            # per node, backed off apart from the reaping: a notice for a partition of a dead
            # node holds back only the relay of the node it waits on
            done = self.relays.run(sorted(told), lambda _node, ps: relay_pass(
                self.client, self.keys, self.scripts, partitions=ps))
        except Exception:
            with self._relay_lock:
                self._relay_told |= told  # read again next pass: a failed pass loses none
            raise  # the loop backs off (a plain server's outage)
        n = sum(r.applied for r in done.values())
        again = {p for r in done.values() for p in r.again}
        again |= {p for node, ps in self.relays.groups(told).items() if node not in done for p in ps}
        if again:
            with self._relay_lock:
                self._relay_told |= again
        refused = [e for r in done.values() for e in r.refused]
        if refused:  # a damaged key or entry: the rest of the pass went on
            log.error("dependency relay refused", error=refused[0], refusals=len(refused))
        if n:
            log.info("dependency notices relayed", count=n)
        return n

    def sync_retention(self) -> int:
        """Copy the namespace's retention by state (`<ns>:retention`, and the task catalogue's
        `retention` options) into every partition's T:retention whose copy differs (a digest
        says which); a changed table also resets that
        partition's sweep watermark and kept set, so the new retention is applied to every
        finished run (once, in batches). Checked at every sweep (a partition HGET each, once
        a minute): a copy lost (FLUSHDB, a failover) is written again. → partitions updated."""
        k = self.keys
        try:
            t = retention_mod.table(self.client.hgetall(k.retention_config),
                                    self.client.hgetall(k.tasks))
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError) as exc:
            if not self.shards.cluster:
                raise
            # the node holding the namespace's table is down: every partition keeps the copy
            # it has (reap.lua applies it), and the next sweep copies again
            log.warning("retention table unreadable; partitions keep their copies",
                        error=str(exc)[:200])
            return 0
        d = retention_mod.digest(t, self.retention_ms)
        done = self.shards.run(range(k.partitions),
                               lambda _node, ps: self._sync_retention_group(ps, t, d))
        stale = [p for ps in done.values() for p in ps]
        if stale:
            log.info("retention by state copied into partitions", partitions=len(stale),
                     overrides=len(t))
        return len(stale)

    def _sync_retention_group(self, partitions: list[int], t: dict[str, int], d: str) -> list[int]:
        """`sync_retention` for the partitions of one node; → those updated."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p in partitions:
            pipe.hget(k.retention(p), retention_mod.DIGEST)
        stale = [p for p, have in zip(partitions, pipe.execute(raise_on_error=False), strict=True)
                 if isinstance(have, Exception) or have is None or have.decode() != d]
        for p in stale:
            # the new fields first, then the stale ones go: reap.lua sees the old table or the
            # new one (or a moment of both, each a valid retention), never none; no MULTI, so
            # the same commands work on a cluster
            mapping: dict[str, str | int] = {**t, retention_mod.DIGEST: d}
            try:
                old_fields = set(self.client.hkeys(k.retention(p)))
                self.client.hset(k.retention(p), mapping=mapping)  # type: ignore[arg-type]
                gone = [f for f in old_fields
                        if (f.decode(errors="replace") if isinstance(f, bytes) else f) not in mapping]
                if gone:
                    self.client.hdel(k.retention(p), *gone)
                self.client.delete(k.kept(p), k.swept(p))  # every finished run examined again
            except redis.ResponseError as exc:  # one damaged partition: the others go on
                self._damaged(p, exc)
        return stale

    def run(self) -> None:
        log.info("reaper started", tick_s=self.tick_s, partitions=self.keys.partitions)
        listener = Listener(self.client, self.url, self.keys.sched_wake, "ld", self.heads,
                            self.stopping, relay=self.told_relay)
        listener.start()
        listener.subscribed.wait(5)
        while not self.stopping.is_set():
            metrics.health.beat("reaper")
            try:
                if listener.reread.is_set():
                    listener.reread.clear()
                    self._read_all_at = 0.0
                    self._relayed_all_at = float("-inf")  # notices missed while away
                self.heads.changed.clear()
                self.reap_once()
                self.relay_once()
                report_health("reaper", listener, self.shards)
                self.outage.ok()
                metrics.REFUSING_WRITES.set(0)
                self.heads.changed.wait(self._sleep_s())
            except redis.RedisError as exc:
                if isinstance(exc, redis.exceptions.OutOfMemoryError):
                    # reap.lua is refused as a whole at maxmemory while heartbeats (allow-oom)
                    # go on extending leases: nothing is expired that a live worker could keep
                    metrics.REFUSING_WRITES.set(1)
                self.stopping.wait(backed_off("reaper", self.outage, exc, self.url, self.client))
        metrics.health.ready("reaper", False, "stopping")
        log.info("reaper stopped")

    def _sleep_s(self) -> float:
        """Until the earliest lease expiry or deadline (on the server clock: a dead worker's
        run is recovered right when its lease ends), the next sweep or safety read, at most a
        tick (a wake-up that finds nothing due sends nothing)."""
        now = self._now_ms()
        wake = min(self._swept_ms + SWEEP_MS,
                   now + int((SAFETY_S - (time.monotonic() - self._read_all_at)) * 1000))
        # partitions of a node backing off wait for its back-off, not for their heads (due
        # already: they would wake the loop at once, over and over)
        head = self.heads.earliest(self.shards.live(range(self.keys.partitions)))
        if head is not None:
            wake = min(wake, head + 2)
        sleep = max(0.002, (wake - now) / 1000)
        release = self.shards.next_release()
        if release is not None:
            sleep = min(sleep, max(0.002, release - time.monotonic()))
        return min(self.tick_s, sleep)

    def stop(self) -> None:
        self.stopping.set()
        self.heads.changed.set()

    def close(self) -> None:
        self.shards.close()
        self.relays.close()
        self.client.close()


