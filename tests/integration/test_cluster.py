"""Scale-out on Redis Cluster and Valkey cluster: three primaries, the same scripts.

Every script touches one partition, i.e. one hash slot, so it runs on whichever primary owns
that slot; the partitions spread over the shards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from duetime.common.connection import sync_client
from duetime.scheduler.evaluator import Evaluator

import duetime
from duetime.embedded import EmbeddedCluster
from tests.apps import basic
from tests.conftest import ROOT, Procs, configured, wait_for
from tests.integration.test_schedules import occurrence, run_field, runs_of

pytestmark = [pytest.mark.scripts, pytest.mark.slow]


@pytest.fixture(scope="module", params=["redis", "valkey", "redis+replicas"])
def cluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    """Three primaries; `+replicas`: each with a replica, the shape a failover needs, so the
    lifecycle cases below are proven on it too (failovers themselves: test_failover.py)."""
    kind, _, replicated = request.param.partition("+")
    with EmbeddedCluster(kind, replicas=1 if replicated else 0) as c:
        yield c


@pytest.fixture
def capp(cluster: EmbeddedCluster):
    with configured(basic.app, cluster.url, "c") as a:
        yield a


@pytest.fixture
def cprocs(cluster: EmbeddedCluster, capp) -> Iterator[Procs]:
    ps = Procs(cluster.url, capp.keys.namespace)
    yield ps
    ps.stop_all()


def test_partitions_spread_over_every_shard(cluster, capp):
    """Each primary owns the slots of some partitions (partition tags spread over slots)."""
    from redis.crc import key_slot

    slots = {key_slot(capp.keys.run(p, "x").encode()) for p in range(capp.keys.partitions)}
    owners = set()
    for lo, hi, primary, *_ in redis.Redis(port=cluster.nodes[0].port).execute_command(
            "CLUSTER SLOTS"):
        if any(lo <= s <= hi for s in slots):
            owners.add(int(primary[1]))
    assert owners == {n.port for n in cluster.primaries()}


def test_two_workers_exactly_once_on_a_cluster(capp, cprocs):
    ids = capp.enqueue_many([(basic.noop, [i]) for i in range(600)]
                            + [(basic.anoop, [i]) for i in range(600)])
    cprocs.worker("--concurrency", "32")
    cprocs.worker("--concurrency", "32")
    r = sync_client(capp.redis_url)
    wait_for(lambda: r.hlen(basic.count_key()) >= 1200, 60, what="1200 executions")
    wait_for(lambda: all(capp.get_run(i).state == "succeeded" for i in ids[::37]), 20,
             what="runs to succeed")
    counts = {k.decode(): int(v) for k, v in r.hgetall(basic.count_key()).items()}
    assert set(counts) == set(ids) and max(counts.values()) == 1


def test_bulk_enqueue_over_several_round_trips_on_a_cluster(capp):
    ids = capp.enqueue_many([(basic.noop, [i]) for i in range(4500)])
    r = sync_client(capp.redis_url)
    k = capp.keys
    assert sum(r.zcard(k.due(p, "default")) for p in range(k.partitions)) == 4500
    assert capp.get_run(ids[4499]).args == [4499]


def test_crash_recovery_and_schedules_on_a_cluster(capp, cprocs):
    run_id = capp.enqueue(basic.slow, [2.0])
    victim = cprocs.worker("--lease", "1s")
    r = sync_client(capp.redis_url)
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    capp.schedule("tick", duetime.Every(timedelta(seconds=1)), basic.noop)
    cprocs.duetime("scheduler", "--lead", "300ms")
    cprocs.worker("--lease", "1s")
    wait_for(lambda: capp.get_run(run_id).state == "succeeded", 30, what="rerun")
    assert [a.outcome for a in capp.get_run(run_id).attempts] == ["unknown", "succeeded"]
    wait_for(lambda: capp.get_schedule("tick").materialized_count >= 3, 15, what="3 scheduled runs")


def test_catch_up_after_downtime_on_a_cluster(capp, cluster):
    """Occurrences missed while no scheduler ran follow each schedule's catch-up policy on a
    cluster as on one server: `all` runs the newest `max_catchup` and records the rest as
    skipped, `latest` one run standing for all of them."""
    every = duetime.Every(timedelta(milliseconds=500))
    capp.schedule("down-all", every, basic.noop, catchup="all", max_catchup=3)
    capp.schedule("down-latest", every, basic.noop, catchup="latest")
    first = int(capp.get_schedule("down-all").next_fire.timestamp() * 1000)
    first_latest = int(capp.get_schedule("down-latest").next_fire.timestamp() * 1000)
    time.sleep(3.2)  # no scheduler runs: about six occurrences pass
    t0 = time.time() * 1000
    Evaluator(cluster.url, capp.keys, lead_ms=0, miss_tolerance_ms=300).tick()
    t1 = time.time() * 1000

    def due_by(start: int, t: float) -> int:
        """Occurrences of a 500 ms schedule starting at `start` due by `t`: what the tick
        saw lies between those due by t0 (less the tolerance's and a boundary's worth) and
        those due by t1 -- each schedule is evaluated at its own moment of the tick."""
        return int((t - start) // 500) + 1

    missed = capp.get_schedule("down-all").skipped_count + 3
    assert max(5, due_by(first, t0) - 2) <= missed <= due_by(first, t1), missed
    caught_up = sorted(occurrence(r) for r in runs_of(capp, "down-all")
                       if occurrence(r) < first + 500 * missed)
    assert caught_up == [first + 500 * i for i in range(missed - 3, missed)]
    coalesced = [r for r in runs_of(capp, "down-latest") if run_field(capp, r, "coalesced")]
    assert len(coalesced) == 1
    stood_for = int(run_field(capp, coalesced[0], "coalesced"))
    assert max(5, due_by(first_latest, t0) - 2) <= stood_for <= due_by(first_latest, t1), stood_for


def test_cli_reads_a_cluster(capp, cluster):
    run_id = capp.enqueue(basic.noop)
    out = subprocess.run([sys.executable, "-m", "duetime", "--redis-url", cluster.url,
                          "--namespace", capp.keys.namespace, "runs", "show", run_id, "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f'"id": "{run_id}"' in out.stdout


def test_new_connections_load_the_scripts_themselves(cluster, capp, cprocs):
    """An empty script cache on every node (as after restarts): a worker's fresh connections
    load the scripts when they open; no NOSCRIPT reaches a pipeline."""
    for node in cluster.nodes:
        redis.Redis(port=node.port).script_flush()
    capp.close()  # the app reconnects too
    run_id = capp.enqueue(basic.anoop)
    cprocs.worker()
    wait_for(lambda: capp.get_run(run_id).state == "succeeded", 20, what="run after flush")


def test_retry_cost_and_surge_lint_on_a_cluster(capp, cprocs, cluster):
    """The worker's cost counts go to a namespace key in the same pipeline as its partition
    scripts (another slot); lint and policy read and write `<ns>:meta` and every partition."""
    run_id = capp.enqueue(basic.billing_flaky, [0.05])
    cprocs.worker()
    assert capp.wait(run_id, timeout=30) == "charged"
    ns = capp.keys.namespace

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "duetime", "--redis-url", cluster.url,
                              "--namespace", ns, *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def cost() -> list:
        frame = json.loads(cli("top", "--once", "--json"))
        return [(r["task"], r["owner"], r["attempts"], r["failed"]) for r in frame["retry_cost"]]

    wait_for(lambda: cost() == [("billing.flaky", "billing", 3, 2)], 15, what="retry cost")
    capp.schedule_many([capp.schedule_def(f"h{i}", duetime.Cron("0 * * * *"), basic.noop)
                        for i in range(300)])
    lint = json.loads(cli("schedule", "lint", "--max-per-second", "50", "--json"))
    assert lint["peak"] == 300 and lint["over"] == 24 and lint["suggestion"]["stagger_s"]
    cli("schedule", "policy", "set", "--stagger", f"{lint['suggestion']['stagger_s']:g}s")
    assert json.loads(cli("schedule", "lint", "--max-per-second", "50", "--json"))["flat"]


def test_a_queue_pause_holds_every_partition_of_a_cluster(capp):
    from tests.integration.inproc import burst
    from tests.integration.test_queue_pause import claim_everywhere

    capp.pause_queue("default", note="cluster")
    ids = capp.enqueue_many([(basic.noop, [i]) for i in range(64)])  # over every partition
    assert len({capp.keys.partition_of_run(i) for i in ids}) > 1
    assert claim_everywhere(capp)[0] == []  # each partition's slot holds its copy
    capp.resume_queue("default")
    assert burst(capp).processed == 64
    assert all(capp.get_run(i).state == "succeeded" for i in ids)
