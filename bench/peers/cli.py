"""`python -m bench.peers.cli <system> <command> [arg]`, run inside the system's virtualenv.

Commands (each prints one JSON object on its last stdout line):
  describe              versions' sources, settings, the enqueue path, the documented knobs
  enqueue-burst N [F]   enqueue N no-op jobs numbered F..F+N-1 (F=0) by the fastest documented path
  enqueue-at FILE       FILE: JSON list of epoch instants; job k is due at instants[k]
  enqueue-long SECONDS  one job number 0 that runs SECONDS (W3), with the mode's settings
  register-schedules N E  W5: N schedules, numbers 0..E-1 fire every minute, the rest yearly
  argv WORKLOAD         the worker's command line(s) for the workload: {"procs": [[...], ...]}
                        (W5: the scheduler process first)
  run-worker            for adapters whose documented entry is a Python call (arq)
"""

from __future__ import annotations

import importlib
import json
import sys
import time


def main() -> None:
    system, command, *rest = sys.argv[1:]
    mod = importlib.import_module(f"bench.peers.{system}")
    out: dict = {}
    if command == "describe":
        out = mod.describe()
    elif command == "enqueue-burst":
        n, first = int(rest[0]), int(rest[1]) if len(rest) > 1 else 0
        t0 = time.perf_counter()
        mod.enqueue_burst(n, first)
        out = {"seconds": time.perf_counter() - t0, "n": n}
    elif command == "enqueue-at":
        with open(rest[0]) as f:
            instants = json.load(f)
        t0 = time.perf_counter()
        mod.enqueue_at(instants)
        out = {"seconds": time.perf_counter() - t0, "n": len(instants)}
    elif command == "enqueue-long":
        mod.enqueue_long(float(rest[0]))
        out = {"enqueued_at": time.time()}
    elif command == "register-schedules":
        n, every = int(rest[0]), int(rest[1])
        t0 = time.perf_counter()
        mod.register_schedules(n, every)
        out = {"seconds": time.perf_counter() - t0, "n": n}
    elif command == "argv":
        out = {"procs": mod.worker_procs(rest[0])}
    elif command == "run-worker":
        mod.run_worker()
        return
    else:
        raise SystemExit(f"unknown command {command!r}")
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
