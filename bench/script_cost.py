"""Redis CPU per run of the hot scripts, driven directly (no worker): enqueue N runs with
enqueue_many, claim them all in batches, acknowledge them all in batches; INFO cpu deltas per
phase. Give several copies of `lua/` to compare script variants on one server, interleaved
(enqueue, claim and complete all come from each copy; enqueue is driven as the client sends it,
200 random ids per call, marked fresh for a copy whose enqueue.lua reads that mark).
With several copies it also prints each round's claim cost relative to the first copy's in the
same round, and their median: on a loaded machine that paired ratio is the steadier figure.
Each round also sizes what a retained finished run costs in memory: the server's used_memory
growth over the round's N finished runs (run hash, attempts key, index entries), per run.

    .venv/bin/python -m bench.script_cost [--runs 20000] [--batch 50] [--rounds 5] [--payload B]
        [--retained N] [LUA_DIR ...]

`--results` instead compares completing with and without a stored result (a task's return
value kept on its run for `wait`), interleaved on one server: Redis CPU and memory per run.
`--guard` compares the claim and complete scripts with and without their resharding check
(common/scripts.py SLOT_GUARD), interleaved; `--batch 1` shows its cost per script call.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import uuid
from pathlib import Path
from typing import Any

import redis
from duetime.common import scripts
from duetime.common import transitions as tr
from duetime.common.codec import pack_payload, pack_result

from bench.apps import app, noop
from bench.drive import claim_all, fences, parser
from duetime.client.runs import task_fields
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
    """(run id, fence, bare) of each run of a claim reply of `lua_dir`'s claim.lua, however
    many fields per run its copy replies (claim/lease.lua's `out[o + N]` lines; the reply grew,
    then shrank to 8 with the optional fields nested, `bare` the last of them). `bare` is what
    the worker passes back to complete.lua (False for copies before it)."""
    lease = lua_dir / "claim" / "lease.lua"
    if not lease.exists():
        return lambda res: [(i, f, False) for i, f in fences(res)]
    text = lease.read_text()
    width = max(int(m) for m in re.findall(r"out\[o \+ (\d+)\]", text))
    if re.search(r"-- head$", text, re.M):  # fence, attempt, ready, id in one value: parse_claim
        return lambda res: [(c.run_id, c.fence, c.bare) for c in tr.parse_claim(res).runs]
    nested = width == 8 and "-- bare" in text

    def decode(res: Any) -> list[tuple[str, int, bool]]:
        return [(res[i].decode(), int(res[i + 1]),
                 nested and (not res[i + width - 1] or res[i + width - 1][-1] == b"1"))
                for i in range(tr.CLAIM_HEADER, len(res), width)]

    return decode


def _cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6


# what a report task might return: small, like most results (a count, a path, a flag)
RESULT = pack_result({"rows": 1234, "path": "s3://reports/2026-12-01/daily.csv", "ok": True})


def _payload(i: int, size: int) -> bytes:
    """Run i's packed arguments: `[i]` (3 bytes), or padded with a string argument to about
    `size` bytes (a record field over 64 bytes turns a listpack hash into a hash table)."""
    bare = pack_payload([i], {})
    if size <= len(bare):
        return bare
    return pack_payload([i, "x" * max(0, size - len(bare) - 3)], {})


def _enqueue_all(r: redis.Redis, lua_dir: Path, n: int, payload: int = 0) -> None:
    """n runs of `noop`, as enqueue_many sends them: one enqueue.lua call per 200 runs of a
    partition; a copy before the `fresh` mark (ARGV[5]) gets its older argument list."""
    src = _source(lua_dir, "enqueue")
    enqueue = r.register_script(src)
    fresh = "ARGV[5] fresh" in src
    forms = "the runs' form" in src  # a copy that reads the plain form (2 values per run)
    k = app.keys
    shared = task_fields(noop.spec, "default")
    entropy = os.urandom(10 * n).hex()
    by_p: dict[int, list[tuple[str, str, int, list[Any]]]] = {}
    for i in range(n):
        rid = entropy[20 * i : 20 * i + 20]
        by_p.setdefault(k.partition_of_run(rid), []).append(
            (rid, "", 0, ["payload", _payload(i, payload)]))
    pipe, created, calls = r.pipeline(transaction=False), 0, 0
    for p, runs in by_p.items():
        for j in range(0, len(runs), 200):
            keys, args = tr.enqueue(k, p, "default", shared, runs[j : j + 200], fresh=fresh,
                                    forms=forms)
            if not fresh:
                del args[4]
            enqueue(keys=keys, args=args, client=pipe)
            calls += 1
            if calls % 10 == 0:  # a round trip per 2,000 runs, as enqueue_many sends them
                created += sum(pipe.execute())
    assert created + sum(pipe.execute()) == n


def one_round(url: str, lua_dir: Path, n: int, batch: int, result: bytes = b"",
              memory: list[float] | None = None, meter: Any = None,
              payload: int = 0, retained: int = 0,
              ) -> tuple[float, float, float, float]:
    """(enqueue, claim, complete) Redis CPU µs per run, and the used_memory growth per
    finished run (bytes). With `memory`, appends the mean MEMORY USAGE of a finished run's
    record (500 sampled; a result changes nothing else: the indexes hold the same entries
    either way). `meter(r)`: the server's cumulative cost counter (default: its CPU µs).
    `payload`: each run's packed arguments padded to about that many bytes (0: 3 bytes).
    `retained`: that many runs go through their whole life first, unmeasured, so the
    measured runs meet a namespace in service (its done sets past their listpack size, as
    retained finished runs make them) rather than an empty one."""
    app.configure(redis_url=url, namespace=f"sc{uuid.uuid4().hex[:6]}")
    r = redis.Redis.from_url(url)
    meter = meter or _cpu_us
    app.store.ready()
    claim = r.register_script(_source(lua_dir, "claim"))
    complete_src = _source(lua_dir, "complete")
    complete = r.register_script(complete_src)
    # copies before the `bare` mark read 4 values per run, before the report-fault field 3;
    # a copy with the forms (ARGV[4]) is sent what the worker sends
    forms = "ARGV[4] form" in complete_src
    per_run = 5 if forms else next((n for n in (5, 4) if f"#ARGV, {n} do" in complete_src), 3)
    k = app.keys

    def complete_all(held: dict[int, list[Any]]) -> None:
        for p, items in held.items():
            for i in range(0, len(items), batch):
                # every run here is a first attempt: the mark '1' (bare) is what every copy since
                # the mark reads, a first attempt's too
                done = [(run_id, fence, result, "", bare, 1)
                        for run_id, fence, bare in items[i : i + batch]]
                keys, args = tr.complete(k, p, done, forms=forms)
                if per_run < 5:  # an older copy: its values per run, the first of the five
                    args = args[:3] + [a for j, a in enumerate(args[3:]) if j % 5 < per_run]
                assert set(complete(keys=keys, args=args)) <= {b"succeeded", b"ok"}  # ok: old

    if retained:
        _enqueue_all(r, lua_dir, retained, payload)
        complete_all(claim_all(k, claim, batch, 60_000, retained, _decoder(lua_dir)))
    m0 = r.info("memory")["used_memory"]
    c0 = meter(r)
    _enqueue_all(r, lua_dir, n, payload)
    c1 = meter(r)
    held = claim_all(k, claim, batch, 60_000, n, _decoder(lua_dir))
    c2 = meter(r)
    complete_all(held)
    c3 = meter(r)
    grown = (r.info("memory")["used_memory"] - m0) / n
    if memory is not None:
        sample = [(p, run_id) for p, items in held.items() for run_id, *_ in items][:: max(1, n // 500)]
        memory.append(statistics.mean(r.memory_usage(k.run(p, run_id), samples=0)
                                      for p, run_id in sample))
    r.flushall()
    r.close()
    app.close()
    return (c1 - c0) / n, (c2 - c1) / n, (c3 - c2) / n, grown


def _state_args(ap: argparse.ArgumentParser) -> None:
    """What the measured runs meet: their payload's size and the finished runs already kept."""
    ap.add_argument("--payload", type=int, default=0,
                    help="bytes of each run's packed arguments (default: 3); over 64 the run "
                         "hash is a hash table, not a listpack")
    ap.add_argument("--retained", type=int, default=0,
                    help="finished runs kept in the namespace before the measured ones (a "
                         "namespace in service; default: none, an empty namespace)")


