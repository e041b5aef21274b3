"""What limits cost at claim time, and the fair-share bound under a backlog.

1. Script cost, driven directly (no worker): enqueue N runs, claim them all in batches, then
   complete them all; Redis CPU inside EVALSHA (INFO commandstats usec) per run, per phase,
   for each scenario. Limits are set high enough never to hold a run back, so what is measured
   is the price of checking and counting them. `held` measures instead one claim call that
   finds a tenant's concurrency limit full (it scans and leaves the runs).
2. Drain rate: one `duetime worker` process (async no-op task) drains N runs, per scenario,
   first to last finish on the server clock.
3. Fair share: tenant A enqueues a backlog; once a worker drains it, tenant B enqueues 10 runs;
   B's wait = attempt start - creation (server clock), while A still has thousands left.

    .venv/bin/python -m bench.limits [--runs 20000] [--backlog 100000] [--rounds 3]

`--compare LUA_DIR ...` compares the claim cost of each scenario (and of a call meeting a full
limit) between copies of lua/, interleaved, script rounds only (no worker).
`--before LUA_DIR` instead compares the hot path (no limit, no tenant, no priority) of the
claim and complete scripts of LUA_DIR (e.g. `git archive main lua`) with the current ones,
interleaved on one server: what the limit checks cost runs that use none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from duetime.common import transitions as tr
from duetime.common.models import to_ms
from duetime.common.scripts import Scripts

from bench import script_cost
from bench.apps import app, noop
from bench.drive import claim_all, complete_all, parser
from duetime.embedded import EmbeddedServer

TENANTS = [f"t{i}" for i in range(8)]
BATCH = 50


def _evalsha_us(r: redis.Redis) -> float:
    return float(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def _items(scenario: str, n: int) -> list[dict[str, Any]]:
    tenant = scenario in ("concurrency", "tenants")
    return [{"task": noop, "args": [i],
             **({"tenant": TENANTS[i % len(TENANTS)]} if tenant else {}),
             **({"priority": 1 + i % 10} if scenario == "priority" else {})}
            for i in range(n)]


def _limits(scenario: str) -> None:
    if scenario == "concurrency":
        for t in TENANTS:
            app.set_limit("tenant", t, concurrency=1_000_000)
    elif scenario == "rate":
        app.set_limit("task", noop.name, rate=1e9, per=1.0, burst=1e9)


SCENARIOS = ("none", "concurrency", "rate", "tenants", "priority")


class _Copy:
    """The claim and complete scripts of a copy of lua/, called like Scripts' (`--compare`)."""

    def __init__(self, r: redis.Redis, lua_dir: Path) -> None:
        self.claim = r.register_script(script_cost._source(lua_dir, "claim"))
        self.complete = r.register_script(script_cost._source(lua_dir, "complete"))


def script_round(url: str, scenario: str, n: int, lua_dir: Path | None = None) -> dict[str, float]:
    app.configure(redis_url=url, namespace=f"bl{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    app.store.ready()
    scripts: Any = Scripts(r) if lua_dir is None else _Copy(r, lua_dir)
    k = app.keys
    _limits(scenario)
    items = _items(scenario, n)
    e0 = _evalsha_us(r)
    app.enqueue_many(items)
    u0 = _evalsha_us(r)
    held = claim_all(k, scripts.claim, BATCH, 600_000, n)
    u1 = _evalsha_us(r)
    complete_all(k, scripts.complete, held, BATCH)
    u2 = _evalsha_us(r)
    r.close()
    app.close()
    # each claim loop ends with one empty call per partition: negligible next to n runs
    return {"enqueue_us": (u0 - e0) / n, "claim_us": (u1 - u0) / n, "complete_us": (u2 - u1) / n}


def held_round(url: str, n: int = 10_000, calls: int = 200, lua_dir: Path | None = None) -> float:
    """µs of one claim call that finds tenant t0's concurrency limit (10) full."""
    app.configure(redis_url=url, namespace=f"bh{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    app.store.ready()
    scripts: Any = Scripts(r) if lua_dir is None else _Copy(r, lua_dir)
    k = app.keys
    app.set_limit("tenant", "t0", concurrency=10)
    app.enqueue_many([{"task": noop, "args": [i], "tenant": "t0"} for i in range(n)])
    p = k.partition_of_tenant("t0")
    keys, args = tr.claim(k, p, "default", "bench:1", BATCH, 600_000)
    assert len(tr.parse_claim(scripts.claim(keys=keys, args=args)).runs) == 10
    u0 = _evalsha_us(r)
    for _ in range(calls):
        assert not tr.parse_claim(scripts.claim(keys=keys, args=args)).runs
    u1 = _evalsha_us(r)
    r.close()
    app.close()
    return (u1 - u0) / calls


def _worker(url: str, ns: str, concurrency: int = 100) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    return subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                             "--app", "bench.apps:app", "--concurrency", str(concurrency)],
                            env=env)


