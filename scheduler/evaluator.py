"""The schedule evaluator: turns due schedules of the partitions this process owns into runs,
slightly ahead of their due time, so workers can start them on time.

Safety does not rest on ownership: run ids are derived from (schedule, occurrence) and
`materialize.lua` compares-and-sets the schedule's version and cursor, so two evaluators
racing over one schedule create each run once. Ownership only splits the work.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from typing import Any

import redis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms, sync_client, unavailable
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.schedules import MISS_TOLERANCE_MS, TRIGGER_FIELDS, plan, run_id_for, trigger_from_fields
from duetime.common.scripts import Scripts
from duetime.common.timespec import Trigger

log = get_logger("duetime.scheduler")

SCHED_FIELDS = ("version", "next_ms", "queue", "catchup", "max_catchup", "jitter_ms", "paused",
                "miss_tolerance_ms", *TRIGGER_FIELDS)
BATCH = 200


def _about_the_record(exc: Exception) -> bool:
    """An error raised while a script read a schedule's own record (a runtime error located in
    a script, or a key of the wrong type), not a refusal by the server (OOM, READONLY, ...)."""
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and (".lua:" in text or text.startswith("WRONGTYPE"))


class Ownership:
    """Partition leases: every live scheduler holds about P / (live schedulers) partitions;
    a dead one's leases expire and the others pick its partitions up."""

    def __init__(self, client: redis.Redis, keys: Keyspace, scripts: Scripts, sid: str,
                 ttl_ms: int) -> None:
        self.client, self.keys, self.scripts, self.id, self.ttl_ms = client, keys, scripts, sid, ttl_ms
        self.owned: set[int] = set()
        # another scheduler missed its renewal (it renews every ttl/3): it may be dead, so its
        # partitions free up when its leases expire; refresh on every tick until then, so the
        # takeover comes a tick after the expiry rather than up to ttl/3 after it
        self.suspect = False

    def refresh(self, now_ms: int) -> set[int]:
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(k.schedulers, {self.id: now_ms})
        pipe.zremrangebyscore(k.schedulers, "-inf", now_ms - self.ttl_ms)
        pipe.zrange(k.schedulers, 0, -1, withscores=True)
        members = pipe.execute()[2]
        live = max(1, len(members))
        overdue = now_ms - self.ttl_ms / 2
        self.suspect = any(seen < overdue for sid, seen in members if sid.decode() != self.id)
        target = math.ceil(k.partitions / live)
        # renew what we hold up to the target and give back extras (a scheduler joined) ...
        mine = sorted(self.owned)
        pipe = self.client.pipeline(transaction=False)
        for i, p in enumerate(mine):
            self._lease(pipe, p, "hold" if i < target else "release")
        self.owned = {p for p, ok in zip(mine, pipe.execute(), strict=True) if ok}
        # ... then take free partitions (no owner, or a dead owner's expired lease) up to it
        deficit = target - len(self.owned)
        if deficit > 0:
            others = [p for p in range(k.partitions) if p not in self.owned]
            pipe = self.client.pipeline(transaction=False)
            for p in others:
                pipe.exists(k.owner(p))
            free = [p for p, taken in zip(others, pipe.execute(), strict=True) if not taken]
            free = free[:deficit]
            pipe = self.client.pipeline(transaction=False)
            for p in free:
                self._lease(pipe, p, "hold")
            self.owned |= {p for p, ok in zip(free, pipe.execute(), strict=True) if ok}
        metrics.PARTITIONS_OWNED.set(len(self.owned))
        return self.owned

    def _lease(self, pipe: Any, p: int, mode: str) -> None:
        keys, args = tr.partition_lease(self.keys, p, self.id, self.ttl_ms, mode)
        self.scripts.partition_lease(keys=keys, args=args, client=pipe)

    def release_all(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for p in self.owned:
            self._lease(pipe, p, "release")
        pipe.zrem(self.keys.schedulers, self.id)
        pipe.execute()
        self.owned = set()


class Evaluator:
    def __init__(self, url: str, keys: Keyspace, lead_ms: int = 2000, tick_s: float = 0.25,
                 lease_ms: int = 3000, miss_tolerance_ms: int | None = None) -> None:
        self.url, self.keys, self.lead_ms, self.tick_s = url, keys, lead_ms, tick_s
        # None: each schedule's own tolerance; a number overrides them all (`--miss-tolerance`)
        self.miss_tolerance_ms = miss_tolerance_ms
        self.client = sync_client(url)
        self.scripts = Scripts(self.client)
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"
        self.ownership = Ownership(self.client, keys, self.scripts, self.id, lease_ms)
        self._refreshed_ms = 0
        self.stopping = threading.Event()
        self._triggers: dict[tuple[str, bytes], Trigger] = {}
        self.materialized = 0

    def _trigger(self, name: str, version: bytes, raw: list[bytes | None]) -> Trigger:
        """Parsed triggers are cached per (schedule, version): a cron parses once."""
        key = (name, version)
        t = self._triggers.get(key)
        if t is None:
            if len(self._triggers) > 200_000:
                self._triggers.clear()
            t = self._triggers[key] = trigger_from_fields(raw)
        return t

    def tick(self) -> int:
        """One evaluation of every due schedule in the owned partitions → runs created."""
        now = server_time_ms(self.client)
        # partition leases are renewed (and free ones taken) a third of their TTL apart, not
        # on every tick: the ticks between only read the owned partitions' due schedules
        # (unless another scheduler looks dead: then every tick, to take its partitions over)
        if now - self._refreshed_ms >= self.ownership.ttl_ms / 3 or self.ownership.suspect:
            self.ownership.refresh(now)
            self._refreshed_ms = now
        owned = sorted(self.ownership.owned)
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p in owned:
            pipe.zrange(k.sched_due(p), "-inf", now + self.lead_ms, byscore=True, offset=0, num=BATCH)
        due = [(p, n.decode()) for p, names in zip(owned, pipe.execute(), strict=True) for n in names]
        created = 0
        for i in range(0, len(due), BATCH):
            created += self._evaluate(due[i : i + BATCH], now)
        return created

    def _evaluate(self, due: list[tuple[int, str]], now: int) -> int:
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p, name in due:
            pipe.hmget(k.sched(p, name), *SCHED_FIELDS)
        records = pipe.execute()
        pipe = self.client.pipeline(transaction=False)
        calls: list[tuple[int, str, bytes]] = []
        for (p, name), f in zip(due, records, strict=True):
            version, next_ms, queue, catchup, max_catchup, jitter_ms, paused, tolerance = f[:8]
            if version is None or next_ms is None or paused == b"1":
                continue  # deleted, finished or paused meanwhile: upsert/pause fix the index
            try:
                q = queue.decode()
                if self.miss_tolerance_ms is not None:
                    tolerance = self.miss_tolerance_ms
                pl = plan(self._trigger(name, version, f[8:]), int(next_ms), now, self.lead_ms,
                          name=name, catchup=catchup.decode(), max_catchup=int(max_catchup),
                          jitter_ms=int(jitter_ms or 0),
                          tolerance_ms=MISS_TOLERANCE_MS if tolerance is None else int(tolerance))
            except Exception as exc:  # noqa: BLE001 - one damaged record must not stop the rest
                self._quarantine(p, name, version, f"{type(exc).__name__}: {exc}")
                continue
            runs: list[Any] = []
            for r in pl.runs:
                runs += [run_id_for(name, r.occurrence_ms), r.occurrence_ms, r.due_ms, r.coalesced,
                         r.coalesced_from_ms]
            if pl.skipped:
                metrics.SKIPPED.inc(pl.skipped)
                log.info("occurrences skipped by catch-up policy", schedule=name,
                         skipped=pl.skipped, catchup=catchup.decode())
            keys, args = tr.materialize(
                k, p, name, q, runs, expected=(version, next_ms, "" if pl.next_ms is None else pl.next_ms),
                skipped=pl.skipped)
            self.scripts.materialize(keys=keys, args=args, client=pipe)
            calls.append((p, name, version))
        if not calls:
            return 0
        created = 0
        for (p, name, version), res in zip(calls, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(res, Exception):
                if not _about_the_record(res):
                    raise res  # the server, not this schedule: the loop backs off
                self._quarantine(p, name, version, f"materialize.lua failed on it: {res}")
                continue
            created += int(res[1])
        metrics.MATERIALIZED.inc(created)
        self.materialized += created
        return created

    def _quarantine(self, p: int, name: str, version: bytes, reason: str) -> None:
        """Set a schedule whose record cannot be evaluated aside (it stays visible, with the
        reason, in `schedule list` and `doctor`); registering it again brings it back."""
        reason = reason[:500]
        keys, args = tr.schedule_quarantine(self.keys, p, name, version, reason)
        if self.scripts.schedule_quarantine(keys=keys, args=args) == b"quarantined":
            metrics.QUARANTINED.inc()
            log.error("schedule quarantined: its record cannot be evaluated; the others go on",
                      schedule=name, reason=reason,
                      fix="register the schedule again (app.schedule or `duetime schedule add`)")

    def run(self) -> None:
        log.info("evaluator started", scheduler_id=self.id, lead_ms=self.lead_ms,
                 partitions=self.keys.partitions)
        backoff = 0.1
        while not self.stopping.is_set():
            try:
                t0 = time.monotonic()
                self.tick()
                backoff = 0.1
                self.stopping.wait(max(0.0, self.tick_s - (time.monotonic() - t0)))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("redis unavailable; evaluator retrying",
                            error=str(unavailable(self.url, exc)), retry_in=backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except redis.RedisError as exc:
                # refused (OOM at maxmemory, READONLY after a failover, a damaged key): the
                # process stays up and tries again, rather than crash-looping under a supervisor
                log.error("redis refused a call; evaluator retrying", error=str(exc),
                          retry_in=backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            self.ownership.release_all()
        log.info("evaluator stopped", materialized=self.materialized)

    def stop(self) -> None:
        self.stopping.set()
