"""The Redis key layout (docs/keys.md): one hash tag per partition, so each Lua script
touches exactly one cluster slot.

Partition tags are searched so the P partitions land in P evenly spaced slot ranges;
a cluster's shards own contiguous slot ranges, so partitions spread over shards.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import cached_property

from duetime.common.errors import DamagedState, InvalidInput
from duetime.common.names import check_name
from redis.crc import key_slot

SLOTS = 16384
MAX_PARTITIONS = 1024


def stored_partitions(raw: bytes | str | None, meta_key: str = "<ns>:meta") -> int | None:
    """The partition count recorded in the namespace's meta hash (None: not recorded yet).
    A value no duetime process writes (`HSET <ns>:meta partitions abc`) is refused with a
    reason naming the key, not a traceback."""
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_PARTITIONS):
        raise DamagedState(f"{meta_key} field partitions is {text[:40]!r}, not a count in "
                           f"1..{MAX_PARTITIONS}: the namespace's key layout is unknown (restore "
                           f"it with HSET {meta_key} partitions N)")
    return int(text)


@dataclass(frozen=True)
class KeyKind:
    """One kind of key: its suffix (after `ns:{tag}:` or `ns:`), Redis type, what it holds,
    and what follows the suffix (a queue, run id, schedule name or worker id), if anything."""

    suffix: str
    type: str
    holds: str
    item: str = ""

    @property
    def pattern(self) -> str:
        return self.suffix + (f"<{self.item}>" if self.item else "")


# Every key of a partition, spelled here and nowhere else: the Python side builds names with
# the Keyspace methods below; the Lua scripts name them `K.<kind>` and common/scripts.py
# writes the suffix in when it loads them; `duetime keys` documents them from this table.
# A suffix ending in ':' is followed by a run id, queue or schedule name.
PARTITION_KEYS: dict[str, KeyKind] = {
    "due": KeyKind("due:", "zset", "run id -> due time (ms); claimable once due <= now", "queue"),
    "retry": KeyKind("retry:", "zset", "run id -> retry time (ms) after a failed attempt", "queue"),
    "leases": KeyKind("leases", "zset", "running run id -> lease expiry (ms): the lease itself "
                      "(owner and fence are the run's worker and fence fields)"),
    "run": KeyKind("run:", "hash", "the run record (plain fields; payload is msgpack)", "run"),
    "attempts": KeyKind("attempts:", "list", "one JSON entry per ended attempt that did not "
                        "succeed (the succeeded one is inline in the run hash)", "run"),
    "notify": KeyKind("notify:", "list", "a run's final state, pushed for each client waiting on "
                      "it (exists briefly, only while someone waits)", "run"),
    "sched": KeyKind("sched:", "hash", "a schedule's side state (paused, buffered, fail_streak, "
                     "counters; only while it has any); a schedule written before the packed "
                     "layout: its whole record", "name"),
    "scheds": KeyKind("scheds", "hash", "schedule name -> its packed record (<key><length>:<value> "
                      "text entries: definition and cursor state)"),
    "sched_due": KeyKind("sched_due", "zset", "schedule name -> next fire time (ms); +inf: "
                         "paused, ended or quarantined (every schedule is in it)"),
    "schedules": KeyKind("schedules", "zset",
                         "schedule name -> created (ms): the index of schedules written before "
                         "the packed layout (emptied as they are converted)"),
    "quarantine": KeyKind("quarantine", "zset", "schedule name -> time (ms) it was set aside "
                          "because its record could not be evaluated"),
    "sched_running": KeyKind("sched_running:", "set",
                             "runs running now of a schedule whose overlap policy is not allow",
                             "name"),
    "deadlines": KeyKind("deadlines", "zset", "run id -> starting deadline (ms); later: missed"),
    "dead": KeyKind("dead", "zset", "dead-lettered run id -> time (ms)"),
    "uncertain": KeyKind("uncertain", "zset", "uncertain run id -> time (ms): an operator decides"),
    "done": KeyKind("done", "zset", "finished run id -> time (ms), for listing and retention"),
    "events": KeyKind("events", "stream", "capped lifecycle events, for audit"),
    "prio": KeyKind("prio:", "zset", "run id -> -priority * 1e13 + due ms, for runs enqueued "
                    "with a priority: claimed first (highest, then earliest) once due; an entry "
                    "whose run is no longer scheduled is dropped by the claim", "queue"),
    "lane": KeyKind("lane:", "zset", "run id -> due ms: one tenant's first attempts waiting in a "
                    "queue ('<queue>|<tenant>'; '<queue>|' for runs without a tenant), claimed "
                    "round-robin between tenants", "lane"),
    "lanes": KeyKind("lanes:", "zset", "tenant -> when the claim last took from its lane (ms; 0 "
                     "= never): least recently served first", "queue"),
    "laned": KeyKind("laned:", "zset", "run id -> due ms: the runs of the queue's due set that "
                     "wait in a lane (the claim's due-order path skips them)", "queue"),
    "limits": KeyKind("limits", "hash", "this partition's share of the namespace's limits: "
                      "'<kind>:<name>:c' -> concurrency, '<kind>:<name>:r' -> 'tokens per ms, "
                      "burst' (absent: no limit; claim.lua reads it; the field names: "
                      "common/limit_fields.py)"),
    "caps": KeyKind("caps", "hash", "the namespace's caps, copied into every partition so "
                    "enqueue.lua checks them in its slot: max_payload -> bytes (absent: no cap; "
                    "set with duetime limits payload)"),
    "paused": KeyKind("paused", "hash", "the namespace's paused queues, copied into every "
                      "partition so claim.lua sees a pause in its slot: queue -> JSON {note, "
                      "at} (absent: nothing paused; set with duetime queue pause)"),
    "coalesce": KeyKind("coalesce", "hash", "debounce and throttle by key: '<task>\\n<key>' -> "
                        "the key's current run id (enqueue.lua, lua/enqueue/coalesce.lua; an "
                        "entry whose run is gone or started is replaced by the next enqueue)"),
    "holds": KeyKind("holds", "hash", "rate-limit holds raised by runs (RateLimited): '<kind>:"
                     "<name>' (task, queue or tenant) -> until ms; claim.lua admits no run of a "
                     "held scope until then (an expired entry is ignored, then dropped)"),
    "limrun": KeyKind("limrun:", "zset", "runs holding a concurrency slot of a limit -> lease "
                      "expiry hint (ms); an entry whose lease is gone frees its slot",
                      "scope"),
    "waiting": KeyKind("waiting", "zset", "run id -> created (ms): the partition's waiting runs "
                       "(dependencies, batch callbacks), for listings"),
    "deps": KeyKind("deps:", "set", "a waiting run's dependencies not counted yet (run ids); "
                    "it is released when the set is empty (docs/workloads.md)", "run"),
    "dependents": KeyKind("dependents:", "set", "runs waiting on this run: '<partition>|<run "
                          "id>' (the run's field deps_out says it has some)", "run"),
    "depnotes": KeyKind("depnotes", "list", "'<partition>|<dependent>|<dependency>|<state>': "
                        "a run of this partition ended and a dependent in another partition "
                        "waits on it; the relay (reaper) applies it there, then removes it"),
    "deplinks": KeyKind("deplinks", "list", "'<partition>|<dependency>|<dependent>': a "
                        "waiting run of this partition still to register with a dependency in "
                        "another partition (the producer does it at once; the relay if it died)"),
    "batch": KeyKind("batch:", "hash", "a batch: total, succeeded, failed, state, created, "
                     "finished and its callbacks' run ids", "batch"),
    "bpending": KeyKind("bpending:", "set", "a batch's members not finished yet (plus '~open' "
                        "while its creation is under way)", "batch"),
    "bmembers": KeyKind("bmembers:", "zset", "a batch's members -> when added (ms)", "batch"),
    "batches": KeyKind("batches", "zset", "batch id -> created, then finished (ms): the "
                       "partition's batch index"),
    "bucket": KeyKind("bucket:", "hash", "a rate limit's token bucket: tokens, ts (server ms); "
                      "expires once full again", "scope"),
    "retention": KeyKind("retention", "hash", "the namespace's retention by state, copied into "
                         "every partition by the reaper so reap.lua reads it in its slot: "
                         "'<scope>|<state>' -> ms (scope *, q:<queue> or t:<task>; 0 = never "
                         "deleted), _digest -> the table's digest (common/retention.py)"),
    "kept": KeyKind("kept", "zset", "finished run id -> when the retention sweep deletes it "
                    "(ms): runs it examined and kept longer than the shortest retention"),
    "swept": KeyKind("swept", "hash", "the retention sweep's watermark per finished-run index "
                     "(done, dead, uncertain) -> the score up to which it examined every run"),
    "node_owners": KeyKind("owners", "hash", "cluster only, in the first partition a node serves: "
                      "which scheduler evaluates which of that node's partitions, as <ns>:owners "
                      "(p:<partition> -> '<scheduler id>|<lease expiry ms>', s:<scheduler id> "
                      "-> last seen ms)"),
}
SUFFIX: dict[str, str] = {name: kind.suffix for name, kind in PARTITION_KEYS.items()}

# Keys and the channel shared by the whole namespace: `<ns>:` + the suffix.
GLOBAL_KEYS: dict[str, KeyKind] = {
    "meta": KeyKind("meta", "hash", "partition count and format version of the namespace; its "
                    "default schedule stagger (stagger_ms); its payload cap (max_payload)"),
    "queues": KeyKind("queues", "set", "every queue name used in the namespace"),
    "workers": KeyKind("workers", "zset", "worker id -> last heartbeat (ms)"),
    "worker": KeyKind("worker:", "hash", "a live worker: queues, concurrency, in-flight (expires)",
                      "worker"),
    "owners": KeyKind("owners", "hash", "which scheduler evaluates which partition (a plain "
                      "server; a cluster keeps one table per node, T:node_owners, and reads this one "
                      "only for partitions an older scheduler holds): "
                      "p:<partition> -> '<scheduler id>|<lease expiry ms>', "
                      "s:<scheduler id> -> last seen (ms)"),
    "sched_wake": KeyKind("sched_wake", "channel", "pub/sub: '<kind>|<partition>|<ms>' tells "
                          "schedulers a schedule (s), a lease (l) or a starting deadline (d) "
                          "came due earlier than they knew, or that a partition's dependency "
                          "lists hold an entry for the relay (r)"),
    "tasks": KeyKind("tasks", "hash", "task name -> its options as JSON, published by workers, so "
                     "a producer without the task's code enqueues it with the right options"),
    "task_seen": KeyKind("task_seen", "hash", "task name -> when a live worker that has its "
                         "code last said so (ms): a run of a task no worker has known for the "
                         "grace period is dead-lettered; by-name enqueues check it"),
    "wake": KeyKind("wake", "channel", "pub/sub: '<partition>|<queue>|<due ms>' wakes idle workers"),
    "limits": KeyKind("limits", "hash", "the limits set for the namespace (duetime limits set): "
                      "'<kind>:<name>' -> JSON; copied as per-partition shares into T:limits"),
    "paused": KeyKind("paused", "hash", "paused queues as paused (duetime queue pause): queue "
                      "-> JSON {note, at ms}; copied into every partition's T:paused"),
    "series": KeyKind("series:", "stream", "per-queue numbers (backlog, running, finished/s, "
                      "start lateness p50/p99, dead) sampled by schedulers at a fixed step, capped; "
                      "entry id = the sample's time: what the web console plots", "step"),
    "retention": KeyKind("retention", "hash", "retention by state as set (duetime retention "
                         "set): '*', 'queue:<q>', 'task:<t>' -> JSON {state: ms}; the reapers "
                         "copy it into every partition's T:retention"),
    "cost": KeyKind("cost", "hash", "'<task>|<owner>|a|f|ms' -> attempts, attempts that did not "
                    "succeed, ms spent on those, counted by workers since the namespace began"),
    "cost_minute": KeyKind("cost:", "hash", "the same counts for one minute (epoch minute of "
                           "the workers' clocks), kept a day: `top`'s recent window", "minute"),
    "calendar": KeyKind("calendar:", "hash", "a business calendar (duetime calendar add): version, "
                        "weekdays, dates (excluded, resolved over first_year..last_year), its "
                        "sources (country, subdiv, explicit, ics_dates), updated", "name"),
    "calendars": KeyKind("calendars", "zset", "calendar name -> when it was last changed (ms)"),
}
GLOBAL: dict[str, str] = {name: kind.suffix for name, kind in GLOBAL_KEYS.items()}


def _tag_for(p: int, partitions: int) -> str:
    lo, hi = p * SLOTS // partitions, (p + 1) * SLOTS // partitions
    n = 0
    while True:
        tag = f"p{p}.{n}"
        if lo <= key_slot(tag.encode()) < hi:
            return tag
        n += 1


def stable_hash(text: str) -> int:
    """crc32: stable across processes and Python versions (unlike hash())."""
    return zlib.crc32(text.encode())


@dataclass(frozen=True)
class Keyspace:
    namespace: str = "duetime"
    partitions: int = 16
    _tags: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidInput(f"partitions must be in 1..{MAX_PARTITIONS}, got {self.partitions}")
        tags = tuple(_tag_for(p, self.partitions) for p in range(self.partitions))
        object.__setattr__(self, "_tags", tags)

    # -- partitions -------------------------------------------------------------
    def prefix(self, p: int) -> str:
        """`ns:{tag}:`: every key of partition p starts with it."""
        return f"{self.namespace}:{{{self._tags[p]}}}:"

    def partition_of_schedule(self, name: str) -> int:
        return stable_hash(name) % self.partitions

    def partition_of_run(self, run_id: str) -> int:
        """Scheduled runs (`schedule@ms`) live with their schedule; others by their id."""
        if "@" in run_id:
            return self.partition_of_schedule(run_id.rsplit("@", 1)[0])
        return stable_hash(run_id) % self.partitions

    def partition_of_tenant(self, tenant: str) -> int:
        """A tenant's home partition: its enqueued runs all live there, so its limits are
        counted in one slot, atomically with the claim (docs/fairness.md)."""
        return stable_hash("tenant\0" + tenant) % self.partitions

    def pin_run_id(self, run_id: str, p: int) -> str:
        """`run_id`, or the first `<run_id>t<n>` that falls in partition p: a tenant's run keeps
        an id from which every tool finds its partition (same id for the same key)."""
        if self.partition_of_run(run_id) == p:
            return run_id
        if "@" in run_id:  # partitioned by its schedule's name: the loop below would not end
            raise InvalidInput(f"run id {run_id!r} belongs to its schedule's partition")
        # crc32 continued from the common prefix's (the same value as crc32 of the whole id,
        # without encoding and hashing `<run_id>t` again for each of the ~partitions tries)
        base, parts, n = zlib.crc32(f"{run_id}t".encode()), self.partitions, 0
        while zlib.crc32(str(n).encode(), base) % parts != p:
            n += 1
        return f"{run_id}t{n}"

    # -- per-partition keys (suffixes from SUFFIX) ------------------------------------------
    def due(self, p: int, queue: str) -> str:
        return self.prefix(p) + SUFFIX["due"] + queue

    def retry(self, p: int, queue: str) -> str:
        return self.prefix(p) + SUFFIX["retry"] + queue

    def leases(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["leases"]

    def run(self, p: int, run_id: str) -> str:
        return self.prefix(p) + SUFFIX["run"] + run_id

    def attempts(self, p: int, run_id: str) -> str:
        return self.prefix(p) + SUFFIX["attempts"] + run_id

    def notify(self, p: int, run_id: str) -> str:
        return self.prefix(p) + SUFFIX["notify"] + run_id

    def dead(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["dead"]

    def uncertain(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["uncertain"]

    def done(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["done"]

    def deadlines(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["deadlines"]

    def sched_running(self, p: int, name: str) -> str:
        return self.prefix(p) + SUFFIX["sched_running"] + name

    def events(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["events"]

    def sched(self, p: int, name: str) -> str:
        return self.prefix(p) + SUFFIX["sched"] + name

    def quarantine(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["quarantine"]

    def node_owners(self, p: int) -> str:
        """The owners table a cluster node's partitions share, in the slot of its first one."""
        return self.prefix(p) + SUFFIX["node_owners"]

    def sched_due(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["sched_due"]

    def scheds(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["scheds"]

    def schedules(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["schedules"]

    def prio(self, p: int, queue: str) -> str:
        return self.prefix(p) + SUFFIX["prio"] + queue

    def lane(self, p: int, queue: str, tenant: str | None = None) -> str:
        """A tenant's lane in a queue ('' = runs without a tenant); with tenant None, `queue`
        is the whole item, '<queue>|<tenant>'."""
        return self.prefix(p) + SUFFIX["lane"] + queue + ("" if tenant is None else "|" + tenant)

    def lanes(self, p: int, queue: str) -> str:
        return self.prefix(p) + SUFFIX["lanes"] + queue

    def laned(self, p: int, queue: str) -> str:
        return self.prefix(p) + SUFFIX["laned"] + queue

    def limits(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["limits"]

    def caps(self, p: int) -> str:
        """HASH of the namespace's caps as this partition's scripts read them (max_payload)."""
        return self.prefix(p) + SUFFIX["caps"]

    def paused(self, p: int) -> str:
        """HASH queue -> pause record: the queues claim.lua takes nothing from."""
        return self.prefix(p) + SUFFIX["paused"]

    def coalesce(self, p: int) -> str:
        """HASH of debounce/throttle keys -> their current run (lua/enqueue/coalesce.lua)."""
        return self.prefix(p) + SUFFIX["coalesce"]

    def holds(self, p: int) -> str:
        """HASH of rate-limit holds: scope -> until ms (RateLimited; claim.lua admission)."""
        return self.prefix(p) + SUFFIX["holds"]

    def limrun(self, p: int, scope: str) -> str:
        """Runs holding a concurrency slot of `scope` ('tenant:acme', 'queue:default')."""
        return self.prefix(p) + SUFFIX["limrun"] + scope

    def bucket(self, p: int, scope: str) -> str:
        return self.prefix(p) + SUFFIX["bucket"] + scope

    def waiting(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["waiting"]

    def deps(self, p: int, run_id: str) -> str:
        return self.prefix(p) + SUFFIX["deps"] + run_id

    def dependents(self, p: int, run_id: str) -> str:
        return self.prefix(p) + SUFFIX["dependents"] + run_id

    def depnotes(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["depnotes"]

    def deplinks(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["deplinks"]

    def batch(self, p: int, batch_id: str) -> str:
        return self.prefix(p) + SUFFIX["batch"] + batch_id

    def bpending(self, p: int, batch_id: str) -> str:
        return self.prefix(p) + SUFFIX["bpending"] + batch_id

    def bmembers(self, p: int, batch_id: str) -> str:
        return self.prefix(p) + SUFFIX["bmembers"] + batch_id

    def batches(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["batches"]
    def retention(self, p: int) -> str:
        """HASH '<scope>|<state>' -> ms: the retention table reap.lua applies."""
        return self.prefix(p) + SUFFIX["retention"]

    def kept(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["kept"]

    def swept(self, p: int) -> str:
        return self.prefix(p) + SUFFIX["swept"]

    # -- global keys (`<ns>:` + GLOBAL[...]) ----------------------------------------------
    def _global(self, name: str) -> str:
        return f"{self.namespace}:{GLOBAL[name]}"

    @cached_property
    def meta(self) -> str:
        return self._global("meta")

    def calendar(self, name: str) -> str:
        """HASH of one business calendar (common/time/calendar.py reads it)."""
        return self._global("calendar") + name

    @cached_property
    def calendars(self) -> str:
        """ZSET of every calendar's name -> when it was last changed."""
        return self._global("calendars")

    @cached_property
    def workers(self) -> str:
        return self._global("workers")

    def worker(self, worker_id: str) -> str:
        return self._global("worker") + worker_id

    @cached_property
    def queues(self) -> str:
        """SET of every queue name ever used in the namespace (for `top` and the gauges)."""
        return self._global("queues")

    @cached_property
    def owners(self) -> str:
        return self._global("owners")

    @cached_property
    def sched_wake(self) -> str:
        return self._global("sched_wake")

    @cached_property
    def tasks(self) -> str:
        return self._global("tasks")

    @cached_property
    def task_seen(self) -> str:
        """HASH task name -> when a live worker last published it (ms, worker/unknown.py)."""
        return self._global("task_seen")

    @cached_property
    def limit_config(self) -> str:
        """HASH '<kind>:<name>' -> the limit as set (JSON), for listing and re-sharing."""
        return self._global("limits")

    @cached_property
    def paused_config(self) -> str:
        """HASH queue -> the pause as recorded (JSON), for listing and repair."""
        return self._global("paused")

    @cached_property
    def retention_config(self) -> str:
        """HASH scope -> retention by state as set (JSON), copied into T:retention."""
        return self._global("retention")

    @cached_property
    def wake_channel(self) -> str:
        return self._global("wake")

    @cached_property
    def cost(self) -> str:
        """HASH of retry-cost counters since the namespace began (common/retrycost.py)."""
        return self._global("cost")

    def cost_minute(self, minute: int) -> str:
        """HASH of the retry-cost counters of one epoch minute."""
        return self._global("cost_minute") + str(minute)

    def series(self, step: str) -> str:
        """The capped stream of queue samples at one resolution (`10s`, `5m`)."""
        return self._global("series") + step
