"""SAQ adapter: Redis queue, `saq bench.peers.saq.settings`, concurrency 100."""

from __future__ import annotations

import asyncio
import os
import sys

from saq import Job, Queue

from bench.peers import common

CONCURRENCY = common.CONCURRENCY
CHUNK = 100
queue = Queue.from_url(common.URL)


async def count(ctx: dict, *, i: int) -> None:
    common.record(i)


async def long(ctx: dict, *, i: int, seconds: float) -> None:
    await common.long_async(i, seconds)


settings = {"queue": queue, "functions": [count, long], "concurrency": CONCURRENCY}
if common.MODE == "aggressive":
    settings["timers"] = {"sweep": 1}


def describe() -> dict:
    return {
        "enqueue": f"await queue.enqueue('count', i=i), {CHUNK} at a time with asyncio.gather",
        "enqueue_at": "await queue.enqueue('count', i=k, scheduled=epoch seconds (float))",
        "worker": f"saq bench.peers.saq.settings --quiet, concurrency {CONCURRENCY}, "
                  "schedule timer 1 s (default)",
        "recovery": {
            "default": "Job defaults timeout 10 s, heartbeat 0, retries 1; sweep every 60 s",
            "aggressive": "Job(timeout=6, retries=3); timers sweep=1 s",
        },
    }


async def _enqueue(items: list[dict]) -> None:
    await queue.connect()
    for s in range(0, len(items), CHUNK):
        await asyncio.gather(*(queue.enqueue(**kw) for kw in items[s:s + CHUNK]))
    await queue.disconnect()


def enqueue_burst(n: int, first: int = 0) -> None:
    asyncio.run(_enqueue([{"job_or_func": "count", "i": i} for i in range(first, first + n)]))


def enqueue_at(instants: list[float]) -> None:
    asyncio.run(_enqueue([{"job_or_func": "count", "i": k, "scheduled": t}
                          for k, t in enumerate(instants)]))


def enqueue_long(seconds: float) -> None:
    if common.MODE == "aggressive":
        job = Job("long", kwargs={"i": 0, "seconds": seconds}, timeout=6, retries=3)
    else:
        job = Job("long", kwargs={"i": 0, "seconds": seconds})
    asyncio.run(_enqueue([{"job_or_func": job}]))


def worker_procs(workload: str) -> list[list[str]]:
    bin_ = os.path.join(os.path.dirname(sys.executable), "saq")
    return [[bin_, "bench.peers.saq.settings", "--quiet"]]
