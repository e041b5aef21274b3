"""Queue-level gauges (backlog, oldest-due age, active leases, dead letters, unowned
partitions), computed by the scheduler process from the partition indexes; and the small
per-queue time series the web console plots (common/series.py), one point per step.

Every scheduler exports the same namespace-wide numbers; dashboards aggregate with max().
One pass is a few pipelined commands per partition and queue, never a key scan.
"""

from __future__ import annotations

import threading

import redis
from duetime.common import metrics
from duetime.common.connection import sync_client
from duetime.common.errors import RedisUnavailable
from duetime.common.inspect import Inspector
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.series import SeriesWriter

log = get_logger("duetime.gauges")


class Gauges:
    def __init__(self, url: str, keys: Keyspace, interval_s: float = 5.0) -> None:
        self.client = sync_client(url)
        self.inspector = Inspector(self.client, keys, url)
        self.interval_s = interval_s
        self.series = SeriesWriter(self.inspector)
        self.stopping = threading.Event()

    def update(self) -> None:
        ov = self.inspector.overview()
        for q, st in ov.queues.items():
            metrics.QUEUE_BACKLOG.labels(q).set(st.backlog)
            metrics.QUEUE_OLDEST_DUE.labels(q).set(st.oldest_due_age_s)
            metrics.QUEUE_SCHEDULED.labels(q).set(st.scheduled_later)
            metrics.QUEUE_RETRYING.labels(q).set(st.retrying)
        metrics.LEASES_ACTIVE.set(ov.leases)
        metrics.DEAD_RUNS.set(ov.dead)
        metrics.UNCERTAIN_RUNS.set(ov.uncertain)
        metrics.PARTITIONS_UNOWNED.set(len(ov.unowned_partitions))
        metrics.WORKERS_LIVE.set(ov.workers)
        try:
            self.series.record()
        except redis.ResponseError as exc:  # refused (maxmemory): the gauges above still count
            log.warning("queue samples for the web console not written", error=str(exc))

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.update()
            except (redis.ConnectionError, redis.TimeoutError, RedisUnavailable) as exc:
                log.warning("redis unavailable; gauges not updated", error=str(exc))
            self.stopping.wait(self.interval_s)
        self.client.close()

    def stop(self) -> None:
        self.stopping.set()
