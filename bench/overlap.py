"""Overlap `buffer_one`: how soon a buffered run starts after the run it waited for ended.
A schedule fires every second a task that runs longer (2.3 s); one scheduler and one worker
process; the gap is the buffered run's own first instant minus its predecessor's last one
(the same machine's clock). The integration test (tests/integration/test_schedules.py) checks
the order only; this measures the delay it used to bound (< 0.5 s).

    .venv/bin/python -m bench.overlap --seconds 12 --repeat 3
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import duetime
from bench.drive import parser, repeated
from bench.stats import percentile
from tests.apps import basic


def one_round(url: str, seconds: float) -> dict[str, float]:
    ns = f"ovl{uuid.uuid4().hex[:6]}"
    app = basic.app
    app.configure(redis_url=url, namespace=ns)
    app.schedule("ovl", duetime.Every(timedelta(seconds=1)), basic.sched_slow, args=[2.3],
                 overlap="buffer_one")
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns}
    cmd = [sys.executable, "-m", "duetime", "--log-level", "WARNING"]
    procs = [subprocess.Popen([*cmd, "scheduler", "--lead", "300ms"], env=env),
             subprocess.Popen([*cmd, "worker", "--app", "tests.apps.basic:app",
                               "--concurrency", "8"], env=env)]
    time.sleep(seconds)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)
    iv = []
    for raw in basic.r().lrange(basic.intervals_key(), 0, -1):
        _, start, end = raw.decode().split("|")
        iv.append((float(start), float(end)))
    iv.sort()
    gaps = [(b[0] - a[1]) * 1000 for a, b in zip(iv, iv[1:], strict=False)]
    app.close()
    return {"runs": float(len(iv)), "gap_p50_ms": percentile(gaps, 50),
            "gap_max_ms": max(gaps) if gaps else float("nan"),
            "overlaps": float(sum(1 for g in gaps if g < 0))}


def main() -> None:
    args = parser(seconds=12.0, repeat=3).parse_args()
    repeated(args, lambda url: one_round(url, args.seconds),
             f"server={args.server} seconds={args.seconds} repeat={args.repeat}")


if __name__ == "__main__":
    main()
