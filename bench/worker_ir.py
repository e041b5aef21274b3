"""The worker's instructions per run, counted by valgrind (callgrind): N no-op runs enqueued on a
fresh `redis-server`, then one `duetime worker` process of each tree given, run under callgrind,
drains them; its counters are zeroed at the first finished run and dumped at the last, so
start-up and shutdown are left out. Instructions are what the worker's Python costs whatever
else the machine runs: its CPU time in `bench.throughput` moves by ±20 % between rounds on a
shared 2-core box, these by about 1 %. (The worker runs ~50x slower under valgrind: it finds
each claim full, as a busy worker does; its system calls are not counted.)

    .venv/bin/python -m bench.worker_ir [--runs 6000] [--concurrency 100] [TREE ...]

Each TREE is a checkout with its own `.venv` (this tree by default; another:
`git worktree add --detach /tmp/base <commit>`, then a venv with `pip install -e .` in it).
Prints thousands of instructions per run for each, and each relative to the first. Needs
`valgrind` and `redis-server` on PATH.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis

from bench.apps import app, noop
from bench.script_ir import _free_port
from bench.throughput import finished, wait_done

ROOT = Path(__file__).resolve().parent.parent


def one_tree(tree: Path, runs: int, concurrency: int) -> float:
    """Instructions per run of `tree`'s worker draining `runs` no-op runs."""
    port = _free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = Path(tempfile.mkdtemp(prefix="duetime-worker-ir-"))
    worker: subprocess.Popen[bytes] | None = None
    try:
        url = f"redis://127.0.0.1:{port}/0"
        r = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        ns = f"wir{uuid.uuid4().hex[:6]}"
        app.configure(redis_url=url, namespace=ns)
        app.enqueue_many([(noop, [i]) for i in range(runs)])
        done_keys = [app.keys.done(p) for p in range(app.keys.partitions)]
        env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
        worker = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dumps}/cg.%p",
             str(tree / ".venv/bin/python"), "-m", "duetime", "--log-level", "WARNING",
             "worker", "--app", "bench.apps:app", "--concurrency", str(concurrency)],
            env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        limit = time.monotonic() + 600 + runs / 20  # ~50x slower than the worker alone
        wait_done(r, done_keys, 1, poll_s=0.1, deadline=limit)
        subprocess.run(["callgrind_control", "-z", str(worker.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = finished(r, done_keys)
        wait_done(r, done_keys, runs, poll_s=0.1, deadline=limit)
        subprocess.run(["callgrind_control", "-d", str(worker.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # the dump after the zeroing: the drain from `first` on
        [dump] = dumps.glob("cg.*.1")
        m = re.search(r"^summary: (\d+)", dump.read_text(errors="replace"), re.M)
        assert m is not None, f"no summary in {dump}"
        app.close()
        return int(m.group(1)) / (runs - first)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
        server.terminate()
        server.wait(30)
        shutil.rmtree(dumps, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    args = ap.parse_args()
    res = {t: one_tree(t.resolve(), args.runs, args.concurrency) for t in args.trees}
    print(f"one worker process under callgrind, runs={args.runs} "
          f"concurrency={args.concurrency} (thousands of instructions per run)")
    first = res[args.trees[0]]
    for t, ir in res.items():
        print(f"{str(t):40s} {ir / 1e3:7.1f}  ({ir / first:.3f} of the first)")


if __name__ == "__main__":
    main()
