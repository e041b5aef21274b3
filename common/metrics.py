"""Prometheus metrics shared by workers, the scheduler and the reaper (base units: seconds)."""

from __future__ import annotations

import bisect
import math
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from duetime.common.errors import RATE_SCOPES, DuetimeError, InvalidInput
from duetime.common.health import Health, Verdict
from duetime.common.outcomes import Outcome
from duetime.common.retrycost import ATTEMPT_ENDINGS
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60, 300)

RUNS_FINISHED = Counter(
    "duetime_runs_finished_total",
    "Attempts finished by a worker, by task and outcome as the recording script decided it "
    "(common/outcomes.py)",
    ["task", "outcome"],
)
START_LATENESS = Histogram(
    "duetime_start_lateness_seconds", "Attempt start minus the run's scheduled time",
    ["queue"], buckets=LATENCY_BUCKETS,
)
EXECUTION = Histogram(
    "duetime_execution_duration_seconds", "Task execution time", ["task"],
    buckets=LATENCY_BUCKETS,
)
CLAIMED = Counter("duetime_runs_claimed_total", "Runs claimed by this worker", ["queue"])
LEASES_LOST = Counter("duetime_leases_lost_total", "Leases a worker found lost mid-run")
LATE_REJECTED = Counter(
    "duetime_late_results_rejected_total", "Results refused because the fence was stale"
)
REAPED = Counter(
    "duetime_lease_expiries_total", "Runs whose lease expired, by what the reaper did", ["result"]
)
MISSED = Counter("duetime_runs_missed_total", "Runs not started before their starting deadline")
SKIPPED = Counter("duetime_runs_skipped_total", "Occurrences skipped by catch-up or overlap policy")
MATERIALIZED = Counter("duetime_runs_materialized_total", "Runs created from schedules")
QUARANTINED = Counter("duetime_schedules_quarantined_total",
                      "Schedules set aside because their stored record could not be evaluated")
# counted by the process whose script made the dead transition (a worker's fail.lua, a
# reaper's reap.lua): the pause is written in that same script (lua/_lib.lua schedule_dead)
AUTO_PAUSED = Counter("duetime_schedules_auto_paused_total",
                      "Schedules paused by their pause_after_failures guardrail")
PARTITIONS_OWNED = Gauge("duetime_scheduler_partitions_owned", "Partitions this scheduler evaluates")
INFLIGHT = Gauge("duetime_worker_inflight_runs", "Runs executing in this worker")
QUEUE_DELAY = Histogram(
    "duetime_queue_delay_seconds",
    "Attempt start minus the time the attempt became claimable (due time; retry time for retries)",
    ["queue"], buckets=LATENCY_BUCKETS,
)
RUNS_LIMITED = Counter(
    "duetime_runs_limited_total",
    "Runs a limit held back at claim time, by kind of limit (concurrency or rate); a run "
    "counts once per limit it waits on",
    ["limit"],
)
LIMITED_DELAY = Histogram(
    "duetime_limited_delay_seconds",
    "Attempt start minus the time it became claimable, for runs a limit held back (kept out "
    "of duetime_queue_delay_seconds and duetime_start_lateness_seconds)",
    ["queue"], buckets=LATENCY_BUCKETS,
)
RATE_LIMITED = Counter(
    "duetime_rate_limited_total",
    "Runs a worker gave back because the task raised RateLimited (no attempt spent), by task "
    "and the scope held (task, queue or tenant)", ["task", "scope"],
)
RETRIES = Counter("duetime_retries_total", "Failed attempts a worker reported that will be retried",
                  ["task"])
DEAD_LETTERS = Counter("duetime_dead_letters_total",
                       "Runs a worker's report sent to dead-letter, by task and the task's owner "
                       "(alerts route on it)", ["task", "owner"])
ATTEMPTS = Counter(
    "duetime_attempts_total",
    "Attempts a worker ran, by task, the task's owner and how the attempt ended as the worker "
    "saw it (`ending`): succeeded, failed (raised, timed out, could not start) or interrupted "
    "(lease lost, cancelled, released at shutdown)",
    ["task", "owner", "ending"],
)
FAILED_ATTEMPT_SECONDS = Counter(
    "duetime_failed_attempt_seconds_total",
    "Execution seconds spent on attempts that did not succeed (the cost of retries), by task "
    "and owner", ["task", "owner"],
)