def _done(r: redis.Redis) -> int:
    pipe = r.pipeline(transaction=False)
    for p in range(app.keys.partitions):
        pipe.zcard(app.keys.done(p))
    return sum(pipe.execute())


def _wait(pred: Callable[[], bool], timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("bench round did not finish")
        time.sleep(0.005)


def drain_round(url: str, scenario: str, n: int) -> float:
    ns = f"bd{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    r = redis.Redis.from_url(url)
    app.store.ready()
    _limits(scenario)
    app.enqueue_many(_items(scenario, n))
    proc = _worker(url, ns)
    try:
        _wait(lambda: _done(r) >= n)
    finally:
        proc.terminate()
        proc.wait(30)
    pipe = r.pipeline(transaction=False)
    for p in range(app.keys.partitions):
        pipe.zrange(app.keys.done(p), 0, 0, withscores=True)
        pipe.zrange(app.keys.done(p), -1, -1, withscores=True)
    heads = [x[0][1] for x in pipe.execute() if x]
    r.close()
    app.close()
    return n / ((max(heads) - min(heads)) / 1000)


def fair_round(url: str, backlog: int, same: bool) -> dict[str, float]:
    """`same`: the small tenant shares the big one's home partition (tenant lanes decide);
    else it lives in another partition (the worker's order decides)."""
    ns = f"bf{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    r = redis.Redis.from_url(url)
    app.store.ready()
    k = app.keys
    home = k.partition_of_tenant("big")
    small_t = next(t for t in (f"s{i}" for i in range(10_000))
                   if (k.partition_of_tenant(t) == home) == same)
    for i in range(0, backlog, 20_000):
        app.enqueue_many([{"task": noop, "args": [j], "tenant": "big"}
                          for j in range(i, min(backlog, i + 20_000))])
    proc = _worker(url, ns)
    try:
        _wait(lambda: _done(r) >= 1000)
        small = [app.enqueue(noop, [i], tenant=small_t) for i in range(10)]
        _wait(lambda: all(app.get_run(i).state == "succeeded" for i in small), 60)
        left = backlog - _done(r) + 10
    finally:
        proc.terminate()
        proc.wait(30)
    waits = [to_ms(run.started) - to_ms(run.created) for run in map(app.get_run, small)]
    r.flushdb()
    r.close()
    app.close()
    return {"max_wait_ms": max(waits), "median_wait_ms": statistics.median(waits),
            "big_left": left}


def hot_round(url: str, lua_dir: Path, n: int) -> tuple[float, float]:
    """(claim, complete) EVALSHA µs per run of runs without limits, with `lua_dir`'s scripts."""
    app.configure(redis_url=url, namespace=f"bo{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    app.store.ready()
    k = app.keys
    claim = r.register_script(script_cost._source(lua_dir, "claim"))
    complete = r.register_script(script_cost._source(lua_dir, "complete"))
    # the reply's header is 3 values before limits (then 11 per run); this version's reply
    # is read by parse_claim
    def decode(res: Any) -> list[tuple[str, int]]:
        if lua_dir.resolve() == script_cost.LUA:
            return [(c.run_id, c.fence) for c in tr.parse_claim(res).runs]
        return [(res[i].decode(), int(res[i + 1])) for i in range(3, len(res), 11)]

    app.enqueue_many([(noop, [i]) for i in range(n)])
    u0 = _evalsha_us(r)
    held = claim_all(k, claim, BATCH, 600_000, n, decode)
    u1 = _evalsha_us(r)
    complete_all(k, complete, held, BATCH)
    u2 = _evalsha_us(r)
    r.flushdb()
    r.close()
    app.close()
    return (u1 - u0) / n, (u2 - u1) / n


def hot_path(args: argparse.Namespace) -> None:
    dirs = [args.before, script_cost.LUA]
    res: dict[Path, list[tuple[float, float]]] = {d: [] for d in dirs}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for d in dirs:
                res[d].append(hot_round(server.url, d, args.runs))
    print(f"server={args.server} runs={args.runs} batch={BATCH} rounds={args.rounds} "
          "(EVALSHA µs per run, medians; no limit, no tenant, no priority)")
    for d, rounds in res.items():
        cl, co = (statistics.median(x) for x in zip(*rounds, strict=True))
        print(f"{str(d):40s} claim {cl:6.2f}  complete {co:6.2f}  total {cl + co:6.2f}")


def compare(args: argparse.Namespace) -> None:
    """Claim cost per run of each scenario, and of a claim meeting a full limit, for each copy
    of lua/, interleaved on one server; with each round's ratio to the first copy (paired: the
    load the machine had then cancels), and their median."""
    dirs: list[Path] = args.compare
    cost: dict[tuple[str, Path], list[float]] = {(s, d): [] for s in SCENARIOS for d in dirs}
    held: dict[Path, list[float]] = {d: [] for d in dirs}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for s in SCENARIOS:
                for d in dirs:
                    cost[s, d].append(script_round(server.url, s, args.runs, d)["claim_us"])
            for d in dirs:
                held[d].append(held_round(server.url, lua_dir=d))
    print(f"server={args.server} runs={args.runs} batch={BATCH} rounds={args.rounds} "
          "(claim EVALSHA µs per run, medians; paired ratio to the first copy)")
    rows = [(s, {d: cost[s, d] for d in dirs}) for s in SCENARIOS] + [("held call", held)]
    for name, by_dir in rows:
        cells = []
        for d in dirs:
            ratios = [b / a for a, b in zip(by_dir[dirs[0]], by_dir[d], strict=True)]
            cells.append(f"{statistics.median(by_dir[d]):8.2f} (x{statistics.median(ratios):.3f})")
        print(f"{name:12s} " + "  ".join(cells))
    print("copies: " + ", ".join(str(d) for d in dirs))


def main() -> None:
    ap = parser(runs=20_000, backlog=100_000, rounds=3)
    ap.add_argument("--before", type=Path, default=None,
                    help="a copy of lua/ to compare the no-limit hot path with")
    ap.add_argument("--compare", type=Path, nargs="+", default=None, metavar="LUA_DIR",
                    help="copies of lua/ whose claim cost per scenario to compare, interleaved")
    args = ap.parse_args()
    if args.before is not None:
        hot_path(args)
        return
    if args.compare is not None:
        compare(args)
        return
    cost: dict[str, list[dict[str, float]]] = {s: [] for s in SCENARIOS}
    drain: dict[str, list[float]] = {s: [] for s in SCENARIOS}
    held: list[float] = []
    fair: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for s in SCENARIOS:  # interleaved: the machine's noise hits every scenario
                cost[s].append(script_round(server.url, s, args.runs))
            held.append(held_round(server.url))
        for _ in range(args.rounds):
            for s in SCENARIOS:
                drain[s].append(drain_round(server.url, s, args.runs))
        for _ in range(args.rounds):
            for same in (False, True):
                fair[same].append(fair_round(server.url, args.backlog, same))
    print(f"server={args.server} runs={args.runs} batch={BATCH} rounds={args.rounds} (medians)")
    base = statistics.median(x["claim_us"] for x in cost["none"])
    base_drain = statistics.median(drain["none"])
    print(f"{'scenario':12s} {'enqueue µs/run':>15s} {'claim µs/run':>13s} {'vs none':>8s}"
          f" {'complete µs/run':>16s} {'drain runs/s':>13s} {'vs none':>8s}")
    for s in SCENARIOS:
        e = statistics.median(x["enqueue_us"] for x in cost[s])
        c = statistics.median(x["claim_us"] for x in cost[s])
        co = statistics.median(x["complete_us"] for x in cost[s])
        d = statistics.median(drain[s])
        print(f"{s:12s} {e:15.2f} {c:13.2f} {c / base:8.2f} {co:16.2f} {d:13,.0f}"
              f" {d / base_drain:8.2f}")
    print(f"claim call finding a tenant's concurrency limit full: {statistics.median(held):.1f} µs")
    for same, got in fair.items():
        rounds = ", ".join(f"{x['max_wait_ms']:.0f}" for x in got)
        where = "its partition" if same else "another partition"
        print(f"fair share, backlog {args.backlog:,} of tenant big, 10 runs of a tenant in "
              f"{where}: max wait {statistics.median(x['max_wait_ms'] for x in got):.0f} ms "
              f"(rounds: {rounds}), median wait "
              f"{statistics.median(x['median_wait_ms'] for x in got):.0f} ms, big still had "
              f"{statistics.median(x['big_left'] for x in got):,.0f} runs waiting")


if __name__ == "__main__":
    main()
