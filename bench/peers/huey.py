"""Huey adapter: RedisHuey, `huey_consumer -w 8 -k thread`."""

from __future__ import annotations

import os
import sys
import time

from huey import RedisHuey

from bench.peers import common

THREADS = 8
huey = RedisHuey("bench", url=common.URL)


@huey.task(name="bench.count")
def count(i: int) -> None:
    common.record(i)


@huey.task(name="bench.long")
def long(i: int, seconds: float) -> None:
    common.long_sync(i, seconds)


def describe() -> dict:
    return {
        "enqueue": "count(i) per task (huey has no bulk enqueue)",
        "enqueue_at": "count.schedule(args=(k,), delay=seconds until the instant)",
        "worker": f"huey_consumer bench.peers.huey.huey -w {THREADS} -k thread -q "
                  "(scheduler checks every 1 s, the minimum)",
        "recovery": {
            "default": "huey has no acknowledgement: a task being executed when the consumer dies "
                       "is gone",
            "aggressive": "no setting exists; same as default",
        },
    }


def enqueue_burst(n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        count(i)


def enqueue_at(instants: list[float]) -> None:
    for k, t in enumerate(instants):
        count.schedule(args=(k,), delay=max(0.0, t - time.time()))


def enqueue_long(seconds: float) -> None:
    long(0, seconds)


def worker_procs(workload: str) -> list[list[str]]:
    bin_ = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
    return [[bin_, "bench.peers.huey.huey", "-w", str(THREADS), "-k", "thread", "-q"]]