# Namespace-level gauges, exported by every scheduler process (aggregate with max()).
QUEUE_BACKLOG = Gauge("duetime_queue_backlog", "Runs claimable now (due or retry time passed)",
                      ["queue"])
QUEUE_OLDEST_DUE = Gauge("duetime_queue_oldest_due_age_seconds",
                         "Age of the oldest claimable run (0 when none is waiting)", ["queue"])
QUEUE_SCHEDULED = Gauge("duetime_queue_scheduled", "Runs due later", ["queue"])
QUEUE_RETRYING = Gauge("duetime_queue_retrying", "Runs waiting for a retry", ["queue"])
QUEUE_PAUSED = Gauge("duetime_queue_paused", "1 while the queue is paused (duetime queue pause): "
                     "nothing is claimed from it", ["queue"])
LEASES_ACTIVE = Gauge("duetime_leases_active", "Runs running under a lease")
DEAD_RUNS = Gauge("duetime_dead_letter_runs", "Dead-lettered runs not yet replayed or purged")
UNCERTAIN_RUNS = Gauge("duetime_uncertain_runs", "Runs whose outcome is unknown (await an operator)")
PARTITIONS_UNOWNED = Gauge("duetime_partitions_unowned", "Partitions no scheduler evaluates")
WORKERS_LIVE = Gauge("duetime_workers_live", "Workers that heartbeated recently")
REFUSING_WRITES = Gauge(
    "duetime_redis_refusing_writes",
    "1 while Redis refuses writes (at maxmemory with noeviction): no run is created, claimed or "
    "recovered meanwhile; heartbeats still extend leases",
)

# What each process exports on /metrics: its own metrics, every one from startup. A scheduler
# does not show worker gauges at 0 (a dashboard summing them would read a scheduler as an idle
# worker), nor a worker the namespace gauges. In-process, all are in the default registry.
WORKER_METRICS = (RUNS_FINISHED, START_LATENESS, QUEUE_DELAY, EXECUTION, CLAIMED, LEASES_LOST,
                  LATE_REJECTED, INFLIGHT, RETRIES, DEAD_LETTERS, MISSED, SKIPPED, ATTEMPTS,
                  FAILED_ATTEMPT_SECONDS, RUNS_LIMITED,
                  LIMITED_DELAY, RATE_LIMITED, AUTO_PAUSED)
REAPER_METRICS = (REAPED, MISSED, REFUSING_WRITES, AUTO_PAUSED)
SCHEDULER_METRICS = (*REAPER_METRICS, SKIPPED, MATERIALIZED, QUARANTINED, PARTITIONS_OWNED,
                     QUEUE_BACKLOG, QUEUE_OLDEST_DUE, QUEUE_SCHEDULED, QUEUE_RETRYING,
                     QUEUE_PAUSED,
                     LEASES_ACTIVE, DEAD_RUNS, UNCERTAIN_RUNS, PARTITIONS_UNOWNED, WORKERS_LIVE)
ROLES: dict[str, tuple[Any, ...]] = {"worker": WORKER_METRICS, "reaper": REAPER_METRICS,
                                     "scheduler": SCHEDULER_METRICS}


def registry(role: str) -> CollectorRegistry:
    """The metrics `role` exports, with the process, platform and GC collectors."""
    reg = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR,
                      *dict.fromkeys(ROLES[role])):
        reg.register(collector)
    return reg


REAPED.labels("recovered")  # its one result so far: there from startup


