"""Scale-out: enqueue N no-op runs, then time their drain by `duetime worker --processes P`
(P = 1, 2, 4), against one Redis server and against a Redis Cluster of 3 primaries, both started
here on loopback ports. Also the Redis server CPU one run costs over its whole life (enqueue +
claim + complete): INFO cpu (used_cpu_sys + used_cpu_user) deltas summed over every node,
divided by N. Medians over the rounds, rounds interleaved over the set-ups so the machine's
noise hits each of them; then the sizing table that follows from the CPU per run.

Per shard (`--per-shard`, on by default): each primary's own CPU delta, the runs of the
partitions it serves, its runs/s over the drain and its CPU per run, and how busy its main
thread was (CPU s / drain s): the figure that carries to bigger machines is a shard's CPU per
run, since a shard's main thread does its scripts whatever the number of shards.

    .venv/bin/python -m bench.cluster --runs 20000 --repeat 3 [--processes 1,2,4] [--server redis]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
import uuid

import redis
from duetime.common.connection import sync_client

from bench.apps import app, noop
from bench.stats import print_rounds
from bench.throughput import drain_s, wait_done
from duetime.embedded import EmbeddedCluster, EmbeddedServer

CORE_SHARE = 0.7  # of one core: what a shard's main thread is sized to, leaving headroom
TARGETS = (100_000, 1_000_000)  # runs/s the sizing table answers for


def cpu_us(ports: list[int]) -> float:
    """Server CPU so far, summed over the nodes, in µs."""
    total = 0.0
    for port in ports:
        with redis.Redis(port=port) as c:
            info = c.info("cpu")
        total += (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6
    return total


def cpu_by_port(ports: list[int]) -> dict[int, float]:
    """Server CPU so far per node, in µs."""
    out = {}
    for port in ports:
        with redis.Redis(port=port) as c:
            info = c.info("cpu")
        out[port] = (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6
    return out


def partitions_by_port(ports: list[int], keys: object) -> dict[int, list[int]]:
    """Which node serves which partition (one server: all of them)."""
    from redis.crc import key_slot

    parts = range(keys.partitions)  # type: ignore[attr-defined]
    if len(ports) == 1:
        return {ports[0]: list(parts)}
    with redis.Redis(port=ports[0]) as c:
        ranges = [(lo, hi, int(primary[1])) for lo, hi, primary, *_ in
                  c.execute_command("CLUSTER SLOTS")]
    out: dict[int, list[int]] = {port: [] for port in ports}
    for p in parts:
        slot = key_slot(keys.prefix(p).encode())  # type: ignore[attr-defined]
        out[next(port for lo, hi, port in ranges if lo <= slot <= hi)].append(p)
    return out


def idle_cpu_us_per_s(ports: list[int], seconds: float = 1.0) -> float:
    """The nodes' background CPU with nothing to do (timers, the cluster bus), per second: how
    much of a round's CPU is not the runs'."""
    c0, t0 = cpu_us(ports), time.perf_counter()
    time.sleep(seconds)
    return (cpu_us(ports) - c0) / (time.perf_counter() - t0)


def one_round(url: str, ports: list[int], n: int, processes: int,
              concurrency: int) -> dict[str, float]:
    ns = f"bc{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    app.store.ready()
    r = sync_client(url)  # standalone or cluster alike
    done_keys = [app.keys.done(p) for p in range(app.keys.partitions)]
    idle = idle_cpu_us_per_s(ports)
    by_port = partitions_by_port(ports, app.keys)
    n0 = cpu_by_port(ports)
    c0, t0 = cpu_us(ports), time.perf_counter()
    app.enqueue_many([(noop, [i]) for i in range(n)])
    t_enq = time.perf_counter() - t0
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    t1 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                             "--app", "bench.apps:app", "--concurrency", str(concurrency),
                             "--processes", str(processes)], env=env)
    wait_done(r, done_keys, n, poll_s=0.02)
    t_wall = time.perf_counter() - t1
    t_drain = drain_s(r, done_keys)
    c1, t2 = cpu_us(ports), time.perf_counter()
    n1 = cpu_by_port(ports)
    shard: dict[str, float] = {}
    for i, port in enumerate(sorted(ports)):
        runs = sum(r.zcard(app.keys.done(p)) for p in by_port[port])
        cpu = n1[port] - n0[port]
        shard[f"shard{i}_runs"] = runs
        shard[f"shard{i}_runs_per_s"] = runs / t_drain
        shard[f"shard{i}_cpu_us_per_run"] = cpu / runs if runs else 0.0
        shard[f"shard{i}_busy"] = cpu / 1e6 / (t2 - t0)  # of one core, enqueue to the end
    proc.terminate()
    proc.wait(30)
    r.close()
    app.close()
    for port in ports:
        with redis.Redis(port=port) as c:
            c.flushall()
    return {
        "enqueue_per_s": n / t_enq,
        "drain_per_s": n / t_drain,
        "drain_incl_startup_per_s": n / t_wall,
        "redis_cpu_us_per_run": (c1 - c0) / n,
        "of_which_idle_us": idle * (t2 - t0) / n,
        **shard,
    }


def sizing(cpu_us_per_run: float) -> tuple[float, list[int]]:
    """Runs/s one shard carries at CORE_SHARE of a core, and the shards each target needs."""
    per_shard = CORE_SHARE * 1e6 / cpu_us_per_run
    return per_shard, [math.ceil(t / per_shard) for t in TARGETS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--processes", default="1,2,4", help="worker process counts to compare")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--server", choices=["redis", "valkey"], default="redis")
    args = ap.parse_args()
    counts = [int(x) for x in args.processes.split(",")]
    load_before = os.getloadavg()
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with EmbeddedServer(args.server) as single, EmbeddedCluster(args.server, n=3) as cluster:
        setups = {"1 server": (single.url, [single.port]),
                  "cluster, 3 primaries": (cluster.url, [node.port for node in cluster.nodes])}
        for _ in range(args.repeat):
            for name, (url, ports) in setups.items():
                for p in counts:
                    results.setdefault((name, p), []).append(
                        one_round(url, ports, args.runs, p, args.concurrency))
    print(f"server={args.server} runs={args.runs} repeat={args.repeat} "
          f"concurrency={args.concurrency} per process; {os.cpu_count()} cores on this machine; "
          f"load average before/after {load_before[0]:.2f}/{os.getloadavg()[0]:.2f}")
    for (name, p), rounds in results.items():
        print(f"{name}, --processes {p}")
        print_rounds(rounds)

    def med(name: str, p: int, key: str) -> float:
        return statistics.median(r[key] for r in results[(name, p)])

    print("\n| Redis | worker processes | drain runs/s | incl. start-up | enqueue runs/s "
          "| Redis CPU µs/run (all nodes) | of which idle |")
    print("|---|---|---|---|---|---|---|")
    for name, p in results:
        print(f"| {name} | {p} | {med(name, p, 'drain_per_s'):,.0f} "
              f"| {med(name, p, 'drain_incl_startup_per_s'):,.0f} "
              f"| {med(name, p, 'enqueue_per_s'):,.0f} | {med(name, p, 'redis_cpu_us_per_run'):.1f} "
              f"| {med(name, p, 'of_which_idle_us'):.1f} |")
    print("\n| Redis | worker processes | shard | runs | runs/s | Redis CPU µs/run on the shard "
          "| its main thread busy |")
    print("|---|---|---|---|---|---|---|")
    for name, p in results:
        shards = sorted({k.split("_")[0] for k in results[(name, p)][0] if k.startswith("shard")})
        for sh in shards:
            print(f"| {name} | {p} | {sh[5:]} | {med(name, p, sh + '_runs'):,.0f} "
                  f"| {med(name, p, sh + '_runs_per_s'):,.0f} "
                  f"| {med(name, p, sh + '_cpu_us_per_run'):.1f} "
                  f"| {med(name, p, sh + '_busy'):.0%} |")
    print(f"\n| CPU per run from | µs/run | runs/s per shard at {CORE_SHARE:.0%} of a core | "
          + " | ".join(f"shards for {t:,} runs/s" for t in TARGETS) + " |")
    print("|---|---|---|" + "---|" * len(TARGETS))
    for name in setups:
        worst = max(med(name, p, "redis_cpu_us_per_run") for p in counts)
        per_shard, shards = sizing(worst)
        print(f"| {name} (highest median over --processes {args.processes}) | {worst:.1f} "
              f"| {per_shard:,.0f} | " + " | ".join(str(s) for s in shards) + " |")
        keys = sorted({k for p in counts for k in results[(name, p)][0]
                       if k.startswith("shard") and k.endswith("_cpu_us_per_run")})
        if len(keys) > 1:
            worst = max(med(name, p, k) for p in counts for k in keys)
            per_shard, shards = sizing(worst)
            print(f"| {name}, its busiest shard's own CPU per run | {worst:.1f} "
                  f"| {per_shard:,.0f} | " + " | ".join(str(s) for s in shards) + " |")


if __name__ == "__main__":
    main()
