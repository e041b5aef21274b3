"""W1-style burst: enqueue N no-op runs with enqueue_many, then drain them with ONE worker
process; report runs/s for both, and per run: Redis commands (INFO commandstats deltas, script
calls included), socket reads (INFO stats total_reads_processed: the round trips the server
served), time inside scripts and server CPU (INFO cpu).

    .venv/bin/python -m bench.throughput --runs 20000 --repeat 3 [--server redis|valkey]
        [--middleware N]   (N no-op middleware in the producer and the worker: their cost)
        [--task sleepy]    (runs that wait 5 ms each, instead of no-op ones)
        [--rtt_ms 1]       (the worker reaches Redis through a delay proxy: each chunk waits
                            half of it each way, order kept; tests/chaos/proxy.py, in this
                            process's thread, on a loop with sub-ms timers: rtt_measured_ms
                            says what the worker got. No `tc netem` on this kernel: a proxy
                            is what there is. The producer and the bench's own reads go
                            direct)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import redis

from bench.apps import app, noop, sleepy
from bench.drive import parser, repeated


def commandstats(r: redis.Redis) -> dict[str, float]:
    """Command calls, plus three pseudo-entries: reads, CPU µs and µs inside EVALSHA."""
    info = r.info("all")
    out: dict[str, float] = {k: v["calls"] for k, v in info.items() if k.startswith("cmdstat_")}
    out["@reads"] = info["total_reads_processed"]
    out["@cpu_us"] = (info["used_cpu_sys"] + info["used_cpu_user"]) * 1e6
    out["@evalsha_us"] = info.get("cmdstat_evalsha", {}).get("usec", 0)
    return out


def finished(r: redis.Redis, done_keys: list[str]) -> int:
    """How many runs the done sets hold (`r` may be a cluster client: the reads are pipelined
    either way)."""
    pipe = r.pipeline(transaction=False)
    for k in done_keys:
        pipe.zcard(k)
    return int(sum(pipe.execute()))


def wait_done(r: redis.Redis, done_keys: list[str], n: int, poll_s: float = 0.005,
              deadline: float | None = None) -> int:
    """Until the done sets hold n runs; → how many they hold. `deadline` (monotonic): raise
    TimeoutError past it instead of waiting on (a worker under valgrind may never get there)."""
    while (done := finished(r, done_keys)) < n:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the worker finished {done} of {n} runs in time")
        time.sleep(poll_s)
    return done


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system, /proc: Linux), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ping_ms(url: str, n: int = 200) -> float:
    """The median round trip of a PING to `url`, in ms."""
    c = redis.Redis.from_url(url)
    c.ping()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.ping()
        times.append((time.perf_counter() - t0) * 1000)
    c.close()
    return sorted(times)[n // 2]


def drain_s(r: redis.Redis, done_keys: list[str]) -> float:
    """First to last finish on the server clock (the done sets' scores): worker start-up is
    left out, so it can be reported apart."""
    pipe = r.pipeline(transaction=False)
    for k in done_keys:
        pipe.zrange(k, 0, 0, withscores=True)
        pipe.zrange(k, -1, -1, withscores=True)
    heads = [x[0][1] for x in pipe.execute() if x]
    return (max(heads) - min(heads)) / 1000


def one_round(url: str, n: int, concurrency: int, rtt_ms: float = 0.0,
              task: str = "noop") -> dict[str, float]:
    ns = f"bench{uuid.uuid4().hex[:6]}"
    app.configure(redis_url=url, namespace=ns)
    r = redis.Redis.from_url(url)
    app.store.ready()
    stats0 = commandstats(r)
    t0, c0 = time.perf_counter(), time.process_time()
    fn = sleepy if task == "sleepy" else noop
    app.enqueue_many([(fn, [i]) for i in range(n)])
    t_enq, enqueue_cpu = time.perf_counter() - t0, time.process_time() - c0
    hub = None
    worker_url = url
    rtt_measured = 0.0
    if rtt_ms:
        from tests.chaos.proxy import ProxyHub

        hub = ProxyHub(precise=True)  # sub-ms timers: the round trip asked for, not 2x it
        link = hub.link(int(url.rsplit(":", 1)[1].split("/")[0]))
        link.latency(rtt_ms / 2000)
        worker_url = link.url()
        rtt_measured = ping_ms(worker_url)
    stats1 = commandstats(r)
    env = {**os.environ, "DUETIME_REDIS_URL": worker_url, "DUETIME_NAMESPACE": ns,
           "DUETIME_BENCH_MIDDLEWARE": str(MIDDLEWARE[0])}
    t1 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                             "--app", "bench.apps:app", "--concurrency", str(concurrency)], env=env)
    done_keys = [app.keys.done(p) for p in range(app.keys.partitions)]
    # the worker's CPU from its first finished run to its last: start-up (imports) left out.
    # The bench's own polling is kept light (16 ZCARDs a poll, inside the measured window:
    # every 1 ms through the worker's start-up it added ~0.3 us of Redis CPU per run); the
    # drain rate is read from the done sets' scores, whatever the polling interval
    wait_done(r, done_keys, 1, poll_s=0.005)
    cpu0, done0 = cpu_s(proc.pid), sum(r.zcard(k) for k in done_keys)
    bench_cpu0 = time.process_time()
    wait_done(r, done_keys, n, poll_s=0.02)
    worker_cpu = cpu_s(proc.pid) - cpu0
    bench_cpu = time.process_time() - bench_cpu0  # polling, and the delay proxy's thread
    t_wall = time.perf_counter() - t1
    t_drain = drain_s(r, done_keys)
    stats2 = commandstats(r)
    proc.terminate()
    proc.wait(30)
    if hub is not None:
        hub.close()
    # worker start-up (interpreter + imports) is part of t_drain; measure it to report both
    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        d = {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) - a.get(k, 0) > 0}
        d.pop("cmdstat_info", None)  # the bench's own INFO: one read each
        d["@reads"] = d.get("@reads", 0) - 1
        return d

    enq, drain = delta(stats0, stats1), delta(stats1, stats2)
    polls = drain.pop("cmdstat_zcard", 0) / len(done_keys)  # the bench's own polling
    drain["@reads"] -= polls
    pseudo = ("@reads", "@cpu_us", "@evalsha_us")

    def cmds(d: dict[str, float]) -> float:
        return sum(v for k, v in d.items() if k not in pseudo)

    app.close()
    r.close()
    return {
        "enqueue_per_s": n / t_enq,
        "drain_per_s": n / t_drain,
        "worker_startup_s": t_wall - t_drain,
        "enqueue_cmds_per_run": cmds(enq) / n,
        "drain_cmds_per_run": cmds(drain) / n,
        "drain_evalsha_per_run": drain.get("cmdstat_evalsha", 0) / n,
        "reads_per_run": (enq["@reads"] + drain["@reads"]) / n,
        "script_us_per_run": (enq["@evalsha_us"] + drain["@evalsha_us"]) / n,
        "enqueue_script_us_per_run": enq["@evalsha_us"] / n,
        "redis_cpu_us_per_run": (enq["@cpu_us"] + drain["@cpu_us"]) / n,
        # the worker process's own CPU per run (Python: claim, execute, report, hooks), the
        # steadier figure on a loaded machine than runs/s
        "worker_cpu_us_per_run": worker_cpu * 1e6 / max(n - done0, 1),
        "enqueue_cpu_us_per_run": enqueue_cpu * 1e6 / n,
        # this process while the worker drained: its polling, and with --rtt_ms the delay
        # proxy (a Python thread here, competing for the same two cores)
        "bench_cpu_us_per_run": bench_cpu * 1e6 / max(n - done0, 1),
        # the round trip through the proxy, measured (median of PINGs before the drain)
        "rtt_measured_ms": rtt_measured,
    }


MIDDLEWARE = [0]  # no-op middleware registered (bench/apps.py), here and in the worker


def main() -> None:
    ap = parser(runs=20000, repeat=3, concurrency=256, middleware=0, rtt_ms=0.0)
    ap.add_argument("--task", choices=["noop", "sleepy"], default="noop")
    args = ap.parse_args()
    if args.middleware:
        from bench.apps import add_middleware

        MIDDLEWARE[0] = args.middleware
        add_middleware(args.middleware)
    repeated(args, lambda url: one_round(url, args.runs, args.concurrency, args.rtt_ms,
                                         args.task),
             f"server={args.server} runs={args.runs} repeat={args.repeat} "
             f"concurrency={args.concurrency} middleware={args.middleware} rtt_ms={args.rtt_ms} "
             f"task={args.task}")

if __name__ == "__main__":
    main()
