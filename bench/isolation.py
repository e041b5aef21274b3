"""Process isolation's overhead per run: a tiny sync task executed in the worker's thread pool
vs in a reused child process (`isolation="process"`, worker/isolation.py).

Two measures, thread and process interleaved in each round (ratios are taken within a round):
- **call**: the executor's body call alone, no Redis: `ProcessPool.call` (msgpack request over
  the socket pair, the child runs the function, msgpack reply) vs `run_in_executor` on a
  thread pool; µs per call, sequential, one child reused throughout.
- **drain**: end to end, an in-process worker (`Worker.run(until_idle=True)`) draining N runs
  of the task against an embedded Redis; runs/s, at --concurrency 1 and 8. The pool's children
  are started before the clock starts (spawn once, not per run), and their start is reported.

    .venv/bin/python -m bench.isolation --runs 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from duetime.common import logs
from duetime.common.context import RunContext
from duetime.worker.config import WorkerConfig
from duetime.worker.isolation import ProcessPool
from duetime.worker.runtime import Worker

import duetime
from duetime.embedded import EmbeddedServer

app = duetime.App()
REF = "bench.isolation:app"


@app.task(name="bench.iso.thread", store_result=False)
def in_thread(i: int = 0) -> int:
    return i + 1


@app.task(name="bench.iso.process", isolation="process", store_result=False)
def in_process(i: int = 0) -> int:
    return i + 1


def _ctx(i: int) -> RunContext:
    return RunContext(run_id=f"r{i}", task="bench.iso.process", queue="default", attempt=1,
                      fence=1, worker_id="bench", idempotency_key=f"r{i}", scheduled_at=None)


async def call_round(n: int) -> dict[str, float]:
    pool = ProcessPool(REF, None, None, size=1)
    t0 = time.perf_counter()
    await pool.call(_ctx(0), "bench.iso.process", [0], {}, None, False)  # start the child
    spawn_ms = (time.perf_counter() - t0) * 1000
    threads = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    for i in range(n):
        await loop.run_in_executor(threads, in_thread, i)
    thread_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for i in range(n):
        await pool.call(_ctx(i), "bench.iso.process", [i], {}, 30.0, False)
    process_us = (time.perf_counter() - t0) / n * 1e6
    pool.close()
    threads.shutdown()
    assert pool.started == 1, pool.started  # one child for every call: reused
    return {"spawn_ms": spawn_ms, "thread_us": thread_us, "process_us": process_us}


async def drain_round(url: str, task: Any, n: int, concurrency: int) -> dict[str, float]:
    app.configure(redis_url=url, namespace=f"iso{uuid.uuid4().hex[:8]}")
    cfg = WorkerConfig(queues=["default"], concurrency=concurrency, app_ref=REF)
    app.enqueue_many([(task, [i]) for i in range(n)])
    w = Worker(app.registry, url, app.keys, cfg)
    pool = w.executor.processes
    if task is in_process:  # the children this concurrency uses are started before the clock
        assert pool is not None
        await asyncio.gather(*(pool.call(_ctx(i), "bench.iso.process", [i], {}, None, False)
                               for i in range(concurrency)))
    t0 = time.perf_counter()
    await w.run(handle_signals=False, until_idle=True)
    rate = n / (time.perf_counter() - t0)
    started = pool.started if pool is not None else 0
    app.close()
    assert w.processed == n, (w.processed, n)
    return {"rate": rate, "children": float(started)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", choices=["redis", "valkey"], default="redis")
    args = ap.parse_args()
    logs.configure("WARNING")
    calls = [asyncio.run(call_round(args.runs)) for _ in range(args.rounds)]
    print(f"call (no Redis), {args.runs} sequential calls x {args.rounds} rounds")
    for key in ("spawn_ms", "thread_us", "process_us"):
        vals = [c[key] for c in calls]
        print(f"  {key:<12} median {statistics.median(vals):9.1f}  min {min(vals):9.1f}  "
              f"max {max(vals):9.1f}")
    extra = [c["process_us"] - c["thread_us"] for c in calls]
    print(f"  overhead per call: median {statistics.median(extra):.1f} µs")
    with EmbeddedServer(args.server) as server:
        for conc in (1, 8):
            rows: list[tuple[float, float, float]] = []
            asyncio.run(drain_round(server.url, in_thread, min(args.runs, 500), conc))  # warm-up
            for k in range(args.rounds):  # the order alternates, round by round
                if k % 2:
                    p = asyncio.run(drain_round(server.url, in_process, args.runs, conc))
                    t = asyncio.run(drain_round(server.url, in_thread, args.runs, conc))
                else:
                    t = asyncio.run(drain_round(server.url, in_thread, args.runs, conc))
                    p = asyncio.run(drain_round(server.url, in_process, args.runs, conc))
                rows.append((t["rate"], p["rate"], p["children"]))
            print(f"drain {args.runs} runs, --concurrency {conc}, server={args.server}")
            for label, i in (("thread runs/s", 0), ("process runs/s", 1)):
                vals = [r[i] for r in rows]
                print(f"  {label:<15} median {statistics.median(vals):9.1f}  min {min(vals):9.1f}"
                      f"  max {max(vals):9.1f}")
            ratio = [r[1] / r[0] for r in rows]
            per_run = [(1 / r[1] - 1 / r[0]) * 1e6 for r in rows]
            print(f"  process/thread rate ratio median {statistics.median(ratio):.3f} "
                  f"(range {min(ratio):.3f}-{max(ratio):.3f}); extra µs per run median "
                  f"{statistics.median(per_run):.0f}; children started in the timed drain "
                  f"{max(r[2] for r in rows):.0f}")


if __name__ == "__main__":
    main()
