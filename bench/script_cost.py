"""Redis CPU per run of the hot scripts, driven directly (no worker): enqueue N runs with
enqueue_many, claim them all in batches, acknowledge them all in batches; INFO cpu deltas per
phase. Give several copies of `lua/` to compare script variants on one server, interleaved
(the claim and complete scripts come from each copy; enqueue uses the installed scripts).

    .venv/bin/python -m bench.script_cost [--runs 20000] [--batch 50] [--rounds 5] [LUA_DIR ...]
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from pathlib import Path

import redis
from duetime.common import scripts
from duetime.common import transitions as tr

from bench.apps import app, noop
from duetime.embedded import EmbeddedServer

LUA = Path(__file__).resolve().parent.parent / "lua"


def _source(lua_dir: Path, name: str) -> str:
    """A script of `lua_dir` as the installed code would assemble it; a copy of `lua/` from
    before per-script helpers and K.<kind> keys (no `K.` in it) is assembled as it was then:
    all of _lib.lua prepended."""
    lib, body = (lua_dir / "_lib.lua").read_text(), (lua_dir / f"{name}.lua").read_text()
    if "K." not in lib + body:
        return lib + "\n" + body
    return scripts.assemble(name, lib, body)


def _cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6


def one_round(url: str, lua_dir: Path, n: int, batch: int) -> tuple[float, float, float]:
    """(enqueue, claim, complete) Redis CPU µs per run. Enqueue uses the installed scripts."""
    app.configure(redis_url=url, namespace=f"sc{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    app.store.ready()
    claim = r.register_script(_source(lua_dir, "claim"))
    complete = r.register_script(_source(lua_dir, "complete"))
    k = app.keys
    c0 = _cpu_us(r)
    app.enqueue_many([(noop, [i]) for i in range(n)])
    c1 = _cpu_us(r)
    held: dict[int, list[tuple[str, int]]] = {}
    for p in range(k.partitions):
        while True:
            keys, args = tr.claim(k, p, "default", "bench:1", batch, 60_000)
            runs = tr.parse_claim(claim(keys=keys, args=args)).runs
            if not runs:
                break
            held.setdefault(p, []).extend((c.run_id, c.fence) for c in runs)
    c2 = _cpu_us(r)
    assert sum(len(v) for v in held.values()) == n, "not every run was claimed"
    for p, items in held.items():
        for i in range(0, len(items), batch):
            keys, args = tr.complete(k, p, items[i : i + batch])
            assert set(complete(keys=keys, args=args)) <= {b"succeeded", b"ok"}  # ok: old copies
    c3 = _cpu_us(r)
    r.flushall()
    r.close()
    app.close()
    return (c1 - c0) / n, (c2 - c1) / n, (c3 - c2) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--server", choices=["redis", "valkey"], default="redis")
    ap.add_argument("lua_dirs", nargs="*", type=Path, default=[LUA])
    args = ap.parse_args()
    res: dict[Path, list[tuple[float, float, float]]] = {d: [] for d in args.lua_dirs}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for d in args.lua_dirs:  # interleaved: the machine's noise hits every variant
                res[d].append(one_round(server.url, d, args.runs, args.batch))
    print(f"server={args.server} runs={args.runs} batch={args.batch} rounds={args.rounds}"
          " (Redis CPU µs per run, medians)")
    for d, rounds in res.items():
        enq, cl, co = (statistics.median(c) for c in zip(*rounds, strict=True))
        print(f"{str(d):40s} enqueue {enq:6.2f}  claim {cl:6.2f}  complete {co:6.2f}"
              f"  total {enq + cl + co:6.2f}")


if __name__ == "__main__":
    main()
