"""The Redis key layout (docs/keys.md): one hash tag per partition, so each Lua script
touches exactly one cluster slot.

Partition tags are searched so the P partitions land in P evenly spaced slot ranges;
a cluster's shards own contiguous slot ranges, so partitions spread over shards.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import cached_property

from duetime.common.errors import InvalidInput
from duetime.common.names import check_name
from redis.crc import key_slot

SLOTS = 16384
MAX_PARTITIONS = 1024


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

    # -- per-partition keys -------------------------------------------------------
    def due(self, p: int, queue: str) -> str:
        return f"{self.prefix(p)}due:{queue}"

    def retry(self, p: int, queue: str) -> str:
        return f"{self.prefix(p)}retry:{queue}"

    def leases(self, p: int) -> str:
        return f"{self.prefix(p)}leases"

    def lease(self, p: int, run_id: str) -> str:
        return f"{self.prefix(p)}lease:{run_id}"

    def run(self, p: int, run_id: str) -> str:
        return f"{self.prefix(p)}run:{run_id}"

    def attempts(self, p: int, run_id: str) -> str:
        return f"{self.prefix(p)}attempts:{run_id}"

    def dead(self, p: int) -> str:
        return f"{self.prefix(p)}dead"

    def uncertain(self, p: int) -> str:
        return f"{self.prefix(p)}uncertain"

    def done(self, p: int) -> str:
        return f"{self.prefix(p)}done"

    def deadlines(self, p: int) -> str:
        return f"{self.prefix(p)}deadlines"

    def sched_running(self, p: int, name: str) -> str:
        return f"{self.prefix(p)}sched_running:{name}"

    def events(self, p: int) -> str:
        return f"{self.prefix(p)}events"

    def sched(self, p: int, name: str) -> str:
        return f"{self.prefix(p)}sched:{name}"

    def sched_due(self, p: int) -> str:
        return f"{self.prefix(p)}sched_due"

    def schedules(self, p: int) -> str:
        return f"{self.prefix(p)}schedules"

    def owner(self, p: int) -> str:
        return f"{self.prefix(p)}owner"

    # -- global keys --------------------------------------------------------------
    @cached_property
    def meta(self) -> str:
        return f"{self.namespace}:meta"

    @cached_property
    def workers(self) -> str:
        return f"{self.namespace}:workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.namespace}:worker:{worker_id}"

    @cached_property
    def queues(self) -> str:
        """SET of every queue name ever used in the namespace (for `top` and the gauges)."""
        return f"{self.namespace}:queues"

    @cached_property
    def schedulers(self) -> str:
        return f"{self.namespace}:schedulers"

    @cached_property
    def wake_channel(self) -> str:
        return f"{self.namespace}:wake"
