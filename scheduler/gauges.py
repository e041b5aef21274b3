"""Queue-level gauges (backlog, oldest-due age, active leases, dead letters, unowned
partitions), computed by the scheduler process from the partition indexes; and the small
per-queue time series the web console plots (common/series.py), one point per step.

Every scheduler exports the same namespace-wide numbers; dashboards aggregate with max().
One pass is a few pipelined commands per partition and queue, never a key scan. While the
namespace is idle (nothing claimable, nothing running) a pass runs at most a minute apart --
sooner when a run comes due, and at once when any run or schedule notice arrives -- and only
the 5-minute samples are kept: an idle scheduler costs its server almost nothing.
"""

from __future__ import annotations

import threading

import redis
from duetime.common import metrics
from duetime.common.connection import process_kw, sync_client
from duetime.common.errors import RedisUnavailable
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.overview import NamespaceReader
from duetime.common.series import SeriesWriter
from duetime.scheduler.notices import Heads, Listener

log = get_logger("duetime.gauges")


IDLE_S = 60.0  # an idle namespace's gauges are recomputed at most this far apart


class Gauges:
    def __init__(self, url: str, keys: Keyspace, interval_s: float = 5.0) -> None:
        self.url, self.keys = url, keys
        self.client = sync_client(url, **process_kw())  # bounded waits
        self.inspector = NamespaceReader(self.client, keys, url)
        self.interval_s = interval_s
        self.series = SeriesWriter(self.inspector)
        self.stopping = threading.Event()
        self.pokes = Heads()  # only its `changed` event: a notice arrived
        self.idle = False
        self._next_due_ms: int | None = None

    def update(self) -> None:
        ov = self.inspector.overview()
        self.idle = ov.leases == 0 and all(st.backlog == 0 for st in ov.queues.values())
        dues = [st.next_due_ms for st in ov.queues.values() if st.next_due_ms is not None]
        self._next_due_ms = min(dues) if dues else None
        for q, st in ov.queues.items():
            metrics.QUEUE_BACKLOG.labels(q).set(st.backlog)
            metrics.QUEUE_OLDEST_DUE.labels(q).set(st.oldest_due_age_s)
            metrics.QUEUE_SCHEDULED.labels(q).set(st.scheduled_later)
            metrics.QUEUE_RETRYING.labels(q).set(st.retrying)
            metrics.QUEUE_PAUSED.labels(q).set(1 if st.paused else 0)
        metrics.LEASES_ACTIVE.set(ov.leases)
        metrics.DEAD_RUNS.set(ov.dead)
        metrics.UNCERTAIN_RUNS.set(ov.uncertain)
        metrics.PARTITIONS_UNOWNED.set(len(ov.unowned_partitions))
        metrics.WORKERS_LIVE.set(ov.workers)
        try:
            self.series.record(only=("5m",) if self.idle else None)
        except redis.ResponseError as exc:  # refused (maxmemory): the gauges above still count
            log.warning("queue samples for the web console not written", error=str(exc))

    def _wait_s(self) -> float:
        if not self.idle:
            return self.interval_s
        wait = IDLE_S
        if self._next_due_ms is not None:  # something comes due: look then
            ahead = (self._next_due_ms - self.inspector.now_ms()) / 1000 + 1.0
            wait = min(wait, max(self.interval_s, ahead))
        return wait

    def run(self) -> None:
        listener = Listener(self.client, self.url, [self.keys.wake_channel, self.keys.sched_wake],
                            None, self.pokes, self.stopping)
        listener.start()
        while not self.stopping.is_set():
            wait = self.interval_s
            try:
                self.pokes.changed.clear()
                self.update()
                wait = self._wait_s()
            except (redis.ConnectionError, redis.TimeoutError, RedisUnavailable) as exc:
                log.warning("redis unavailable; gauges not updated", error=str(exc))
            except Exception:  # noqa: BLE001 - gauges are observability: never stop the scheduler
                log.exception("gauges not updated this time; trying again")
            if self.idle:  # a notice (a run, a schedule, a lease) ends the idle wait at once
                self.pokes.changed.wait(wait)
            else:
                self.stopping.wait(wait)
        self.client.close()

    def stop(self) -> None:
        self.stopping.set()
        self.pokes.changed.set()
