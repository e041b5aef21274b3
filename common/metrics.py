"""Prometheus metrics shared by workers, the scheduler and the reaper (base units: seconds)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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
PARTITIONS_OWNED = Gauge("duetime_scheduler_partitions_owned", "Partitions this scheduler evaluates")
INFLIGHT = Gauge("duetime_worker_inflight_runs", "Runs executing in this worker")
QUEUE_DELAY = Histogram(
    "duetime_queue_delay_seconds",
    "Attempt start minus the time the attempt became claimable (due time; retry time for retries)",
    ["queue"], buckets=LATENCY_BUCKETS,
)
RETRIES = Counter("duetime_retries_total", "Failed attempts a worker reported that will be retried",
                  ["task"])
DEAD_LETTERS = Counter("duetime_dead_letters_total", "Runs a worker's report sent to dead-letter",
                       ["task"])

# Namespace-level gauges, exported by every scheduler process (aggregate with max()).
QUEUE_BACKLOG = Gauge("duetime_queue_backlog", "Runs claimable now (due or retry time passed)",
                      ["queue"])
QUEUE_OLDEST_DUE = Gauge("duetime_queue_oldest_due_age_seconds",
                         "Age of the oldest claimable run (0 when none is waiting)", ["queue"])
QUEUE_SCHEDULED = Gauge("duetime_queue_scheduled", "Runs due later", ["queue"])
QUEUE_RETRYING = Gauge("duetime_queue_retrying", "Runs waiting for a retry", ["queue"])
LEASES_ACTIVE = Gauge("duetime_leases_active", "Runs running under a lease")
DEAD_RUNS = Gauge("duetime_dead_letter_runs", "Dead-lettered runs not yet replayed or purged")
UNCERTAIN_RUNS = Gauge("duetime_uncertain_runs", "Runs whose outcome is unknown (await an operator)")
PARTITIONS_UNOWNED = Gauge("duetime_partitions_unowned", "Partitions no scheduler evaluates")
WORKERS_LIVE = Gauge("duetime_workers_live", "Workers that heartbeated recently")


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
