"""RQ adapter: `rq worker` (forking, the default) or SimpleWorker (variant "simple")."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from redis import Redis
from rq import Queue, Retry

from bench.peers import common

conn = Redis.from_url(common.URL)
queue = Queue("bench", connection=conn)


def count(i: int) -> None:
    # the default worker runs each job in a forked child that exits at once: count before it
    if common.VARIANT == "simple":
        common.record(i)
    else:
        common.record_now(i)


def long(i: int, seconds: float) -> None:
    common.long_sync(i, seconds)


def describe() -> dict:
    return {
        "enqueue": "Queue.enqueue_many([Queue.prepare_data(count, (i,)) ...], pipeline=pipe)",
        "enqueue_at": "queue.enqueue_at(datetime, count, k) per job; worker --with-scheduler",
        "worker": ("rq worker --with-scheduler --worker-class rq.worker.SimpleWorker (no fork per job)"
                   if common.VARIANT == "simple" else
                   "rq worker --with-scheduler (the default Worker: one fork per job)"),
        "recovery": {
            "default": "defaults: job_timeout 180 s, no Retry, job monitoring 30 s, maintenance 600 s",
            "aggressive": "job enqueued with Retry(max=3), job_timeout=10; worker "
                          "--job-monitoring-interval 1 --maintenance-interval 1 --worker-ttl 16 "
                          "(a dequeue blocks worker_ttl - 15 s, and maintenance waits for it)",
        },
    }


def enqueue_burst(n: int, first: int = 0) -> None:
    with conn.pipeline() as pipe:
        queue.enqueue_many([Queue.prepare_data(count, (i,)) for i in range(first, first + n)], pipeline=pipe)
        pipe.execute()


def enqueue_at(instants: list[float]) -> None:
    for k, t in enumerate(instants):
        queue.enqueue_at(datetime.fromtimestamp(t, UTC), count, k)


def enqueue_long(seconds: float) -> None:
    if common.MODE == "aggressive":
        queue.enqueue(long, 0, seconds, retry=Retry(max=3), job_timeout=10)
    else:
        queue.enqueue(long, 0, seconds)


def worker_procs(workload: str) -> list[list[str]]:
    rq_bin = os.path.join(os.path.dirname(sys.executable), "rq")
    argv = [rq_bin, "worker", "--url", common.URL, "--logging_level", "WARNING", "--with-scheduler"]
    if common.VARIANT == "simple":
        argv += ["--worker-class", "rq.worker.SimpleWorker"]
    if workload == "W3" and common.MODE == "aggressive":
        # the maintenance (which finds abandoned jobs) only runs between dequeues, and a dequeue
        # blocks worker_ttl - 15 s (405 s by default): --worker-ttl 16 makes that 1 s
        argv += ["--job-monitoring-interval", "1", "--maintenance-interval", "1", "--worker-ttl", "16"]
    return [[*argv, "bench"]]
