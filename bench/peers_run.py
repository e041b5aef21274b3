"""Peer benchmark: duetime and its Python peers through the same workloads, on the
same machine, against a fresh loopback redis-server per run; writes the raw results and their
report to bench/out/peers-<time>.{json,md} (`--results` names the report elsewhere). It never
writes bench/RESULTS.md by default: that file keeps every earlier measurement too, and the
figures of a run are copied into a section of it by hand, with what they mean.

    .venv/bin/python -m bench.peers_run --workloads W1,W2,W3,W4 --systems all --repeat 3

Each system's adapter (bench/peers/<system>.py) runs in that system's own virtualenv
(bench/.venvs/<peer>/, created here from PyPI pins; duetime: this .venv). Jobs count themselves
on a separate counter server (db 1), so losses and duplicates show whatever a system believes,
and the counting never shows in the measured server's INFO commandstats / cpu.
Every wait is bounded; every process started here is SIGKILLed (whole tree) before returning.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import peer_venvs
from bench.peers import common
from bench.stats import percentile
from duetime.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
PROBE = 10**9  # the job number of readiness probes, left out of every count
LIVE: set[Runner] = set()  # runners with processes, all killed on exit (signals included)


@dataclass(frozen=True)
class System:
    name: str          # as reported
    module: str        # bench.peers.<module>, and the venv
    variant: str = ""
    workloads: tuple[str, ...] = ("W1", "W2", "W3", "W4")
    note: str = ""
    in_all: bool = True  # part of `--systems all`


SYSTEMS = [
    System("duetime", "duetime", workloads=("W1", "W2", "W3", "W4", "W5")),
    System("rq", "rq", note="forking Worker (the default)"),
    System("rq-simple", "rq", "simple", ("W1", "W4"), "SimpleWorker, no fork per job"),
    System("arq", "arq"),
    System("celery", "celery", note="prefork pool, 2 children (the default: one per core)"),
    System("celery-threads", "celery", "threads", ("W1", "W4"), "8 threads", in_all=False),
    System("celery-solo", "celery", "solo", ("W1", "W4"), "solo pool", in_all=False),
    System("dramatiq", "dramatiq"),
    System("huey", "huey"),
    System("saq", "saq"),
    System("taskiq", "taskiq", workloads=("W1", "W2", "W3", "W4", "W5")),
    # W5 needs schedules kept in Redis: these peers' add-ons do that (arq, SAQ, huey and plain
    # Celery beat keep schedules in a process's code; dramatiq has no scheduler)
    System("celery-redbeat", "redbeat", workloads=("W5",), note="Celery beat + RedBeat"),
    System("rq-scheduler", "rqscheduler", workloads=("W5",), note="RQ + rq-scheduler"),
]
BY_NAME = {s.name: s for s in SYSTEMS}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- processes ----------------------------------------------------------------------------
def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def process_tree(pid: int) -> list[int]:
    kids, out, todo = _children_map(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGSTOP the whole tree (no more forks), then SIGKILL every member and the group."""
    if proc.poll() is None:
        seen: set[int] = set()
        for _ in range(3):
            tree = [p for p in process_tree(proc.pid) if p not in seen]
            if not tree:
                break
            for p in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGSTOP)
            seen.update(tree)
        for p in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


class Runner:
    """Runs one system's adapter commands and worker processes against one server."""

    def __init__(self, system: System, server_url: str, count_url: str, tag: str, mode: str,
                 pydir: str, logdir: Path) -> None:
        self.system, self.tag, self.logdir = system, tag, logdir
        self.python = peer_venvs.python_of(system.module)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH",
                                                                 "PYTHONHOME")}
        env.update(PYTHONPATH=pydir, PYTHONUNBUFFERED="1", BENCH_URL=server_url,
                   BENCH_COUNT_URL=count_url, BENCH_TAG=tag, BENCH_MODE=mode,
                   BENCH_VARIANT=system.variant, DUETIME_REDIS_URL=server_url, DUETIME_NAMESPACE="bench",
                   PATH=f"{Path(self.python).parent}{os.pathsep}{env.get('PATH', '')}")
        self.env, self.cwd = env, pydir
        self.procs: list[subprocess.Popen] = []

    def adapter(self, command: str, *args: str, timeout: float = 300) -> dict:
        res = subprocess.run([self.python, "-m", "bench.peers.cli", self.system.module, command, *args],
                             cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"{self.system.name} {command} failed ({res.returncode}): "
                               f"{res.stderr.strip()[-1500:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])

    def argv(self, workload: str) -> list[list[str]]:
        return self.adapter("argv", workload, timeout=120)["procs"]

    def start(self, argv: list[str], label: str) -> subprocess.Popen:
        logf = open(self.logdir / f"{self.tag.replace(':', '_')}-{label}.log", "ab")  # noqa: SIM115
        p = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=logf, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        self.procs.append(p)
        LIVE.add(self)
        return p

    def stop_all(self) -> None:
        for p in self.procs:
            kill_tree(p)
        self.procs.clear()
        LIVE.discard(self)


Stats = tuple[dict[str, int], float, int]


def server_stats(r: redis.Redis) -> Stats:
    """Command calls, CPU seconds and socket reads (`total_reads_processed`: each read event on
    a client socket, i.e. the round trips the server served; a pipeline is one or a few)."""
    info = r.info("commandstats", "cpu", "stats")  # one INFO call, one read
    cmds = {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()
            if k.startswith("cmdstat_")}
    cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return cmds, cpu, int(info["total_reads_processed"])


def stats_delta(a: Stats, b: Stats) -> dict[str, Any]:
    cmds = {k: v - a[0].get(k, 0) for k, v in b[0].items() if v - a[0].get(k, 0) > 0}
    own = cmds.pop("info", 0)  # the harness's own INFO calls, one read each
    return {"cmds": cmds, "total": sum(cmds.values()), "cpu_s": b[1] - a[1],
            "reads": b[2] - a[2] - own}


@dataclass
class Ctx:
    count: redis.Redis
    count_url: str
    pydir: str
    logdir: Path
    args: argparse.Namespace
    argvs: dict[str, dict[str, list[list[str]]]] = field(default_factory=dict)

    def runner(self, system: System, server: EmbeddedServer, tag: str, mode: str = "default") -> Runner:
        return Runner(system, server.url, self.count_url, tag, mode, self.pydir, self.logdir)

    def starts(self, tag: str) -> list[tuple[int, float]]:
        out = []
        for raw in self.count.lrange(common.starts_key(tag), 0, -1):
            i, t = raw.decode().split()
            if int(i) != PROBE:
                out.append((int(i), float(t)))
        return out

    def counts(self, tag: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.count.hgetall(common.count_key(tag)).items()
                if int(k) != PROBE}

    def wait_count(self, tag: str, n: int, deadline: float, procs: list[subprocess.Popen],
                   poll: float = 0.01, probe: bool = False) -> bool:
        key = common.count_key(tag)

        def have() -> bool:
            if probe:
                return bool(self.count.hexists(key, str(PROBE)))
            return self.count.hlen(key) - self.count.hexists(key, str(PROBE)) >= n

        while time.time() < deadline:
            if have():
                return True
            if procs and all(p.poll() is not None for p in procs):
                return False
            time.sleep(poll)
        return have()

    def remember_argv(self, system: System, workload: str, mode: str, argv: list[list[str]]) -> None:
        self.argvs.setdefault(system.name, {})[f"{workload}/{mode}"] = argv

    def ready(self, rn: Runner, deadline: float) -> bool:
        """A probe job (own tag) through the fastest path proves the worker consumes."""
        rn.adapter("enqueue-burst", "1", str(PROBE), timeout=120)
        return self.wait_count(rn.tag, 1, deadline, rn.procs, poll=0.02, probe=True)


# -- W1 burst (+ W4 cost over the same lifecycle) ---------------------------------------------
def w1_round(ctx: Ctx, system: System, rnd: int) -> dict[str, Any]:
    a = ctx.args
    caps = {"rq": a.rq_fork_runs, "rq-simple": a.rq_simple_runs}
    n = min(a.runs, caps.get(system.name, a.runs))
    tag = f"{system.name}:w1:{rnd}"
    with EmbeddedServer("redis") as server:
        r = redis.Redis.from_url(server.url)
        rn = ctx.runner(system, server, tag)
        try:
            argv = rn.argv("W1")
            ctx.remember_argv(system, "W1", "default", argv)
            s0 = server_stats(r)
            enq = rn.adapter("enqueue-burst", str(n), timeout=a.timeout)
            s1 = server_stats(r)
            t_start = time.time()
            for k, cmd in enumerate(argv):
                rn.start(cmd, f"p{k}")
            ok = ctx.wait_count(tag, n, t_start + a.timeout, rn.procs)
            t_seen = time.time()
            time.sleep(0.5)  # acks that follow the job's own counting; late duplicates
            s2 = server_stats(r)
        finally:
            rn.stop_all()
        r.close()
    starts, counts = ctx.starts(tag), ctx.counts(tag)
    times = sorted(t for _, t in starts)
    done = len(counts)
    span = times[-1] - times[0] if len(times) > 1 else None
    out = {
        "n": n, "complete": ok, "enqueue_s": enq["seconds"], "enqueue_per_s": n / enq["seconds"],
        "drain_per_s": (len(times) - 1) / span if span else None,
        "drain_incl_start_per_s": done / (t_seen - t_start) if done else None,
        "first_start_after_spawn_s": times[0] - t_start if times else None,
        "lost": n - done, "duplicates": sum(counts.values()) - done,
        "enqueue_cost": stats_delta(s0, s1), "drain_cost": stats_delta(s1, s2),
    }
    log(f"  W1 {system.name:<10} round {rnd}: enqueue {out['enqueue_per_s']:8.0f}/s  drain "
        f"{out['drain_per_s'] or 0:8.0f}/s  lost {out['lost']} dup {out['duplicates']}  "
        f"cmds/run {(out['enqueue_cost']['total'] + out['drain_cost']['total']) / n:.1f}")
    return out


# -- W2 precision -------------------------------------------------------------------------------
def w2_round(ctx: Ctx, system: System, rnd: int) -> dict[str, Any]:
    a = ctx.args
    n, spread = a.w2_runs, a.w2_spread
    tag = f"{system.name}:w2:{rnd}"
    rng = random.Random(rnd)
    with EmbeddedServer("redis") as server:
        r = redis.Redis.from_url(server.url)
        rn = ctx.runner(system, server, tag)
        try:
            argv = rn.argv("W2")
            ctx.remember_argv(system, "W2", "default", argv)
            for k, cmd in enumerate(argv):
                rn.start(cmd, f"p{k}")
            if not ctx.ready(rn, time.time() + 90):
                raise RuntimeError("worker did not run a probe job within 90 s")
            time.sleep(a.w2_settle)  # e.g. taskiq's scheduler process starting beside the worker
            base = time.time() + a.w2_lead
            slot = spread / n
            instants = [base + k * slot + rng.uniform(0, slot) for k in range(n)]
            f = Path(ctx.logdir) / f"instants-{tag.replace(':', '_')}.json"
            f.write_text(json.dumps(instants))
            s0 = server_stats(r)
            enq = rn.adapter("enqueue-at", str(f), timeout=a.timeout)
            enq_end = time.time()
            ok = ctx.wait_count(tag, n, instants[-1] + a.w2_grace, rn.procs)
            time.sleep(0.5)
            s1 = server_stats(r)
        finally:
            rn.stop_all()
        r.close()
    first: dict[int, float] = {}
    for i, t in ctx.starts(tag):
        first.setdefault(i, t)
    counts = ctx.counts(tag)
    late = [(first[k] - instants[k]) * 1000 for k in range(n) if k in first]
    out: dict[str, Any] = {
        "n": n, "complete": ok, "enqueue_s": enq["seconds"],
        "enqueue_overran": sum(1 for t in instants if t < enq_end),
        "lost": n - len(counts), "duplicates": sum(counts.values()) - len(counts),
        "early": sum(1 for x in late if x < 0), "cost": stats_delta(s0, s1),
    }
    if late:
        out.update({f"p{p}_ms": percentile(late, p) for p in (50, 95, 99)})
        out["max_ms"], out["min_ms"] = max(late), min(late)
    log(f"  W2 {system.name:<10} round {rnd}: p50 {out.get('p50_ms', float('nan')):7.1f} ms  p99 "
        f"{out.get('p99_ms', float('nan')):7.1f} ms  max {out.get('max_ms', float('nan')):7.1f} ms  "
        f"early {out['early']}  lost {out['lost']} dup {out['duplicates']}")
    return out


# -- W5 schedules -----------------------------------------------------------------------------------
def cpu_of_tree(pid: int) -> float:
    """User + system CPU seconds of a live process and its live descendants (/proc)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def w5_round(ctx: Ctx, system: System, rnd: int) -> dict[str, Any]:
    """Register N schedules (E fire every minute, the rest yearly), start the scheduler and a
    worker, and watch the first minute boundary at least --w5-settle s after they started:
    start lateness of the E runs, then Redis and scheduler cost over an idle window."""
    a = ctx.args
    n, every = a.w5_schedules, a.w5_every
    tag = f"{system.name}:w5:{rnd}"
    with EmbeddedServer("redis") as server:
        r = redis.Redis.from_url(server.url)
        rn = ctx.runner(system, server, tag)
        try:
            argv = rn.argv("W5")
            ctx.remember_argv(system, "W5", "default", argv)
            mem0 = int(r.info("memory")["used_memory"])
            reg = rn.adapter("register-schedules", str(n), str(every), timeout=a.w5_register_timeout)
            mem1 = int(r.info("memory")["used_memory"])
            procs = [rn.start(cmd, f"p{k}") for k, cmd in enumerate(argv)]
            boundary = math.ceil((time.time() + a.w5_settle) / 60) * 60
            first: dict[int, float] = {}
            dup = 0
            while time.time() < boundary + a.w5_grace:
                if all(p.poll() is not None for p in procs):
                    raise RuntimeError("the scheduler and worker exited")
                first, dup = w5_firsts(ctx.starts(tag), boundary, every)
                if len(first) >= every:
                    break
                time.sleep(0.2)
            settled = time.time()
            # idle window: after the firing, ending before the next one (a minute after it)
            fired_at = min(first.values()) if first else boundary
            begin = max(settled + 1, boundary + a.w5_idle_after)
            end = min(begin + a.w5_idle, fired_at + 55)
            out: dict[str, Any] = {"n": n, "every": every, "register_s": reg["seconds"],
                                   "register_per_s": n / reg["seconds"],
                                   "bytes_per_schedule": (mem1 - mem0) / n}
            if end - begin >= 5:
                time.sleep(max(0.0, begin - time.time()))
                s0, c0, t0 = server_stats(r), cpu_of_tree(procs[0].pid), time.time()
                time.sleep(end - begin)
                s1, c1, t1 = server_stats(r), cpu_of_tree(procs[0].pid), time.time()
                d = stats_delta(s0, s1)
                out.update(idle_s=t1 - t0, idle_cmds_per_s=d["total"] / (t1 - t0),
                           idle_redis_cpu_ms_per_s=d["cpu_s"] * 1000 / (t1 - t0),
                           idle_sched_cpu_ms_per_s=(c1 - c0) * 1000 / (t1 - t0),
                           idle_cmds=d["cmds"])
            first, dup = w5_firsts(ctx.starts(tag), boundary, every)
        finally:
            rn.stop_all()
        r.close()
    late = [(t - boundary) * 1000 for k, t in first.items() if k < every]
    out.update(fired=len(late), not_fired=every - len(late), duplicates=dup,
               early=sum(1 for x in late if x < 0))
    if late:
        out.update({f"p{p}_ms": percentile(late, p) for p in (50, 95, 99)})
        out["max_ms"], out["min_ms"] = max(late), min(late)
    log(f"  W5 {system.name:<14} round {rnd}: register {out['register_per_s']:7.0f}/s  "
        f"{out['bytes_per_schedule']:5.0f} B/schedule  min {out.get('min_ms', float('nan')):8.1f} "
        f"p50 {out.get('p50_ms', float('nan')):8.1f} p99 {out.get('p99_ms', float('nan')):8.1f} ms"
        f"  fired {out['fired']}/{every} dup {dup}  idle sched CPU "
        f"{out.get('idle_sched_cpu_ms_per_s', float('nan')):.0f} ms/s")
    return out


def w5_firsts(starts: list[tuple[int, float]], boundary: float, every: int
              ) -> tuple[dict[int, float], int]:
    """Each every-minute job's first start from 1 s before `boundary` on (the firing for that
    minute), and how many more starts the same firing had (within 50 s of it: duplicates)."""
    first: dict[int, float] = {}
    for i, t in sorted(starts, key=lambda x: x[1]):
        if i < every and t >= boundary - 1 and i not in first:
            first[i] = t
    dup = sum(1 for i, t in starts if i in first and first[i] < t < first[i] + 50)
    return first, dup


# -- W3 recovery ----------------------------------------------------------------------------------
def w3_case(ctx: Ctx, system: System, mode: str, rnd: int) -> dict[str, Any]:
    a = ctx.args
    tag = f"{system.name}:w3{mode[0]}:{rnd}"
    out: dict[str, Any] = {"mode": mode}
    with EmbeddedServer("redis") as server:
        rn = ctx.runner(system, server, tag, mode)
        try:
            argv = rn.argv("W3")
            ctx.remember_argv(system, "W3", mode, argv)
            procs = [rn.start(cmd, f"p{k}") for k, cmd in enumerate(argv)]
            if not ctx.ready(rn, time.time() + 90):
                raise RuntimeError("worker did not run a probe job within 90 s")
            rn.adapter("enqueue-long", str(a.w3_job_seconds), timeout=120)
            deadline = time.time() + 60
            st = ctx.starts(tag)
            while not st and time.time() < deadline:
                time.sleep(0.01)
                st = ctx.starts(tag)
            if not st:
                raise RuntimeError("the long job did not start within 60 s")
            time.sleep(max(0.0, st[0][1] + a.w3_kill_after - time.time()))
            t_kill = time.time()
            kill_tree(procs[0])  # the worker's whole tree; a reaper/scheduler process stays up
            rn.start(argv[0], "p0-restarted")  # a supervisor restarts the worker at once
            out["killed_at_s_into_job"] = t_kill - st[0][1]
            rerun = None
            deadline = t_kill + a.w3_wait
            while time.time() < deadline:
                st = ctx.starts(tag)
                if len(st) > 1:
                    rerun = st[1][1]
                    break
                time.sleep(0.05)
            out["rerun"] = rerun is not None
            out["rerun_after_kill_s"] = rerun - t_kill if rerun is not None else None
            if rerun is not None:  # let the rerun finish to see it complete exactly once
                ctx.wait_count(tag, 1, rerun + a.w3_job_seconds + 5, [])
                time.sleep(0.5)
        finally:
            rn.stop_all()
    out["starts"] = len(ctx.starts(tag))
    out["completions"] = sum(ctx.counts(tag).values())
    seen = (f"{out['rerun_after_kill_s']:.1f} s after the kill" if out["rerun"]
            else f"NO (within {a.w3_wait:.0f} s)")
    log(f"  W3 {system.name:<10} {mode:<10} round {rnd}: rerun {seen}  starts {out['starts']} "
        f"completions {out['completions']}")
    return out


def run_w3(ctx: Ctx, systems: list[System], results: dict[str, Any]) -> None:
    """All W3 cases in parallel threads, each on its own server: the cases of one round start
    --w3-stagger apart, rounds --w3-round-gap apart (a round's kills and reruns are over by then;
    what is left of it is idle waiting)."""
    args = ctx.args
    cases = [(s, m) for s in systems if "W3" in s.workloads for m in ("default", "aggressive")]
    log(f"W3 recovery: {args.repeat} rounds of {len(cases)} cases, each on its own server; "
        f"waiting up to {args.w3_wait:g} s for a rerun")
    box: dict[tuple[str, str, int], dict] = {}
    threads = [threading.Thread(target=w3_thread, args=(box, ctx, s, m, rnd,
                                                       rnd * args.w3_round_gap + k * args.w3_stagger),
                                daemon=True)
               for rnd in range(args.repeat) for k, (s, m) in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.w3_wait + args.repeat * args.w3_round_gap + 400)
    for (name, m, _rnd), res in sorted(box.items(), key=lambda kv: kv[0][2]):
        results["W3"].setdefault(name, {}).setdefault(m, []).append(res)


def w3_thread(box: dict, ctx: Ctx, system: System, mode: str, rnd: int, delay: float) -> None:
    time.sleep(delay)
    box[(system.name, mode, rnd)] = guarded(w3_case, ctx, system, mode, rnd)


# -- orchestration --------------------------------------------------------------------------------
def guarded(fn: Callable[..., dict], *fa: Any) -> dict[str, Any]:
    try:
        return fn(*fa)
    except Exception as exc:  # one system's failure is a result, not the end of the run
        log(f"  ERROR {fa[1].name}: {exc}")
        return {"error": str(exc)[:800]}


def run_all(args: argparse.Namespace, systems: list[System], workloads: set[str], pydir: str
            ) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    logdir = OUT / "logs" / time.strftime("%Y%m%d-%H%M%S")
    logdir.mkdir(parents=True)
    results: dict[str, Any] = {"W1": {}, "W2": {}, "W3": {}, "W5": {}}
    with EmbeddedServer("redis") as counter:
        count_url = f"redis://127.0.0.1:{counter.port}/1"
        ctx = Ctx(redis.Redis.from_url(count_url), count_url, pydir, logdir, args)
        t_all = time.time()
        for rnd in range(args.repeat):
            results.setdefault("loadavg", []).append(os.getloadavg())
            n = f"round {rnd + 1}/{args.repeat}"
            rounds = (({"W1", "W4"}, "W1", w1_round, f"W1 burst, {n}, {args.runs} runs"),
                      ({"W2"}, "W2", w2_round, f"W2 precision, {n}, {args.w2_runs} runs over "
                                               f"{args.w2_spread:g} s"),
                      ({"W5"}, "W5", w5_round, f"W5 schedules, {n}, {args.w5_schedules:,} "
                                               f"schedules, {args.w5_every:,} every minute"))
            for wanted, w, one_round, what in rounds:  # W4 is measured in the W1 rounds
                if workloads & wanted:
                    log(what)
                    for s in systems:
                        if w in s.workloads:
                            results[w].setdefault(s.name, []).append(
                                guarded(one_round, ctx, s, rnd))
            log(f"round {rnd + 1} done, {time.time() - t_all:.0f} s so far")
        if "W3" in workloads:
            results["loadavg_w3"] = os.getloadavg()
            run_w3(ctx, systems, results)
        ctx.count.close()
    results["argv"] = {k: {w: [[shorten(x) for x in cmd] for cmd in cmds] for w, cmds in v.items()}
                       for k, v in ctx.argvs.items()}
    results["elapsed_s"] = time.time() - t_all
    return results


def shorten(arg: str) -> str:
    """Command lines as reported: repository-relative paths, the run's server URL as $BENCH_URL."""
    arg = arg.replace(str(ROOT) + "/", "")
    return re.sub(r"redis://127\.0\.0\.1:\d+/0", "$BENCH_URL", arg)


def describe_all(systems: list[System], pydir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in systems:
        rn = Runner(s, "redis://127.0.0.1:1/0", "redis://127.0.0.1:1/1", "describe", "default", pydir,
                    OUT)
        try:
            out[s.name] = {"describe": rn.adapter("describe", timeout=120),
                           "versions": peer_venvs.versions(s.module)}
        except Exception as exc:
            out[s.name] = {"error": str(exc)[:800]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--systems", default="all", help="comma-separated, or all: " +
                    ",".join(s.name for s in SYSTEMS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20000, help="W1 burst size")
    ap.add_argument("--concurrency", type=int, default=100,
                    help="jobs at once in each asyncio system's worker (duetime, taskiq, arq, saq): "
                         "BENCH_CONCURRENCY, the same for all of them")
    ap.add_argument("--rq-fork-runs", type=int, default=1000,
                    help="W1 size for rq's forking worker (a fork per job: ~30 jobs/s here)")
    ap.add_argument("--rq-simple-runs", type=int, default=2000,
                    help="W1 size for rq's SimpleWorker (~150-250 jobs/s here)")
    ap.add_argument("--timeout", type=float, default=240, help="bound on one enqueue or one drain (s)")
    ap.add_argument("--w2-runs", type=int, default=1000)
    ap.add_argument("--w2-spread", type=float, default=10.0)
    ap.add_argument("--w2-lead", type=float, default=2.0, help="first instant this long after enqueue")
    ap.add_argument("--w2-settle", type=float, default=1.0,
                    help="after the probe, before the enqueue (taskiq's scheduler process starts)")
    ap.add_argument("--w2-grace", type=float, default=30.0, help="wait after the last instant (s)")
    ap.add_argument("--w3-wait", type=float, default=120.0, help="how long to wait for a rerun (s)")
    ap.add_argument("--w3-job-seconds", type=float, default=5.0)
    ap.add_argument("--w3-kill-after", type=float, default=1.0, help="SIGKILL this far into the job")
    ap.add_argument("--w3-stagger", type=float, default=1.5, help="between parallel W3 case starts")
    ap.add_argument("--w3-round-gap", type=float, default=60.0, help="between W3 rounds' starts (s)")
    ap.add_argument("--w5-schedules", type=int, default=100_000)
    ap.add_argument("--w5-every", type=int, default=1000, help="of them, firing every minute")
    ap.add_argument("--w5-settle", type=float, default=20.0,
                    help="the watched boundary is at least this long after the processes start")
    ap.add_argument("--w5-grace", type=float, default=62.0,
                    help="wait after the boundary (s): taskiq fires on its own 60 s phase")
    ap.add_argument("--w5-idle-after", type=float, default=15.0,
                    help="idle window starts this long after the boundary (or after the firing)")
    ap.add_argument("--w5-idle", type=float, default=25.0, help="idle window length (s)")
    ap.add_argument("--w5-register-timeout", type=float, default=900.0)
    ap.add_argument("--results", default=None,
                    help="the report's path (default: bench/out/peers-<time>.md, beside the raw "
                         "results)")
    args = ap.parse_args()
    os.environ["BENCH_CONCURRENCY"] = str(args.concurrency)  # read by every adapter process
    workloads = {w.strip().upper() for w in args.workloads.split(",") if w.strip()}
    names = [s.name for s in SYSTEMS if s.in_all] if args.systems == "all" else args.systems.split(",")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown systems {unknown}")
    systems = [BY_NAME[n] for n in names]
    if "duetime" not in names:
        log("note: duetime not selected, so no duetime/peer ratios")
    setup_errors: dict[str, str] = {}
    for mod in sorted({s.module for s in systems} - {"duetime"}):
        try:
            peer_venvs.ensure(mod, log=log)
        except Exception as exc:
            setup_errors[mod] = str(exc)[:1500]
            log(f"cannot set up {mod}: {exc}")
    runnable = [s for s in systems if s.module not in setup_errors]
    # the adapters' import root: only `bench` on PYTHONPATH (not the repository's other packages)
    pydir = tempfile.mkdtemp(prefix="duetime-peers-")
    os.symlink(ROOT / "bench", Path(pydir) / "bench")
    info = describe_all(runnable, pydir)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    env = environment()  # before the run: the duetime code the workers import is this one

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        results = run_all(args, runnable, workloads, pydir)
    finally:
        for rn in list(LIVE):
            rn.stop_all()
        shutil.rmtree(pydir, ignore_errors=True)
    results.update(info=info, setup_errors=setup_errors, started=started, workloads=sorted(workloads),
                   systems=[s.name for s in systems], args=vars(args),
                   env=dict(env, git_end=git_line()))
    path = OUT / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    from bench.peers_report import render

    report = Path(args.results) if args.results else path.with_suffix(".md")
    report.write_text(render(results))
    log(f"raw results {path.relative_to(ROOT)}; report {report}; {results['elapsed_s']:.0f} s")


def git_line() -> str:
    """Which duetime was measured (read-only git queries): HEAD and uncommitted core files."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "common", "duetime", "lua",
                                "scheduler", "worker"], cwd=ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"HEAD {head} + {len(dirty)} uncommitted files in common/ duetime/ lua/ scheduler/ worker/"


def environment() -> dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    redis_v = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return {"git": git_line(), "cpu": cpu, "cores": str(os.cpu_count()), "mem_gib": f"{int(mem) / 2**20:.0f}",
            "kernel": platform.release(), "python": platform.python_version(), "redis": redis_v,
            "argv": " ".join(shlex.quote(a) for a in [".venv/bin/python", "-m", "bench.peers_run",
                                                       *sys.argv[1:]])}


if __name__ == "__main__":
    main()
