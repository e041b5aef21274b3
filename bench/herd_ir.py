"""The worker's instructions per body started when a herd is released, counted by valgrind
(callgrind): N runs due at one instant, claimed ahead by one in-process worker, which holds them
and releases them together (worker/execution.py `_release`). Counting is on from the moment the
held attempts are queued until the last body of the herd has started (`_after_release`), so
the claims before and the reports after are left out. Instructions are the herd's cost whatever
else the machine runs: the wall-clock herd of `bench.schedules --herd` moves by ±40 % between
rounds on a shared 2-core box, these by well under 1 %. (The worker runs ~50x slower under
valgrind: the runs are due LEAD seconds after the enqueue.)

    .venv/bin/python -m bench.herd_ir [--runs 2000] [--lead 30] [TREE ...]

Each TREE is a checkout with its own `.venv` (this tree by default; another:
`git worktree add --detach /tmp/base <commit>`, then a venv with `pip install -e .` in it).
Prints instructions per body for each, and each relative to the first. Needs `valgrind`
(with its headers, for the toggle), `gcc` and `redis-server` on PATH.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# CALLGRIND_TOGGLE_COLLECT is a client request (a magic instruction sequence), only reachable
# from C: a one-function library the child calls through ctypes at the two edges of the herd.
TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"


def child(runs: int, url: str, lead_s: float, toggle: str) -> None:
    """Run inside the tree's own Python (imports only duetime): enqueue the herd, serve it with
    one Worker, count from the release to the last body started."""
    import asyncio
    import ctypes
    import uuid
    from datetime import UTC, datetime, timedelta

    from duetime.common.connection import sync_client
    from duetime.worker.runtime import Worker, WorkerConfig

    import duetime

    lib = ctypes.CDLL(toggle)
    app = duetime.App()
    started: list[int] = []

    @app.task(name="herd_ir.body")
    async def body(i: int = 0) -> None:
        started.append(i)

    app.configure(redis_url=url, namespace=f"hir{uuid.uuid4().hex[:6]}")
    sec, usec = sync_client(url).time()
    at = datetime.fromtimestamp(sec + usec / 1e6, tz=UTC) + timedelta(seconds=lead_s)
    app.enqueue_many([{"task": body, "args": [i], "at": at} for i in range(runs)])
    ahead = int(lead_s * 1000) + 5000
    w = Worker(app.registry, url, app.keys, WorkerConfig(
        queues=["default"], concurrency=runs, claim_ahead_ms=ahead, lease_ms=ahead * 4))
    submit, after = w.executor.runners.submit_held, w.executor._after_release
    released: list[int] = []

    def counted_submit(items: list) -> None:  # type: ignore[type-arg]
        released.append(len(items))
        lib.cg_toggle()
        submit(items)

    def counted_after(*a: object) -> None:
        lib.cg_toggle()
        after(*a)  # type: ignore[arg-type]

    w.executor.runners.submit_held = counted_submit  # type: ignore[method-assign]
    w.executor._after_release = counted_after  # type: ignore[method-assign]
    asyncio.run(w.run(handle_signals=False, until_idle=True))
    app.close()
    # one release of the whole herd, or the count is not the herd's
    print(f"released {released} started {len(started)}")


def one_tree(tree: Path, runs: int, lead_s: float, toggle: Path) -> float:
    from duetime.embedded import EmbeddedServer

    with EmbeddedServer("redis") as server, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        p = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no",
             f"--callgrind-out-file={out}", str(tree / ".venv/bin/python"), __file__, "--child",
             str(runs), server.url, str(lead_s), str(toggle)],
            cwd=tree, capture_output=True, text=True, timeout=900)
        if f"released [{runs}] started {runs}" not in p.stdout:
            raise SystemExit(f"{tree}: the herd was not released whole (claims too slow under "
                             f"valgrind? raise --lead):\n{p.stdout[-500:]}\n{p.stderr[-1500:]}")
        m = re.search(r"Collected : (\d+)", p.stderr)
        assert m is not None, p.stderr[-1000:]
        return int(m.group(1)) / runs


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        runs, url, lead, toggle = sys.argv[2:6]
        child(int(runs), url, float(lead), toggle)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--lead", type=float, default=30.0, help="seconds from enqueue to the instant")
    ap.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "toggle.c", Path(tmp) / "toggle.so"
        src.write_text(TOGGLE_C)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
        res = {t: one_tree(t.resolve(), args.runs, args.lead, lib) for t in args.trees}
    print(f"one in-process worker under callgrind, a herd of {args.runs} runs at one instant "
          "(instructions per body, from the release to the last body started)")
    first = res[args.trees[0]]
    for t, ir in res.items():
        print(f"{str(t):40s} {ir:9.0f}  ({ir / first:.3f} of the first)")


if __name__ == "__main__":
    main()
