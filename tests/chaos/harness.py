"""One chaos run, end to end: a server with AOF, schedulers and workers behind proxy links, the
mixed load, a sequence of fault episodes, then quiescence and the invariant checker.

Shared by the bounded CI test (tests/chaos/test_chaos.py) and the long run (bench/chaos.py),
so there is one copy of the load, the faults and the checks.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from duetime.common.connection import sync_client
from duetime.common.keys import Keyspace

from duetime.embedded import EmbeddedServer
from duetime.ops.inspect import Inspector
from tests.apps import chaos as chaos_app
from tests.chaos import journal, netns, snapshot
from tests.chaos.checker import Checker, Report
from tests.chaos.faults import FaultLog, ServerControl
from tests.chaos.fleet import Fleet, Member
from tests.chaos.load import NOWHERE, LoadGenerator, register_schedules, schedules
from tests.chaos.proxy import ProxyHub

# every kind of fault episode; a run goes through all of them once (in a seeded order), then
# picks at random until its time is up
EPISODES = ("worker_kill", "worker_kill_backlog", "worker_stop", "worker_term", "scheduler_kill",
            "scheduler_stop", "link_cut", "link_stall", "link_slow", "server_sigkill_everysec",
            "server_sigkill_always", "server_shutdown", "oom")
# what a network does beyond that (bench/chaos.py --net): a peer that vanishes without a FIN
# or an RST, resets in the middle of a reply, and a partition by the kernel of a worker that
# runs in a network namespace (needs `ip netns`: root or CAP_NET_ADMIN)
NET_EPISODES = ("link_halfopen", "link_reset", "partition")


@dataclass
class ChaosConfig:
    kind: str = "redis"  # server: redis | valkey
    duration_s: float = 45.0  # of fault injection (at least one round of EPISODES)
    rate: float = 15.0  # ad-hoc runs per second
    workers: int = 3
    schedulers: int = 2
    lease_s: float = 2.0
    concurrency: int = 8
    grace_s: float = 1.0
    seed: int = 1
    episodes: tuple[str, ...] = EPISODES
    calm_s: tuple[float, float] = (0.5, 1.5)  # between episodes
    quiesce_s: float = 60.0  # at most, waiting for every run to settle after the load
    workdir: Path | None = None  # kept if given; a temporary one is removed when the run passes
    idle_cpu_s: float = 0.0  # > 0: measure idle workers' CPU while the server is down this long
    backlog: int = 1500  # runs enqueued at once just before the backlog episode's kill
    latency_ms: tuple[float, float] | None = None  # on every connection of every process
    netns_workers: int = 0  # workers in a network namespace each (the `partition` episode)


@dataclass
class Outcome:
    report: Report
    config: ChaosConfig
    workdir: Path
    submitted: int
    executions: int
    refusals: dict[str, int]
    idle_cpu: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    network: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        cfg = asdict(self.config)
        cfg["workdir"] = str(cfg["workdir"])
        return {"ok": self.report.ok, "violations": self.report.violations,
                "allowed": self.report.allowed, "counts": self.report.counts, "config": cfg,
                "submitted": self.submitted, "executions": self.executions,
                "refusals": self.refusals, "idle_cpu_percent": self.idle_cpu,
                "network": self.network,
                "elapsed_s": round(self.elapsed_s, 1), "workdir": str(self.workdir)}


class Chaos:
    """The episodes: each picks its victim with the run's seeded random generator."""

    def __init__(self, cfg: ChaosConfig, fleet: Fleet, control: ServerControl, load: LoadGenerator,
                 log: Callable[[str], None]) -> None:
        self.cfg, self.fleet, self.control, self.log = cfg, fleet, control, log
        self.load = load
        self.keys = load.app.keys
        self.client = sync_client(control.server.url, socket_timeout=5)
        self.rnd = random.Random(cfg.seed)

    def pick(self, role: str | None = None) -> Member:
        pool = [m for m in self.fleet.members if role is None or m.role == role]
        return self.rnd.choice(pool)

    def busy_worker(self) -> Member:
        """The worker holding the most leases right now (a fault on an idle one proves
        little); a random one when none holds any."""
        held: dict[int, int] = {}
        try:
            k = self.keys
            pipe = self.client.pipeline(transaction=False)
            for p in range(k.partitions):
                pipe.zrange(k.leases(p), 0, -1)
            ids = [(p, rid.decode()) for p, found in enumerate(pipe.execute()) for rid in found]
            pipe = self.client.pipeline(transaction=False)
            for p, rid in ids:
                pipe.hget(k.run(p, rid), "worker")
            for w in pipe.execute():
                pid = _pid(w.decode() if w else "")
                if pid is not None:
                    held[pid] = held.get(pid, 0) + 1
        except redis.RedisError:
            pass
        workers = self.fleet.of("worker")
        best = max(workers, key=lambda m: (held.get(m.pid or 0, 0), self.rnd.random()))
        return best if held.get(best.pid or 0) else self.rnd.choice(workers)

    def episode(self, kind: str) -> None:
        r, lease, f = self.rnd, self.cfg.lease_s, self.fleet
        self.log(f"episode {kind}")
        if kind == "worker_kill":
            m = self.busy_worker()
            f.kill(m)
            time.sleep(r.uniform(0.2, 1.0))
            f.start(m)
        elif kind == "worker_kill_backlog":  # its runs must restart ahead of a fresh backlog
            created = self.load.burst(self.cfg.backlog)
            time.sleep(0.3)
            m = self.busy_worker()
            f.kill(m, backlog=created)
            time.sleep(r.uniform(0.2, 1.0))
            f.start(m)
        elif kind == "worker_stop":  # frozen past its lease: its runs are reaped and rerun
            m = self.busy_worker()
            f.stop(m)
            time.sleep(lease * r.uniform(1.3, 2.0))
            f.cont(m)
        elif kind == "worker_term":  # graceful: in-flight runs get --grace, then are released
            m = self.busy_worker()
            f.terminate(m)
            f.start(m)
        elif kind == "scheduler_kill":
            m = self.pick("scheduler")
            f.kill(m)
            time.sleep(r.uniform(0.5, 2.0))
            f.start(m)
        elif kind == "scheduler_stop":
            m = self.pick("scheduler")
            f.stop(m)
            time.sleep(r.uniform(2.0, 4.0))
            f.cont(m)
        elif kind in ("link_cut", "link_stall", "link_slow"):
            m = self.busy_worker() if self.rnd.random() < 0.6 else self.pick()
            mode = kind.split("_")[1]
            secs = {"cut": r.uniform(0.5, 2.5), "stall": lease * r.uniform(0.5, 1.8),
                    "slow": r.uniform(2.0, 4.0)}[mode]
            f.faults.begin(mode, m.name)
            if mode == "slow":
                m.link.slow(r.uniform(0.02, 0.1))
            else:
                m.link.set("down" if mode == "cut" else "stall")
            time.sleep(secs)
            m.link.heal()
            f.faults.end(mode, m.name)
        elif kind == "link_halfopen":  # the peer vanishes, longer than a lease
            m = self.busy_worker() if self.rnd.random() < 0.7 else self.pick()
            f.faults.begin("halfopen", m.name)
            m.link.half_open()
            time.sleep(lease * r.uniform(1.3, 2.5))
            m.link.heal()
            f.faults.end("halfopen", m.name)
        elif kind == "link_reset":  # replies cut short by an RST
            m = self.busy_worker() if self.rnd.random() < 0.7 else self.pick()
            f.faults.begin("reset", m.name)
            m.link.reset_reply(cut_at=r.randint(1, 200))
            time.sleep(r.uniform(0.3, 1.5))
            m.link.heal()
            f.faults.end("reset", m.name)
        elif kind == "partition":  # the kernel drops a namespaced worker's packets
            members = [m for m in f.members if m.netns is not None]
            if not members:
                self.log("partition: no worker in a network namespace (netns_workers=0)")
                return
            m = self.rnd.choice(members)
            assert m.netns is not None
            f.faults.begin("partition", m.name)
            m.netns.partition()
            time.sleep(lease * r.uniform(2.0, 4.0))
            m.netns.heal()
            f.faults.end("partition", m.name)
        elif kind.startswith("server_sigkill_"):
            self.control.sigkill_restart(kind.rsplit("_", 1)[1], r.uniform(0.2, 1.5))
        elif kind == "server_shutdown":
            self.control.shutdown_restart(r.choice(["everysec", "always"]), r.uniform(0.2, 1.0))
        elif kind == "oom":
            self.control.oom(r.uniform(1.0, 3.0))
        else:
            raise ValueError(f"unknown episode {kind!r}")

    def run(self, seconds: float) -> list[str]:
        done: list[str] = []
        order = list(self.cfg.episodes)
        self.rnd.shuffle(order)
        end = time.monotonic() + seconds
        try:
            while order or time.monotonic() < end:
                kind = order.pop() if order else self.rnd.choice(self.cfg.episodes)
                self.episode(kind)
                done.append(kind)
                time.sleep(self.rnd.uniform(*self.cfg.calm_s))
        finally:
            self.client.close()
        return done


