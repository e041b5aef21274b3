"""Schedules at scale, on an embedded Redis:

1. register N schedules (bulk `schedule_many`): schedules/s and Redis memory per schedule;
2. materialisation: one evaluator pass over M schedules all due at once: runs/s;
3. a herd: K schedules firing at the same instant, one scheduler + W worker processes:
   start lateness (claim on the server clock minus due time) p50/p99/max, plain and with jitter;
4. idle: with the N registered schedules (none due soon), one scheduler process and one idle
   worker: Redis commands per second (`INFO commandstats`, commands run inside scripts
   included) and Redis CPU, over a window after they settled.

    .venv/bin/python -m bench.schedules --register 100000 --materialize 10000 --herd 1000,10000 \
        --idle 60
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import redis
from duetime.scheduler.evaluator import Evaluator

import duetime
from bench.apps import app, mark, noop
from bench.stats import percentile
from duetime.embedded import EmbeddedServer

CHUNK = 5000


def fresh(url: str) -> str:
    ns = f"sb{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    app.store.ready()
    return ns


def register(url: str, n: int) -> None:
    fresh(url)
    r = redis.Redis.from_url(url)
    mem0 = r.info("memory")["used_memory"]
    t0 = time.perf_counter()
    for i in range(0, n, CHUNK):
        defs = [app.schedule_def(f"job-{j:06d}", duetime.Cron("H H * * *"), noop, args=[j])
                for j in range(i, min(n, i + CHUNK))]
        app.schedule_many(defs)
    dt = time.perf_counter() - t0
    mem = r.info("memory")["used_memory"] - mem0
    print(f"register: {n} schedules in {dt:.2f} s = {n / dt:,.0f}/s; "
          f"Redis memory {mem / n:,.0f} bytes/schedule ({mem / 2**20:,.1f} MiB)")
    k = app.keys
    parts = range(k.partitions)
    names = [f"job-{j:06d}" for j in range(0, n, max(1, n // 200))]
    side = sum(r.exists(k.sched(k.partition_of_schedule(x), x)) for x in names)
    packed = sum(r.hlen(k.scheds(p)) for p in parts)
    index = {}
    for label, key in (("due order", k.sched_due), ("listing (old layout)", k.schedules)):
        count = sum(r.zcard(key(p)) for p in parts)
        if count:
            index[label] = sum(r.memory_usage(key(p), samples=0) or 0 for p in parts) / count
    if packed:  # the packed layout: one field of T:scheds per schedule
        record = sum(r.memory_usage(k.scheds(p), samples=0) or 0 for p in parts) / packed
        x = names[0]
        raw = r.hget(k.scheds(k.partition_of_schedule(x)), x) or b""
        what = f"its packed record {record:,.0f} B ({len(raw)} B of text), side hashes {side}/{len(names)}"
    else:
        record = sum(r.memory_usage(k.sched(k.partition_of_schedule(x), x), samples=0) or 0
                     for x in names) / len(names)
        fields = r.hgetall(k.sched(k.partition_of_schedule(names[0]), names[0]))
        text = sum(len(f) + len(v) for f, v in fields.items())
        what = f"its hash {record:,.0f} B ({len(fields)} fields, {text} B of field names and values)"
    print(f"  per schedule (MEMORY USAGE): {what}, "
          + ", ".join(f"{lb} index {b:,.0f} B" for lb, b in index.items()))
    t0 = time.perf_counter()
    app.schedule_many([app.schedule_def(f"job-{j:06d}", duetime.Cron("H H * * *"), noop, args=[j])
                       for j in range(min(n, CHUNK))])
    print(f"  re-registering {min(n, CHUNK)} unchanged: {time.perf_counter() - t0:.2f} s (no writes)")


def _commands(r: redis.Redis) -> tuple[dict[str, int], float]:
    info = r.info("commandstats")
    cpu = r.info("cpu")
    return ({k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()},
            cpu["used_cpu_sys"] + cpu["used_cpu_user"])


def idle(url: str, n: int, window_s: float, settle_s: float = 10.0) -> None:
    """n schedules none of which fires in the window (yearly, spread by H), a scheduler and an
    idle worker: count what they send while nothing is due."""
    fresh(url)
    for i in range(0, n, CHUNK):
        app.schedule_many([app.schedule_def(f"y-{j:06d}", duetime.Cron("H H 1 1 *"), noop, args=[j])
                           for j in range(i, min(n, i + CHUNK))])
    r = redis.Redis.from_url(url)
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": app.keys.namespace}
    cmd = [sys.executable, "-m", "duetime", "--log-level", "WARNING"]
    procs = [subprocess.Popen([*cmd, "scheduler"], env=env),
             subprocess.Popen([*cmd, "worker", "--app", "bench.apps:app"], env=env)]
    try:
        time.sleep(settle_s)
        (c0, cpu0), t0 = _commands(r), time.perf_counter()
        time.sleep(window_s)
        (c1, cpu1), dt = _commands(r), time.perf_counter() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    delta = {k: v - c0.get(k, 0) for k, v in c1.items() if v - c0.get(k, 0) > 0}
    delta["info"] = delta.get("info", 0) - 4  # this bench's own INFO calls
    total = sum(v for v in delta.values() if v > 0)
    top = ", ".join(f"{k} {v / dt:.2f}" for k, v in sorted(delta.items(), key=lambda kv: -kv[1])[:6]
                    if v > 0)
    print(f"idle: {n:,} schedules, one scheduler + one idle worker, {window_s:g} s after "
          f"{settle_s:g} s to settle: "
          f"{total / dt:.2f} Redis commands/s ({top}); Redis CPU {(cpu1 - cpu0) / dt * 1000:.2f} ms/s")


def materialize(url: str, n: int) -> None:
    fresh(url)
    r = redis.Redis.from_url(url)
    sec, _ = r.time()
    at = datetime.fromtimestamp(sec + 3, tz=UTC)
    for i in range(0, n, CHUNK):
        app.schedule_many([app.schedule_def(f"m-{j:06d}", duetime.At(at), noop)
                           for j in range(i, min(n, i + CHUNK))])
    ev = Evaluator(url, app.keys, lead_ms=10_000)
    cpu0, rcpu0 = time.process_time(), _commands(r)[1]
    t0 = time.perf_counter()
    created = 0
    while created < n:
        created += ev.tick()
    dt = time.perf_counter() - t0
    cpu, rcpu = time.process_time() - cpu0, _commands(r)[1] - rcpu0
    print(f"materialize: {created} runs in {dt:.2f} s = {created / dt:,.0f} runs/s (one evaluator); "
          f"evaluator CPU {cpu / created * 1e6:.0f} µs/run, Redis CPU {rcpu / created * 1e6:.0f} µs/run")


def herd(url: str, n: int, jitter_s: float, workers: int, args_concurrency: int,
         worker_args: tuple[str, ...] = (), own_start: bool = False, lead: str = "2s",
         herd_in: float = 8.0) -> None:
    """Start lateness as the claim recorded it (the run's `started`, on the server clock:
    max(claim time, due)) and, with `own_start`, as the task saw it (its own first instant,
    same machine clock); also how late the evaluator created the runs (`created` - due)."""
    ns = fresh(url)
    task = mark if own_start else noop
    r = redis.Redis.from_url(url)
    sec, _ = r.time()
    at = datetime.fromtimestamp(sec + herd_in, tz=UTC)
    for i in range(0, n, CHUNK):
        app.schedule_many([app.schedule_def(f"h-{j:06d}", duetime.At(at), task,
                                            jitter=timedelta(seconds=jitter_s) if jitter_s else None)
                           for j in range(i, min(n, i + CHUNK))])
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    cmd = [sys.executable, "-m", "duetime", "--log-level", "WARNING"]
    procs = [subprocess.Popen([*cmd, "scheduler", "--lead", lead], env=env)]
    procs += [subprocess.Popen([*cmd, "worker", "--app", "bench.apps:app",
                                "--concurrency", str(args_concurrency), *worker_args], env=env)
              for _ in range(workers)]
    done_keys = [app.keys.done(p) for p in range(app.keys.partitions)]
    deadline = time.monotonic() + 60 + jitter_s
    while time.monotonic() < deadline:
        pipe = r.pipeline(transaction=False)
        for k in done_keys:
            pipe.zcard(k)
        if sum(pipe.execute()) >= n:
            break
        time.sleep(0.2)
    if own_start:  # the stamps are written by the task's own thread once they stop coming
        stamps_r = redis.Redis.from_url(url, db=1)
        until = time.monotonic() + 10
        while stamps_r.hlen(f"{ns}:stamps") < n and time.monotonic() < until:
            time.sleep(0.05)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)
    late, made, own = [], [], []
    stamps = {k.decode(): float(v) for k, v in
              redis.Redis.from_url(url, db=1).hgetall(f"{ns}:stamps").items()} if own_start else {}
    for p in range(app.keys.partitions):
        ids = [x.decode() for x in r.zrange(app.keys.done(p), 0, -1)]
        pipe = r.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(app.keys.run(p, run_id), "started", "due", "created")
        rows = pipe.execute()
        part = [int(s) - int(d) for s, d, _ in rows]
        made += [int(c) - int(d) for _, d, c in rows]
        own += [stamps[i] - int(d) for i, (_, d, _) in zip(ids, rows, strict=True) if i in stamps]
        if os.environ.get("BENCH_DEBUG") and part:
            print(f"  partition {p}: {len(part)} runs, lateness {min(part)}..{max(part)} ms")
        late += part
    label = f"jitter {jitter_s:g}s" if jitter_s else "no jitter"
    print(f"herd: {n} schedules at one instant, {label}, {workers} worker process(es) x "
          f"concurrency {args_concurrency}: "
          f"{len(late)} runs; start lateness p50 {percentile(late, 50):.0f} ms, "
          f"p99 {percentile(late, 99):.0f} ms, "
          f"max {max(late):.0f} ms, early {sum(1 for x in late if x < 0)}; created "
          f"- due p50 {percentile(made, 50):.0f} ms, max {max(made):.0f} ms "
          f"({sum(1 for x in made if x > 0)} created after their due time)")
    if own:
        print(f"  the task's own start - due: min {min(own):.1f} ms (the release), p50 "
              f"{percentile(own, 50):.1f} ms, p99 "
              f"{percentile(own, 99):.1f} ms, max {max(own):.1f} ms, early "
              f"{sum(1 for x in own if x < 0)}, {len(own)} stamped")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--register", type=int, default=100_000)
    ap.add_argument("--materialize", type=int, default=10_000)
    ap.add_argument("--herd", default="1000,10000")
    ap.add_argument("--jitter", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--worker-args", default="", help="extra worker options, e.g. '--claim-ahead 50ms'")
    ap.add_argument("--lead", default="2s", help="herd: the scheduler's --lead (how far ahead "
                    "it creates runs; a herd of 10,000 takes it seconds to create)")
    ap.add_argument("--herd-in", type=float, default=8.0,
                    help="herd: its instant this many seconds after registration begins")
    ap.add_argument("--own-start", action="store_true",
                    help="herd: also the task's own first instant (a buffered stamp)")
    ap.add_argument("--idle", type=float, default=0, help="seconds of idle measurement (0: none)")
    args = ap.parse_args()
    with EmbeddedServer("redis") as server:
        if args.register:
            register(server.url, args.register)
        if args.idle:
            idle(server.url, args.register or 100_000, args.idle)
        if args.materialize:
            materialize(server.url, args.materialize)
        for n in [int(x) for x in args.herd.split(",") if x]:
            extra = tuple(args.worker_args.split())
            herd(server.url, n, 0, args.workers, args.concurrency, extra, args.own_start,
                 args.lead, args.herd_in)
            if args.jitter:
                herd(server.url, n, args.jitter, args.workers, args.concurrency, extra,
                     args.own_start, args.lead, args.herd_in)


if __name__ == "__main__":
    main()
