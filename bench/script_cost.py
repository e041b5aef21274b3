"""Redis CPU per run of the hot scripts, driven directly (no worker): enqueue N runs with
enqueue_many, claim them all in batches, acknowledge them all in batches; INFO cpu deltas per
phase. Give several copies of `lua/` to compare script variants on one server, interleaved
(the claim and complete scripts come from each copy; enqueue uses the installed scripts).
With several copies it also prints each round's claim cost relative to the first copy's in the
same round, and their median: on a loaded machine that paired ratio is the steadier figure.

    .venv/bin/python -m bench.script_cost [--runs 20000] [--batch 50] [--rounds 5] [LUA_DIR ...]

`--results` instead compares completing with and without a stored result (a task's return
value kept on its run for `wait`), interleaved on one server: Redis CPU and memory per run.
`--guard` compares the claim and complete scripts with and without their resharding check
(common/scripts.py SLOT_GUARD), interleaved; `--batch 1` shows its cost per script call.
"""

from __future__ import annotations

import argparse
import re
import statistics
import uuid
from pathlib import Path
from typing import Any

import redis
from duetime.common import scripts
from duetime.common import transitions as tr
from duetime.common.codec import pack_result

from bench.apps import app, noop
from bench.drive import claim_all, fences, parser
from duetime.embedded import EmbeddedServer

LUA = Path(__file__).resolve().parent.parent / "lua"


def _source(lua_dir: Path, name: str) -> str:
    """A script of `lua_dir` as the installed code would assemble it; a copy of `lua/` from
    before per-script helpers and K.<kind> keys (no `K.` in it) is assembled as it was then:
    all of _lib.lua prepended."""
    lib, body = (lua_dir / "_lib.lua").read_text(), (lua_dir / f"{name}.lua").read_text()
    if "K." not in lib + body:
        return lib + "\n" + body
    return scripts.assemble(name, lambda f: (lua_dir / f).read_text())


def _decoder(lua_dir: Path) -> Any:
    """(run id, fence) of each run of a claim reply of `lua_dir`'s claim.lua, however many
    fields per run its copy replies (claim/lease.lua's `out[o + N]` lines; the reply grew)."""
    lease = lua_dir / "claim" / "lease.lua"
    if not lease.exists():
        return fences
    width = max(int(m) for m in re.findall(r"out\[o \+ (\d+)\]", lease.read_text()))

    def decode(res: Any) -> list[tuple[str, int]]:
        return [(res[i].decode(), int(res[i + 1])) for i in range(tr.CLAIM_HEADER, len(res), width)]

    return decode


def _cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6


# what a report task might return: small, like most results (a count, a path, a flag)
RESULT = pack_result({"rows": 1234, "path": "s3://reports/2026-12-01/daily.csv", "ok": True})


