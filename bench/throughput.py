"""W1-style burst: enqueue N no-op runs with enqueue_many, then drain them with ONE worker
process; report runs/s for both and Redis commands per run (INFO commandstats deltas).

    .venv/bin/python -m bench.throughput --runs 20000 --repeat 3 [--server redis|valkey]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

import redis

from bench.apps import app, noop
from bench.stats import print_rounds
from duetime.embedded import EmbeddedServer


def commandstats(r: redis.Redis) -> dict[str, int]:
    return {k: v["calls"] for k, v in r.info("commandstats").items()}


def one_round(url: str, n: int, concurrency: int) -> dict[str, float]:
    ns = f"bench{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    r = redis.Redis.from_url(url)
    app.store.ready()
    stats0 = commandstats(r)
    t0 = time.perf_counter()
    app.enqueue_many([(noop, [i]) for i in range(n)])
    t_enq = time.perf_counter() - t0
    stats1 = commandstats(r)
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    t1 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                             "--app", "bench.apps:app", "--concurrency", str(concurrency)], env=env)
    done_keys = [app.keys.done(p) for p in range(app.keys.partitions)]
    while True:
        pipe = r.pipeline(transaction=False)
        for k in done_keys:
            pipe.zcard(k)
        if sum(pipe.execute()) >= n:
            break
        time.sleep(0.005)
    t_wall = time.perf_counter() - t1
    # drain rate on the server clock, first to last finish: worker start-up is reported apart
    pipe = r.pipeline(transaction=False)
    for k in done_keys:
        pipe.zrange(k, 0, 0, withscores=True)
        pipe.zrange(k, -1, -1, withscores=True)
    heads = [x[0][1] for x in pipe.execute() if x]
    t_drain = (max(heads) - min(heads)) / 1000
    stats2 = commandstats(r)
    proc.terminate()
    proc.wait(30)
    # worker start-up (interpreter + imports) is part of t_drain; measure it to report both
    def delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) - a.get(k, 0) > 0}

    enq_cmds, drain_cmds = delta(stats0, stats1), delta(stats1, stats2)
    drain_cmds.pop("cmdstat_zcard", None)  # the bench's own polling
    app.close()
    r.close()
    return {
        "enqueue_per_s": n / t_enq,
        "drain_per_s": n / t_drain,
        "worker_startup_s": t_wall - t_drain,
        "enqueue_cmds_per_run": sum(enq_cmds.values()) / n,
        "drain_cmds_per_run": sum(drain_cmds.values()) / n,
        "drain_evalsha_per_run": drain_cmds.get("cmdstat_evalsha", 0) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--server", choices=["redis", "valkey"], default="redis")
    args = ap.parse_args()
    with EmbeddedServer(args.server) as server:
        rounds = [one_round(server.url, args.runs, args.concurrency) for _ in range(args.repeat)]
    print(f"server={args.server} runs={args.runs} repeat={args.repeat} concurrency={args.concurrency}")
    print_rounds(rounds)

if __name__ == "__main__":
    main()