def _pid(worker_id: str) -> int | None:
    """Worker ids are `host:pid:random`."""
    try:
        return int(worker_id.split(":")[-2])
    except (IndexError, ValueError):
        return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(fleet: Fleet, control: ServerControl, seconds: float) -> dict[str, float]:
    """CPU % each (idle) worker uses while the server is down for `seconds`."""
    workers = [m for m in fleet.of("worker") if m.alive()]
    control.set_fsync("always")  # nothing acknowledged is lost to this kill: it is no fault
    control.server.kill()
    fleet.faults.begin("server_down_idle", "server")
    time.sleep(1.0)  # the first reconnect attempts are not the steady state
    before = {m.name: cpu_seconds(m.pid) for m in workers if m.pid}
    time.sleep(seconds)
    after = {m.name: cpu_seconds(m.pid) for m in workers if m.pid}
    control.server.start(timeout=60)
    fleet.faults.end("server_down_idle", "server")
    return {n: round(100 * (after[n] - before[n]) / seconds, 2) for n in before}


def settled(client: redis.Redis, keys: Keyspace) -> bool:
    """No run waits in a due or retry set (now or soon) and none holds a lease."""
    pipe = client.pipeline(transaction=False)
    for p in range(keys.partitions):
        pipe.zcard(keys.leases(p))
        pipe.zcard(keys.retry(p, "default"))
        pipe.zcard(keys.due(p, "default"))
        pipe.zcard(keys.due(p, NOWHERE))
    return not any(pipe.execute())


