"""Prometheus metrics shared by workers, the scheduler and the reaper (base units: seconds)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60, 300)

RUNS_FINISHED = Counter(
    "duetime_runs_finished_total", "Attempts finished by a worker, by task and outcome",
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
PARTITIONS_OWNED = Gauge("duetime_scheduler_partitions_owned", "Partitions this scheduler evaluates")
INFLIGHT = Gauge("duetime_worker_inflight_runs", "Runs executing in this worker")


_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """`metric.labels(...)` memoised: the hot path calls this per run, labels() takes a lock."""
    key = (id(metric), labels)
    c = _children.get(key)
    if c is None:
        c = _children[key] = metric.labels(*labels)
    return c


def serve(port: int | None, addr: str = "0.0.0.0") -> None:
    if port:
        start_http_server(port, addr=addr)
