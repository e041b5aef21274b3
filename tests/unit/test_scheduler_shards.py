"""scheduler/shards.py: a loop's work split by cluster node, each node on its own back-off."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import redis
from duetime.common.keys import Keyspace
from duetime.scheduler.shards import PLAIN, Shards, by_node
from redis.crc import key_slot


@dataclass
class _Node:
    name: str


class _Nodes:
    """A slot map: partition p is served by node p % 3."""

    def __init__(self, keys: Keyspace) -> None:
        self.slots = {key_slot(keys.prefix(p).encode()): f"n{p % 3}" for p in range(keys.partitions)}
        self.initialized = 0

    def get_node_from_slot(self, slot: int) -> _Node:
        return _Node(self.slots[slot])

    def initialize(self) -> None:
        self.initialized += 1


class _Cluster:
    def __init__(self, keys: Keyspace) -> None:
        self.nodes_manager = _Nodes(keys)


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def __getattr__(self, level: str):  # warning, info, error
        return lambda msg, **kw: self.lines.append((msg, kw))


def test_a_failing_node_is_backed_off_alone_and_tried_again_after_its_back_off():
    keys = Keyspace("ns", 6)
    client, log, now = _Cluster(keys), _Log(), [0.0]
    shards = Shards(client, keys, "reaper", log, clock=lambda: now[0])
    calls: list[str] = []

    def work(node: str, ps: list[int]) -> list[int]:
        calls.append(node)
        if node == "n1":
            raise redis.ConnectionError("Connection refused")
        return ps

    assert shards.run(range(6), work) == {"n0": [0, 3], "n2": [2, 5]}
    assert shards.down() == ["n1"] and client.nodes_manager.initialized == 1  # slot map re-read
    assert shards.live(range(6)) == {0, 2, 3, 5}
    assert [kw["node"] for msg, kw in log.lines if "backing off" in msg] == ["n1"]
    calls.clear()
    assert shards.run(range(6), work) == {"n0": [0, 3], "n2": [2, 5]}
    assert "n1" not in calls  # held: not tried during its back-off
    now[0] = shards.next_release() or 0.0
    calls.clear()
    shards.run(range(6), work)
    shards._out["n1"].result(10)  # its back-off over: tried again, in the background
    assert "n1" in calls
    assert shards.unready() is None  # other nodes answer: the loop is ready
    shards.close()


def test_a_node_that_hangs_in_an_incident_does_not_delay_the_others():
    """A node whose last call failed is tried in the background: the live nodes' pass returns
    without waiting for it (a dead host's connect timeout), and its answer counts later."""
    keys = Keyspace("ns", 6)
    now = [0.0]
    shards = Shards(_Cluster(keys), keys, "reaper", _Log(), clock=lambda: now[0])
    release = threading.Event()
    down = [True]

    def work(node: str, ps: list[int]) -> int:
        if node == "n1":
            if down[0]:
                raise redis.ConnectionError("Connection refused")
            assert release.wait(10)
        return len(ps)

    assert shards.run(range(6), work) == {"n0": 2, "n2": 2}
    down[0] = False
    now[0] = 100.0  # its back-off is over; the next call to it hangs until released
    assert shards.run(range(6), work) == {"n0": 2, "n2": 2}  # without waiting for n1
    assert shards.is_held("n1") and shards.next_release() is None
    assert shards.run(range(6), work) == {"n0": 2, "n2": 2}  # still out: not sent again
    release.set()
    shards._out["n1"].result(10)
    assert shards.run(range(6), work)["n1"] == 2  # its late answer is taken in
    assert shards.down() == [] and not shards.errors
    shards.close()


def test_every_node_down_makes_the_loop_unready():
    keys = Keyspace("ns", 3)
    shards = Shards(_Cluster(keys), keys, "evaluator", _Log(), clock=lambda: 0.0)

    def dead(node: str, ps: list[int]) -> None:
        raise redis.ConnectionError("Connection refused")

    assert shards.run(range(3), dead) == {}
    assert shards.unready() is not None
    shards.close()


def test_a_plain_server_is_one_group_whose_errors_reach_the_loop():
    keys = Keyspace("ns", 4)
    plain = object()
    assert by_node(plain, keys, [3, 1, 0, 2]) == {PLAIN: [0, 1, 2, 3]}
    shards = Shards(plain, keys, "reaper", _Log())

    def dead(node: str, ps: list[int]) -> None:
        raise redis.ConnectionError("Connection refused")

    with pytest.raises(redis.ConnectionError):
        shards.run(range(4), dead)


def test_a_cluster_client_error_backs_its_node_off_and_ends_no_pass():
    """redis-py's RedisClusterException family (SlotNotCoveredError, 'Redis Cluster cannot be
    connected') is no RedisError: one node's call raising it backs that node off like any
    other failure, the other nodes' results are kept, and the node is tried again later."""
    from redis.exceptions import SlotNotCoveredError

    keys = Keyspace("ns", 6)
    now = [0.0]
    shards = Shards(_Cluster(keys), keys, "dependency relay", _Log(), clock=lambda: now[0])
    broken = [True]

    def work(node: str, ps: list[int]) -> int:
        if node == "n1" and broken[0]:
            raise SlotNotCoveredError('Slot "5" not covered by the cluster.')
        return len(ps)

    assert shards.run(range(6), work) == {"n0": 2, "n2": 2}
    assert shards.down() == ["n1"]
    broken[0] = False
    now[0] = 100.0
    shards.run(range(6), work)  # its back-off over: tried again (in the background)
    shards._out["n1"].result(10)
    assert shards.run(range(6), work) == {"n0": 2, "n1": 2, "n2": 2}
    assert shards.down() == [] and not shards.errors
    shards.close()