def preset(tasks: Iterable[str] = (), queues: Iterable[str] = (),
           owners: dict[str, str] | None = None) -> None:
    """Create the labelled series a worker will report at 0, so a rate() or an absent() alert
    has a series to read before the first run (unlabelled ones start at 0 by themselves).
    `owners`: task -> its owner ('' when it has none), the owner label of the cost series."""
    for q in queues:
        for metric in (CLAIMED, START_LATENESS, QUEUE_DELAY, LIMITED_DELAY):
            child(metric, q)
    for kind in ("concurrency", "rate"):
        child(RUNS_LIMITED, kind)
    for t in tasks:
        for metric in (EXECUTION, RETRIES):
            child(metric, t)
        for scope in RATE_SCOPES:
            child(RATE_LIMITED, t, scope)
        for outcome in Outcome:
            child(RUNS_FINISHED, t, outcome.value)
        owner = (owners or {}).get(t, "")
        child(DEAD_LETTERS, t, owner)
        child(FAILED_ATTEMPT_SECONDS, t, owner)
        for ending in ATTEMPT_ENDINGS:
            child(ATTEMPTS, t, owner, ending)


def preset_queue_gauges(queues: Iterable[str]) -> None:
    """A scheduler's queue gauges at 0 for the queues it knows at startup: the first gauges
    pass fills them a moment later, but a scrape in between must already see the series."""
    for q in queues:
        for metric in (QUEUE_BACKLOG, QUEUE_OLDEST_DUE, QUEUE_SCHEDULED, QUEUE_RETRYING,
                       QUEUE_PAUSED):
            child(metric, q)


_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """`metric.labels(...)` memoised: the hot path calls this per run, labels() takes a lock."""
    key = (id(metric), labels)
    c = _children.get(key)
    if c is None:
        c = _children[key] = metric.labels(*labels)
    return c


def observe_many(hist: Any, values: list[float]) -> None:
    """`hist.observe(v)` for each of `values` (a histogram child, see `child`), in bulk: the
    buckets are counted here and each touched bucket, the sum (and the count) is incremented
    once, where observing one by one takes a lock and scans the buckets per value. The same
    series, read the same way by a scrape; a histogram of another make is observed one by one."""
    bounds = getattr(hist, "_upper_bounds", None)
    buckets = getattr(hist, "_buckets", None)
    total = getattr(hist, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            hist.observe(v)
        return
    hist._raise_if_not_observable()
    counts = [0] * len(bounds)
    for v in values:  # the first bucket whose upper bound is >= v (the last is +Inf)
        counts[bisect.bisect_left(bounds, v)] += 1
    total.inc(math.fsum(values))
    for bucket, n in zip(buckets, counts, strict=True):
        if n:
            bucket.inc(n)


# What /healthz and /readyz answer: the process's loops report here (see common/health.py).
health = Health()

_Start = Callable[[str, list[tuple[str, str]]], Any]


def _app(metrics_app: Callable[..., Iterable[bytes]], probes: Health) -> Callable[..., Iterable[bytes]]:
    """/healthz and /readyz from the health registry; every other path is the metrics."""
    paths: dict[str, Callable[[], Verdict]] = {"/healthz": probes.liveness,
                                               "/readyz": probes.readiness}

    def app(environ: dict[str, Any], start_response: _Start) -> Iterable[bytes]:
        probe = paths.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics_app(environ, start_response)
        verdict = probe()
        body = verdict.body()
        start_response(f"{verdict.http_status} {'OK' if verdict.ok else 'Service Unavailable'}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                        ("Cache-Control", "no-store")])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app


class _Quiet(WSGIRequestHandler):
    """No access log: probes come every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def serve(port: int | None, addr: str = "127.0.0.1", role: str = "scheduler",
          probes: Health | None = None) -> WSGIServer | None:
    """/metrics (`role`'s), /healthz and /readyz on `addr:port`, in a daemon thread; nothing
    without a port. Loopback unless told otherwise (the metrics name tasks, queues and owners);
    `0.0.0.0` in a container, where the orchestrator probes and Prometheus scrapes from outside."""
    if not port:
        return None
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise InvalidInput(f"metrics host {addr!r}: {exc.strerror}") from None
    server_class: type[_Server] = type("MetricsServer", (_Server,), {"address_family": family})
    try:
        httpd = make_server(str(sockaddr[0]), port, _app(make_wsgi_app(registry(role)), probes or health),
                            server_class, handler_class=_Quiet)
    except OSError as exc:
        raise DuetimeError(f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from None
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd
