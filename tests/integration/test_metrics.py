"""`/metrics` scraped over HTTP from a running worker and scheduler after known work."""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import timedelta

import pytest
from duetime.common import metrics
from prometheus_client.parser import text_string_to_metric_families

import duetime
from duetime.embedded import free_port
from tests.apps import basic
from tests.conftest import ROOT, Procs, wait_for
from tests.integration.opkit import Driver

Samples = dict[tuple[str, frozenset], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_worker_and_scheduler_metrics_after_known_work(app, procs):
    sched_port, worker_port = free_port(), free_port()
    procs.duetime("scheduler", "--metrics-port", str(sched_port), "--gauges-every", "100ms",
                  "--tick", "100ms", "--reap-tick", "100ms")
    waiting = app.enqueue_many([(basic.noop, [i]) for i in range(5)])

    def sched(name: str, **labels: str) -> float | None:
        return value(scrape(sched_port), name, **labels)

    # no worker yet: the backlog gauge sees the 5 runs, the oldest one ageing
    wait_for(lambda: _try(lambda: sched("duetime_queue_backlog", queue="default") == 5), 20,
             what="backlog gauge = 5")
    assert sched("duetime_queue_oldest_due_age_seconds", queue="default") > 0
    assert sched("duetime_scheduler_partitions_owned") == 16
    wait_for(lambda: sched("duetime_partitions_unowned") == 0, 10, what="no unowned partition")
    app.schedule("metrics-every-second", duetime.Every(timedelta(seconds=1)), basic.anoop)

    # a lease that expires (nobody serves 'orphan'): the scheduler's reaper recovers it
    orphan = app.enqueue(basic.noop, queue="orphan")
    assert [c.run_id for _, c in Driver(app).claim_all(queue="orphan", lease_ms=100)] == [orphan]
    wait_for(lambda: app.get_run(orphan).state == "retrying", 20, what="reaper")

    procs.worker("--metrics-port", str(worker_port), "--queues", "default")
    fatal = app.enqueue(basic.fatal)
    flaky = app.enqueue(basic.always_fails)  # 3 attempts, 2 retries, then dead
    retried = app.enqueue(basic.retry_later, [0.2])  # Retry once, then succeeds
    wait_for(lambda: [app.get_run(r).state for r in (*waiting, fatal, flaky, retried)]
             == ["succeeded"] * 5 + ["dead", "dead", "succeeded"], 30, what="known work done")

    def worker_ready() -> bool:
        s = scrape(worker_port)
        lateness = value(s, "duetime_start_lateness_seconds_count", queue="default") or 0
        delay = value(s, "duetime_queue_delay_seconds_count", queue="default") or 0
        return value(s, "duetime_retries_total", task="flaky") == 2 and delay - lateness == 3

    wait_for(worker_ready, 10, what="worker counters")
    w = scrape(worker_port)
    assert value(w, "duetime_runs_finished_total", task="noop", outcome="succeeded") == 5
    assert value(w, "duetime_runs_finished_total", task="fatal", outcome="dead") == 1
    # outcomes as the scripts decided them: flaky's 3 failed attempts = 2 retries, then dead
    assert value(w, "duetime_runs_finished_total", task="flaky", outcome="retrying") == 2
    assert value(w, "duetime_runs_finished_total", task="flaky", outcome="dead") == 1
    assert value(w, "duetime_runs_finished_total", task="retry_later", outcome="retrying") == 1
    assert value(w, "duetime_runs_finished_total", task="retry_later", outcome="succeeded") == 1
    assert value(w, "duetime_retries_total", task="retry_later") == 1
    assert value(w, "duetime_dead_letters_total", task="flaky", owner="") == 1
    assert value(w, "duetime_dead_letters_total", task="fatal", owner="") == 1
    assert value(w, "duetime_execution_duration_seconds_count", task="noop") == 5
    assert value(w, "duetime_execution_duration_seconds_bucket", task="noop", le="+Inf") == 5
    # first attempts: 5 noop + fatal + flaky + retry_later + the schedule's anoop runs. The
    # schedule keeps firing: paused, its last run started may still be running, so the two
    # counters agree once it finished (read again until then, from one scrape each time)
    app.pause("metrics-every-second")

    def first_attempts_agree() -> bool:
        s = scrape(worker_port)
        anoops = value(s, "duetime_runs_finished_total", task="anoop", outcome="succeeded") or 0
        return value(s, "duetime_start_lateness_seconds_count", queue="default") == 8 + anoops

    wait_for(first_attempts_agree, 20, what="first attempts = 8 + the schedule's runs")
    w = scrape(worker_port)
    anoops = value(w, "duetime_runs_finished_total", task="anoop", outcome="succeeded") or 0
    assert value(w, "duetime_start_lateness_seconds_sum", queue="default") >= 0
    # the retries waited their backoff before they were claimed, not since the due time
    retry_delay_sum = (value(w, "duetime_queue_delay_seconds_sum", queue="default")
                       - value(w, "duetime_start_lateness_seconds_sum", queue="default"))
    assert 0 <= retry_delay_sum < 5
    assert value(w, "duetime_runs_claimed_total", queue="default") >= 10 + anoops
    assert value(w, "duetime_late_results_rejected_total") == 0
    assert value(w, "duetime_leases_lost_total") == 0

    wait_for(lambda: _try(lambda: sched("duetime_dead_letter_runs") == 2), 10, what="gauges")
    s = scrape(sched_port)
    assert value(s, "duetime_queue_backlog", queue="default") == 0
    assert value(s, "duetime_queue_retrying", queue="orphan") == 1
    assert value(s, "duetime_lease_expiries_total", result="recovered") == 1
    assert value(s, "duetime_runs_materialized_total") >= 1
    assert value(s, "duetime_workers_live") == 1
    assert value(s, "duetime_uncertain_runs") == 0


def _documented_metrics() -> set[str]:
    """The metrics the reference page lists: the first cell of each row of its tables."""
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    return set(re.findall(r"^\| `(duetime_[a-z_]+)`", text, re.M))


def _families(samples: Samples) -> set[str]:
    """Metric names as documented: counters with `_total`, histograms without suffix."""
    out = set()
    for name, _ in samples:
        out.add(name)
        out.add(re.sub(r"_(count|sum|bucket)$", "", name))
    return out


def test_every_documented_metric_is_exported_from_startup_by_its_own_role(app, procs):
    """Before any work: each metric docs/reference/metrics.md lists is on /metrics (at 0) of the process that
    reports it, and a process exports only its own (no worker gauge on a scheduler)."""
    sched_port, worker_port = free_port(), free_port()
    procs.duetime("scheduler", "--metrics-port", str(sched_port))
    procs.worker("--metrics-port", str(worker_port), "--queues", "default")
    wait_for(lambda: _up(sched_port) and _up(worker_port), 20, what="both metrics endpoints")
    w, s = scrape(worker_port), scrape(sched_port)
    documented = _documented_metrics()
    defined = {m._name + ("_total" if m._type == "counter" else "")
               for role in metrics.ROLES.values() for m in role}
    assert documented == defined  # the reference lists every metric, and only real ones
    assert documented - (_families(w) | _families(s)) == set()

    # the worker's series exist for its tasks and queues, at 0
    assert value(w, "duetime_runs_finished_total", task="noop", outcome="succeeded") == 0
    assert value(w, "duetime_runs_finished_total", task="fatal", outcome="dead") == 0
    assert value(w, "duetime_retries_total", task="flaky") == 0
    assert value(w, "duetime_dead_letters_total", task="flaky", owner="") == 0
    assert value(w, "duetime_execution_duration_seconds_count", task="noop") == 0
    assert value(w, "duetime_start_lateness_seconds_count", queue="default") == 0
    assert value(w, "duetime_queue_delay_seconds_count", queue="default") == 0
    assert value(w, "duetime_runs_claimed_total", queue="default") == 0
    assert value(w, "duetime_leases_lost_total") == 0

    worker_only = {"duetime_worker_inflight_runs", "duetime_runs_finished_total",
                   "duetime_execution_duration_seconds", "duetime_leases_lost_total"}
    scheduler_only = {"duetime_queue_backlog", "duetime_scheduler_partitions_owned",
                      "duetime_workers_live", "duetime_partitions_unowned",
                      "duetime_runs_materialized_total", "duetime_lease_expiries_total"}
    assert worker_only <= _families(w) and not worker_only & _families(s)
    assert scheduler_only <= _families(s)
    assert not scheduler_only & _families(w)
    assert value(s, "duetime_lease_expiries_total", result="recovered") == 0
    assert value(s, "duetime_runs_materialized_total") == 0
    assert "process_cpu_seconds_total" in _families(w) | _families(s)


def test_a_scheduler_waiting_for_redis_already_exports_its_queue_gauges(namespace):
    """The endpoint is served while the scheduler still waits for Redis (unready): a scrape
    then already finds the queue gauge families, at 0 for the default queue, so what the
    startup test scrapes cannot depend on whether the first read of the known queues won the
    race. The URL's port is bound here and never listened on, so no server can answer there
    (nor another test's take the port): the scheduler waits for as long as it runs."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    procs = Procs(f"redis://127.0.0.1:{taken.getsockname()[1]}", namespace)
    port = free_port()
    try:
        procs.duetime("scheduler", "--metrics-port", str(port))
        wait_for(lambda: _up(port), 20, what="the metrics endpoint")
        s = scrape(port)
        for name in ("duetime_queue_backlog", "duetime_queue_oldest_due_age_seconds",
                     "duetime_queue_scheduled", "duetime_queue_retrying", "duetime_queue_paused"):
            assert value(s, name, queue="default") == 0, name
        with pytest.raises(urllib.error.HTTPError) as unready:  # it still waits: 503
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert unready.value.code == 503
    finally:
        procs.stop_all()
        taken.close()


def _try(fn: Callable[[], object]) -> bool:
    """A scrape may race the server starting."""
    try:
        return bool(fn())
    except (OSError, TypeError):
        return False


def test_a_reaper_holds_off_while_redis_refuses_writes_and_says_so(app, r, procs):
    """At maxmemory the reaper's script is refused as a whole: an expired lease stays as it
    was (nothing half-done), the refusal shows as a metric, and recovery resumes after."""
    port = free_port()
    d = Driver(app)
    run_id = app.enqueue(basic.noop)
    [(p, _)] = d.claim_all()
    r.zadd(app.keys.leases(p), {run_id: 0})  # its worker is gone: the lease has expired
    old = r.config_get("maxmemory")["maxmemory"]
    r.config_set("maxmemory", 1)
    try:
        procs.duetime("reaper", "--tick", "100ms", "--metrics-port", str(port))
        wait_for(lambda: _up(port) and value(scrape(port), "duetime_redis_refusing_writes") == 1,
                 20, what="the refusing-writes gauge")
        assert app.get_run(run_id).state == "running"
        assert r.zscore(app.keys.leases(p), run_id) == 0
    finally:
        r.config_set("maxmemory", old)
    wait_for(lambda: app.get_run(run_id).state == "retrying", 20,
             what="recovery after the refusal ends")
    wait_for(lambda: value(scrape(port), "duetime_redis_refusing_writes") == 0, 20)


def _up(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True
