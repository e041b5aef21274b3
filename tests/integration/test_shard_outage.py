"""A dead primary holds back only its own partitions' schedules and lease recovery.

Three primaries with a replica each. The primary that holds the namespace's global keys (the
owners table an older version kept, the scheduler wake channel's slot, `<ns>:meta`) is
SIGKILLed while its replica is told not to take over (`cluster-replica-no-failover yes`), and
every node serves the slots it has (`cluster-require-full-coverage no`): the outage lasts as
long as the test needs, not as long as an election happens to take. While the node is dead,
and the cluster has marked it failed, each live shard's schedule must go on materialising
every occurrence, and leases that expire on live shards must be reaped -- observed as events
(a schedule's last occurrence moving on by three, a run's attempt ended `unknown` by the
reaper) with generous deadlines, the dead node checked to be still down at the time of each
observation. Then the replica may take over, and the dead shard catches up.

Before the scheduler worked per node, one pipeline across every node failed as a whole: no
schedule and no lease on any shard moved until the promotion, which here never comes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.connection import sync_client
from duetime.common.keys import Keyspace
from duetime.common.schedules import run_id_for
from duetime.common.scripts import Scripts
from redis.crc import key_slot

import duetime
from duetime.client.runs import keyed_run_id
from duetime.embedded import EmbeddedCluster, EmbeddedServer
from tests.apps import failover as fo
from tests.conftest import Procs, wait_for
from tests.integration.test_failover import _in_sync, _is_primary, _replicas_of, _slot_owners

pytestmark = [pytest.mark.scripts, pytest.mark.slow]

NODE_TIMEOUT_MS = 2000
LEASE_MS = 1000
MORE_OCCURRENCES = 3  # each live schedule moves on by this many during the outage


@pytest.fixture(scope="module", params=["redis", "valkey"])
def scluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(request.param, n=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as c:
        for node in c.nodes:  # the live shards serve while a slot range has no node
            redis.Redis(port=node.port).config_set("cluster-require-full-coverage", "no")
        yield c


def _port_of(owners: list[tuple[int, int, int]], key: str) -> int:
    slot = key_slot(key.encode())
    return next(port for lo, hi, port in owners if lo <= slot <= hi)


def _namespace_on_one_node(owners: list[tuple[int, int, int]]) -> tuple[str, int]:
    """A namespace whose global keys the scheduler touches all live on one primary."""
    for _ in range(10_000):
        ns = f"so{uuid.uuid4().hex[:8]}"
        k = Keyspace(ns)
        ports = {_port_of(owners, key) for key in (k.owners, k.sched_wake, k.meta)}
        if len(ports) == 1:
            return ns, ports.pop()
    raise AssertionError("no namespace found")


def _by_port(owners: list[tuple[int, int, int]], keys: Keyspace) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in range(keys.partitions):
        out.setdefault(_port_of(owners, keys.prefix(p)), []).append(p)
    return out


def _schedule_in(keys: Keyspace, partitions: list[int], tag: str) -> str:
    return next(f"{tag}-{i}" for i in range(10_000)
                if keys.partition_of_schedule(f"{tag}-{i}") in partitions)


def _probe_in(keys: Keyspace, p: int, tag: str) -> str:
    """An enqueue key whose run lands on partition p."""
    return next(f"{tag}-{i}" for i in range(100_000)
                if keys.partition_of_run(keyed_run_id(fo.work.spec.name, f"{tag}-{i}")) == p)


def _last_ms(app: duetime.App, name: str) -> int:
    last = app.get_schedule(name).last_occurrence
    return 0 if last is None else int(last.timestamp() * 1000)


def _marked_failed(cluster: EmbeddedCluster, port: int) -> bool:
    """A live node's view: the dead node is flagged `fail` (not only `fail?`)."""
    for n in cluster.nodes:
        if n.port == port:
            continue
        try:
            with redis.Redis(port=n.port, socket_timeout=1) as c:
                for line in c.execute_command("CLUSTER", "NODES").decode().splitlines():
                    parts = line.split()
                    if parts[1].startswith(f"127.0.0.1:{port}@"):
                        return "fail" in parts[2].split(",")
        except redis.RedisError:
            continue
    return False


def _still_down(victim: EmbeddedServer, replica_port: int) -> None:
    proc = victim.process
    assert proc is None or proc.poll() is not None, "the killed primary is running again"
    with pytest.raises(redis.ConnectionError), redis.Redis(port=victim.port, socket_timeout=1) as c:
        c.ping()  # nothing answers on its port
    assert not _is_primary(replica_port), "its replica was promoted: the outage is over"


def _claim_as_a_dead_worker(client: redis.Redis, scripts: Scripts, keys: Keyspace, p: int,
                            rid: str) -> None:
    """Claim the run with a short lease for a worker that never heartbeats: the lease
    expires on purpose, LEASE_MS later."""
    ks, args = tr.claim(keys, p, "default", "ghost-worker", 10, LEASE_MS)
    reply = tr.parse_claim(scripts.claim(keys=ks, args=args))
    assert rid in {c.run_id for c in reply.runs}, (rid, reply)


