"""Debounce under a stream of events: 10,000 events/s over 1,000 keys by default.

Producers send events at the target rate for `--seconds` (split over `--producers`
processes; each tick of 10 ms one `enqueue_many`, keys drawn at random from `--keys`, each with
`debounce=--debounce-ms` and `max_wait=--max-wait-ms`), while one `duetime worker` process runs
what comes due. Then the worker drains what is left. Reported per round:

- the event rate achieved (events sent / send time, on this machine's clock),
- runs created (the run records of the namespace) and events per run,
- the runs per key against the bounds: with debounce D and max wait W over S seconds, a key
  enqueued steadily gets about S / W runs (each due W after its first event, as events keep
  coming faster than D), and at least S / (W + drain latency),
- Redis CPU per event (INFO commandstats, EVALSHA usec, the worker's claims included),
- every run succeeded exactly once (counted on a side key by the task, bench.counted).

    .venv/bin/python -m bench.debounce [--rate 10000] [--keys 1000] [--seconds 10]
        [--debounce-ms 500] [--max-wait-ms 2000] [--producers 2] [--rounds 3]
        [--server redis|valkey]
    .venv/bin/python -m bench.debounce --cost 20000 [--keys 1000] [--rounds 5]
    .venv/bin/python -m bench.debounce --ceiling 5 [--batch 33,200,1000] [--rounds 3]

`--ceiling S`: is the producer the bottleneck? One producer in this process enqueues
coalescing events as fast as it can for S seconds (no worker, no ticks), in `enqueue_many`
calls of each `--batch` size (interleaved rounds): events/s, the producer's own CPU per event
(process time) and Redis's (INFO cpu of the server). One producer on one free core can send
at most 1e6 / (its µs per event); Redis at most 1e6 / (its µs per event).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import redis

from bench.apps import app, counted
from bench.drive import parser
from duetime.embedded import EmbeddedServer

TICK_S = 0.01


def _evalsha_us(r: redis.Redis) -> float:
    return float(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def _worker(url: str, ns: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    return subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                             "--app", "bench.apps:app", "--concurrency", "100"], env=env)


def produce(url: str, ns: str, rate: float, keys: int, seconds: float, debounce_ms: int,
            max_wait_ms: int, seed: int) -> tuple[int, float]:
    """One producer: `rate` events/s for `seconds`, in ticks of TICK_S; → events sent and
    the seconds sending took."""
    app.configure(redis_url=url, namespace=ns)
    app.store.ready()
    rng = random.Random(seed)
    per_tick = max(1, int(rate * TICK_S))
    sent, t0 = 0, time.monotonic()
    next_tick = t0
    while time.monotonic() - t0 < seconds:
        app.enqueue_many([{"task": counted, "args": [seed * 10**9 + sent + j],
                           "key": f"key-{rng.randrange(keys)}",
                           "debounce": debounce_ms / 1000, "max_wait": max_wait_ms / 1000}
                          for j in range(per_tick)])
        sent += per_tick
        next_tick += TICK_S
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    took = time.monotonic() - t0
    app.close()
    return sent, took


def one_round(url: str, rate: int, keys: int, seconds: float, debounce_ms: int,
              max_wait_ms: int, producers: int, seed: int) -> dict[str, Any]:
    ns = f"bdb{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    app.store.ready()
    r = redis.Redis.from_url(url)
    side = redis.Redis.from_url(url, db=1)
    proc = _worker(url, ns)
    time.sleep(1.0)  # the worker's start is not part of the stream
    cpu0 = _evalsha_us(r)
    prods = [subprocess.Popen([sys.executable, "-m", "bench.debounce", "--produce", url, ns,
                               str(rate / producers), str(keys), str(seconds), str(debounce_ms),
                               str(max_wait_ms), str(seed * 100 + i)], stdout=subprocess.PIPE)
             for i in range(producers)]
    outs = [p.communicate()[0].split() for p in prods]
    sent = sum(int(o[0]) for o in outs)
    send_s = max(float(o[1]) for o in outs)  # the producers run side by side
    # runs created: every run record of the namespace; each must run once (side counts)
    run_keys = [k for k in r.scan_iter(f"{ns}:*", count=5000) if b":run:" in k]
    end = time.monotonic() + 120
    while True:
        counts = side.hgetall(f"{ns}:count")
        if len(counts) >= len(run_keys) or time.monotonic() > end:
            break
        time.sleep(0.05)
    cpu1 = _evalsha_us(r)
    proc.terminate()
    proc.wait(30)
    pipe = r.pipeline(transaction=False)
    for k in run_keys:
        pipe.hmget(k, "key", "state")
    per_key: dict[bytes, int] = {}
    succeeded = 0
    for key, state in pipe.execute():
        per_key[key] = per_key.get(key, 0) + 1
        succeeded += state == b"succeeded"
    runs = len(run_keys)
    once = sum(1 for v in counts.values() if v == b"1")
    side.delete(f"{ns}:count")
    r.close()
    side.close()
    app.close()
    return {"events": sent, "rate": sent / send_s, "runs": runs, "events_per_run": sent / runs,
            "runs_per_key_median": statistics.median(per_key.values()),
            "runs_per_key_max": max(per_key.values()), "keys_seen": len(per_key),
            "cpu_us_per_event": (cpu1 - cpu0) / sent, "succeeded": succeeded,
            "ran_once": once, "bound_runs_per_key": seconds * 1000 / max_wait_ms}


def cost_round(url: str, mode: str, events: int, keys: int) -> float:
    """Redis CPU (EVALSHA usec) per event of enqueue.lua alone, no worker: `events` enqueues in
    calls of 100, plain (new ids), key= (idempotency), debounce= or throttle= over `keys`."""
    ns = f"bdc{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    app.store.ready()
    r = redis.Redis.from_url(url)
    opts: dict[str, Any] = {"plain": {}, "key": {}, "debounce": {"debounce": 3600},
                            "throttle": {"throttle": 3600}}[mode]
    rng = random.Random(1)
    u0 = _evalsha_us(r)
    for start in range(0, events, 100):
        app.enqueue_many([{"task": counted, "args": [start + j],
                           **({} if mode == "plain" else {"key": f"key-{rng.randrange(keys)}"}),
                           **opts} for j in range(100)])
    u1 = _evalsha_us(r)
    for k in r.scan_iter(f"{ns}:*", count=5000):
        r.unlink(k)
    r.close()
    app.close()
    return (u1 - u0) / events


def _server_cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6


def ceiling_round(url: str, batch: int, keys: int, seconds: float, seed: int) -> dict[str, float]:
    """One producer, flat out: `enqueue_many` of `batch` debounced events per call."""
    ns = f"bdx{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    app.store.ready()
    r = redis.Redis.from_url(url)
    rng = random.Random(seed)
    sent = 0
    c0, p0, t0 = _server_cpu_us(r), time.process_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        app.enqueue_many([{"task": counted, "args": [sent + j],
                           "key": f"key-{rng.randrange(keys)}", "debounce": 0.5,
                           "max_wait": 2.0} for j in range(batch)])
        sent += batch
    wall, cpu = time.monotonic() - t0, time.process_time() - p0
    server = _server_cpu_us(r) - c0
    for k in r.scan_iter(f"{ns}:*", count=5000):
        r.unlink(k)
    r.close()
    app.close()
    return {"events_per_s": sent / wall, "producer_us_per_event": cpu * 1e6 / sent,
            "redis_us_per_event": server / sent}


def main() -> None:
    if sys.argv[1:2] == ["--produce"]:
        url, ns, rate, keys, seconds, deb, mw, seed = sys.argv[2:10]
        sent, took = produce(url, ns, float(rate), int(keys), float(seconds), int(deb), int(mw),
                             int(seed))
        print(sent, took)
        return
    ap = parser(rate=10000, keys=1000, seconds=10.0, rounds=3, producers=2)
    ap.add_argument("--debounce-ms", type=int, default=500)
    ap.add_argument("--max-wait-ms", type=int, default=2000)
    ap.add_argument("--cost", type=int, default=0, help="instead: enqueue.lua's Redis CPU per "
                    "event over this many events per mode, interleaved rounds")
    ap.add_argument("--ceiling", type=float, default=0.0)
    ap.add_argument("--batch", default="33,200,1000")
    args = ap.parse_args()
    if args.ceiling:
        batches = [int(b) for b in args.batch.split(",")]
        got: dict[int, list[dict[str, float]]] = {b: [] for b in batches}
        with EmbeddedServer(args.server) as server:
            for n in range(args.rounds):
                for b in (batches if n % 2 == 0 else batches[::-1]):
                    got[b].append(ceiling_round(server.url, b, args.keys, args.ceiling, n))
        print(f"load average {os.getloadavg()}")
        for b in batches:
            print(f"batch {b}: " + ", ".join(
                f"{k} {statistics.median(x[k] for x in got[b]):,.1f} "
                f"({min(x[k] for x in got[b]):,.1f}-{max(x[k] for x in got[b]):,.1f})"
                for k in got[b][0]))
        return
    if args.cost:
        modes = ("plain", "key", "debounce", "throttle")
        res: dict[str, list[float]] = {m: [] for m in modes}
        with EmbeddedServer(args.server) as server:
            for _ in range(args.rounds):
                for m in modes:
                    res[m].append(cost_round(server.url, m, args.cost, args.keys))
        for m in modes:
            print(f"{m}: {statistics.median(res[m]):.2f} us/event "
                  f"({min(res[m]):.2f}-{max(res[m]):.2f}); ratio to plain, paired median "
                  f"{statistics.median(a / b for a, b in zip(res[m], res['plain'], strict=True)):.2f}")
        return
    rows = []
    with EmbeddedServer(args.server) as server:
        for n in range(args.rounds):
            row = one_round(server.url, args.rate, args.keys, args.seconds, args.debounce_ms,
                            args.max_wait_ms, args.producers, seed=n)
            rows.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    print("median:", {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]})


if __name__ == "__main__":
    main()