def ready(client: redis.Redis, keys: Keyspace, cfg: ChaosConfig, timeout: float = 60.0) -> None:
    """Every worker and scheduler has announced itself: faults start on a running fleet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        schedulers = Inspector(client, keys, "").schedulers()
        if client.zcard(keys.workers) >= cfg.workers and len(schedulers) >= cfg.schedulers:
            return
        time.sleep(0.2)
    raise RuntimeError("the chaos fleet did not come up; see the logs in the work directory")


def caught_up(app: Any, timeout: float) -> bool:
    """Every interval schedule has a run for its occurrence of a second ago: the evaluators
    caught up after the last fault (one may have been backing off)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.time()
        if all(info.last_occurrence and info.last_occurrence.timestamp() >= now - 1.5
               for info in (app.get_schedule(s.name) for s in schedules()) if info.name != "chaos-cron"):
            return True
        time.sleep(0.2)
    return False


def judge_exits(report: Report, fleet: Fleet) -> None:
    """A process may exit at start-up when the server cannot be reached (one error line, by
    design: its supervisor restarts it); a running process must never exit by itself."""
    refused = 0
    for e in fleet.exits:
        if e.lived_s < 15 and e.last_line.startswith("error:") and "Redis" in e.last_line:
            refused += 1
        else:
            report.violations.append(f"{e.name} (pid {e.pid}) exited by itself (code {e.code}) "
                                     f"after {e.lived_s:.1f}s: {e.last_line}")
    report.counts["process exits at start-up, server unreachable (restarted)"] = refused


