"""How late a held run wakes at its instant, the worker's hold alone (no Redis): N waits in
one event loop, each until an instant a random 5-15 ms ahead (one at a time, as W2's runs
come), by `asyncio.sleep` (the hold of old), by `ServerClock.wait_until` with the helper
thread's fine timer (`FineTimer`, the hold before the loop's timerfd, still the one off
Linux) and with the loop's own timerfd (`LoopFineTimer`, the default on Linux); lateness =
the monotonic clock after the wait - the instant. Rounds interleaved.

    .venv/bin/python -m bench.hold_timer --waits 300 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

from duetime.worker.clock import FineTimer, ServerClock, fine_sleep

from bench.stats import percentile


async def one_round(kind: str, n: int, rng: random.Random) -> dict[str, float]:
    # server clock = the monotonic one, no error
    fine = FineTimer().sleep if kind == "wait_until, thread" else fine_sleep
    clock = ServerClock(wall=time.monotonic, fine=fine)
    late: list[float] = []
    for _ in range(n):
        at = time.monotonic() + rng.uniform(0.005, 0.015)
        if kind == "asyncio.sleep":
            await asyncio.sleep(at - time.monotonic())
        else:
            await clock.wait_until(at * 1000)
        late.append((time.monotonic() - at) * 1000)
    return {"p50": percentile(late, 50), "p99": percentile(late, 99), "max": max(late),
            "early": float(sum(1 for x in late if x < 0))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--waits", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(1)
    rows: dict[str, list[dict[str, float]]] = {
        "asyncio.sleep": [], "wait_until, thread": [], "wait_until, timerfd": []}
    for _ in range(args.repeat):
        for kind in rows:
            rows[kind].append(asyncio.run(one_round(kind, args.waits, rng)))
    print(f"{args.waits} waits x {args.repeat} rounds, load average {os.getloadavg()[0]:.1f}")
    for kind, rs in rows.items():
        med = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0]}
        print(f"  {kind:<20} lateness ms (median of rounds): p50 {med['p50']:.3f}  "
              f"p99 {med['p99']:.3f}  max {med['max']:.3f}  early {sum(r['early'] for r in rs):.0f}")


if __name__ == "__main__":
    main()
