"""The long chaos run: the same load, faults and invariant checker as tests/chaos (one copy, in
tests/chaos/harness.py), for minutes to hours, with the measurements of bench/RESULTS.md:
runs lost, duplicate executions and what explains each, how soon a dead or frozen worker's
runs start again, what each restart mode lost, and the CPU an idle worker spends while the
server is down.

    .venv/bin/python -m bench.chaos --minutes 20 --server redis --rate 15 --seed 7 \\
        [--workers 3] [--schedulers 2] [--lease 2] [--idle-cpu 10] [--out DIR] \\
        [--net] [--latency 1,50] [--netns-workers 1]

`--net` adds what a network does beyond the process faults: 1-50 ms of jittered latency on
every connection of every process, half-open links (the peer vanishes without a FIN or an
RST), resets in the middle of a reply, and a partition by the kernel of a worker that runs in
a network namespace (`ip netns`; needs root or CAP_NET_ADMIN), reporting how soon half-open
connections were given up and how soon a partitioned worker served runs again after the heal.

Exit status 0 when every invariant held, 1 otherwise; the report is printed and written to
DIR/report.json (with the journal, the fault log and every process's log beside it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tests.chaos.harness import EPISODES, NET_EPISODES, ChaosConfig, run_chaos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="of fault injection")
    ap.add_argument("--server", choices=("redis", "valkey"), default="redis")
    ap.add_argument("--rate", type=float, default=15.0, help="ad-hoc runs per second")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--schedulers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--lease", type=float, default=2.0, help="worker lease, seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--episodes", default=None,
                    help="comma-separated subset of: " + ", ".join(EPISODES + NET_EPISODES)
                         + " (default: all but the network ones; with --net, all)")
    ap.add_argument("--net", action="store_true",
                    help="network faults too: the NET episodes, --latency 1,50, one worker in "
                         "a network namespace")
    ap.add_argument("--latency", default=None,
                    help="ms on every chunk of every connection, each way: min,max (jittered)")
    ap.add_argument("--netns-workers", type=int, default=None,
                    help="workers run in network namespaces of their own (the partition episode)")
    ap.add_argument("--calm", default="0.5,2.0", help="seconds between episodes: min,max")
    ap.add_argument("--idle-cpu", type=float, default=10.0,
                    help="seconds the server stays down while idle workers' CPU is measured "
                         "(0: skip)")
    ap.add_argument("--out", type=Path, default=None, help="keep everything here")
    a = ap.parse_args(argv)
    out = a.out or Path(f"/tmp/duetime-chaos-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        # the checker reads every journal line in it: an earlier run's executions would be
        # judged as this run's (same seed, same run ids) and reported as duplicates
        ap.error(f"--out {out} is not empty: give a new directory")
    lo, hi = (float(x) for x in a.calm.split(","))
    episodes = a.episodes.split(",") if a.episodes else list(EPISODES + NET_EPISODES
                                                           if a.net else EPISODES)
    unknown = set(episodes) - set(EPISODES + NET_EPISODES)
    if unknown:
        ap.error(f"unknown episodes: {', '.join(sorted(unknown))}")
    latency_arg = a.latency or ("1,50" if a.net else None)
    latency = None
    if latency_arg:
        l_lo, l_hi = (float(x) for x in latency_arg.split(","))
        latency = (l_lo, l_hi)
    netns_workers = a.netns_workers if a.netns_workers is not None else (
        1 if a.net or "partition" in episodes else 0)
    cfg = ChaosConfig(kind=a.server, duration_s=a.minutes * 60, rate=a.rate, workers=a.workers,
                      schedulers=a.schedulers, lease_s=a.lease, concurrency=a.concurrency,
                      seed=a.seed, episodes=tuple(episodes), calm_s=(lo, hi),
                      quiesce_s=120.0, workdir=out, idle_cpu_s=a.idle_cpu, latency_ms=latency,
                      netns_workers=netns_workers)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

    def log(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    log(f"chaos run: {a.minutes} min on {a.server}, rate {a.rate}/s, seed {a.seed}, "
        f"HEAD {head}, out {out}")
    result = run_chaos(cfg, log)
    doc = result.to_json()
    doc.update({"command": " ".join(["python", "-m", "bench.chaos", *(argv or sys.argv[1:])]),
                "head": head, "started": started})
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=str))
    print(result.report.text(limit=60))
    print(f"submitted {result.submitted}, executions {result.executions}, "
          f"refused enqueue calls {result.refusals}")
    if result.idle_cpu:
        print(f"idle worker CPU while the server was down: {result.idle_cpu} (% of one core)")
    if result.network:
        print(f"network: {result.network}")
    print(f"elapsed {result.elapsed_s:.0f}s; report {out / 'report.json'}")
    return 0 if result.report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