def network_stats(cfg: ChaosConfig, faults: FaultLog, fleet: Fleet,
                  executions: list[journal.Execution], detections: list[float],
                  resets: int) -> dict[str, Any]:
    """What the network faults did: how soon a client gave a half-open connection up (from
    the first bytes it sent into the silence), how many replies were reset, and, per
    partition, how soon after the heal its worker started a run again."""
    names = fleet.pid_names()
    recoveries = []
    for f in faults.of("partition"):
        if f.end is None:
            continue
        after = [x.start for x in executions if names.get(x.pid) == f.target and x.start >= f.end]
        recoveries.append(round(min(after) - f.end, 3) if after else None)
    det = sorted(detections)
    return {
        "latency_ms": cfg.latency_ms,
        "half_open_given_up": len(det),
        "half_open_detection_s": None if not det else {
            "median": round(det[len(det) // 2], 3), "max": round(det[-1], 3)},
        "replies_reset": resets,
        "partitions": len(faults.of("partition")),
        "partition_recovery_s": recoveries,
    }


def run_chaos(cfg: ChaosConfig, log: Callable[[str], None] = lambda s: None) -> Outcome:
    t_start = time.monotonic()
    workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="duetime-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    namespace = f"chaos{uuid.uuid4().hex[:8]}"
    faults = FaultLog()
    server = EmbeddedServer(cfg.kind, extra=["--appendonly", "yes", "--appendfsync", "everysec"])
    server.start()
    control = ServerControl(server, faults)
    hub = ProxyHub()
    lat = None if cfg.latency_ms is None else (cfg.latency_ms[0] / 1000, cfg.latency_ms[1] / 1000)
    fleet = Fleet(server.port, namespace, workdir, faults, hub, latency=lat)
    spaces: list[netns.Netns] = []
    app = chaos_app.app
    app.configure(redis_url=server.url, namespace=namespace)
    keys = app.keys
    load = LoadGenerator(app, cfg.rate, cfg.seed)
    idle: dict[str, float] = {}
    try:
        register_schedules(app)
        for _ in range(cfg.schedulers):
            fleet.add("scheduler", "--retention", "1h", "--reap-tick", "200ms")
        lease = f"{int(cfg.lease_s * 1000)}ms"
        if cfg.netns_workers:
            why = netns.available()
            if why is not None:
                raise RuntimeError(f"netns_workers needs network namespaces: {why}")
        for i in range(cfg.workers):
            ns = None
            if i < cfg.netns_workers:
                ns = netns.Netns().__enter__()
                spaces.append(ns)
            fleet.add("worker", "--lease", lease, "--concurrency", str(cfg.concurrency),
                      "--grace", f"{int(cfg.grace_s * 1000)}ms", netns=ns)
        fleet.supervise()
        ready(client := sync_client(server.url), keys, cfg)
        client.close()
        load.start()
        episodes = Chaos(cfg, fleet, control, load, log).run(cfg.duration_s)
        log(f"episodes done: {len(episodes)}")
        # heal: every process up and running, every link clear, memory unlimited
        for ns in spaces:
            ns.heal()
        for m in fleet.members:
            fleet.cont(m)
            m.link.heal()
            if not m.alive():
                fleet.start(m)
        load.stop()
        load.join(120)
        caught_up(app, 30.0)  # the evaluators made up for the outages before the pause
        paused_at = time.time()
        for s in schedules():
            app.pause(s.name, note="chaos run over")
        client = sync_client(server.url)
        deadline = time.monotonic() + cfg.quiesce_s
        time.sleep(3.0)  # runs materialized ahead of the pause (--lead 2s) become due
        while time.monotonic() < deadline and not settled(client, keys):
            time.sleep(0.5)
        time.sleep(0.5)
        if cfg.idle_cpu_s > 0:
            idle = idle_cpu(fleet, control, cfg.idle_cpu_s)
            deadline = time.monotonic() + cfg.quiesce_s
            time.sleep(1.0)
            while time.monotonic() < deadline and not settled(client, keys):
                time.sleep(0.5)
        snap = snapshot.take(client, keys, ["default", NOWHERE])
        client.close()
        for m in fleet.members:  # graceful stops, so nothing is left running
            fleet.terminate(m, timeout=15)
    finally:
        load.stop()
        fleet.close()
        detections = [d for link in hub.links for d in link.detections]
        resets = sum(link.resets for link in hub.links)
        hub.close()
        for ns in spaces:
            ns.remove()
        app.close()
        server.stop()
    executions = journal.read(fleet.journal)
    network = network_stats(cfg, faults, fleet, executions, detections, resets)
    report = Checker(snap, executions, faults, load.submitted, schedules(), cfg.lease_s,
                     fleet.pid_names(), paused_at).run()
    judge_exits(report, fleet)
    out = Outcome(report, cfg, workdir, len(load.submitted), len(executions), load.refusals,
                  idle, time.monotonic() - t_start, network)
    (workdir / "report.json").write_text(json.dumps(out.to_json(), indent=2, default=str))
    (workdir / "faults.json").write_text(json.dumps(
        [asdict(f) for f in faults.faults], indent=1, default=str))
    if report.ok and cfg.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(server.dir, ignore_errors=True)
    return out