def main() -> None:
    ap = parser(runs=20000, batch=50, rounds=5)
    ap.add_argument("--results", action="store_true",
                    help="compare completing with and without a stored result")
    ap.add_argument("--guard", action="store_true",
                    help="compare the scripts with and without their resharding check")
    _state_args(ap)
    ap.add_argument("lua_dirs", nargs="*", type=Path, default=[LUA])
    args = ap.parse_args()
    if args.results:
        results(args)
        return
    if args.guard:
        guard(args)
        return
    res: dict[Path, list[tuple[float, float, float, float]]] = {d: [] for d in args.lua_dirs}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for d in args.lua_dirs:  # interleaved: the machine's noise hits every variant
                res[d].append(one_round(server.url, d, args.runs, args.batch,
                                        payload=args.payload, retained=args.retained))
    print(f"server={args.server} runs={args.runs} batch={args.batch} rounds={args.rounds}"
          f" payload={args.payload or 3} B retained={args.retained}"
          " (Redis CPU µs per run, medians)")
    first = args.lua_dirs[0]
    for d, rounds in res.items():
        enq, cl, co, mem = (statistics.median(c) for c in zip(*rounds, strict=True))
        print(f"{str(d):40s} enqueue {enq:6.2f}  claim {cl:6.2f}  complete {co:6.2f}"
              f"  total {enq + cl + co:6.2f}  memory/finished run {mem:6.0f} B")
    for d in args.lua_dirs[1:]:
        # paired: each round's variants ran back to back, so a round's ratio cancels the load
        # the machine had then (medians of independent rounds do not)
        for name, col in (("enqueue", 0), ("claim", 1), ("complete", 2)):
            ratios = [b[col] / a[col] for a, b in zip(res[first], res[d], strict=True)]
            print(f"{name} {d} / {first}, per round: " + " ".join(f"{x:.3f}" for x in ratios)
                  + f"; median {statistics.median(ratios):.3f}")
        totals = [sum(b[:3]) / sum(a[:3]) for a, b in zip(res[first], res[d], strict=True)]
        print(f"total {d} / {first}, per round: " + " ".join(f"{x:.3f}" for x in totals)
              + f"; median {statistics.median(totals):.3f}")


def guard(args: argparse.Namespace) -> None:
    variants = {"with the guard": scripts.SLOT_GUARD, "without": ""}
    res: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in variants}
    with EmbeddedServer(args.server) as server:
        for _ in range(args.rounds):
            for name, text in variants.items():  # `_source` assembles with the current guard
                scripts.SLOT_GUARD = text
                res[name].append(one_round(server.url, LUA, args.runs, args.batch))
    scripts.SLOT_GUARD = variants["with the guard"]
    print(f"server={args.server} runs={args.runs} batch={args.batch} rounds={args.rounds}"
          " (Redis CPU µs per run, medians)")
    for name, rounds in res.items():
        _, cl, co, _ = (statistics.median(c) for c in zip(*rounds, strict=True))
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
