"""arq adapter. The worker is started with arq's documented `run_worker(WorkerSettings)` so
that arq's CLI does not log every job at INFO (its CLI has no log-level option)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import run_worker as arq_run_worker

from bench.peers import common

MAX_JOBS = common.CONCURRENCY
CHUNK = 100


async def count(ctx: dict, i: int) -> None:
    common.record(i)


async def long(ctx: dict, i: int, seconds: float) -> None:
    await common.long_async(i, seconds)


class WorkerSettings:
    functions = [count, long]
    redis_settings = RedisSettings.from_dsn(common.URL)
    max_jobs = MAX_JOBS
    if common.MODE == "aggressive":
        job_timeout = 6  # in-progress key TTL = job_timeout + 10 s; must outlast the 5 s job


def describe() -> dict:
    return {
        "enqueue": f"await pool.enqueue_job('count', i), {CHUNK} at a time with asyncio.gather "
                   "(arq has no bulk enqueue)",
        "enqueue_at": "await pool.enqueue_job('count', k, _defer_until=datetime)",
        "worker": f"run_worker(WorkerSettings), max_jobs={MAX_JOBS}, poll_delay 0.5 s (default)",
        "recovery": {
            "default": "job_timeout 300 s (in-progress key TTL 310 s), max_tries 5",
            "aggressive": "job_timeout=6 (in-progress key TTL 16 s), max_tries 5",
        },
    }


async def _enqueue(calls: list[tuple]) -> None:
    pool = await create_pool(RedisSettings.from_dsn(common.URL))
    for s in range(0, len(calls), CHUNK):
        await asyncio.gather(*(pool.enqueue_job(*c[0], **c[1]) for c in calls[s:s + CHUNK]))
    await pool.aclose()


def enqueue_burst(n: int, first: int = 0) -> None:
    asyncio.run(_enqueue([(("count", i), {}) for i in range(first, first + n)]))


def enqueue_at(instants: list[float]) -> None:
    asyncio.run(_enqueue([(("count", k), {"_defer_until": datetime.fromtimestamp(t, UTC)})
                          for k, t in enumerate(instants)]))


def enqueue_long(seconds: float) -> None:
    asyncio.run(_enqueue([(("long", 0, seconds), {})]))


def worker_procs(workload: str) -> list[list[str]]:
    return [[sys.executable, "-m", "bench.peers.cli", "arq", "run-worker"]]


def run_worker() -> None:
    arq_run_worker(WorkerSettings)
