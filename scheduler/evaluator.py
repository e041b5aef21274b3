"""The schedule evaluator: turns due schedules of the partitions this process owns into runs,
slightly ahead of their due time, so workers can start them on time.

Safety does not rest on ownership: run ids are derived from (schedule, occurrence) and
`materialize.lua` compares-and-sets the schedule's version and cursor, so two evaluators
racing over one schedule create each run once. Ownership only splits the work.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any

import redis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.connection import (
    process_kw,
    server_time_ms,
    sync_client,
)
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.outage import Outage
from duetime.common.schedules import (
    CHECKED_FIELDS,
    MISS_TOLERANCE_MS,
    TRIGGER_FIELDS,
    Plan,
    check_stored,
    effective_stagger_ms,
    plan,
    read_stagger_policy,
    record_fields,
    run_id_for,
    stored_stagger,
    trigger_from_fields,
)
from duetime.common.scripts import Scripts
from duetime.common.time.spec import Trigger
from duetime.scheduler.calendars import CALENDAR_FIELDS, apply, extras, read_calendars
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
from duetime.scheduler.shards import PLAIN, Shards, by_node

log = get_logger("duetime.scheduler")

SCHED_FIELDS = ("version", "next_ms", "queue", "catchup", "max_catchup", "jitter_ms", "paused",
                "miss_tolerance_ms", "stagger_ms", *TRIGGER_FIELDS,
                *[c for c in CHECKED_FIELDS if c not in ("queue", "catchup", "max_catchup",
                                                         "jitter_ms", "paused",
                                                         "miss_tolerance_ms")],
                *CALENDAR_FIELDS)
N_PLAIN = 9  # the fields before the trigger's
N_TRIGGER = N_PLAIN + len(TRIGGER_FIELDS)  # the checked fields follow the trigger's
N_CAL = len(SCHED_FIELDS) - len(CALENDAR_FIELDS)  # the calendar's fields come last
POLICY_EVERY_S = 5.0  # how often the namespace's stagger policy is read again
BATCH = 200
LEGACY_RETRY_S = 10.0  # <ns>:owners unreadable (cluster): read again this much later


def _about_the_record(exc: Exception) -> bool:
    """An error raised while a script read a schedule's own record (a runtime error located in
    a script, or a key of the wrong type), not a refusal by the server (OOM, READONLY, ...)."""
    return bool(about_a_key(exc))


class Ownership:
    """Which partitions this scheduler evaluates: its share of them (about P / live
    schedulers), kept with partition_owners.lua a third of the lease apart -- sooner when
    another scheduler's lease on a partition this one should take over expires.

    On a plain server that is one call on the `<ns>:owners` table. On a cluster each node's
    partitions have a table of their own (`T:node_owners` of the node's first partition), renewed
    on their own: a dead primary stops the ownership of its partitions only, the other nodes'
    stay owned and evaluated. A cluster scheduler also reads `<ns>:owners`, which an older
    version keeps on one node, and leaves the partitions held there by a live older scheduler
    to it (a rolling upgrade); that table unreadable, it goes on with what it knew."""

    def __init__(self, client: redis.Redis, keys: Keyspace, scripts: Scripts, sid: str,
                 ttl_ms: int) -> None:
        self.client, self.keys, self.scripts, self.id, self.ttl_ms = client, keys, scripts, sid, ttl_ms
        self.cluster = hasattr(client, "nodes_manager")
        self.by_node: dict[str, set[int]] = {}  # node -> partitions of its table held
        self.next_by_node: dict[str, int] = {}  # node -> server time of its next call
        self.offset_ms: float | None = None  # server clock - local monotonic clock
        self.foreign: set[int] = set()  # held by an older scheduler in <ns>:owners
        self._legacy_at = -1e9  # monotonic time <ns>:owners was last read (cluster)
        self._lock = threading.Lock()  # nodes are renewed side by side (scheduler/shards.py)

    @property
    def owned(self) -> set[int]:
        with self._lock:
            return set().union(*self.by_node.values())

    @property
    def next_ms(self) -> int:
        """The earliest renewal due (0 before the first)."""
        with self._lock:
            return min(self.next_by_node.values(), default=0)

    @next_ms.setter
    def next_ms(self, ms: int) -> None:
        with self._lock:
            for node in self.next_by_node:
                self.next_by_node[node] = ms

    def next_of(self, node: str) -> int:
        with self._lock:
            return self.next_by_node.get(node, 0)

    def now_ms(self) -> int:
        """The server's clock, from the offset measured at the last call (one before any)."""
        if self.offset_ms is None:
            self.offset_ms = server_time_ms(self.client) - time.monotonic() * 1000
        return int(time.monotonic() * 1000 + self.offset_ms)

    def refresh(self) -> set[int]:
        """Every node's table (a plain server's one) renewed now; → the partitions owned."""
        self.read_legacy(force=True)
        for node, ps in by_node(self.client, self.keys, range(self.keys.partitions)).items():
            self.refresh_node(node, ps)
        return self.owned

    def refresh_node(self, node: str, partitions: list[int]) -> set[int]:
        """One node's table renewed (`partitions`: the ones it serves); → those owned."""
        if node == PLAIN:
            keys, args = tr.partition_owners(self.keys, self.id, self.ttl_ms)
        else:
            keys, args = tr.partition_owners(self.keys, self.id, self.ttl_ms, partitions=partitions,
                                             foreign=sorted(self.foreign & set(partitions)))
        now, takeover, *owned = tr.counts(self.scripts.partition_owners(keys=keys, args=args))
        self.offset_ms = now - time.monotonic() * 1000
        mine = set(owned)
        nxt = now + self.ttl_ms // 3
        if takeover >= 0:  # another scheduler lapses, or a lease to take over runs out, then
            nxt = min(nxt, takeover)
        with self._lock:
            for other, held in self.by_node.items():  # a slot moved: this node's table has it
                if other != node:
                    held -= set(partitions)
            self.by_node[node] = mine
            self.next_by_node[node] = nxt
        metrics.PARTITIONS_OWNED.set(len(self.owned))
        return mine

    def read_legacy(self, force: bool = False) -> None:
        """Cluster only, at most once a renewal period: the partitions an older scheduler holds
        in `<ns>:owners` (a live lease of another scheduler: no scheduler of this version
        writes partitions there), left to it; while there are some, this scheduler says it is
        alive there too, so the older ones shrink their share and give partitions back. The
        table lost (its node dead), the partitions known to be foreign stay so."""
        if not self.cluster or (not force and time.monotonic() - self._legacy_at < self.ttl_ms / 3000):
            return
        self._legacy_at = time.monotonic()
        try:
            table = self.client.hgetall(self.keys.owners)
        except (redis.RedisError, OSError):
            # its node is down: asked again LEGACY_RETRY_S later, not every renewal (each try
            # at a dead node costs the client's own retries)
            self._legacy_at = time.monotonic() + LEGACY_RETRY_S
            return
        now = self.now_ms()
        foreign = set()
        for f, v in table.items():
            field = f.decode(errors="replace") if isinstance(f, bytes) else str(f)
            value = v.decode(errors="replace") if isinstance(v, bytes) else str(v)
            sid, _, exp = value.rpartition("|")
            if field.startswith("p:") and sid != self.id and exp.isdigit() and int(exp) > now:
                with contextlib.suppress(ValueError):
                    foreign.add(int(field[2:]))
        self.foreign = foreign
        if foreign:
            with contextlib.suppress(redis.RedisError, OSError):
                self.client.hset(self.keys.owners, f"s:{self.id}", now)

    def release_all(self) -> None:
        """Give every partition back (a clean stop), node by node, as far as nodes answer."""
        for node, ps in by_node(self.client, self.keys, range(self.keys.partitions)).items():
            if node == PLAIN:
                keys, args = tr.partition_owners(self.keys, self.id, self.ttl_ms, "release")
            else:
                keys, args = tr.partition_owners(self.keys, self.id, self.ttl_ms, "release",
                                                 partitions=ps)
            try:
                self.scripts.partition_owners(keys=keys, args=args)
            except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError):
                if node == PLAIN:
                    raise
        with self._lock:
            self.by_node = {}
        if self.cluster:
            with contextlib.suppress(redis.RedisError, OSError):
                self.client.hdel(self.keys.owners, f"s:{self.id}")


