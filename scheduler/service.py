"""`duetime scheduler`: the evaluator, the reaper and the queue gauges in one process, each in
its own thread, so a slow pass of one never delays the others."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

from duetime.common import metrics
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.scheduler.evaluator import Evaluator
from duetime.scheduler.gauges import Gauges
from duetime.scheduler.reaper import Reaper

log = get_logger("duetime.scheduler")


class _Part(threading.Thread):
    """A thread of the scheduler process that remembers how it ended."""

    error: BaseException | None

    def __init__(self, name: str, target: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._body, self.error = target, None

    def run(self) -> None:
        try:
            self._body()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
            log.exception("scheduler part died", part=self.name)


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
    for name in ("evaluator", "reaper"):  # ready only when both are
        metrics.health.expect(name)
    parts = [_Part("evaluator", evaluator.run), _Part("reaper", reaper.run),
             _Part("gauges", gauges.run)]
    for t in parts:
        t.start()
    # A part that ends while the others run (a bug, not a Redis outage: those are retried
    # inside) must not leave a process that looks alive and does nothing: stop, exit non-zero,
    # and let the supervisor restart it.
    while all(t.is_alive() for t in parts):
        for t in parts:
            t.join(0.2)
    dead = [t for t in parts if not t.is_alive() and (t.error or not evaluator.stopping.is_set())]
    stop()
    for t in parts:
        t.join(10)
    if dead:
        log.critical("a part of the scheduler stopped; exiting so it is restarted",
                     parts=[t.name for t in dead],
                     errors=[f"{type(t.error).__name__}: {t.error}" for t in dead if t.error])
        sys.exit(1)
