"""What replicated durability costs an enqueue: latency of one `enqueue` (p50/p99) and
throughput of one-at-a-time enqueues and of `enqueue_many`, with `wait_replicas=0` and `=1`, on
a loopback Redis Cluster of 3 primaries with a replica each. Each round measures both settings
(alternating which goes first), so a ratio is taken between numbers of one round.

    .venv/bin/python -m bench.durability --singles 2000 --bulk 20000 --rounds 3
"""

from __future__ import annotations

import statistics
import time
import uuid

import redis

import duetime
from bench.drive import parser
from bench.stats import percentile
from duetime.embedded import EmbeddedCluster


def wait_calls(cluster: EmbeddedCluster) -> int:
    """WAIT commands the primaries ran so far (proof that the setting took effect)."""
    total = 0
    for n in cluster.primaries():
        with redis.Redis(port=n.port) as c:
            total += int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    return total


def measure(cluster: EmbeddedCluster, wait_replicas: int, singles: int, bulk: int) -> dict[str, float]:
    url = cluster.url
    waits = wait_calls(cluster)
    app = duetime.App(redis_url=url, namespace=f"dur{uuid.uuid4().hex[:6]}",
                      wait_replicas=wait_replicas)

    @app.task(name="bench.durable")
    def work(i: int) -> None:
        pass

    app.enqueue(work, [0])  # connect and record the namespace first
    lat = []
    t0 = time.perf_counter()
    for i in range(singles):
        t = time.perf_counter()
        app.enqueue(work, [i])
        lat.append((time.perf_counter() - t) * 1000)
    single_rate = singles / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    app.enqueue_many([(work, [i]) for i in range(bulk)])
    bulk_rate = bulk / (time.perf_counter() - t0)
    app.close()
    return {"p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "singles_per_s": single_rate, "bulk_runs_per_s": bulk_rate,
            "wait_calls": float(wait_calls(cluster) - waits)}


def main() -> None:
    args = parser(singles=2000, bulk=20000, rounds=3).parse_args()
    rounds: list[dict[int, dict[str, float]]] = []
    with EmbeddedCluster(args.server, n=3, replicas=1) as cluster:
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            rounds.append({w: measure(cluster, w, args.singles, args.bulk) for w in order})
            print(f"round {r + 1}: " + "; ".join(
                f"wait_replicas={w}: " + ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1][w].items())
                for w in (0, 1)))
    print(f"\nmedians over {args.rounds} rounds ({args.server}, 3 primaries + 3 replicas, loopback):")
    for key in rounds[0][0]:
        a = statistics.median(r[0][key] for r in rounds)
        b = statistics.median(r[1][key] for r in rounds)
        ratio = statistics.median(r[1][key] / r[0][key] if r[0][key] else float("nan")
                                  for r in rounds)
        print(f"  {key:<16} wait_replicas=0 {a:10.2f}   wait_replicas=1 {b:10.2f}   "
              f"ratio (same round) {ratio:5.2f}")


if __name__ == "__main__":
    main()
