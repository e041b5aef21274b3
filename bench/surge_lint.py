"""`duetime schedule lint` at scale, on an embedded Redis: N schedules at one cron expression
(the worst surge: all alike), then the lint's parts timed separately over several rounds --
reading the schedules (pipelined HMGET), walking the triggers (one walk per distinct
expression), the profile, the suggestion -- with no stagger and with a 30 s policy, and the
whole command in-process (`CliRunner`, as an operator runs it, JSON output).

    .venv/bin/python -m bench.surge_lint --schedules 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import time
import uuid

from click.testing import CliRunner
from duetime.common.connection import server_time_ms

import duetime
from bench.apps import app, noop
from bench.stats import percentile
from duetime.cli import main
from duetime.embedded import EmbeddedServer
from duetime.ops.schedule_listing import lint_schedules
from duetime.ops.surge import profile, suggest_stagger, walk

DAY_MS = 86_400_000


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cron", default="0 * * * *")
    ap.add_argument("--max-per-second", type=int, default=500)
    args = ap.parse_args()
    with EmbeddedServer("redis") as server:
        ns = f"sl{uuid.uuid4().hex[:6]}"
        app.configure(redis_url=server.url, namespace=ns)
        app.store.ready()
        t0 = time.perf_counter()
        defs = [app.schedule_def(f"job-{i:06d}", duetime.Cron(args.cron), noop)
                for i in range(args.schedules)]
        app.schedule_many(defs)
        print(f"registered {args.schedules} schedules at {args.cron!r} in {_ms(t0) / 1000:.2f} s")
        times: dict[str, list[float]] = {}
        for policy_ms in (0, 30_000):
            app.schedules.set_stagger_policy(policy_ms)
            for _ in range(args.rounds):
                start = server_time_ms(app.store.client)
                t0 = time.perf_counter()
                scheds, _, _ = lint_schedules(app.schedules)
                t1 = time.perf_counter()
                walks = walk(scheds, start, DAY_MS)
                t2 = time.perf_counter()
                prof = profile(scheds, start, DAY_MS, max_per_second=args.max_per_second,
                               policy_ms=policy_ms, walks=walks)
                t3 = time.perf_counter()
                sugg = suggest_stagger(scheds, start, DAY_MS, max_per_second=args.max_per_second,
                                       policy_ms=policy_ms, peak=prof.peak, walks=walks)
                t4 = time.perf_counter()
                for part, a, b in (("read", t0, t1), ("walk", t1, t2), ("profile", t2, t3),
                                   ("suggest", t3, t4), ("total", t0, t4)):
                    times.setdefault(f"{part} policy={policy_ms // 1000}s", []).append((b - a) * 1000)
            print(f"policy {policy_ms // 1000}s: peak {prof.peak}, over {prof.over}, "
                  f"suggestion {sugg.stagger_ms}")
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                res = CliRunner().invoke(main, ["--redis-url", server.url, "--namespace", ns,
                                                "schedule", "lint", "--max-per-second",
                                                str(args.max_per_second), "--json"])
                assert res.exit_code == 0, res.output
                times.setdefault(f"cli policy={policy_ms // 1000}s", []).append(_ms(t0))
        for key, values in times.items():
            print(f"{key:<22} median {percentile(values, 50):8.1f} ms  "
                  f"(min {min(values):.1f}, max {max(values):.1f}; {len(values)} rounds)")


if __name__ == "__main__":
    main_()
