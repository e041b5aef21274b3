"""`duetime scheduler`: the evaluator and the reaper in one process, each in its own thread,
so a slow pass of one never delays the other."""

from __future__ import annotations

import signal
import threading

from common.keys import Keyspace
from scheduler.evaluator import Evaluator
from scheduler.reaper import Reaper


def run_scheduler(url: str, keys: Keyspace, lead_ms: int = 2000, tick_s: float = 0.25,
                  reap_tick_s: float = 0.5, miss_tolerance_ms: int = 10_000,
                  retention_ms: int = 24 * 3600 * 1000) -> None:
    evaluator = Evaluator(url, keys, lead_ms=lead_ms, tick_s=tick_s,
                          miss_tolerance_ms=miss_tolerance_ms)
    reaper = Reaper(url, keys, tick_s=reap_tick_s, retention_ms=retention_ms)

    def stop(*_: object) -> None:
        evaluator.stop()
        reaper.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threads = [threading.Thread(target=evaluator.run, name="evaluator"),
               threading.Thread(target=reaper.run, name="reaper")]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.2)
