"""`duetime scheduler`: the evaluator, the reaper and the queue gauges in one process, each in
its own thread, so a slow pass of one never delays the others."""

from __future__ import annotations

import signal
import threading

from duetime.common.keys import Keyspace
from duetime.scheduler.evaluator import Evaluator
from duetime.scheduler.gauges import Gauges
from duetime.scheduler.reaper import Reaper


def run_scheduler(url: str, keys: Keyspace, lead_ms: int = 2000, tick_s: float = 0.25,
                  reap_tick_s: float = 0.5, miss_tolerance_ms: int | None = None,
                  retention_ms: int = 24 * 3600 * 1000, gauge_interval_s: float = 5.0) -> None:
    evaluator = Evaluator(url, keys, lead_ms=lead_ms, tick_s=tick_s,
                          miss_tolerance_ms=miss_tolerance_ms)
    reaper = Reaper(url, keys, tick_s=reap_tick_s, retention_ms=retention_ms)
    gauges = Gauges(url, keys, interval_s=gauge_interval_s)

    def stop(*_: object) -> None:
        evaluator.stop()
        reaper.stop()
        gauges.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threads = [threading.Thread(target=evaluator.run, name="evaluator"),
               threading.Thread(target=reaper.run, name="reaper"),
               threading.Thread(target=gauges.run, name="gauges", daemon=True)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.2)
