"""The retention sweep's cost per call, with 10k and with 1,000,000 finished runs kept.

Finished runs are written in bulk by a Lua script (a run hash and its index entry each, in
the partition's slot), aged by their `finished` field and index score, so nothing waits for
the clock. Each round then ages a fixed slice of runs past their retention and times the
sweep (every partition's reap.lua) that deletes them: Redis CPU (INFO cpu) and commands per
sweep. With the watermark (T:swept) the runs kept are never read again, so the cost follows
the slice, not the namespace.

    .venv/bin/python -m bench.retention [--small 10000] [--large 1000000] [--due 2000]
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from typing import Any

import redis
from duetime.common import retention as rt
from duetime.common import transitions as tr
from duetime.common.keys import Keyspace
from duetime.common.scripts import Scripts

# KEYS[1] the partition's index to add to (done, dead or uncertain)
# ARGV[1] partition prefix   ARGV[2] state   ARGV[3] queue   ARGV[4] task   ARGV[5] finished ms
# ARGV[6] index score   ARGV[7..] run ids (of this partition)
BULK = """
local prefix = ARGV[1]
for i = 7, #ARGV do
  local id = ARGV[i]
  redis.call('HSET', prefix .. 'run:' .. id, 'id', id, 'state', ARGV[2], 'queue', ARGV[3],
    'task', ARGV[4], 'finished', ARGV[5])
  redis.call('ZADD', KEYS[1], ARGV[6], id)
end
return #ARGV - 6
"""
INDEX = {"dead": "dead", "uncertain": "uncertain"}  # every other finished state: done


def bulk_finished(client: redis.Redis, keys: Keyspace, n: int, *, state: str, age_ms: int,
                  queue: str = "default", task: str = "bench.noop", tag: str | None = None,
                  chunk: int = 5000, indexed_age_ms: int | None = None) -> list[str]:
    """Write n finished runs, finished `age_ms` before the server's now, each in the
    partition its id belongs to (ids `<tag>-<i>`). Their index score is `indexed_age_ms` ago
    when given (a replayed dead run enters the done index when replayed). → the ids."""
    now_s, now_us = client.time()
    finished = now_s * 1000 + now_us // 1000 - age_ms
    score = finished if indexed_age_ms is None else finished + age_ms - indexed_age_ms
    tag = tag or uuid.uuid4().hex[:6]
    script = client.register_script(BULK)
    by_p: dict[int, list[str]] = {}
    for i in range(n):
        rid = f"{tag}-{i}"
        by_p.setdefault(keys.partition_of_run(rid), []).append(rid)
    pipe = client.pipeline(transaction=False)
    queued = 0
    for p, ids in by_p.items():
        index = getattr(keys, INDEX.get(state, "done"))(p)
        for first in range(0, len(ids), chunk):
            script(keys=[index], args=[keys.prefix(p), state, queue, task, finished, score,
                                       *ids[first : first + chunk]], client=pipe)
            queued += 1
            if queued >= 20:
                pipe.execute()
                pipe, queued = client.pipeline(transaction=False), 0
    pipe.execute()
    return [i for ids in by_p.values() for i in ids]


def sweep(client: redis.Redis, keys: Keyspace, short_ms: int = 24 * 3600 * 1000,
          batch: int = 500) -> tuple[int, int, int]:
    """One full retention sweep, as the reaper runs it (each partition called again while a
    batch was full). → (deleted, examined, calls)."""
    scripts = Scripts(client)
    deleted = examined = calls = 0
    pending = list(range(keys.partitions))
    while pending:
        again = []
        for p in pending:
            k, a = tr.reap(keys, p, batch, random.random(), short_ms, rt.DEAD_MS, rt.UNCERTAIN_MS)
            counts = tr.counts(scripts.reap(keys=k, args=a))
            calls += 1
            deleted += counts[2]
            examined += counts[5]
            if counts[2] >= batch or counts[5] >= batch:
                again.append(p)
        pending = again
    return deleted, examined, calls


def _cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def measure(client: redis.Redis, kept: int, due: int, rounds: int) -> dict[str, float]:
    keys = Keyspace(f"benchret{uuid.uuid4().hex[:6]}", 16)
    t0 = time.perf_counter()
    # kept, though older than the shortest retention (24 h): dead letters (30 days) and
    # uncertain runs (never deleted) -- what a sweep without a watermark would read each time
    bulk_finished(client, keys, kept // 2, state="dead", age_ms=25 * 3600 * 1000)
    bulk_finished(client, keys, kept - kept // 2, state="uncertain", age_ms=48 * 3600 * 1000)
    built = time.perf_counter() - t0
    f0 = time.perf_counter()
    first = sweep(client, keys)  # examines each once (dead filed in T:kept), then never again
    first_s = time.perf_counter() - f0
    assert first[0] == 0 and first[1] == kept, first
    cpu, cmds, wall = [], [], []
    for _ in range(rounds):
        bulk_finished(client, keys, due, state="succeeded", age_ms=25 * 3600 * 1000)
        c0, n0, w0 = _cpu(client), _commands(client), time.perf_counter()
        deleted, _, _ = sweep(client, keys)
        wall.append(time.perf_counter() - w0)
        cpu.append(_cpu(client) - c0)
        cmds.append(_commands(client) - n0)
        assert deleted == due, (deleted, due)
    # leave no 1M-run namespace behind
    for p in range(keys.partitions):
        cur = 0
        while True:
            cur, found = client.scan(cur, match=keys.prefix(p) + "*", count=5000)
            if found:
                client.unlink(*found)
            if cur == 0:
                break
    return {"kept": kept, "build_s": built, "first_s": first_s, "cpu_ms": 1000 * sorted(cpu)[len(cpu) // 2],
            "wall_ms": 1000 * sorted(wall)[len(wall) // 2], "commands": sorted(cmds)[len(cmds) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument("--due", type=int, default=2_000, help="runs past their retention per sweep")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    client = redis.Redis.from_url(a.url)
    rows = [measure(client, n, a.due, a.rounds) for n in (a.small, a.large)]
    for r in rows:
        print(f"kept {r['kept']:>9,}: built in {r['build_s']:.1f}s, first sweep (examines each "
              f"once) {r['first_s']:.1f}s; then per sweep deleting {a.due}: "
              f"redis cpu {r['cpu_ms']:.1f} ms, wall {r['wall_ms']:.1f} ms, "
              f"{r['commands']:,} commands (median of {a.rounds})")
    print(f"ratio large/small: cpu {rows[1]['cpu_ms'] / max(rows[0]['cpu_ms'], 1e-9):.2f}, "
          f"wall {rows[1]['wall_ms'] / max(rows[0]['wall_ms'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
