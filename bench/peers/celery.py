"""Celery adapter: Redis broker, no result backend; `celery worker` with its default prefork pool
(2 children on this 2-core machine); variants "threads" (8 threads) and "solo"."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from celery import Celery

from bench.peers import common

PREFORK = 2  # celery's default: as many pool processes as cores (2 here)
THREADS = 8  # variant "threads"
app = Celery("bench", broker=common.URL)
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)
if common.MODE == "aggressive":
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options={"visibility_timeout": 10, "unacked_restore_interval": 1,
                                  "unacked_restore_throttle": 1},
    )


@app.task(name="bench.count")
def count(i: int) -> None:
    common.record(i)


@app.task(name="bench.long")
def long(i: int, seconds: float) -> None:
    common.long_sync(i, seconds)


def describe() -> dict:
    return {
        "enqueue": "count.apply_async((i,), producer=producer) in one app.producer_or_acquire() "
                   "(no bulk API; a group would only loop the same way)",
        "enqueue_at": "count.apply_async((k,), eta=datetime)",
        "worker": {"threads": f"celery worker --pool threads --concurrency {THREADS} --loglevel WARNING",
                   "solo": "celery worker --pool solo --loglevel WARNING"}.get(
            common.VARIANT, f"celery worker --pool prefork --concurrency {PREFORK} (the default pool) "
                            "--loglevel WARNING"),
        "recovery": {
            "default": "defaults: acks before execution (task_acks_late=False)",
            "aggressive": "task_acks_late, task_reject_on_worker_lost, broker_transport_options "
                          "visibility_timeout=10 (> the 5 s job), unacked_restore_interval=1, "
                          "unacked_restore_throttle=1",
        },
    }


def enqueue_burst(n: int, first: int = 0) -> None:
    with app.producer_or_acquire() as producer:
        for i in range(first, first + n):
            count.apply_async((i,), producer=producer)


def enqueue_at(instants: list[float]) -> None:
    with app.producer_or_acquire() as producer:
        for k, t in enumerate(instants):
            count.apply_async((k,), eta=datetime.fromtimestamp(t, UTC), producer=producer)


def enqueue_long(seconds: float) -> None:
    long.apply_async((0, seconds))


def worker_procs(workload: str) -> list[list[str]]:
    celery_bin = os.path.join(os.path.dirname(sys.executable), "celery")
    pool = {"threads": ["--pool", "threads", "--concurrency", str(THREADS)], "solo": ["--pool", "solo"]}.get(
        common.VARIANT, ["--pool", "prefork", "--concurrency", str(PREFORK)])
    return [[celery_bin, "-A", "bench.peers.celery", "worker", *pool, "--loglevel", "WARNING"]]
