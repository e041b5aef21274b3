"""Key layout and partitioning (pure logic)."""

from __future__ import annotations

from duetime.common.keys import SLOTS, Keyspace
from redis.crc import key_slot


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_every_key_of_a_partition_shares_one_slot():
    k = Keyspace("duetime", 16)
    for p in range(16):
        keys = [k.due(p, "q"), k.retry(p, "q"), k.leases(p), k.run(p, "r1"),
                k.attempts(p, "r1"), k.dead(p), k.uncertain(p), k.done(p), k.events(p),
                k.sched(p, "s"), k.sched_due(p)]
        assert len({slot(x) for x in keys}) == 1


def test_partitions_spread_evenly_over_the_slot_space():
    for n in (1, 3, 16, 64):
        k = Keyspace("duetime", n)
        for p in range(n):
            s = slot(k.run(p, "x"))
            assert p * SLOTS // n <= s < (p + 1) * SLOTS // n


def test_scheduled_runs_live_with_their_schedule():
    k = Keyspace("duetime", 16)
    name = "billing@eu"  # an '@' in the name is fine: the last one separates the instant
    assert k.partition_of_run(f"{name}@1767225600000") == k.partition_of_schedule(name)


def test_keys_are_readable():
    k = Keyspace("duetime", 16)
    assert k.due(0, "default").startswith("duetime:{p0.") and k.due(0, "default").endswith(
        "}:due:default")


def test_pin_run_id_is_the_first_suffix_in_the_partition() -> None:
    """`<id>t<n>` for the least n whose id falls in partition p (the definition every tool
    relies on to find a pinned run), computed with a continued crc32: same ids as the plain
    loop over whole ids; a schedule's run id (partitioned by its schedule) is refused."""
    import random

    import pytest
    from duetime.common.errors import InvalidInput

    def reference(ks: Keyspace, run_id: str, p: int) -> str:
        n, candidate = 0, run_id
        while ks.partition_of_run(candidate) != p:
            candidate, n = f"{run_id}t{n}", n + 1
        return candidate

    rnd = random.Random(7)
    for parts in (1, 3, 16, 257):
        ks = Keyspace(partitions=parts)
        for _ in range(300):
            run_id = "".join(rnd.choice("0123456789abcdef.k") for _ in range(rnd.randrange(1, 40)))
            p = rnd.randrange(parts)
            pinned = ks.pin_run_id(run_id, p)
            assert pinned == reference(ks, run_id, p) and ks.partition_of_run(pinned) == p
    ks = Keyspace(partitions=16)
    here = ks.partition_of_run("nightly@1700000000000")
    assert ks.pin_run_id("nightly@1700000000000", here) == "nightly@1700000000000"
    with pytest.raises(InvalidInput, match="schedule's partition"):
        ks.pin_run_id("nightly@1700000000000", (here + 1) % 16)
