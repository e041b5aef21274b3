"""Resharding under load: a busy partition's slot moves to another primary while workers claim
and report, a scheduler fires an Every(1s) schedule and a producer enqueues.

The slot is moved the way an operator's tooling does it (CLUSTER SETSLOT IMPORTING/MIGRATING,
MIGRATE in small batches, SETSLOT NODE on every node), so for a while some of the partition's
keys are on one node and some on the other: the window in which a script that found its
declared keys could meet a moved (or not yet created) key halfway through and stop after some of
its writes. Afterwards: every acknowledged enqueue ended, no run was executed twice without a
lease expiry, runs that held their leases across the move succeeded at their first attempt,
the schedule has every occurrence once, and the processes that started before the move are the
ones that finished the work (they followed MOVED/ASK, nobody restarted them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.connection import sync_client
from duetime.common.errors import DuetimeError, EnqueueIncomplete, RedisRefused
from duetime.common.models import Run, to_ms
from duetime.common.scripts import Scripts, sha
from redis.crc import key_slot

import duetime
from duetime.client.runs import keyed_run_id
from duetime.embedded import EmbeddedCluster, EmbeddedServer, valkey_available
from tests.apps import basic
from tests.conftest import ROOT, configured, wait_for

KINDS = ["redis"] + (["valkey"] if valkey_available() else [])
MIGRATE_BATCH = 10  # keys per MIGRATE, as `redis-cli --cluster reshard` pipelines them
RUN_S = 0.05  # each run sleeps this long, so runs of the moving partition are in flight
LONG_S = 6.0  # a few runs last longer than the move: heartbeats meet it

pytestmark = [pytest.mark.scripts, pytest.mark.slow]


@pytest.fixture(scope="module", params=KINDS)
def cluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(request.param) as c:
        yield c


@pytest.fixture
def capp(cluster: EmbeddedCluster):
    with configured(basic.app, cluster.url, "rs") as a:
        yield a


class FileProcs:
    """Worker and scheduler processes whose logs go to files (a pipe nobody reads would fill
    and stall a process that logs the refusals of a migration)."""

    def __init__(self, url: str, namespace: str, logs: Path) -> None:
        self.url, self.namespace, self.logs = url, namespace, logs
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"{args[0]}-{len(self.procs)}.log"
        env = {**os.environ, "DUETIME_REDIS_URL": self.url, "DUETIME_NAMESPACE": self.namespace,
               "PYTHONPATH": str(ROOT)}
        with open(log, "wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", *args],
                                 env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append((p, log))
        return p

    def stop_all(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def text(self) -> str:
        return "".join(log.read_text(errors="replace") for _, log in self.procs)


@pytest.fixture
def fprocs(cluster: EmbeddedCluster, capp, tmp_path: Path) -> Iterator[FileProcs]:
    ps = FileProcs(cluster.url, capp.keys.namespace, tmp_path)
    yield ps
    ps.stop_all()


def node_id(node: EmbeddedServer) -> str:
    with redis.Redis(port=node.port) as c:
        return c.execute_command("CLUSTER MYID").decode()


def move_slot(cluster: EmbeddedCluster, slot: int, src: EmbeddedServer, dst: EmbeddedServer,
              pause_s: float = 0.2) -> int:
    """Move `slot` from src to dst in batches of MIGRATE_BATCH keys, pausing between batches
    (the partly moved state lasts a while, as with big slots); returns the keys moved."""
    sid, did = node_id(src), node_id(dst)
    s, d = redis.Redis(port=src.port), redis.Redis(port=dst.port)
    d.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", sid)
    s.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", did)
    moved = 0
    while keys := s.execute_command("CLUSTER GETKEYSINSLOT", slot, MIGRATE_BATCH):
        s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
        moved += len(keys)
        time.sleep(pause_s)
    s.close()
    d.close()
    finish_move(cluster, slot, src, dst)
    return moved


def finish_move(cluster: EmbeddedCluster, slot: int, src: EmbeddedServer,
                dst: EmbeddedServer) -> None:
    """SETSLOT NODE: the new owner first, then the old one (from then on it answers MOVED),
    then the others."""
    did = node_id(dst)
    for node in [dst, src, *[n for n in cluster.primaries() if n.port not in (src.port, dst.port)]]:
        with redis.Redis(port=node.port) as c:
            c.execute_command("CLUSTER SETSLOT", slot, "NODE", did)


class Producer(threading.Thread):
    """Enqueues batches at a steady pace; a batch Redis did not take is sent again with the
    same idempotency keys (what an application does), so `acked` holds exactly the runs whose
    enqueue returned."""

    def __init__(self, app: duetime.App, batch: int = 10, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.app, self.batch, self.every_s = app, batch, every_s
        self.acked: list[str] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            items = [{"task": basic.aslow, "args": [RUN_S], "key": f"load-{n + i}"}
                     for i in range(self.batch)]
            n += self.batch
            while not self.stop.is_set():
                try:
                    self.acked += self.app.enqueue_many(items)
                    break
                except DuetimeError:
                    self.failures += 1
                    time.sleep(0.05)
            time.sleep(self.every_s)


def executions(capp) -> dict[str, int]:
    """run id -> how often the task body ran (counted by the task itself, outside duetime)."""
    return {k.decode(): int(v) for k, v in basic.r().hgetall(basic.count_key()).items()}


def occurrences(k, p: int, node: EmbeddedServer, name: str = "tick") -> list[int]:
    """The occurrences (ms) a schedule has runs for, from its partition's node."""
    with redis.Redis(port=node.port) as c:
        return sorted(int(key.rsplit(b"@", 1)[1]) for key in c.keys(k.run(p, f"{name}@*")))


def final_states(capp, ids: list[str]) -> dict[str, tuple[str, list[str]]]:
    """run id -> (state, attempt outcomes), read in one pipeline (the history as readers see
    it: the attempt that succeeded is inline in the run hash, docs/keys.md)."""
    k = capp.keys
    pipe = basic.r().pipeline(transaction=False)
    for run_id in ids:
        p = k.partition_of_run(run_id)
        pipe.hgetall(k.run(p, run_id))
        pipe.lrange(k.attempts(p, run_id), 0, -1)
    res = pipe.execute()
    runs = [Run.decode(run_id, res[2 * i], res[2 * i + 1]) for i, run_id in enumerate(ids)]
    return {r.id: (r.state, [a.outcome for a in r.attempts]) for r in runs}


def attempts(capp, run_id: str) -> list[dict]:
    run = capp.get_run(run_id)
    return [{"start": to_ms(a.started) if a.started else None,
             "end": to_ms(a.ended) if a.ended else None, "outcome": a.outcome,
             "worker": a.worker, "fence": a.fence} for a in run.attempts]


def wait_succeeded(capp, ids: list[str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = {i: v for i, v in final_states(capp, ids).items() if v[0] != "succeeded"}
        if not left:
            return
        if time.monotonic() > deadline:
            sample = {i: (v, capp.get_run(i).reason) for i, v in list(left.items())[:5]}
            raise AssertionError(f"{len(left)} of {what} did not succeed: {sample}")
        time.sleep(0.1)


def check_runs(capp, ids: list[str], counts: dict[str, int]) -> None:
    """Each run ended, succeeded, and ran as often as its attempts say: more than once only
    after a lease expiry (an `unknown` attempt)."""
    for run_id, (state, outcomes) in final_states(capp, ids).items():
        assert state == "succeeded", (run_id, state, outcomes)
        ran = counts.get(run_id, 0)
        assert ran >= 1, (run_id, outcomes)
        assert ran == 1 or "unknown" in outcomes, (run_id, ran, outcomes)
        assert ran <= len([o for o in outcomes if o != "released"]), (run_id, ran, outcomes)


def test_moving_a_busy_partition_under_load(cluster, capp, fprocs):
    k = capp.keys
    # every occurrence matters (catchup="all"): the seconds the partition is paused by the
    # move make late runs, never a run standing for several (the default, "latest")
    capp.schedule("tick", duetime.Every(timedelta(seconds=1)), basic.noop, catchup="all")
    p = k.partition_of_schedule("tick")  # the schedule's partition: runs, schedule and all
    # and one in a partition that stays put, with the default catch-up: the same scheduler
    # evaluates both, and the move must not hold this one back
    tock = next(n for n in (f"tock-{i}" for i in range(100)) if k.partition_of_schedule(n) != p)
    capp.schedule(tock, duetime.Every(timedelta(seconds=1)), basic.noop)
    slot = key_slot(k.prefix(p).encode())
    assert key_slot(basic.count_key().encode()) != slot, "the test's own counter must stay put"
    src = cluster.primary_of(k.prefix(p))
    dst = next(n for n in cluster.primaries() if n.port != src.port)

    workers = [fprocs.start("worker", "--app", "tests.apps.basic:app", "--concurrency", "16")
               for _ in range(2)]
    scheduler = fprocs.start("scheduler", "--lead", "300ms")
    producer = Producer(capp)
    producer.start()
    try:
        moving(cluster, capp, fprocs, workers, scheduler, producer, p, slot, src, dst, tock)
    finally:
        producer.stop.set()
        producer.join(10)


def moving(cluster, capp, fprocs, workers, scheduler, producer, p, slot, src, dst, tock) -> None:
    """The body of the test above, run while the producer enqueues."""
    k = capp.keys
    # busy: runs of the partition are due, running and finished when the move starts
    with redis.Redis(port=src.port) as s:
        wait_for(lambda: s.execute_command("CLUSTER COUNTKEYSINSLOT", slot) >= 150, 30,
                 what="the partition to fill")
    wait_for(lambda: capp.get_schedule("tick").materialized_count >= 3, 15, what="the schedule")
    # and runs that hold their leases across the whole move (their heartbeats are refused
    # meanwhile): each must run once and succeed
    keys = [key for key in (f"long-{i}" for i in range(1000))
            if k.partition_of_run(keyed_run_id("aslow", key)) == p][:3]
    long_ids = capp.enqueue_many([{"task": basic.aslow, "args": [LONG_S], "key": key}
                                  for key in keys])
    wait_for(lambda: all(i in executions(capp) for i in long_ids), 15, what="the long runs")
    before = {w.pid for w in workers} | {scheduler.pid}

    t0 = time.time() * 1000
    moved = move_slot(cluster, slot, src, dst)
    t1 = time.time() * 1000
    assert moved >= 150
    assert cluster.primary_of(k.prefix(p)).port == dst.port
    # more load, and ticks from the new owner, after the move
    wait_for(lambda: max(occurrences(k, p, dst)) > t1 + 1500, 20, what="ticks after the move")
    producer.stop.set()
    producer.join(10)
    capp.close()  # the test's own client: route afresh

    ids = producer.acked
    assert len(ids) == len(set(ids)) and len(ids) > 300
    ids += long_ids
    wait_succeeded(capp, ids, 30, "the acknowledged runs")
    for i in long_ids:  # the attempt that ran across the move is the one that succeeded
        [a] = attempts(capp, i)
        assert a["start"] < t0 and a["end"] > t1 and a["outcome"] == "succeeded", (a, t0, t1)
    moved_ids = [i for i in ids if k.partition_of_run(i) == p]
    assert moved_ids, "no run of the load lived in the moved partition"

    # the schedule: every occurrence from the first to the last once, none missed or doubled
    info = capp.get_schedule("tick")
    assert info.missed_count == 0 and info.skipped_count == 0
    occ = occurrences(k, p, dst)
    ticks = [f"tick@{o}" for o in occ]
    assert len(set(occ)) == len(occ) and occ[0] < t0 - 1000 and occ[-1] > t1 + 1000, (occ, t0, t1)
    assert all(b - a == 1000 for a, b in zip(occ, occ[1:], strict=False)), occ
    wait_succeeded(capp, ticks, 10, "the ticks")
    q = k.partition_of_schedule(tock)
    tocks = occurrences(k, q, cluster.primary_of(k.prefix(q)), tock)
    assert tocks[0] < t0 - 1000 and tocks[-1] > t1 + 1000, (tocks, t0, t1)
    assert all(b - a == 1000 for a, b in zip(tocks, tocks[1:], strict=False)), tocks
    assert capp.get_schedule(tock).skipped_count == 0

    counts = executions(capp)
    check_runs(capp, ids + ticks, counts)
    # the runs were executed by the processes started before the move, none restarted
    assert all(proc.poll() is None for proc in [*workers, scheduler]), fprocs.text()[-3000:]
    assert {w.pid for w in workers} | {scheduler.pid} == before
    holders = {a["worker"] for run_id in moved_ids + ticks for a in attempts(capp, run_id)}
    assert len(holders) == len(workers), holders  # no worker process was replaced meanwhile
    logs = fprocs.text()
    assert "Traceback" not in logs and "claim failed" not in logs, logs[-3000:]


def migrate(src: EmbeddedServer, dst: EmbeddedServer, keys: list[str]) -> None:
    with redis.Redis(port=src.port) as s:
        s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)


def asking(client: redis.Redis, *command: object) -> object:
    """One command on the node importing a slot, as a client that followed an ASK sends it."""
    conn = client.connection_pool.get_connection()
    try:
        conn.send_command("ASKING")
        assert conn.read_response() in ("OK", b"OK")
        conn.send_command(*command)
        return conn.read_response()
    finally:
        client.connection_pool.release(conn)


def test_no_script_runs_on_a_partly_moved_partition(cluster, capp):
    """The two halves of a slot in the middle of a move: on the node giving it away, a script
    whose declared keys are all there but whose run record has gone; on the node taking it,
    under ASKING, one whose declared keys have come but whose run record has not. Either
    would act on a partial view (write halfway, or dead-letter a run whose record it cannot
    see and so block the record's own MIGRATE). Both are refused with TRYAGAIN before any
    write; once the move ends the runs are claimed as usual."""
    k = capp.keys
    by_p: dict[int, list[str]] = {}
    while not any(len(v) >= 2 for v in by_p.values()):
        run_id = capp.enqueue(basic.noop)
        by_p.setdefault(k.partition_of_run(run_id), []).append(run_id)
    p, (first, second) = next((p, v[:2]) for p, v in by_p.items() if len(v) >= 2)
    keys, args = tr.claim(k, p, "default", "w-test", 10, 10_000)
    far = 9_999_999_999_999
    src = cluster.primary_of(k.prefix(p))
    dst = next(n for n in cluster.primaries() if n.port != src.port)
    s = sync_client(f"redis://127.0.0.1:{src.port}/0")
    for key in keys:  # a busy partition: every set the claim declares exists
        if key == k.events(p):
            s.xadd(key, {"run": "-", "event": "test", "detail": ""})
        elif key in (k.limits(p), k.paused(p)):  # the hashes among them
            s.hset(key, "placeholder", "0")
        elif key == k.holds(p):  # a hold of no scope any run has, in force throughout
            s.hset(key, "task:placeholder", far)
        elif key != k.due(p, "default"):
            s.zadd(key, {"placeholder": far})
    slot = key_slot(k.prefix(p).encode())
    with redis.Redis(port=dst.port) as d:
        d.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", node_id(src))
    s.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", node_id(dst))

    # the giving node: declared keys here, the first run's record already moved
    migrate(src, dst, [k.run(p, first)])
    with pytest.raises(redis.exceptions.TryAgainError):
        Scripts(s).claim(keys=keys, args=args)
    assert s.zscore(k.due(p, "default"), first) is not None

    # the taking node: declared keys moved, the second run's record not yet
    rest = s.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    migrate(src, dst, [x for x in rest if x != k.run(p, second)])
    d = sync_client(f"redis://127.0.0.1:{dst.port}/0")
    with pytest.raises(redis.exceptions.TryAgainError):
        asking(d, "EVALSHA", sha("claim"), len(keys), *keys, *args)
    assert asking(d, "EXISTS", k.run(p, second)) == 0  # no record made up there
    assert asking(d, "ZSCORE", k.due(p, "default"), second) is not None

    migrate(src, dst, [k.run(p, second)])  # the record's own move is not blocked
    finish_move(cluster, slot, src, dst)
    capp.close()
    claimed = tr.parse_claim(Scripts(sync_client(capp.redis_url)).claim(keys=keys, args=args))
    assert {c.run_id for c in claimed.runs} >= {first, second}
    assert capp.get_run(first).state == capp.get_run(second).state == "running"


def test_an_enqueue_into_a_moving_partition_is_a_clear_refusal_and_safe_to_repeat(cluster, capp):
    """While a slot moves, the client's own retries of TRYAGAIN run out (redis-py then raises a
    bare 'TTL exhausted.'): the application gets RedisRefused with code TRYAGAIN and advice,
    or EnqueueIncomplete saying which runs were not created; the same keys later create each
    run once."""
    k = capp.keys
    first = capp.enqueue(basic.noop, key="first")
    p = k.partition_of_run(first)
    keys = [f"k{i}" for i in range(200)]
    slot = key_slot(k.prefix(p).encode())
    src = cluster.primary_of(k.prefix(p))
    dst = next(n for n in cluster.primaries() if n.port != src.port)
    with redis.Redis(port=dst.port) as d:
        d.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", node_id(src))
    with redis.Redis(port=src.port) as s:
        s.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", node_id(dst))

    with pytest.raises(RedisRefused) as one:
        for key in keys:  # the first key whose run lives in the moving partition
            capp.enqueue(basic.noop, key=key)
    assert one.value.code == "TRYAGAIN" and "resharding" in str(one.value)
    with pytest.raises(EnqueueIncomplete) as many:
        capp.enqueue_many([{"task": basic.noop, "key": key} for key in keys])
    assert many.value.not_created and "resharding" in str(many.value)

    with redis.Redis(port=src.port) as s:
        while batch := s.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
            migrate(src, dst, batch)
    finish_move(cluster, slot, src, dst)
    ids = capp.enqueue_many([{"task": basic.noop, "key": key} for key in keys])
    assert len(set(ids)) == len(keys)
    assert sum(capp.get_run(i).state == "scheduled" for i in ids) == len(keys)
    assert capp.enqueue(basic.noop, key="first") == first


def test_a_stuck_move_holds_back_only_its_own_partitions_schedules(cluster, capp, fprocs):
    """A move left half done (an operator's reshard interrupted) keeps refusing its partition's
    scripts. The scheduler that evaluates that partition and others goes on with the others,
    every occurrence on time, and picks the stuck one up once the slot is settled."""
    k = capp.keys
    capp.schedule("stuck", duetime.Every(timedelta(seconds=1)), basic.noop)
    p = k.partition_of_schedule("stuck")
    other = next(n for n in (f"free-{i}" for i in range(100)) if k.partition_of_schedule(n) != p)
    capp.schedule(other, duetime.Every(timedelta(seconds=1)), basic.noop)
    q = k.partition_of_schedule(other)
    fprocs.start("scheduler", "--lead", "300ms")
    wait_for(lambda: capp.get_schedule(other).materialized_count >= 2, 15, what="the schedules")
    slot = key_slot(k.prefix(p).encode())
    src = cluster.primary_of(k.prefix(p))
    dst = next(n for n in cluster.primaries() if n.port != src.port)
    with redis.Redis(port=dst.port) as d:
        d.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", node_id(src))
    with redis.Redis(port=src.port) as s:
        s.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", node_id(dst))
    t0 = time.time() * 1000
    # six occurrences of the other schedule are materialized meanwhile (about 6 s: the
    # scheduler's back-off on the refusals grows to seconds), however long a loaded machine takes
    fired = capp.get_schedule(other).materialized_count
    wait_for(lambda: capp.get_schedule(other).materialized_count >= fired + 6, 60,
             what="the other partition's schedule to fire six times")
    t1 = time.time() * 1000
    stuck_before = capp.get_schedule("stuck").materialized_count
    for node in (src, dst):  # the operator settles the slot where it was
        with redis.Redis(port=node.port) as c:
            c.execute_command("CLUSTER SETSLOT", slot, "STABLE")
    wait_for(lambda: capp.get_schedule("stuck").materialized_count > stuck_before, 15,
             what="the stuck partition's schedule to fire again")
    occ = [o for o in occurrences(k, q, cluster.primary_of(k.prefix(q)), other) if t0 <= o <= t1]
    assert len(occ) >= 4 and all(b - a == 1000 for a, b in zip(occ, occ[1:], strict=False)), occ
    assert capp.get_schedule(other).skipped_count == 0
    assert "Traceback" not in fprocs.text()
