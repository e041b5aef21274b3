"""Dramatiq adapter: RedisBroker, `dramatiq --processes 1 --threads 8`."""

from __future__ import annotations

import os
import sys
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import common

THREADS = 8
if common.MODE == "aggressive":
    broker = RedisBroker(url=common.URL, heartbeat_timeout=5000, maintenance_chance=1_000_000)
else:
    broker = RedisBroker(url=common.URL)
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="bench_count", queue_name="bench")
def count(i: int) -> None:
    common.record(i)


@dramatiq.actor(actor_name="bench_long", queue_name="bench")
def long(i: int, seconds: float) -> None:
    common.long_sync(i, seconds)


def describe() -> dict:
    return {
        "enqueue": "count.send(i) per message (RedisBroker has no bulk enqueue)",
        "enqueue_at": "count.send_with_options(args=(k,), delay=ms until the instant)",
        "worker": f"dramatiq bench.peers.dramatiq --processes 1 --threads {THREADS}",
        "recovery": {
            "default": "RedisBroker defaults: heartbeat_timeout 60 s, maintenance_chance 1000/1e6",
            "aggressive": "RedisBroker(heartbeat_timeout=5000 ms, maintenance_chance=1_000_000 "
                          "i.e. on every dispatch call)",
        },
    }


def enqueue_burst(n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        count.send(i)


def enqueue_at(instants: list[float]) -> None:
    for k, t in enumerate(instants):
        count.send_with_options(args=(k,), delay=max(0, int((t - time.time()) * 1000)))


def enqueue_long(seconds: float) -> None:
    long.send(0, seconds)


def worker_procs(workload: str) -> list[list[str]]:
    bin_ = os.path.join(os.path.dirname(sys.executable), "dramatiq")
    return [[bin_, "bench.peers.dramatiq", "--processes", "1", "--threads", str(THREADS)]]
