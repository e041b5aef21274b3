"""Batches: what a batch member costs against a plain run, and how soon a callback starts.

1. Redis CPU per run and drain rate: N plain runs (enqueue_many: spread over every
   partition) against one batch of N members (all in the batch's partition) with an
   on_complete callback; each drained by one in-process worker in burst mode. CPU is Redis's
   INFO cpu delta over enqueue + drain, divided by N. Interleaved rounds; the ratio is taken
   within a round.
2. Completion latency: B batches of M members, served by a running in-process worker; for
   each, the callback's attempt start (`started`, server ms) minus the latest member
   `finished` (server ms): the last member's end to the callback's start.

    .venv/bin/python -m bench.batches [--runs 10000] [--rounds 3] [--batches 200] [--members 10]

3. `--chaos` (the soak of issue size, `make soak-batches`): one batch of 10,000 members
   (9,800 created with it, 100 of them spawners that each `batch_add` 2 more from inside),
   10% failing for good, on 3 worker processes of which one is SIGKILLed every 2-4 s and
   replaced, a reaper recovering the leases: the checks of tests/workloads/batch_chaos_kit.py
   (counts equal the members' final states, each callback created and released once).

    .venv/bin/python -m bench.batches --chaos [--originals 9800] [--workers 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
from duetime.worker.runtime import Worker, WorkerConfig

from bench.apps import app, noop
from bench.stats import percentile
from duetime.embedded import EmbeddedServer


def _cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6


async def _drain(concurrency: int = 64) -> None:
    worker = Worker(app.registry, app.redis_url, app.keys,
                    WorkerConfig(queues=["default"], concurrency=concurrency))
    await worker.run(handle_signals=False, until_idle=True)


def cost_round(url: str, n: int, kind: str) -> dict[str, float]:
    app.configure(redis_url=url, namespace=f"bb{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    app.store.ready()
    c0, t0 = _cpu_us(r), time.perf_counter()
    if kind == "plain":
        app.enqueue_many([(noop, [i]) for i in range(n)])
    else:
        bid = app.batch([(noop, [i]) for i in range(n)], on_complete=(noop, [-1]))
    t1 = time.perf_counter()
    asyncio.run(_drain())
    if kind == "batch":
        asyncio.run(_drain())  # the callback, released by the last member
        b = app.get_batch(bid)
        assert b.succeeded == n and app.get_run(b.on_complete_run).state == "succeeded"
    t2 = time.perf_counter()
    cpu = _cpu_us(r) - c0
    app.close()
    r.close()
    return {"cpu_us_per_run": cpu / n, "enqueue_per_s": n / (t1 - t0), "drain_per_s": n / (t2 - t1)}


async def _latency(batches: int, members: int) -> list[float]:
    worker = Worker(app.registry, app.redis_url, app.keys,
                    WorkerConfig(queues=["default"], concurrency=64))
    task = asyncio.create_task(worker.run(handle_signals=False))
    while not worker.ready.is_set():
        await asyncio.sleep(0.01)
    out = []
    try:
        for _ in range(batches):
            bid = await asyncio.to_thread(app.batch, [(noop, [i]) for i in range(members)],
                                          on_complete=(noop, [-1]))
            while True:
                b = await asyncio.to_thread(app.get_batch, bid)
                cb = b.on_complete_run
                assert cb is not None
                run = await asyncio.to_thread(app.get_run, cb)
                if run.state == "succeeded":
                    break
                await asyncio.sleep(0.002)
            ends = []
            for m in await asyncio.to_thread(app.batch_members, bid):
                ends.append((await asyncio.to_thread(app.get_run, m)).finished)
            assert run.started is not None
            last = max(e for e in ends if e is not None)
            out.append((run.started - last).total_seconds() * 1000)
    finally:
        worker.stop()
        await task
    return out


def chaos(args: argparse.Namespace) -> int:
    """The 10,000-member batch under SIGKILL (see the module docstring); exit status 1 when a
    check failed. Process logs go to /tmp/duetime-batch-chaos-<pid>/."""
    from tests.apps import workloads as w
    from tests.workloads import batch_chaos_kit as kit

    out = Path(f"/tmp/duetime-batch-chaos-{os.getpid()}")
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    started: list[subprocess.Popen[bytes]] = []
    with EmbeddedServer(args.server) as srv:
        ns = f"bc{uuid.uuid4().hex[:6]}"
        w.app.configure(redis_url=srv.url, namespace=ns)
        env = {**os.environ, "DUETIME_REDIS_URL": srv.url, "DUETIME_NAMESPACE": ns,
               "PYTHONPATH": str(root)}

        def proc(*argv: str) -> subprocess.Popen[bytes]:
            log = open(out / f"{argv[0]}-{len(started)}.log", "wb")  # noqa: SIM115 - the process's
            p = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", *argv],
                                 env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            started.append(p)
            return p

        try:
            proc("reaper", "--tick", "100ms")
            the_plan = kit.plan(args.originals, seed=args.seed, spawn_every=98, per_spawn=2)
            print(f"batch of {the_plan.total} members ({len(the_plan.spawns)} spawners adding "
                  f"{the_plan.total - len(the_plan.fails)}), {the_plan.failed} fail for good; "
                  f"{args.workers} workers, one SIGKILLed every 2-4 s", flush=True)
            rep = kit.run(w.app, lambda: proc("worker", "--app", "tests.apps.workloads:app",
                                              "--lease", "2s", "--concurrency", "16"),
                          the_plan, workers=args.workers, kill_every=(2.0, 4.0), max_kills=None,
                          deadline_s=1800, seed=args.seed, progress=print)
        finally:
            for p in started:
                if p.poll() is None:
                    p.kill()
                p.wait()
            w.app.close()
    print(f"members {rep.members} (planned {rep.planned}), kills {rep.kills}, "
          f"{rep.seconds:.0f} s, {rep.retried} members took more than one attempt, "
          f"batch counts {rep.counts}, member states {rep.states}")
    for role, info in rep.callbacks.items():
        print(f"{role}: {info}")
    print("problems: " + ("; ".join(rep.problems) if rep.problems else "none"))
    return 1 if rep.problems else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chaos", action="store_true", help="the 10,000-member batch under SIGKILL")
    ap.add_argument("--originals", type=int, default=9_800)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--server", default="redis")
    args = ap.parse_args()
    if args.chaos:
        sys.exit(chaos(args))
    with EmbeddedServer(args.server) as srv:
        rows: dict[str, list[dict[str, float]]] = {"plain": [], "batch": []}
        ratios: dict[str, list[float]] = {"cpu_us_per_run": [], "drain_per_s": []}
        for i in range(args.rounds):
            order = ["plain", "batch"] if i % 2 == 0 else ["batch", "plain"]
            got = {kind: cost_round(srv.url, args.runs, kind) for kind in order}
            for kind in order:
                rows[kind].append(got[kind])
            for k in ratios:
                ratios[k].append(got["batch"][k] / got["plain"][k])
            print(f"round {i + 1}: " + "; ".join(
                f"{kind}: " + ", ".join(f"{k} {v:,.1f}" for k, v in got[kind].items())
                for kind in order), flush=True)
        for kind, rs in rows.items():
            print(f"{kind:6} median: " + ", ".join(
                f"{k} {statistics.median(r[k] for r in rs):,.1f}" for k in rs[0]))
        print("batch/plain, median of per-round ratios: " + ", ".join(
            f"{k} {statistics.median(v):.2f}" for k, v in ratios.items()))
        app.configure(redis_url=srv.url, namespace=f"bl{uuid.uuid4().hex[:6]}")
        lat = asyncio.run(_latency(args.batches, args.members))
        app.close()
        print(f"completion latency (last member end -> callback start), {len(lat)} batches of "
              f"{args.members}: p50 {percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms, "
              f"max {max(lat):.1f} ms")


if __name__ == "__main__":
    main()
