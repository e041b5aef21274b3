"""Celery beat with RedBeat (celery-redbeat): beat's schedule kept in Redis, one entry per
schedule (W5 only; W1-W4 use bench/peers/celery.py). Same Redis broker and worker as there."""

from __future__ import annotations

import os
import sys

from celery import Celery
from celery.schedules import crontab
from redbeat import RedBeatSchedulerEntry

from bench.peers import common

MAX_INTERVAL = 1  # seconds: beat wakes at least this often (its documented knob)
app = Celery("bench", broker=common.URL)
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False, redbeat_redis_url=common.URL, timezone="UTC",
                enable_utc=True)


@app.task(name="bench.count")
def count(i: int) -> None:
    common.record(i)


def describe() -> dict:
    return {
        "register": "RedBeatSchedulerEntry(name, 'bench.count', crontab(...), args=[k], "
                    "app=app).save() per schedule",
        "worker": "celery worker --pool prefork --concurrency 2 (the default pool)",
        "scheduler": f"celery beat -S redbeat.RedBeatScheduler --max-interval {MAX_INTERVAL}",
    }


def register_schedules(n: int, every: int) -> None:
    minutely = crontab()
    yearly = crontab(minute=0, hour=0, day_of_month=1, month_of_year=1)
    for k in range(n):
        RedBeatSchedulerEntry(f"s{k}", "bench.count", minutely if k < every else yearly,
                              args=[k], app=app).save()


def worker_procs(workload: str) -> list[list[str]]:
    celery_bin = os.path.join(os.path.dirname(sys.executable), "celery")
    return [[celery_bin, "-A", "bench.peers.redbeat", "beat", "-S", "redbeat.RedBeatScheduler",
             "--max-interval", str(MAX_INTERVAL), "--loglevel", "WARNING"],
            [celery_bin, "-A", "bench.peers.redbeat", "worker", "--pool", "prefork",
             "--concurrency", "2", "--loglevel", "WARNING"]]
