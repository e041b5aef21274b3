"""A Redis Cluster primary dies under load; its replica takes over; duetime carries on.

Three primaries with a replica each (node timeout 2 s). Workers and a scheduler run an
Every(1s) schedule and a steady enqueue load; the primary that owns the most partitions is
SIGKILLed. Afterwards: every acknowledged enqueue has a run that reached a final state, no run
ran twice except after a lease expiry, the schedule has every occurrence once. The test prints
how long the replica took to be promoted and how long after the promotion work on the dead
primary's partitions resumed (probe runs due during the outage)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from duetime.common.connection import sync_client
from redis.crc import key_slot

import duetime
from duetime.client.runs import keyed_run_id
from duetime.embedded import EmbeddedCluster, EmbeddedServer
from tests.apps import failover as fo
from tests.conftest import Procs, wait_for

PROBES_PER_PARTITION = 3
NODE_TIMEOUT_S = 2.0
SOAK = os.environ.get("DUETIME_SOAK") == "1"  # `make soak`: latency bounds asserted too
PROBE_DUE_S = (0.5, NODE_TIMEOUT_S + 0.5, NODE_TIMEOUT_S + 1.5)  # after the kill

pytestmark = [pytest.mark.scripts, pytest.mark.slow]


@pytest.fixture(scope="module", params=["redis", "valkey"])
def rcluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(request.param, n=3, replicas=1,
                         node_timeout_ms=int(NODE_TIMEOUT_S * 1000)) as c:
        yield c


def _slot_owners(cluster: EmbeddedCluster) -> list[tuple[int, int, int]]:
    for n in cluster.nodes:
        try:
            with redis.Redis(port=n.port, socket_timeout=1) as c:
                return [(lo, hi, int(primary[1]))
                        for lo, hi, primary, *_ in c.execute_command("CLUSTER SLOTS")]
        except redis.RedisError:
            continue
    raise RuntimeError("no cluster node answers")


def _partitions_by_port(cluster: EmbeddedCluster, keys) -> dict[int, list[int]]:
    owners = _slot_owners(cluster)
    out: dict[int, list[int]] = {}
    for p in range(keys.partitions):
        slot = key_slot(keys.run(p, "x").encode())
        port = next(port for lo, hi, port in owners if lo <= slot <= hi)
        out.setdefault(port, []).append(p)
    return out


def _replicas_of(node: EmbeddedServer) -> list[int]:
    info = redis.Redis(port=node.port).info("replication")
    return [int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]


def _in_sync(node: EmbeddedServer) -> bool:
    info = redis.Redis(port=node.port).info("replication")
    offsets = [int(v["offset"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return bool(offsets) and min(offsets) >= int(info["master_repl_offset"])


def _is_primary(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=0.5) as c:
            return c.execute_command("ROLE")[0] in (b"master", "master")
    except redis.RedisError:
        return False


def _sigkill(node: EmbeddedServer) -> None:
    proc = node.process
    assert proc is not None and proc.poll() is None
    node.kill()  # SIGKILL (Valkey's wrapper forgets the process, so it can start again)


def _schedule_name_in(keys, partitions: list[int]) -> str:
    for i in range(10_000):
        name = f"tick-{i}"
        if keys.partition_of_schedule(name) in partitions:
            return name
    raise AssertionError("no schedule name found for the partitions")


def _probe_keys(keys, partitions: list[int], prefix: str = "") -> list[str]:
    """Keys whose runs land PROBES_PER_PARTITION on each partition (the run id is made from
    the key as given to enqueue: `prefix` + the key)."""
    found: dict[int, list[str]] = {p: [] for p in partitions}
    i = 0
    while any(len(v) < PROBES_PER_PARTITION for v in found.values()):
        key = f"{prefix}probe-{i}"
        p = keys.partition_of_run(keyed_run_id(fo.work.spec.name, key))
        if p in found and len(found[p]) < PROBES_PER_PARTITION:
            found[p].append(key)
        i += 1
    return [k for v in found.values() for k in v]


class Load:
    """Enqueues one run every `pause_s` from a thread; remembers what was acknowledged."""

    def __init__(self, app: duetime.App, pause_s: float = 0.02) -> None:
        self.app, self.pause_s = app, pause_s
        self.acked: list[str] = []
        self.acked_at: dict[str, float] = {}
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            try:
                rid = self.app.enqueue(fo.work, [i])
                self.acked.append(rid)
                self.acked_at[rid] = time.time()
            except Exception as exc:  # noqa: BLE001 - counted, whatever it is
                self.errors.append(f"{type(exc).__name__}: {exc}")
            i += 1
            time.sleep(self.pause_s)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)


def _check_runs(app: duetime.App, ids: list[str], may_lose: set[str]) -> dict[str, int]:
    """Every run exists and succeeded; an attempt before the last ended only by a lease expiry.
    Without replicated durability a run acknowledged just before the kill (`may_lose`) may be
    gone: the primary acknowledged it before its replica had it."""
    lost, not_final, twice, reran_after_expiry = [], [], [], 0
    lost_in_window = 0
    for rid in ids:
        try:
            run = app.get_run(rid)
        except duetime.RunNotFound:
            if rid in may_lose:
                lost_in_window += 1
            else:
                lost.append(rid)
            continue
        if run.state != "succeeded":
            not_final.append((rid, run.state))
        earlier = [a.outcome for a in run.attempts[:-1]]
        if any(o != "unknown" for o in earlier):
            twice.append((rid, [a.outcome for a in run.attempts]))
        reran_after_expiry += len(earlier)
    assert not lost, f"{len(lost)} acknowledged runs lost: {lost[:5]}"
    assert not not_final, f"runs not succeeded: {not_final[:5]}"
    assert not twice, f"runs that ran twice without a lease expiry: {twice[:5]}"
    return {"runs": len(ids), "reran_after_lease_expiry": reran_after_expiry,
            "lost_acked_just_before_the_kill": lost_in_window}


def test_primary_failover_under_load(rcluster: EmbeddedCluster, capsys):
    app = fo.app
    app.configure(redis_url=rcluster.url, namespace=f"fo{uuid.uuid4().hex[:8]}")
    procs = Procs(rcluster.url, app.keys.namespace)
    try:
        by_port = _partitions_by_port(rcluster, app.keys)
        victim_port = max(by_port, key=lambda port: len(by_port[port]))
        victim = next(n for n in rcluster.nodes if n.port == victim_port)
        dead = by_port[victim_port]
        replicas = _replicas_of(victim)
        assert replicas, "the victim has no replica"

        name = _schedule_name_in(app.keys, dead)
        app.schedule(name, duetime.Every(timedelta(seconds=1)), fo.work, catchup="all")
        for _ in range(2):
            procs.worker("--concurrency", "16", "--lease", "3s", app="tests.apps.failover:app")
        procs.duetime("scheduler", "--lead", "1s", "--reap-tick", "200ms")
        wait_for(lambda: app.get_schedule(name).materialized_count >= 2, 20, what="schedule runs")

        with Load(app) as load:
            wait_for(lambda: len(load.acked) >= 50, 20, what="load")
            # probe runs on the dead primary's partitions, due at several points of the outage:
            # before the node is known dead, while the cluster is down, around the promotion.
            # They must be on its replica before the kill, so they are enqueued first; a plan
            # the machine overran (the replica acknowledges its offset once a second) is made
            # again with new probes, until one is met: the kill happens at the planned moment.
            probes: list[str] = []
            for attempt in range(5):
                t_plan = time.time() + 2.0 + attempt
                probes += [app.enqueue(fo.work, [0], key=k,
                                       at=duetime_at(t_plan + PROBE_DUE_S[i % len(PROBE_DUE_S)]))
                           for i, k in enumerate(_probe_keys(app.keys, dead, f"{attempt}-"))]
                wait_for(lambda: _in_sync(victim), 30, interval=0.01, what="replica in sync")
                if time.time() < t_plan:
                    break
            else:
                raise AssertionError("the replica never caught up within a plan")
            time.sleep(max(0.0, t_plan - time.time()))
            t_kill = time.time()
            _sigkill(victim)
            # probes on the other primaries' partitions, due from the kill on (planned from the
            # moment the kill happened, not the one it was meant for): the cluster has not
            # noticed the death yet, so they must not wait for the promotion
            healthy = [p for p in range(app.keys.partitions) if p not in dead]
            others = [app.enqueue(fo.work, [0], key=k, at=duetime_at(t_kill + 0.05 * (i % 5)))
                      for i, k in enumerate(_probe_keys(app.keys, healthy))]
            wait_for(lambda: any(_is_primary(p) for p in replicas), 20, interval=0.02,
                     what="replica promotion")
            t_promo = time.time()
            wait_for(lambda: all(app.get_run(p).state == "succeeded" for p in probes), 30,
                     interval=0.05, what="probe runs after the promotion")
            # per partition, its first start after the promotion: the last of them is when work
            # on every partition of the dead primary had resumed
            first: dict[int, float] = {}
            for rid in probes:
                if app.get_run(rid).due.timestamp() < t_kill:
                    continue  # due before the kill (the replica was slow to acknowledge)
                p = app.keys.partition_of_run(rid)
                started = app.get_run(rid).attempts[0].started.timestamp()
                first[p] = min(first.get(p, started), started)
            # runs on the live primaries due before the cluster noticed the death started on
            # time (from then until the promotion every node answers CLUSTERDOWN: Redis's
            # cluster-require-full-coverage, on by default)
            lateness: list[float] = []
            waited: list[bool] = []
            for rid in others:
                run = app.get_run(rid)
                # due at the instant asked for, to the microsecond (namespace format 4)
                assert duetime_at(t_kill) <= run.due < duetime_at(t_kill + NODE_TIMEOUT_S / 2), \
                    run.due
                wait_for(lambda rid=rid: app.get_run(rid).attempts, 30, what="a live probe")
                started = app.get_run(rid).attempts[0].started.timestamp()
                lateness.append(started - run.due.timestamp())
                waited.append(started >= t_promo)
            # A live primary's runs start before the promotion only if a worker claims them
            # within the node timeout: a bound on latency, which a loaded machine breaks. It is
            # asserted in `make soak` (DUETIME_SOAK=1), printed here.
            if SOAK:
                assert not any(waited), "a live primary's partition waited for the failover"
            # load goes on a while on the new topology
            after = len(load.acked)
            wait_for(lambda: len(load.acked) >= after + 100, 30, what="enqueues after the promotion")
        wait_for(lambda: all(app.get_run(i).state == "succeeded" for i in load.acked[-20:]), 30,
                 what="the last acknowledged runs")
        window = {i for i, t in load.acked_at.items() if t_kill - 1.0 <= t <= t_kill + 0.5}
        stats = _check_runs(app, load.acked + probes + others, window)
        # the schedule: every occurrence between its first and a second ago exists once, ran
        occurrences = _occurrences(app, name)
        resumed = (f"{min(first.values()) - t_promo:+.2f}..{max(first.values()) - t_promo:+.2f}s"
                   if first else "(no probe was due after the kill)")
        with capsys.disabled():
            print(f"\n[{rcluster.nodes[0].kind}] promotion {t_promo - t_kill:.2f}s after the kill; "
                  f"work on its {len(dead)} partitions resumed {resumed} "
                  f"after the promotion; the live primaries' runs due before the death was noticed "
                  f"started at most {max(lateness):.3f}s late ({sum(waited)} of {len(waited)} after the "
                  f"promotion); enqueued {len(load.acked)} acked, "
                  f"{len(load.errors)} refused; "
                  f"{stats}; schedule occurrences {occurrences}")
    finally:
        procs.stop_all()
        app.close()
        _revive(rcluster)


def duetime_at(epoch_s: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_s, UTC)


def _occurrences(app: duetime.App, name: str) -> int:
    """Every occurrence of the Every(1s) schedule, from its first to the last one due, exists
    once and succeeded (ids are `<name>@<ms>`: one run per occurrence by construction)."""
    client = sync_client(app.redis_url)
    p = app.keys.partition_of_schedule(name)
    pattern = app.keys.run(p, f"{name}@*")
    ids = sorted(int(k.decode().rsplit("@", 1)[1]) for k in
                 client.scan_iter(match=pattern, count=1000))
    client.close()
    assert ids, "no schedule runs"
    info = app.get_schedule(name)
    assert info.missed_count == 0 and info.skipped_count == 0, info
    gaps = [b - a for a, b in zip(ids, ids[1:], strict=False)]
    assert all(g == 1000 for g in gaps), f"occurrence gaps (ms): {gaps}"
    now_ms = time.time() * 1000
    for ms in ids:
        if ms < now_ms - 3000:
            run = app.get_run(f"{name}@{ms}")
            assert run.state == "succeeded", (ms, run.state)
            assert all(a.outcome == "unknown" for a in run.attempts[:-1]), run.attempts
    return len(ids)


def _revive(cluster: EmbeddedCluster) -> None:
    """Start every killed node again (it rejoins as a replica of the node promoted in its
    place) and wait until the cluster is whole and in sync, for the next test."""
    for node in cluster.nodes:
        proc = node.process
        if proc is None or proc.poll() is not None:
            node.start()
    cluster.wait_ok(60)


@pytest.mark.parametrize("wait_replicas", [1, 0])
def test_acknowledged_enqueues_survive_a_primary_kill(rcluster: EmbeddedCluster,
                                                      wait_replicas: int, capsys):
    """Producers enqueue as fast as they can; the primary owning the most partitions is
    SIGKILLed among them. With wait_replicas=1 every acknowledged run exists after the
    promotion (its replica had it before the acknowledgement). Without, the primary
    acknowledges before it replicates: the test reports how many acknowledged runs were lost
    (often 0 on loopback: the window is the replication lag)."""
    app = duetime.App(redis_url=rcluster.url, namespace=f"fd{uuid.uuid4().hex[:8]}",
                      enqueue_retry_s=0, wait_replicas=wait_replicas)
    app.registry.add(fo.work.spec)
    try:
        by_port = _partitions_by_port(rcluster, app.keys)
        victim_port = max(by_port, key=lambda port: len(by_port[port]))
        victim = next(n for n in rcluster.nodes if n.port == victim_port)
        replicas = _replicas_of(victim)
        acked: list[str] = []
        unreplicated, failed = [0], [0]
        stop = threading.Event()

        def produce() -> None:
            while not stop.is_set():
                try:
                    acked.append(app.enqueue(fo.work, [0]))
                except duetime.NotReplicated:
                    unreplicated[0] += 1
                except duetime.DuetimeError:
                    failed[0] += 1
                    time.sleep(0.01)

        threads = [threading.Thread(target=produce, daemon=True) for _ in range(6)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 500, 30, what="enqueues")
        _sigkill(victim)
        # producers go on until enqueues meet the dead primary (refused), then stop
        wait_for(lambda: failed[0] + unreplicated[0] >= 1, 30, interval=0.01,
                 what="an enqueue refused by the dead primary")
        stop.set()
        for t in threads:
            t.join(10)
        wait_for(lambda: any(_is_primary(p) for p in replicas), 20, interval=0.02,
                 what="replica promotion")
        app.close()
        lost = []
        for rid in acked:
            for _ in range(100):  # the cluster may still say CLUSTERDOWN for a moment
                try:
                    app.get_run(rid)
                    break
                except duetime.RunNotFound:
                    lost.append(rid)
                    break
                except (duetime.RedisUnavailable, duetime.RedisRefused):
                    time.sleep(0.1)
                    app.close()
            else:
                raise AssertionError("the cluster did not come back")
        with capsys.disabled():
            print(f"\n[{rcluster.nodes[0].kind} wait_replicas={wait_replicas}] "
                  f"{len(acked)} acknowledged, {len(lost)} lost after the promotion "
                  f"({unreplicated[0]} not confirmed by a replica, {failed[0]} refused)")
        if wait_replicas:
            assert not lost, f"{len(lost)} acknowledged enqueues lost: {lost[:5]}"
    finally:
        app.close()
        _revive(rcluster)


def test_an_enqueue_its_replica_did_not_confirm_says_so(rcluster: EmbeddedCluster):
    """WAIT goes to the node that ran the write: with one primary's replica stopped, an
    enqueue on that primary's partitions raises NotReplicated (the run exists), one on another
    primary's is acknowledged as usual."""
    import os
    import signal

    namespace = f"fw{uuid.uuid4().hex[:8]}"

    def make(wait_timeout_ms: int) -> duetime.App:
        made = duetime.App(redis_url=rcluster.url, namespace=namespace, enqueue_retry_s=0,
                           wait_replicas=1, wait_timeout_ms=wait_timeout_ms)
        made.registry.add(fo.work.spec)
        return made

    # The enqueues a running replica confirms get a minute: on a loaded machine a replica can
    # take longer than any short bound to acknowledge. The one whose replica is stopped cannot be
    # confirmed at all, so its 300 ms is how long it waits, not a claim about the replica.
    app, strict = make(60_000), make(300)
    by_port = _partitions_by_port(rcluster, app.keys)
    ports = sorted(by_port)
    stopped_primary, other = ports[0], ports[1]
    [replica_port] = _replicas_of(next(n for n in rcluster.nodes if n.port == stopped_primary))
    replica = next(n for n in rcluster.nodes if n.port == replica_port)
    pid = replica.process.pid

    def keys_on(port: int) -> list[str]:
        return [f"k{i}" for i in range(10_000) if app.keys.partition_of_run(
            keyed_run_id(fo.work.spec.name, f"k{i}")) in by_port[port]][:2]

    first = app.enqueue(fo.work, [0], key=keys_on(other)[0])
    assert strict.get_run(first) is not None  # both connected before the replica stops
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(duetime.NotReplicated, match="created on the primary.*not known to be "
                                                        "replicated") as exc:
            strict.enqueue(fo.work, [1], key=keys_on(stopped_primary)[0])
        fine = app.enqueue(fo.work, [2], key=keys_on(other)[1])
    finally:
        os.kill(pid, signal.SIGCONT)
    [rid] = exc.value.unreplicated
    assert app.get_run(rid).args == [1]  # it exists on the primary
    assert app.get_run(fine).args == [2]
    app.close()
    strict.close()


def _wait_calls(cluster: EmbeddedCluster) -> int:
    total = 0
    for n in cluster.primaries():
        stats = redis.Redis(port=n.port).info("commandstats")
        total += int(stats.get("cmdstat_wait", {}).get("calls", 0))
    return total


def test_replicated_workers_and_scheduler(rcluster: EmbeddedCluster):
    """`--durability replicated`: the worker's claims and reports and the scheduler's
    materializations are followed by WAIT on the primaries, and everything runs as usual."""
    app = fo.app
    app.configure(redis_url=rcluster.url, namespace=f"fr{uuid.uuid4().hex[:8]}")
    procs = Procs(rcluster.url, app.keys.namespace)
    try:
        app.schedule("tick", duetime.Every(timedelta(seconds=1)), fo.work)
        ids = app.enqueue_many([(fo.work, [i]) for i in range(200)])
        before = _wait_calls(rcluster)
        procs.duetime("--durability", "replicated", "worker", "--app", "tests.apps.failover:app")
        procs.duetime("--durability", "replicated", "scheduler", "--lead", "500ms")
        wait_for(lambda: all(app.get_run(i).state == "succeeded" for i in ids[::7]), 30,
                 what="runs to succeed")
        wait_for(lambda: app.get_schedule("tick").materialized_count >= 2, 15, what="schedule runs")
        assert _wait_calls(rcluster) > before
    finally:
        procs.stop_all()
        app.close()
