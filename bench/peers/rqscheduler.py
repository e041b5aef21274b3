"""RQ with rq-scheduler: cron jobs stored in Redis (a job hash each, a sorted set of next run
times) and the `rqscheduler` process that moves due ones to the queue (W5 only)."""

from __future__ import annotations

import os
import sys

from redis import Redis
from rq_scheduler import Scheduler

from bench.peers import common

INTERVAL = 1  # seconds between rqscheduler's polls (its default is 60)
conn = Redis.from_url(common.URL)
scheduler = Scheduler(queue_name="bench", connection=conn)


def count(i: int) -> None:
    common.record(i)


def describe() -> dict:
    return {
        "register": "Scheduler.cron(cron_string, func=count, args=[k], queue_name='bench', "
                    "use_local_timezone=False) per schedule",
        "worker": "rq worker --worker-class rq.worker.SimpleWorker (no fork per job)",
        "scheduler": f"rqscheduler --url $BENCH_URL --interval {INTERVAL}",
    }


def register_schedules(n: int, every: int) -> None:
    for k in range(n):
        scheduler.cron("* * * * *" if k < every else "0 0 1 1 *", func=count, args=[k],
                       queue_name="bench", use_local_timezone=False)


def worker_procs(workload: str) -> list[list[str]]:
    bindir = os.path.dirname(sys.executable)
    return [[os.path.join(bindir, "rqscheduler"), "--url", common.URL, "--interval", str(INTERVAL)],
            [os.path.join(bindir, "rq"), "worker", "--url", common.URL, "--logging_level", "WARNING",
             "--worker-class", "rq.worker.SimpleWorker", "bench"]]
