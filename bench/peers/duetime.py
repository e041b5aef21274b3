"""duetime adapter (runs in the project's .venv). JSON/msgpack payloads, no pickle."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import duetime
from bench.peers import common

CONCURRENCY = common.CONCURRENCY
app = duetime.App(redis_url=common.URL, namespace="bench")


@app.task(name="bench.count")
async def count(i: int) -> None:
    common.record(i)


@app.task(name="bench.long", retries=3)
async def long(i: int, seconds: float) -> None:
    await common.long_async(i, seconds)


def describe() -> dict:
    return {
        "enqueue": "app.enqueue_many([(count, [i]) ...]) (pipelined bulk enqueue)",
        "enqueue_at": "app.enqueue_many([{'task': count, 'args': [i], 'at': datetime}, ...])",
        "worker": f"one `duetime worker` process, --concurrency {CONCURRENCY} (async tasks)",
        "register": "app.schedule_many([app.schedule_def(name, duetime.Cron(expr), count, "
                    "args=[k]), ...]), 5,000 per call",
        "scheduler": "duetime scheduler (defaults: evaluator + reaper, runs materialised ahead)",
        "recovery": {
            "default": "worker --lease 10s (default), reaper --tick 500ms (default); task retries=3",
            "aggressive": "worker --lease 2s, reaper --tick 100ms; task retries=3",
        },
    }


def enqueue_burst(n: int, first: int = 0) -> None:
    app.enqueue_many([(count, [i]) for i in range(first, first + n)])


def enqueue_at(instants: list[float]) -> None:
    app.enqueue_many([{"task": count, "args": [k], "at": datetime.fromtimestamp(t, UTC)}
                      for k, t in enumerate(instants)])


def enqueue_long(seconds: float) -> None:
    app.enqueue(long, [0, seconds])


def register_schedules(n: int, every: int) -> None:
    """W5: n schedules; numbers below `every` fire every minute, the rest once a year."""
    minutely, yearly = duetime.Cron("* * * * *"), duetime.Cron("0 0 1 1 *")
    for s in range(0, n, 5000):
        app.schedule_many([app.schedule_def(f"s{k}", minutely if k < every else yearly, count,
                                            args=[k]) for k in range(s, min(n, s + 5000))])


def worker_procs(workload: str) -> list[list[str]]:
    py = sys.executable
    base = [py, "-m", "duetime", "--log-level", "WARNING"]
    worker = [*base, "worker", "--app", "bench.peers.duetime:app", "--concurrency", str(CONCURRENCY)]
    reaper = [*base, "reaper", "--app", "bench.peers.duetime:app"]
    if workload == "W5":
        return [[*base, "scheduler", "--app", "bench.peers.duetime:app"], worker]
    if workload != "W3":
        return [worker]
    if common.MODE == "aggressive":
        return [[*worker, "--lease", "2s"], [*reaper, "--tick", "100ms"]]
    return [worker, reaper]