def one_round(url: str, lua_dir: Path, n: int, batch: int, result: bytes = b"",
              memory: list[float] | None = None) -> tuple[float, float, float]:
    """(enqueue, claim, complete) Redis CPU µs per run. Enqueue uses the installed scripts.
    With `memory`, appends the mean MEMORY USAGE of a finished run's record (500 sampled; a
    result changes nothing else: the indexes hold the same entries either way)."""
    app.configure(redis_url=url, namespace=f"sc{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    app.store.ready()
    claim = r.register_script(_source(lua_dir, "claim"))
    complete_src = _source(lua_dir, "complete")
    complete = r.register_script(complete_src)
    # copies before the report-fault field read 3 values per run, not 4
    per_run = 4 if "#ARGV, 4 do" in complete_src else 3
    k = app.keys
    c0 = _cpu_us(r)
    app.enqueue_many([(noop, [i]) for i in range(n)])
    c1 = _cpu_us(r)
    held = claim_all(k, claim, batch, 60_000, n, _decoder(lua_dir))
    c2 = _cpu_us(r)
    for p, items in held.items():
        for i in range(0, len(items), batch):
            done = [(run_id, fence, result) if result else (run_id, fence)
                    for run_id, fence in items[i : i + batch]]
            keys, args = tr.complete(k, p, done)
            if per_run == 3:
                args = args[:3] + [a for j, a in enumerate(args[3:]) if j % 4 != 3]
            assert set(complete(keys=keys, args=args)) <= {b"succeeded", b"ok"}  # ok: old copies
    c3 = _cpu_us(r)
    if memory is not None:
        sample = [(p, run_id) for p, items in held.items() for run_id, _ in items][:: max(1, n // 500)]
        memory.append(statistics.mean(r.memory_usage(k.run(p, run_id), samples=0)
                                      for p, run_id in sample))
    r.flushall()
    r.close()
    app.close()
    return (c1 - c0) / n, (c2 - c1) / n, (c3 - c2) / n


def main() -> None:
    ap = parser(runs=20000, batch=50, rounds=5)
    ap.add_argument("--results", action="store_true",
                    help="compare completing with and without a stored result")
    ap.add_argument("--guard", action="store_true",
                    help="compare the scripts with and without their resharding check")
    ap.add_argument("lua_dirs", nargs="*", type=Path, default=[LUA])
    args = ap.parse_args()
    if args.results:
        results(args)
        return
    if args.guard:
        guard(args)
        return
    res: dict[Path, list[tuple[float, float, float]]] = {d: [] for d in args.lua_dirs}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for d in args.lua_dirs:  # interleaved: the machine's noise hits every variant
                res[d].append(one_round(server.url, d, args.runs, args.batch))
    print(f"server={args.server} runs={args.runs} batch={args.batch} rounds={args.rounds}"
          " (Redis CPU µs per run, medians)")
    first = args.lua_dirs[0]
    for d, rounds in res.items():
        enq, cl, co = (statistics.median(c) for c in zip(*rounds, strict=True))
        print(f"{str(d):40s} enqueue {enq:6.2f}  claim {cl:6.2f}  complete {co:6.2f}"
              f"  total {enq + cl + co:6.2f}")
    for d in args.lua_dirs[1:]:
        # paired: each round's variants ran back to back, so a round's ratio cancels the load
        # the machine had then (medians of independent rounds do not)
        ratios = [b[1] / a[1] for a, b in zip(res[first], res[d], strict=True)]
        print(f"claim {d} / {first}, per round: "
              + " ".join(f"{x:.3f}" for x in ratios) + f"; median {statistics.median(ratios):.3f}")


def guard(args: argparse.Namespace) -> None:
    variants = {"with the guard": scripts.SLOT_GUARD, "without": ""}
    res: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for name, text in variants.items():  # `_source` assembles with the current guard
                scripts.SLOT_GUARD = text
                res[name].append(one_round(server.url, LUA, args.runs, args.batch))
    scripts.SLOT_GUARD = variants["with the guard"]
    print(f"server={args.server} runs={args.runs} batch={args.batch} rounds={args.rounds}"
          " (Redis CPU µs per run, medians)")
    for name, rounds in res.items():
        _, cl, co = (statistics.median(c) for c in zip(*rounds, strict=True))
        print(f"{name:16s} claim {cl:6.2f}  complete {co:6.2f}  claim + complete {cl + co:6.2f}")


def results(args: argparse.Namespace) -> None:
    variants = {"off": b"", f"on ({len(RESULT)} B)": RESULT}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    mem: dict[str, list[float]] = {v: [] for v in variants}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for name, result in variants.items():
                cpu[name].append(one_round(server.url, LUA, args.runs, args.batch, result,
                                           mem[name])[2])
    print(f"server={args.server} runs={args.runs} batch={args.batch} rounds={args.rounds}"
          " (medians per run: complete.lua Redis CPU µs; a finished run's record, bytes)")
    for name in variants:
        print(f"result {name:12s} complete {statistics.median(cpu[name]):6.2f} µs"
              f"  memory {statistics.median(mem[name]):7.1f} B")


if __name__ == "__main__":
    main()
