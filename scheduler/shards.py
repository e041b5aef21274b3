"""The scheduler's loops per cluster node: a dead primary holds back only its own partitions.

The evaluator and the reaper act on every partition. On a cluster, one pipeline across every
node fails as a whole when one node is dead (redis-py's sync cluster pipeline raises for the
whole batch once a connection to one node fails), and a node that hangs delays the others
until its socket times out. So, as the worker's claims do (worker/claims.py), each loop splits
its partitions by the node that serves them (as the client knows the slot map), sends each
node's work on its own, side by side, and keeps a back-off per node (common/outage.py
`Outage`, one incident per node in the log): while a primary is dead, its partitions wait for
their node's back-off and the client re-reads the slot map; the other nodes' partitions go on,
on time. On a plain server there is one group, run inline, whose errors go to the loop's own
back-off as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from duetime.common.connection import refresh_topology
from duetime.common.keys import Keyspace
from duetime.common.outage import Outage
from duetime.common.outage import kind as outage_kind
from redis.crc import key_slot

T = TypeVar("T")

PLAIN = ""  # the one group of a plain server
MAX_THREADS = 16  # node groups sent side by side (beyond that, they queue)


def node_of(client: Any, keys: Keyspace, p: int) -> str:
    """The name (host:port) of the node serving partition `p`, as the client knows the slot
    map; PLAIN on a plain server; a name of its own for a slot the client knows no node for
    (it fails alone)."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is None:
        return PLAIN
    try:
        return str(nodes.get_node_from_slot(key_slot(keys.prefix(p).encode())).name)
    except Exception:  # noqa: BLE001 - no node known for the slot: its own group
        return f"?{p}"


def by_node(client: Any, keys: Keyspace, partitions: Iterable[int]) -> dict[str, list[int]]:
    """`partitions` grouped by the node serving them (one group on a plain server), each
    group in ascending order."""
    groups: dict[str, list[int]] = {}
    for p in sorted(partitions):
        groups.setdefault(node_of(client, keys, p), []).append(p)
    return groups


def node_time_ms(client: Any, node: str) -> int:
    """TIME of one cluster node (the node acted on: the clock its scripts go by), in ms."""
    target = client.get_node(node_name=node)
    if target is None:
        raise redis.exceptions.ClusterError(f"no node {node} in the slot map")
    sec, usec = client.time(target_nodes=target)
    return int(sec) * 1000 + int(usec) // 1000


class Shards:
    """One loop's per-node back-off: `run(partitions, fn)` calls `fn(node, its partitions)`
    for every node not backing off, side by side; a Redis error of one node's call backs that
    node off (its own `Outage`) and re-reads the slot map, and leaves the others alone."""

    def __init__(self, client: Any, keys: Keyspace, loop: str, log: Any,
                 clock: Callable[[], float] = time.monotonic, **fields: Any) -> None:
        self.client, self.keys, self.loop, self.log, self.fields = client, keys, loop, log, fields
        self.cluster = hasattr(client, "nodes_manager")
        self._clock = clock
        self.outages: dict[str, Outage] = {}
        self.held: dict[str, float] = {}  # node -> monotonic time its back-off ends
        self.errors: dict[str, BaseException] = {}  # node -> the error holding it back
        self._pool: ThreadPoolExecutor | None = None
        # node -> its call still running, sent while the node was in an incident: not waited
        # for (a dead host's connect timeout must not delay the live nodes), taken in later
        self._out: dict[str, Future[tuple[bool, Any]]] = {}

    def groups(self, partitions: Iterable[int]) -> dict[str, list[int]]:
        return by_node(self.client, self.keys, partitions)

    def is_held(self, node: str) -> bool:
        """Backing off, or a call to it still out from an earlier pass."""
        if node in self._out:
            return True
        until = self.held.get(node)
        return until is not None and self._clock() < until

    def next_release(self) -> float | None:
        """When the earliest held node is tried again (monotonic s), None when none is held
        (a node whose call is still out is not tried again before it comes back)."""
        times = [t for node, t in self.held.items() if node not in self._out]
        return min(times) if times else None

    def live(self, partitions: Iterable[int]) -> set[int]:
        """The partitions whose node is not backing off."""
        if not self.held:
            return set(partitions)
        return {p for p in partitions if not self.is_held(node_of(self.client, self.keys, p))}

    def unready(self) -> str | None:
        """Why the loop is not ready when every node it needs is backing off, else None."""
        if not self.cluster or not self.held:
            return None
        nodes = set(self.groups(range(self.keys.partitions)))
        down = set(self.down())
        if not nodes <= down:
            return None
        from duetime.common.outage import not_ready_reason

        exc = next(iter(self.errors.values()))
        return f"every node backing off: {not_ready_reason('', exc)}"

    def down(self) -> list[str]:
        """The nodes backing off now."""
        return sorted(n for n in self.held if self.is_held(n))

    def run(self, partitions: Iterable[int], fn: Callable[[str, list[int]], T]) -> dict[str, T]:
        """`fn(node, partitions of the node)` for each node not backing off; → node -> result
        of those that went through. A node in an incident (its last call failed) is tried in
        the background: its call is not waited for, and what it returns is taken in by a
        later pass. On a plain server `fn` runs inline and its errors reach the caller (the
        loop's own back-off)."""
        groups = self.groups(partitions)
        if not self.cluster:
            return {node: fn(node, ps) for node, ps in groups.items()}
        out: dict[str, T] = {}
        moving = False

        def take(node: str, ok: bool, value: Any) -> None:
            nonlocal moving
            if ok:
                self._ok(node)
                out[node] = value
            else:
                moving |= self._failed(node, value)

        for node, fut in list(self._out.items()):  # background calls that came back
            if fut.done():
                del self._out[node]
                take(node, *fut.result())
        todo = [(node, ps) for node, ps in groups.items()
                if not self.is_held(node) and node not in out]
        probes = [(node, ps) for node, ps in todo if node in self.errors]
        healthy = [(node, ps) for node, ps in todo if node not in self.errors]
        if probes or len(healthy) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix=f"{self.loop}-node")
            for node, ps in probes:
                self._out[node] = self._pool.submit(self._call, fn, node, ps)
        if len(healthy) == 1:
            take(healthy[0][0], *self._call(fn, *healthy[0]))
        elif healthy:
            assert self._pool is not None
            futures = [(node, self._pool.submit(self._call, fn, node, ps)) for node, ps in healthy]
            for node, f in futures:
                take(node, *f.result())
        if moving:
            refresh_topology(self.client)
        return out

    @staticmethod
    def _call(fn: Callable[[str, list[int]], T], node: str, ps: list[int]) -> tuple[bool, Any]:
        try:
            return True, fn(node, ps)
        # RedisClusterException (a slot no node is known for, a slot map no node would give)
        # is no RedisError: uncaught, it left the pass and ended the loop's thread
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
            return False, exc

    def _ok(self, node: str) -> None:
        self.held.pop(node, None)
        self.errors.pop(node, None)
        outage = self.outages.get(node)
        if outage is not None:
            outage.ok()

    def _failed(self, node: str, exc: BaseException) -> bool:
        """Back `node` off; True when the slot map should be read again (not a refusal)."""
        outage = self.outages.get(node)
        if outage is None:
            outage = self.outages[node] = Outage(self.loop, self.log, cap_s=None, node=node,
                                                 **self.fields)
        self.held[node] = self._clock() + outage.failed(exc)
        self.errors[node] = exc
        return outage_kind(exc) != "refused"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
