"""How long `aenqueue_many` holds the event loop: 10,000 runs enqueued from asyncio code while
a ticker on the same loop measures the wait between two of its turns, in the loop thread's CPU
time (wall time would also count the machine being busy elsewhere), less the time CPython's
garbage collector ran in it (an interpreter pause, not duetime holding the loop).
tests/client/test_async_and_wait.py checks the slicing by counting the work between turns;
this measures the time it used to bound (< 10 ms).

    .venv/bin/python -m bench.async_enqueue --runs 10000 --repeat 3
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

from bench.drive import parser, repeated
from bench.stats import percentile
from tests.apps import basic


def one_round(url: str, n: int) -> dict[str, float]:
    app = basic.app
    app.configure(redis_url=url, namespace=f"aenq{uuid.uuid4().hex[:6]}")
    gc_time = [0.0]
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.thread_time())
        elif started:
            gc_time[0] += time.thread_time() - started.pop()

    async def main() -> list[float]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last, last_gc = time.thread_time(), gc_time[0]
            while not stop.is_set():
                await asyncio.sleep(0)
                now, now_gc = time.thread_time(), gc_time[0]
                gaps.append((now - last) - (now_gc - last_gc))
                last, last_gc = now, now_gc

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        await app.aenqueue_many([(basic.noop, [i]) for i in range(n)])
        stop.set()
        await tick
        return gaps

    gc.callbacks.append(on_gc)
    gc.freeze()
    try:
        gaps = asyncio.run(main())
    finally:
        gc.unfreeze()
        gc.callbacks.remove(on_gc)
        app.close()
    ms = [g * 1000 for g in gaps]
    return {"turns": float(len(ms)), "gap_p50_ms": percentile(ms, 50),
            "gap_p99_ms": percentile(ms, 99), "gap_max_ms": max(ms)}


def main() -> None:
    args = parser(runs=10_000, repeat=3).parse_args()
    repeated(args, lambda url: one_round(url, args.runs),
             f"server={args.server} runs={args.runs} repeat={args.repeat}")


if __name__ == "__main__":
    main()
