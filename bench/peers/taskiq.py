"""taskiq adapter: taskiq-redis RedisStreamBroker (acknowledged), ListRedisScheduleSource for
delayed jobs (taskiq has no delayed send without its scheduler process)."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime

from taskiq import ScheduledTask, TaskiqScheduler
from taskiq_redis import ListRedisScheduleSource, RedisStreamBroker

from bench.peers import common

CHUNK = 100
if common.MODE == "aggressive":
    broker = RedisStreamBroker(url=common.URL, idle_timeout=6000)
else:
    broker = RedisStreamBroker(url=common.URL)
source = ListRedisScheduleSource(common.URL)
scheduler = TaskiqScheduler(broker, sources=[source])


@broker.task(task_name="bench.count")
async def count(i: int) -> None:
    common.record(i)


@broker.task(task_name="bench.long")
async def long(i: int, seconds: float) -> None:
    await common.long_async(i, seconds)


def describe() -> dict:
    return {
        "enqueue": f"await count.kiq(i), {CHUNK} at a time with asyncio.gather",
        "enqueue_at": "await count.schedule_by_time(ListRedisScheduleSource, datetime, k); "
                      "`taskiq scheduler ... --update-interval 1` beside the worker",
        "worker": f"taskiq worker bench.peers.taskiq:broker --workers 1 --max-async-tasks "
                  f"{common.CONCURRENCY} (100: its default)",
        "register": f"await ListRedisScheduleSource.add_schedule(ScheduledTask(cron=..., args=[k])), "
                    f"{CHUNK} at a time with asyncio.gather",
        "scheduler": "taskiq scheduler bench.peers.taskiq:scheduler (defaults: --update-interval 60)",
        "recovery": {
            "default": "RedisStreamBroker idle_timeout 600 s (XAUTOCLAIM of unacked messages)",
            "aggressive": "RedisStreamBroker(idle_timeout=6000 ms, > the 5 s job)",
        },
    }


async def _kiq(calls: list[tuple]) -> None:
    await broker.startup()  # creates the consumer group: messages sent before a worker starts count
    for s in range(0, len(calls), CHUNK):
        await asyncio.gather(*(fn(*a) for fn, a in calls[s:s + CHUNK]))
    await broker.shutdown()


def enqueue_burst(n: int, first: int = 0) -> None:
    asyncio.run(_kiq([(count.kiq, (i,)) for i in range(first, first + n)]))


def enqueue_at(instants: list[float]) -> None:
    async def go() -> None:
        await source.startup()
        await _kiq([(count.schedule_by_time, (source, datetime.fromtimestamp(t, UTC), k))
                    for k, t in enumerate(instants)])
        await source.shutdown()

    asyncio.run(go())


def enqueue_long(seconds: float) -> None:
    asyncio.run(_kiq([(long.kiq, (0, seconds))]))


def register_schedules(n: int, every: int) -> None:
    """W5: n cron schedules in the Redis source; numbers below `every` fire every minute."""
    async def go() -> None:
        await source.startup()
        for s in range(0, n, CHUNK):
            await asyncio.gather(*(source.add_schedule(ScheduledTask(
                task_name="bench.count", labels={}, args=[k], kwargs={}, schedule_id=f"s{k}",
                cron="* * * * *" if k < every else "0 0 1 1 *")) for k in range(s, min(n, s + CHUNK))))
        await source.shutdown()

    asyncio.run(go())


def worker_procs(workload: str) -> list[list[str]]:
    bin_ = os.path.join(os.path.dirname(sys.executable), "taskiq")
    worker = [bin_, "worker", "bench.peers.taskiq:broker", "--workers", "1", "--max-async-tasks",
              str(common.CONCURRENCY), "--log-level", "WARNING"]
    if workload == "W2":
        return [worker, [bin_, "scheduler", "bench.peers.taskiq:scheduler", "--update-interval", "1",
                         "--log-level", "WARNING"]]
    if workload == "W5":
        return [[bin_, "scheduler", "bench.peers.taskiq:scheduler", "--log-level", "WARNING"], worker]
    return [worker]
