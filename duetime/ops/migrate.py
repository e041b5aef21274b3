"""`duetime migrate`: move a namespace on to the layout format this release writes.

A release that changes the layout reads the old format and keeps writing it in a namespace
of that format, so its processes and the previous release's serve one namespace side by side
during a rolling upgrade. Once no process of the previous release is left, `duetime migrate`
moves the namespace on: `<ns>:meta` first (a process of an older release starting from then
on refuses the namespace with FormatTooNew), then every partition's `T:caps` (the scripts that
create runs read the format there, in their own slot). Records written before stay as they
are: this release reads them (docs/keys.md "Namespace format").

The check: every live worker must say it reads the new format (its record's `formats`,
written by each heartbeat). A worker of an older release says nothing, so it is named and the
migration refused, unless forced. Schedulers and reapers of an older release are not
registered that way: stop or upgrade them first (an older reaper reads an expired lease of
a format-3 run as a damaged record: no queue, no max_attempts; docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from duetime.common.connection import FORMAT, check_format, mark_partitions_format, translated
from duetime.common.keys import Keyspace
from duetime.common.overview import NamespaceReader, WorkerInfo


@dataclass(frozen=True)
class Plan:
    """What `duetime migrate` would do: from `current` to `target`, and the live workers that
    do not read `target` (it refuses while there are any, unless forced)."""

    current: int
    target: int
    partitions: int
    blockers: list[WorkerInfo]

    @property
    def needed(self) -> bool:
        return self.current < self.target


def plan(client: redis.Redis, keys: Keyspace, url: str) -> Plan:
    """Read the namespace's format and its live workers (nothing is written)."""
    with translated(url):
        raw = client.hget(keys.meta, "format")
    current = check_format(raw, keys)
    live = [w for w in NamespaceReader(client, keys, url).workers() if w.live]
    return Plan(current, FORMAT, keys.partitions, [w for w in live if w.formats < FORMAT])


def migrate(client: redis.Redis, keys: Keyspace, url: str, p: Plan,
            progress: Callable[[int], None] | None = None) -> None:
    """Move the namespace to `p.target`: the meta first, then each partition (with `progress`
    per partition marked). Run again, it marks the partitions once more: an interrupted
    migration is finished by running it again."""
    with translated(url):
        client.hset(keys.meta, "format", p.target)
        mark_partitions_format(client, keys, p.target, progress)