def _reaped(app: duetime.App, rid: str) -> bool:
    run = app.get_run(rid)
    return run.state != "running" and bool(run.attempts) and run.attempts[0].outcome == "unknown"


def test_a_dead_primary_holds_back_only_its_own_partitions(scluster: EmbeddedCluster, capsys):
    owners = _slot_owners(scluster)
    ns, victim_port = _namespace_on_one_node(owners)
    app = fo.app
    app.configure(redis_url=scluster.url, namespace=ns)
    keys = app.keys
    procs = Procs(scluster.url, ns)
    client = sync_client(scluster.url)
    scripts = Scripts(client)
    victim = next(n for n in scluster.nodes if n.port == victim_port)
    replica_port = _replicas_of(victim)[0]
    replica = redis.Redis(port=replica_port)
    try:
        by_port = _by_port(owners, keys)
        assert len(by_port) == 3, by_port
        names = {port: _schedule_in(keys, ps, f"tick{port}") for port, ps in by_port.items()}
        for name in names.values():
            app.schedule(name, duetime.Every(timedelta(seconds=1)), fo.work, catchup="all")
        # the dead shard's lease: claimed before the kill, recovered only after the promotion
        dead_p = by_port[victim_port][0]
        dead_rid = app.enqueue(fo.work, [0], key=_probe_in(keys, dead_p, "dead"))
        _claim_as_a_dead_worker(client, scripts, keys, dead_p, dead_rid)
        procs.duetime("scheduler", "--lead", "1s", "--reap-tick", "200ms")
        for name in names.values():
            wait_for(lambda name=name: app.get_schedule(name).materialized_count >= 2, 30,
                     what="every shard's schedule materialising")
        wait_for(lambda: _reaped(app, dead_rid), 30, what="the dead shard's first lease reaped")
        dead_rid = app.enqueue(fo.work, [0], key=_probe_in(keys, dead_p, "dead2"))
        _claim_as_a_dead_worker(client, scripts, keys, dead_p, dead_rid)

        replica.config_set("cluster-replica-no-failover", "yes")
        dead_last = _last_ms(app, names[victim_port])  # on the replica once it is in sync
        wait_for(lambda: _in_sync(victim), 30, interval=0.01, what="replica in sync")
        victim.kill()  # SIGKILL
        t_kill = time.monotonic()
        wait_for(lambda: _marked_failed(scluster, victim_port), 60, interval=0.05,
                 what="the cluster marking the dead primary failed")
        t_failed = time.monotonic()

        # the outage, as the cluster sees it: live shards must go on
        live = [port for port in by_port if port != victim_port]
        start = {port: _last_ms(app, names[port]) for port in live}
        probes: dict[str, int] = {}
        for port in live:
            for p in by_port[port][:2]:
                rid = app.enqueue(fo.work, [0], key=_probe_in(keys, p, f"live{port}"))
                _claim_as_a_dead_worker(client, scripts, keys, p, rid)
                probes[rid] = p
        wait_for(lambda: all(_reaped(app, rid) for rid in probes), 60, interval=0.05,
                 what="every expired lease on the live shards reaped during the outage")
        _still_down(victim, replica_port)
        t_reaped = time.monotonic()
        for port in live:
            wait_for(lambda port=port: _last_ms(app, names[port])
                     >= start[port] + MORE_OCCURRENCES * 1000, 60, interval=0.05,
                     what=f"the schedule of the shard at {port} materialising during the outage")
        _still_down(victim, replica_port)
        t_sched = time.monotonic()
        assert _marked_failed(scluster, victim_port)
        for port in live:  # every occurrence, none missed or skipped
            name, last = names[port], _last_ms(app, names[port])
            for ms in range(start[port] - 1000, last + 1, 1000):
                app.get_run(run_id_for(name, ms))  # RunNotFound if an occurrence is missing
            info = app.get_schedule(name)
            assert info.missed_count == 0 and info.skipped_count == 0, info

        # the replica takes over: the dead shard's schedule and lease recovery resume
        replica.config_set("cluster-replica-no-failover", "no")
        wait_for(lambda: _is_primary(replica_port), 60, interval=0.05, what="the promotion")
        t_promo = time.monotonic()
        wait_for(lambda: _reaped(app, dead_rid), 60, what="the dead shard's lease reaped")
        wait_for(lambda: _last_ms(app, names[victim_port]) > dead_last + 1000, 60,
                 what="the dead shard's schedule resuming")
        name = names[victim_port]
        for ms in range(dead_last, _last_ms(app, name) + 1, 1000):  # caught up, nothing lost
            app.get_run(run_id_for(name, ms))
        with capsys.disabled():
            print(f"\n[{victim.kind} shard outage] marked failed {t_failed - t_kill:.1f}s after "
                  f"the kill; live leases reaped {t_reaped - t_failed:.1f}s and {MORE_OCCURRENCES} more "
                  f"occurrences per live schedule {t_sched - t_failed:.1f}s after that, the dead "
                  f"node still down; dead shard resumed after the promotion at "
                  f"+{t_promo - t_kill:.1f}s")
    finally:
        procs.stop_all()
        replica.close()
        client.close()
        app.close()