class Evaluator:
    def __init__(self, url: str, keys: Keyspace, lead_ms: int = 2000, tick_s: float = 0.25,
                 lease_ms: int = 3000, miss_tolerance_ms: int | None = None) -> None:
        self.url, self.keys, self.lead_ms, self.tick_s = url, keys, lead_ms, tick_s
        # None: each schedule's own tolerance; a number overrides them all (`--miss-tolerance`)
        self.miss_tolerance_ms = miss_tolerance_ms
        self.client = sync_client(url, **process_kw())  # bounded waits
        self.scripts = Scripts(self.client)
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"
        self.ownership = Ownership(self.client, keys, self.scripts, self.id, lease_ms)
        self.heads = Heads()  # per owned partition: when its earliest schedule comes due
        self._read_all_at: dict[str, float] = {}  # node -> monotonic time of its last full read
        self.stopping = threading.Event()
        self.outage = Outage("evaluator", log, cap_s=None, scheduler_id=self.id)
        self.shards = Shards(self.client, keys, "evaluator", log, scheduler_id=self.id)
        self._triggers: dict[tuple[str | bytes | None, ...], Trigger] = {}
        self.materialized = 0
        self._aside: dict[int, int] = {}  # partition -> server ms: not evaluated before then
        self._policy_ms = 0  # the namespace's default stagger
        self._policy_at = -POLICY_EVERY_S  # monotonic time it was read

    def _stagger_policy(self) -> int:
        """The namespace's default stagger, read again every few seconds (a policy change
        applies to the runs materialised after it)."""
        if time.monotonic() - self._policy_at >= POLICY_EVERY_S:
            try:
                self._policy_ms = read_stagger_policy(self.client, self.keys)
            except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError):
                if not self.shards.cluster:
                    raise
                # the node holding <ns>:meta is down: the other nodes' schedules go on with
                # the policy last read (read again on the next period)
            self._policy_at = time.monotonic()
        return self._policy_ms

    def _trigger(self, name: str, version: bytes, raw: list[bytes | None]) -> Trigger:
        """Parsed triggers are cached per (schedule, version, stored trigger fields): a cron
        parses once, and a trigger field edited by hand (no new version) is parsed again."""
        key = (name, version, *raw)
        t = self._triggers.get(key)
        if t is None:
            if len(self._triggers) > 200_000:
                self._triggers.clear()
            t = self._triggers[key] = trigger_from_fields(raw)
        return t

    def _now_ms(self) -> int:
        return self.ownership.now_ms()

    def _own(self, node: str, partitions: list[int]) -> set[int]:
        """Renew one node's ownership; the heads of partitions just taken are read."""
        before = self.ownership.owned
        self.ownership.read_legacy()
        owned = self.ownership.refresh_node(node, partitions)
        self.heads.drop_except(self.ownership.owned)
        if owned - before:
            self._read_heads(sorted(owned - before))
        return owned

    def _read_heads(self, partitions: list[int]) -> None:
        mark = self.heads.mark()
        pipe = self.client.pipeline(transaction=False)
        for p in partitions:
            pipe.zrange(self.keys.sched_due(p), 0, 0, withscores=True)
        for p, head in zip(partitions, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(head, Exception):  # a damaged index stops its partition only
                self._damaged_partition(p, self.keys.sched_due(p), head)
                continue
            ms = head_ms(head[0][1]) if head else None
            aside = self._aside.get(p, 0)
            if ms is not None and ms < aside:
                ms = aside  # set aside after a damaged key or no progress: not before then
            self.heads.set(p, ms, mark)

    def _damaged_partition(self, p: int, key: str, exc: Exception) -> None:
        """A partition's index cannot be read (a key of the wrong type, ...): the other
        partitions go on; this one is tried again a few seconds later, not in a loop."""
        if not _about_the_record(exc):
            raise exc  # the server, not this key: the loop backs off
        log.error("damaged key: a partition's schedules wait until it is repaired; the others go on",
                  key=key, partition=p, error=str(exc), fix="duetime doctor names it")
        self._set_aside(p)

    def _set_aside(self, p: int) -> None:
        self._aside[p] = until = self._now_ms() + DAMAGED_RETRY_MS
        self.heads.set(p, until, self.heads.mark())

    def tick(self) -> int:
        """A full pass: renew ownership when due, read every owned partition's head, evaluate
        what is due within the lead; → runs created. (The loop runs `step`, which reads heads
        only when notices or the safety period say so.)"""
        self._read_all_at.clear()
        return self.step()

    def step(self) -> int:
        """Evaluate every owned partition whose earliest schedule is due within the lead (and
        renew ownership when it is time), each node's partitions on their own (a node backing
        off is left out until its back-off ends); → runs created."""
        done = self.shards.run(range(self.keys.partitions), self._step_node)
        created = sum(done.values())
        self.materialized += created
        return created

    def _step_node(self, node: str, partitions: list[int]) -> int:
        """`step` for the partitions one node serves."""
        if self._now_ms() >= self.ownership.next_of(node):
            self._own(node, partitions)
        now = self._now_ms()
        owned = self.ownership.owned & set(partitions)
        if time.monotonic() - self._read_all_at.get(node, -SAFETY_S) >= SAFETY_S:
            self._read_heads(sorted(owned))
            self._read_all_at[node] = time.monotonic()
        ready = self.heads.ready(now + self.lead_ms, owned)
        if not ready:
            return 0
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p in ready:
            pipe.zrange(k.sched_due(p), "-inf", now + self.lead_ms, byscore=True, offset=0, num=BATCH)
        due: list[tuple[int, str]] = []
        for p, names in zip(ready, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(names, Exception):
                self._damaged_partition(p, k.sched_due(p), names)
                continue
            due += [(p, n.decode(errors="replace")) for n in names]
        created = 0
        moved: set[int] = set()  # partitions this step moved on (materialised or quarantined)
        for i in range(0, len(due), BATCH):
            created += self._evaluate(due[i : i + BATCH], now, moved)
        for p in partitions:
            if p in self._aside:
                moved.discard(p)
                if self._aside[p] <= now:
                    del self._aside[p]
        self._read_heads(ready)  # where each stands now (a batch may have left some due)
        # a partition whose due schedules could not be moved on (every one skipped or refused)
        # would be found due again at once: it waits a few seconds instead of spinning
        stuck = {p for p, _ in due} - moved
        for p in stuck:
            h = self.heads.due.get(p)
            if h is not None and h <= now + self.lead_ms:
                log.warning("due schedules of a partition could not be evaluated; retrying later",
                            partition=p, retry_in_ms=DAMAGED_RETRY_MS)
                self._set_aside(p)
        return created

    def _sleep_s(self) -> float:
        """Until the earliest owned schedule is within the lead, the next ownership call or
        the next safety read, whichever is first; a notice wakes the loop sooner. A node
        backing off counts by the end of its back-off, not by its partitions' heads."""
        now = self._now_ms()
        with self.ownership._lock:
            renewals = dict(self.ownership.next_by_node)
        wake = min([ms for n, ms in renewals.items() if not self.shards.is_held(n)]
                   or [now + int(SAFETY_S * 1000)])
        read_at = min([t for n, t in dict(self._read_all_at).items() if not self.shards.is_held(n)],
                      default=time.monotonic())
        wake = min(wake, now + int((SAFETY_S - (time.monotonic() - read_at)) * 1000))
        head = self.heads.earliest(self.shards.live(self.ownership.owned))
        if head is not None:
            wake = min(wake, head - self.lead_ms)
        sleep = max(0.0, (wake - now) / 1000)
        release = self.shards.next_release()
        if release is not None:
            sleep = min(sleep, max(0.0, release - time.monotonic()))
        return sleep

    def _evaluate(self, due: list[tuple[int, str]], now: int, moved: set[int]) -> int:
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p, name in due:
            pipe.hmget(k.sched(p, name), *SCHED_FIELDS)
            pipe.hget(k.scheds(p), name)  # the packed record (common/schedules.py)
        res = pipe.execute(raise_on_error=False)
        records = [side if isinstance(side, Exception) else packed if isinstance(packed, Exception)
                   else record_fields(name, SCHED_FIELDS, side, packed)
                   for (_, name), side, packed in zip(due, res[::2], res[1::2], strict=True)]
        policy_ms = self._stagger_policy()
        calendars = read_calendars(self.client, self.keys, {
            f[N_CAL].decode(errors="replace") for f in records
            if not isinstance(f, Exception) and f[N_CAL]})
        pipe = self.client.pipeline(transaction=False)
        calls: list[tuple[int, str, bytes]] = []
        for (p, name), f in zip(due, records, strict=True):
            if isinstance(f, Exception):  # its key is not a hash: only this schedule stops
                if not _about_the_record(f):
                    raise f
                self._quarantine(p, name, b"", f"key {k.sched(p, name)} is damaged: {f}", moved)
                continue
            version, next_ms, queue, catchup, max_catchup, jitter_ms, paused, tolerance, stagger = \
                f[:N_PLAIN]
            if version is None:
                # its hash is gone (deleted by hand): the due entry is an orphan, removed
                self._quarantine(p, name, b"", "", moved)
                continue
            if paused == b"1" or next_ms is None:
                # paused or finished meanwhile (pause and the last materialize take it out of
                # the due set); left there by a hand edit, the partition is set aside below
                continue
            try:
                trigger = self._trigger(name, version, f[N_PLAIN:N_TRIGGER])
                check_stored(dict(zip(SCHED_FIELDS, f, strict=True)), trigger)
                q = queue.decode()
                if self.miss_tolerance_ms is not None:
                    tolerance = self.miss_tolerance_ms
                applied = apply(trigger, dict(zip(CALENDAR_FIELDS, f[N_CAL:], strict=True)),
                                int(next_ms), now, calendars)
                trigger, cursor = applied.trigger, applied.cursor_ms
                pl = Plan([], 0, None) if cursor is None else plan(
                    trigger, cursor, now, self.lead_ms,
                    name=name, catchup=catchup.decode(), max_catchup=int(max_catchup),
                    jitter_ms=int(jitter_ms or 0),
                    tolerance_ms=MISS_TOLERANCE_MS if tolerance is None else int(tolerance),
                    stagger_ms=effective_stagger_ms(stored_stagger(stagger), policy_ms))
                starts, excluded = extras(name, applied, pl.runs, pl.next_ms, now + self.lead_ms)
            except Exception as exc:  # noqa: BLE001 - one damaged record must not stop the rest
                self._quarantine(p, name, version, f"{type(exc).__name__}: {exc}", moved)
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
                skipped=pl.skipped, intervals=starts, calendar=applied.label, excluded=excluded)
            self.scripts.materialize(keys=keys, args=args, client=pipe)
            calls.append((p, name, version))
            moved.add(p)
        if not calls:
            return 0
        created = 0
        for (p, name, version), res in zip(calls, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(res, Exception):
                if str(res).startswith("PAYLOAD_TOO_LARGE"):  # over the namespace's cap
                    self._quarantine(p, name, version, str(res), moved)
                    continue
                if not _about_the_record(res):
                    raise res  # the server, not this schedule: the loop backs off
                self._quarantine(p, name, version, f"materialize.lua failed on it: {res}", moved)
                continue
            created += int(tr.status_detail(res)[1])
        metrics.MATERIALIZED.inc(created)
        return created

    def _quarantine(self, p: int, name: str, version: bytes, reason: str,
                    moved: set[int]) -> None:
        """Set a schedule whose record cannot be evaluated aside (it stays visible, with the
        reason, in `schedule list` and `doctor`); registering it again brings it back."""
        reason = reason[:500]
        keys, args = tr.schedule_quarantine(self.keys, p, name, version, reason)
        moved.add(p)  # out of the due set: the partition moved on
        try:
            status = tr.status(self.scripts.schedule_quarantine(keys=keys, args=args))
        except redis.ResponseError as exc:  # the partition's own indexes are damaged
            self._damaged_partition(p, self.keys.quarantine(p), exc)
            return
        if status == b"quarantined":
            metrics.QUARANTINED.inc()
            log.error("schedule quarantined: its record cannot be evaluated; the others go on",
                      schedule=name, reason=reason,
                      fix="register the schedule again (app.schedule or `duetime schedule add`)")

    def run(self) -> None:
        log.info("evaluator started", scheduler_id=self.id, lead_ms=self.lead_ms,
                 partitions=self.keys.partitions)
        listener = Listener(self.client, self.url, self.keys.sched_wake, "s", self.heads, self.stopping)
        listener.start()
        listener.subscribed.wait(5)  # notices from now on reach us; then read the heads
        while not self.stopping.is_set():
            metrics.health.beat("evaluator")
            try:
                if listener.reread.is_set():
                    listener.reread.clear()
                    self._read_all_at.clear()  # (re)subscribed: read every head again
                self.heads.changed.clear()
                self.step()
                report_health("evaluator", listener, self.shards)
                self.outage.ok()
                self.heads.changed.wait(min(self._sleep_s(), self.tick_s))
            except redis.RedisError as exc:
                # unreachable, failing over or refused (OOM at maxmemory, a damaged key): the
                # process stays up and tries again, rather than crash-looping under a supervisor
                self.stopping.wait(backed_off("evaluator", self.outage, exc, self.url, self.client))
        metrics.health.ready("evaluator", False, "stopping")
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            self.ownership.release_all()
        self.shards.close()
        log.info("evaluator stopped", materialized=self.materialized)

    def stop(self) -> None:
        self.stopping.set()
        self.heads.changed.set()
