"""W2-style precision: N runs due at instants spread over a window, one worker process;
start lateness (the task's own first instant minus its due time; the embedded server shares
this machine's clock) percentiles, early starts. The due time is the instant asked for, to
the microsecond (namespace format 4).

    .venv/bin/python -m bench.precision --runs 1000 --window 10 --repeat 3 [--wrap "chrt -f 10"]

--wrap runs the worker under a command (a scheduling policy: `chrt -f 10` for SCHED_FIFO,
`nice -n -10`), to tell the worker's own delays from the kernel's handing it a CPU late.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import redis

from bench.apps import app, stamp
from bench.drive import parser, repeated
from bench.stats import percentile


def one_round(url: str, n: int, window: float, wrap: str = "") -> dict[str, float]:
    ns = f"prec{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    r = redis.Redis.from_url(url)
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    proc = subprocess.Popen([*shlex.split(wrap), sys.executable, "-m", "duetime", "--log-level",
                             "WARNING", "worker", "--app", "bench.apps:app", "--concurrency", "64"],
                            env=env)
    time.sleep(1.0)  # the worker is up and idle before the first run is due
    sec, usec = r.time()
    start = datetime.fromtimestamp(sec + usec / 1e6, tz=UTC) + timedelta(seconds=1)
    ids = app.enqueue_many([{"task": stamp, "args": [i],
                             "at": start + timedelta(seconds=window * i / n)} for i in range(n)])
    deadline = time.monotonic() + window + 30
    while time.monotonic() < deadline:
        if all(app.get_run(i).state == "succeeded" for i in ids[-5:]):
            break
        time.sleep(0.2)
    stamps = {k.decode(): float(v) for k, v in
              redis.Redis.from_url(url, db=1).hgetall(f"{ns}:stamps").items()}
    lateness = [stamps[i] - app.get_run(i).due.timestamp() * 1000 for i in ids if i in stamps]
    proc.terminate()
    proc.wait(30)
    app.close()
    return {"p50_ms": percentile(lateness, 50), "p95_ms": percentile(lateness, 95),
            "p99_ms": percentile(lateness, 99), "max_ms": max(lateness),
            "early": float(sum(1 for x in lateness if x < 0)),
            "not_run": float(len(ids) - len(lateness))}


def main() -> None:
    ap = parser(runs=1000, window=10.0, repeat=3)
    ap.add_argument("--wrap", default="", help="run the worker under this command")
    args = ap.parse_args()
    repeated(args, lambda url: one_round(url, args.runs, args.window, args.wrap),
             f"server={args.server} runs={args.runs} window={args.window}s repeat={args.repeat}"
             + (f" worker under {args.wrap!r}" if args.wrap else ""))

if __name__ == "__main__":
    main()
