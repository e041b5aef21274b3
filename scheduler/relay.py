"""The dependency relay: carries dependency notices and link requests between partitions
(docs/workloads.md), run by the reaper (scheduler/reaper.py).

A run ending in partition P whose dependent waits in partition Q leaves the notice
`Q|dependent|dep|state` in P's T:depnotes (lua/_lib.lua `settle_dependents`); a producer that
enqueued a run depending on one in another partition leaves its link request in T:deplinks
until it has linked it itself (duetime/client/workloads.py `Workloads.link`). The relay applies
each with deps_apply.lua / deps_link.lua on the partition it names, then removes it.

Scheduler-side only: a scheduler process imports no producer module for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from duetime.common import transitions as tr
from duetime.common.keys import Keyspace
from duetime.common.scripts import Scripts

RELAY_BATCH = 100  # notices (and link requests) per partition per relay pass


def relay_once(client: Any, keys: Keyspace, scripts: Scripts,
               partitions: Iterable[int] | None = None) -> int:
    """Apply every notice (T:depnotes) and link request (T:deplinks) waiting in the given
    partitions (all by default), at most RELAY_BATCH of each list per partition; each is
    removed after it was applied, and applying one twice changes nothing, so two relays, or a
    relay that dies halfway, never lose or double one. Returns how many were applied."""
    parts = list(range(keys.partitions) if partitions is None else partitions)
    pipe = client.pipeline(transaction=False)
    for p in parts:
        pipe.lrange(keys.depnotes(p), 0, RELAY_BATCH - 1)
        pipe.lrange(keys.deplinks(p), 0, RELAY_BATCH - 1)
    got = pipe.execute(raise_on_error=False)
    done = 0
    for i, p in enumerate(parts):
        notes, links = got[2 * i], got[2 * i + 1]
        for raw in notes if isinstance(notes, list) else []:
            tp, dependent, dep, state = raw.decode().split("|", 3)
            keys_, args = tr.deps_apply(keys, int(tp), [(dependent, dep, state)])
            scripts.deps_apply(keys=keys_, args=args, client=client)
            client.lrem(keys.depnotes(p), 1, raw)
            done += 1
        for raw in links if isinstance(links, list) else []:
            dp, dep, dependent = raw.decode().split("|", 2)
            keys_, args = tr.deps_link(keys, int(dp), dep, p, dependent)
            word, state = tr.status_detail(scripts.deps_link(keys=keys_, args=args, client=client))
            if word in ("ended", "missing"):
                keys_, args = tr.deps_apply(keys, p, [(dependent, dep, state or "missing")])
                scripts.deps_apply(keys=keys_, args=args, client=client)
            client.lrem(keys.deplinks(p), 1, raw)
            done += 1
    return done
