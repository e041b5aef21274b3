"""Renders the raw results of bench/peers_run.py as bench/RESULTS.md.

    .venv/bin/python -m bench.peers_report bench/out/peers-A.json [bench/out/peers-B.json] [> RESULTS.md]

Later files fill in the workloads the earlier ones lack (e.g. W3 or W5 from runs of their
own: a W3 round waits up to 2 minutes, a W5 round for a minute boundary); each section then
names the run it comes from.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from bench.stats import ratios, summary

INTRO = """\
duetime and its Python peers on the same machine, the same Redis build and the same
workloads. Every number below was measured by `bench/peers_run.py` in the run described here;
nothing is copied from elsewhere. Medians are over the rounds; (min–max) beside them. A ratio
duetime/peer is taken between numbers of the same round, then the median of those ratios.

How it runs:
- Each system's adapter is `bench/peers/<system>.py`. Peers run in their own virtualenv
  `bench/.venvs/<peer>/`, created by the harness (`python3 -m venv` + `pip install` of the pins
  below); duetime runs in the project's `.venv`. No peer code is in the repository.
- Every run (one system, one round, one workload) gets a fresh `redis-server` on a free loopback
  port (`duetime.embedded.EmbeddedServer("redis")`), never the system Redis.
- Jobs count themselves: the first thing a job does is `RPUSH` its number and `time.time()`, and
  it `HINCRBY`s its number when it ends, on db 1 of a *separate* loopback counter server (so the
  counting never shows in the measured server's `INFO commandstats` / `INFO cpu`). Lost = numbers
  never counted; duplicates = counts above 1. A no-op job (W1, W2) records its number and start
  time in an in-process buffer that a background thread sends every 2 ms, the same code for
  every system, so counting costs a job microseconds rather than a blocking round trip (rq's
  default worker forks a child per job that exits at once: it counts with one synchronous
  round trip instead). W3's long job counts synchronously at its start and end.
- Workers: one worker process (or the system's single worker command with its supervisor
  process) per run; thread pools of 8 for the threaded systems, 100 concurrent jobs for the
  asyncio ones (duetime included); logging at WARNING where the CLI allows it.
"""


NOTES = """\
## Notes, and what could not be measured

- **W5**: arq's and SAQ's cron jobs, huey's periodic tasks and plain Celery beat keep their
  schedules in a process's code and dramatiq has no scheduler: none has a store for 100,000
  registered schedules to weigh or tick. Their Redis add-ons that do, RedBeat for Celery beat and
  rq-scheduler for RQ, are measured instead, beside taskiq's Redis schedule source.
- **huey** has no acknowledgement or recovery of a task whose consumer died, so W3 has no
  'aggressive' setting to try: both rows run the same configuration.
- **taskiq** (taskiq-redis `RedisStreamBroker`): unacknowledged messages are reclaimed with
  `XAUTOCLAIM` only inside the broker's listen loop *after an `XREADGROUP` returned new messages*
  (`taskiq_redis/redis_broker.py`, `listen()`); with no further traffic the killed job stays
  pending, whatever `idle_timeout` is. With more traffic it would be reclaimed once idle for
  `idle_timeout`. Its `ListQueueBroker` has no acknowledgement at all.
- **rq**: `enqueue_at` scores the job with `calendar.timegm(dt.utctimetuple())`, i.e. the instant
  truncated to the whole second, so delayed jobs may start up to 1 s *early* (the 'early' column).
  The forking worker's drain rate bounds its W2 lateness (1,000 jobs in 10 s is more than it can
  run). In W3 an abandoned job is found only once its StartedJobRegistry entry expires (job
  monitoring interval + 60 s after the last heartbeat), so ~60 s is its floor even with
  `--job-monitoring-interval 1 --maintenance-interval 1` and a `Retry`; the maintenance also runs
  only between dequeues, which block `worker_ttl - 15` s (405 s by default), hence
  `--worker-ttl 16` (without it no rerun came within 120 s). Without `Retry` the job goes to the
  failed registry.
- **arq**: the in-progress key of a running job lives `job_timeout + 10 s` and is never extended:
  310 s by default, longer than the W3 wait.
- **celery**: by default a message is acknowledged before the task runs, so a killed task is lost.
  With `task_acks_late` the message is restored after `visibility_timeout`, which must exceed the
  longest task *and* the longest ETA, or those run twice.
- **saq**: by default a job has `retries=1`, so the sweep marks a stuck job aborted instead of
  retrying it.
- **saq** ran a few W1 jobs twice (the 'dup' column), with nothing killed; a likely cause is its
  sweep, which aborts and retries a job found in the active list before it was marked active.
- **duetime** rounds a due instant *up* to the millisecond and a worker claims a run up to 10 ms
  ahead (`--claim-ahead`), then starts it at its due time plus half the round trip of its last
  server-clock measurement: hence no early starts, and lateness of about the event loop's timer
  resolution.
- **W4 round trips** are the server's socket reads. duetime batches (an `enqueue.lua` call per
  200 runs, pipelines of 2,000; claims and acknowledgements per partition and batch), so a run
  costs a few hundredths of a round trip; every peer sends at least one command per job per
  step. Commands per job count those inside Lua scripts too: there taskiq (a stream entry and
  its ack) and huey use fewer than duetime, which writes a run record, a lease (string with
  TTL and index entry) and an attempt entry per run.
- **W4 Redis CPU** moves with the machine's load more than anything else here: duetime drains
  20,000 jobs in about a second with its worker busy on the other core, and its per-job Redis
  CPU went from 31 to 48 µs between W1/W4 runs of duetime and taskiq on the same day (taskiq
  41–50 µs); duetime was the cheaper of the two in each of those runs, and in one run of the
  day before (at 59 µs) it was not. The scripts were profiled with `perf` on the server: ~12 %
  of it was glibc's float printf/strtod, from Lua numbers handed to `redis.call`; the scripts
  now format each time once per call (`int_s` in `lua/_lib.lua`).
- **W5, taskiq**: its scheduler fires a cron schedule when the current minute matches and 60 s
  have passed since the schedule last fired, checked once a second from the scheduler's start:
  schedules fire on the scheduler's own phase within the minute, so the lateness at a minute
  boundary is anywhere in 0–60 s depending on when the scheduler started (the rounds differ for
  that reason). It re-evaluates every schedule in Python each second, hence the scheduler CPU
  with 100,000 schedules.
- **W5, RedBeat and rq-scheduler** keep due times in a sorted set and read only what is due, so
  holding schedules costs them nearly nothing while idle; their lateness at the boundary is the
  time to send 1,000 jobs one by one (beat) or move them to the queue (rq-scheduler) and then
  run them (prefork pool / SimpleWorker). duetime's idle traffic is its evaluator (4 ticks/s
  over 16 partitions), reaper (2 ticks/s) and worker, whatever the number of schedules.
- **dramatiq**: a dead worker's unacknowledged messages are requeued by a maintenance pass that
  runs on a random 0.1 % of broker calls, once the worker's heartbeat is 60 s old.
- **duetime** is measured as the working tree was at the run (other work on its core goes on
  concurrently); see the git line above.
- Every job, in every system, counts itself the same way (a buffer flushed to the counter server
  every 2 ms); it is part of every drain rate. Enqueue timings include building the job list.
- The machine is shared with other sessions' work (tests, other benchmarks): see the load
  averages; throughput numbers are the most sensitive to that.
"""


def esc(text: str) -> str:
    return text.replace("|", "\\|")


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def cell(vals: list[float | None], digits: int = 0, unit: str = "") -> str:
    s = summary(vals)
    if s is None:
        return "–"
    if s["min"] == s["max"]:
        return f"{fmt(s['median'], digits)}{unit}"
    return f"{fmt(s['median'], digits)}{unit} ({fmt(s['min'], digits)}–{fmt(s['max'], digits)})"


def ratio_cell(ours: list[float | None], theirs: list[float | None], digits: int = 3) -> str:
    rs = ratios(ours, theirs)
    if not rs:
        return "–"
    s = summary(rs)
    assert s is not None
    return f"{s['median']:.{digits}g}×"


def col(rounds: list[dict], key: str | Callable[[dict], float | None]) -> list[float | None]:
    out: list[float | None] = []
    for r in rounds:
        if "error" in r:
            out.append(None)
        elif callable(key):
            out.append(key(r))
        else:
            out.append(r.get(key))
    return out


def errors_of(rounds: list[dict]) -> list[str]:
    return [r["error"] for r in rounds if "error" in r]


def render(res: dict[str, Any]) -> str:
    a, env = res["args"], res["env"]
    L: list[str] = ["# Peer benchmark results", "", INTRO]
    L += ["## This run", "",
          f"- started {res['started']}, took {res['elapsed_s'] / 60:.1f} min",
          f"- command: `{env['argv']}`",
          *([f"- this report, with the sections measured in other runs: `{res['report_argv']}`"]
            if res.get("report_argv") else []),
          f"- machine: {env['cores']} cores ({env['cpu']}), {env['mem_gib']} GiB, Linux {env['kernel']}; "
          f"Python {env['python']}; {env['redis']}",
          f"- rounds: {a['repeat']}; W1 {a['runs']:,} jobs (rq's forking worker: "
          f"{min(a['runs'], a['rq_fork_runs']):,}); W2 {a['w2_runs']:,} jobs over {a['w2_spread']:g} s; "
          f"W3 job of {a['w3_job_seconds']:g} s killed {a['w3_kill_after']:g} s in, rerun awaited "
          f"{a['w3_wait']:g} s; asyncio workers at {a.get('concurrency', 100)} jobs at once",
          "- load average (1, 5, 15 min) at each round's start: "
          + "; ".join("/".join(f"{x:.2f}" for x in la) for la in res.get("loadavg", [])),
          "  (the machine is shared with other work; a high first number means a noisy round)"]
    if "loadavg_w3" in res:
        L.append("- load average at the start of W3: " + "/".join(f"{x:.2f}" for x in res["loadavg_w3"]))
    if env.get("git_end"):
        L.append(f"- duetime measured: {env['git']} at the start, {env['git_end']} at the end")
    elif env.get("git"):
        L.append(f"- duetime measured: {env['git']} (read at the end of the run)")
    L.append("")

    L += ["## Versions and settings", "",
          "| system | versions (PyPI) | enqueue path (W1) | delayed jobs (W2) | worker |",
          "|---|---|---|---|---|"]
    for name in res["systems"]:
        info = res["info"].get(name, {})
        if "error" in info or not info:
            L.append(f"| {name} | – | could not load: {info.get('error', 'not run')[:200]} | | |")
            continue
        d, v = info["describe"], info["versions"]
        vers = ", ".join(f"{k} {x}" for k, x in v.items())
        L.append(f"| {name} | {vers} | {esc(d.get('enqueue', '– (W5 only)'))} "
                 f"| {esc(d.get('enqueue_at', '–'))} | {esc(d['worker'])} |")
    for mod, err in res.get("setup_errors", {}).items():
        L.append(f"| {mod} | not installed | {err[:300]} | | |")
    L.append("")

    systems = [s for s in res["systems"] if s in res["info"] and "error" not in res["info"][s]]
    L += glance(res, [s for s in systems if s in res["W1"] or s in res["W2"] or s in res["W3"]])
    if res["W1"]:
        L += w1_section(res, systems)
        L += w4_section(res, systems)
    if res["W2"]:
        L += w2_section(res, systems)
    if res["W3"]:
        L += w3_section(res, systems)
    L += w5_section(res, systems)
    L += [NOTES]
    L += commands_section(res, systems)
    return "\n".join(L) + "\n"


def glance(res: dict, systems: list[str]) -> list[str]:
    """One line per system, medians only; the sections below have min–max, ratios and notes."""
    W1, W2, W3 = res["W1"], res["W2"], res["W3"]

    def med(vals: list[float | None], digits: int = 0, unit: str = "") -> str:
        s = summary(vals)
        return "–" if s is None else f"{fmt(s['median'], digits)}{unit}"

    def rec(name: str, mode: str) -> str:
        ok = [r for r in W3.get(name, {}).get(mode, []) if "error" not in r]
        if not ok:
            return "–"
        got = [r["rerun_after_kill_s"] for r in ok if r["rerun"]]
        if not got:
            return f"no ({res['args']['w3_wait']:g} s)"
        return f"{med(got, 1, ' s')}" + ("" if len(got) == len(ok) else f" ({len(got)}/{len(ok)})")

    L = ["## At a glance (medians)", "",
         "| system | W1 enqueue/s | W1 drain/s | W2 p99 late | W3 rerun, defaults | W3 rerun, "
         "aggressive | W4 cmds/job | W4 round trips/job | W4 Redis CPU µs/job |",
         "|---|---|---|---|---|---|---|---|---|"]
    for s in systems:
        w1 = W1.get(s, [])
        tot = col(w1, lambda r: (r["enqueue_cost"]["total"] + r["drain_cost"]["total"]) / r["n"])
        cpu = col(w1, lambda r: (r["enqueue_cost"]["cpu_s"] + r["drain_cost"]["cpu_s"]) / r["n"] * 1e6)
        rt = col(w1, reads_per_job)
        L.append(f"| {s} | {med(col(w1, 'enqueue_per_s'))} | {med(col(w1, 'drain_per_s'))} "
                 f"| {med(col(W2.get(s, []), 'p99_ms'), 1, ' ms')} | {rec(s, 'default')} "
                 f"| {rec(s, 'aggressive')} | {med(tot, 1)} | {med(rt, 2)} | {med(cpu, 0)} |")
    L.append("")
    return L


def w1_section(res: dict, systems: list[str]) -> list[str]:
    W1, a = res["W1"], res["args"]
    d = W1.get("duetime", [])
    L = ["## W1 burst", "",
         f"Enqueue {a['runs']:,} no-op jobs by each system's fastest documented path (one client "
         "process, timed around the enqueue call only), then start ONE worker and drain them. "
         "Drain rate = jobs / (last job start − first job start), so interpreter start-up is left "
         "out; the column 'incl. start-up' counts from the worker's spawn to the last count. "
         "Ratios > 1 mean duetime is faster.", "",
         "| system | n | enqueue jobs/s | drain jobs/s | drain incl. start-up | lost | dup | "
         "enqueue duetime/peer | drain duetime/peer |",
         "|---|---|---|---|---|---|---|---|---|"]
    for s in systems:
        rounds = W1.get(s)
        if not rounds:
            continue
        ok = [r for r in rounds if "error" not in r]
        n = ok[0]["n"] if ok else 0
        lost = sum(r["lost"] for r in ok)
        dup = sum(r["duplicates"] for r in ok)
        rat_e = ratio_cell(col(d, "enqueue_per_s"), col(rounds, "enqueue_per_s")) if s != "duetime" else ""
        rat_d = ratio_cell(col(d, "drain_per_s"), col(rounds, "drain_per_s")) if s != "duetime" else ""
        L.append(f"| {s} | {n:,} | {cell(col(rounds, 'enqueue_per_s'))} | {cell(col(rounds, 'drain_per_s'))} "
                 f"| {cell(col(rounds, 'drain_incl_start_per_s'))} | {lost} | {dup} | {rat_e} | {rat_d} |")
        for e in errors_of(rounds):
            L.append(f"| {s} | | error: {e[:250]} | | | | | | |")
    L.append("")
    L.append("lost/dup are totals over all rounds.")
    L.append("")
    return L


def reads_per_job(r: dict) -> float | None:
    """Round trips per job over the W1 lifecycle (None for runs made before reads were kept)."""
    if "reads" not in r["enqueue_cost"]:
        return None
    return (r["enqueue_cost"]["reads"] + r["drain_cost"]["reads"]) / r["n"]


def w4_section(res: dict, systems: list[str]) -> list[str]:
    W1, W2, a = res["W1"], res["W2"], res["args"]
    d = W1.get("duetime", [])

    def total(r: dict) -> float:
        return (r["enqueue_cost"]["total"] + r["drain_cost"]["total"]) / r["n"]

    def cpu(r: dict) -> float:
        return (r["enqueue_cost"]["cpu_s"] + r["drain_cost"]["cpu_s"]) / r["n"] * 1e6

    L = ["## W4 cost", "",
         "Redis commands and Redis server CPU (`INFO cpu` used_cpu_user+sys) per job over the "
         "whole W1 lifecycle: from before the enqueue to 0.5 s after the last job counted itself "
         "(`INFO commandstats` deltas; the harness's own INFO calls are left out; the counter "
         "server is separate). Commands include those a Lua script calls; round trips are the "
         "server's socket reads (`INFO stats` total_reads_processed): what the clients sent over "
         "the network, a pipeline counting once or a few times. "
         f"W2 column: the same for the W2 run ({a['w2_runs']:,} delayed jobs; it "
         f"includes what an idle worker polls during the ~{a['w2_lead'] + a['w2_spread'] + 1:.0f} s "
         "window). Ratios < 1 mean duetime is cheaper.",
         "",
         "| system | cmds/job enqueue | cmds/job drain | cmds/job total | round trips/job | "
         "Redis CPU µs/job | cmds/job W2 | cmds duetime/peer | round trips duetime/peer | "
         "CPU duetime/peer | most frequent commands per job |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in systems:
        rounds = W1.get(s)
        if not rounds:
            continue
        ok = [r for r in rounds if "error" not in r]
        if not ok:
            continue
        w2 = [r["cost"]["total"] / r["n"] for r in W2.get(s, []) if "error" not in r]
        top: dict[str, int] = {}
        for phase in ("enqueue_cost", "drain_cost"):
            for k, v in ok[0][phase]["cmds"].items():
                top[k] = top.get(k, 0) + v
        tops = ", ".join(f"{k} {v / ok[0]['n']:.2f}" for k, v in
                         sorted(top.items(), key=lambda kv: -kv[1])[:6])
        rat_c = ratio_cell(col(d, total), col(rounds, total)) if s != "duetime" else ""
        rat_u = ratio_cell(col(d, cpu), col(rounds, cpu)) if s != "duetime" else ""
        rat_r = ratio_cell(col(d, reads_per_job), col(rounds, reads_per_job)) if s != "duetime" else ""
        L.append(f"| {s} | {cell(col(rounds, lambda r: r['enqueue_cost']['total'] / r['n']), 2)} "
                 f"| {cell(col(rounds, lambda r: r['drain_cost']['total'] / r['n']), 2)} "
                 f"| {cell(col(rounds, total), 2)} | {cell(col(rounds, reads_per_job), 3)} "
                 f"| {cell(col(rounds, cpu), 1)} | {cell(list(w2), 1)} "
                 f"| {rat_c} | {rat_r} | {rat_u} | {tops} |")
    L.append("")
    return L


def w2_section(res: dict, systems: list[str]) -> list[str]:
    W2, a = res["W2"], res["args"]
    d = W2.get("duetime", [])
    L = ["## W2 precision", "",
         f"{a['w2_runs']:,} no-op jobs due at instants spread over {a['w2_spread']:g} s (uniform "
         f"in equal slots), the first {a['w2_lead']:g} s after the enqueue starts; the worker is up "
         "and has run a probe job before. Lateness = the job's own start time − its instant, "
         "same clock. Early = started before its instant. Ratios < 1 mean duetime is more punctual.",
         "",
         "| system | p50 ms | p95 ms | p99 ms | max ms | min ms | early | not run | dup | p99 duetime/peer |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for s in systems:
        rounds = W2.get(s)
        if not rounds:
            continue
        ok = [r for r in rounds if "error" not in r]
        early = sum(r["early"] for r in ok)
        lost = sum(r["lost"] for r in ok)
        dup = sum(r["duplicates"] for r in ok)
        rat = ratio_cell(col(d, "p99_ms"), col(rounds, "p99_ms")) if s != "duetime" else ""
        L.append(f"| {s} | {cell(col(rounds, 'p50_ms'), 1)} | {cell(col(rounds, 'p95_ms'), 1)} "
                 f"| {cell(col(rounds, 'p99_ms'), 1)} | {cell(col(rounds, 'max_ms'), 1)} "
                 f"| {cell(col(rounds, 'min_ms'), 1)} | {early} "
                 f"| {lost} | {dup} | {rat} |")
        for e in errors_of(rounds):
            L.append(f"| {s} | error: {e[:250]} | | | | | | | | |")
        over = sum(r.get("enqueue_overran", 0) for r in ok)
        if over:
            L.append(f"| {s} | note: {over} instants passed before its enqueue call returned "
                     "| | | | | | | | |")
    L += ["", "min ms: the median over rounds of the smallest lateness (negative = early). "
          f"'not run': jobs that had not started {a['w2_grace']:g} s after the last instant (a "
          "system slower than 100 jobs/s cannot keep up; its percentiles are then over the jobs that "
          "ran). early/not run/dup are totals over all rounds.", ""]
    return L


def w3_section(res: dict, systems: list[str]) -> list[str]:
    W3, a = res["W3"], res.get("sources", {}).get("W3", res)["args"]
    L = ["## W3 recovery", "",
         f"One job that runs {a['w3_job_seconds']:g} s; {a['w3_kill_after']:g} s after it started, "
         "the worker's whole process tree is SIGKILLed (SIGSTOP of every descendant, then SIGKILL) "
         "and a new worker with the same settings is started at once, as a supervisor would "
         f"(duetime's reaper, a separate process, stays up). Is the job run again within "
         f"{a['w3_wait']:g} s, and when does the rerun start, counted from the kill? All cases run in "
         f"parallel threads, each with its own server: a round's cases start {a['w3_stagger']:g} s "
         f"apart, rounds {a.get('w3_round_gap', 0):g} s apart.",
         "", *source_line(res, "W3"),
         "| system | settings | rerun | rerun starts after the kill | completed once | "
         "what was set |", "|---|---|---|---|---|---|"]
    for s in systems:
        modes = W3.get(s)
        if not modes:
            continue
        desc = res["info"][s]["describe"]["recovery"]
        for m in ("default", "aggressive"):
            rounds = modes.get(m, [])
            ok = [r for r in rounds if "error" not in r]
            reruns = sum(1 for r in ok if r["rerun"])
            once = sum(1 for r in ok if r["completions"] == 1)
            delay = cell([r["rerun_after_kill_s"] for r in ok if r["rerun"]], 1, " s")
            verdict = f"{reruns}/{len(ok)}" + ("" if reruns else f" (none within {a['w3_wait']:g} s)")
            L.append(f"| {s} | {m} | {verdict} | {delay} | {once}/{len(ok)} | {esc(desc[m])} |")
            for e in errors_of(rounds):
                L.append(f"| {s} | {m} | error: {e[:250]} | | | |")
    L += ["", "'completed once': the job's end was counted exactly once by the end of the case "
          "(0 = never completed; 2 = the killed attempt and a rerun both completed).", ""]
    return L


def w5_section(res: dict, systems: list[str]) -> list[str]:
    W5 = res.get("W5") or {}
    if not W5:
        return ["## W5 schedules", "", "Not run in this report's runs.", ""]
    run = res.get("sources", {}).get("W5", res)
    a, d = run["args"], W5.get("duetime", [])
    L = ["## W5 schedules", "",
         f"{a['w5_schedules']:,} schedules registered by each system's documented path: "
         f"{a['w5_every']:,} of them fire every minute, the rest once a year (`0 0 1 1 *`, never "
         "during the run). Then the system's scheduler process and one worker start, and the first "
         f"minute boundary at least {a['w5_settle']:g} s later is watched: start lateness of the "
         f"{a['w5_every']:,} runs due there (each job's first start from 1 s before the boundary "
         "on, minus the boundary; same clock). Then an idle "
         f"window of up to {a['w5_idle']:g} s, between that firing and the next one: Redis "
         "commands and Redis CPU per second, and the scheduler process's own CPU (/proc) per "
         "second: what holding the schedules costs while nothing is due. Memory: Redis "
         "`used_memory` after minus before the registration. Ratios < 1 favour duetime.", "",
         *source_line(res, "W5"),
         "| system | registered/s | bytes/schedule | p50 late ms | p99 late ms | max late ms | "
         "fired | early | dup | idle Redis cmds/s | idle Redis CPU ms/s | idle scheduler CPU ms/s "
         "| p99 duetime/peer | memory duetime/peer |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in systems:
        rounds = W5.get(s)
        if not rounds:
            continue
        ok = [r for r in rounds if "error" not in r]
        fired = f"{sum(r['fired'] for r in ok):,}/{sum(r['every'] for r in ok):,}"
        rat_p = ratio_cell(col(d, "p99_ms"), col(rounds, "p99_ms")) if s != "duetime" else ""
        rat_m = (ratio_cell(col(d, "bytes_per_schedule"), col(rounds, "bytes_per_schedule"))
                 if s != "duetime" else "")
        L.append(f"| {s} | {cell(col(rounds, 'register_per_s'))} "
                 f"| {cell(col(rounds, 'bytes_per_schedule'))} | {cell(col(rounds, 'p50_ms'), 1)} "
                 f"| {cell(col(rounds, 'p99_ms'), 1)} | {cell(col(rounds, 'max_ms'), 1)} | {fired} "
                 f"| {sum(r['early'] for r in ok)} | {sum(r['duplicates'] for r in ok)} "
                 f"| {cell(col(rounds, 'idle_cmds_per_s'), 1)} "
                 f"| {cell(col(rounds, 'idle_redis_cpu_ms_per_s'), 2)} "
                 f"| {cell(col(rounds, 'idle_sched_cpu_ms_per_s'), 1)} | {rat_p} | {rat_m} |")
        for e in errors_of(rounds):
            L.append(f"| {s} | error: {e[:250]} | | | | | | | | | | | | |")
    L += ["", "fired: runs of the every-minute schedules that started around the watched boundary, "
          "over all rounds; early/dup are totals over all rounds. Scheduler settings:", ""]
    for s in systems:
        desc = res["info"].get(s, {}).get("describe", {})
        if s in W5 and "scheduler" in desc:
            L.append(f"- {s}: {esc(desc['register'])}; {esc(desc['scheduler'])}")
    L.append("")
    return L


def merge(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`base`, with the workloads it lacks taken from another run (and their systems' details)."""
    out = dict(base)
    sources = dict(base.get("sources", {}))
    argv = {k: dict(v) for k, v in base.get("argv", {}).items()}
    for w in ("W1", "W2", "W3", "W5"):
        if out.get(w) or not other.get(w):
            continue
        out[w] = other[w]
        sources[w] = {k: other[k] for k in ("args", "started", "elapsed_s", "env")}
        for s, cmds in other.get("argv", {}).items():
            argv.setdefault(s, {}).update({k: v for k, v in cmds.items() if k.startswith(w)})
        out["systems"] = out["systems"] + [s for s in other["systems"] if s not in out["systems"]]
    out["info"] = {**other.get("info", {}), **base["info"]}
    out["sources"], out["argv"] = sources, argv
    return out


def source_line(res: dict, workload: str) -> list[str]:
    """Where a merged-in workload was measured (nothing when it is this report's own run)."""
    src = res.get("sources", {}).get(workload)
    if not src:
        return []
    env = src["env"]
    return [f"{workload} was measured in its own run: started {src['started']}, took "
            f"{src['elapsed_s'] / 60:.1f} min, `{env['argv']}`; duetime: {env.get('git', '?')} at "
            f"the start, {env.get('git_end', '?')} at the end.", ""]


def commands_section(res: dict, systems: list[str]) -> list[str]:
    L = ["## Command lines", "",
         "Worker command lines as run (paths relative to the repository; `bench/.venvs/<peer>/bin/` "
         "is the peer's virtualenv). Enqueueing is `python -m bench.peers.cli <system> enqueue-burst N` "
         "/ `enqueue-at FILE` / `enqueue-long S` in the same virtualenv.", ""]
    for s in systems:
        seen: dict[str, list[str]] = {}
        for key, cmds in sorted(res.get("argv", {}).get(s, {}).items()):
            for c in cmds:
                seen.setdefault(" ".join(c), []).append(key)
        for cmd, keys in seen.items():
            L.append(f"- {s} ({', '.join(keys)}): `{cmd}`")
    L.append("")
    return L


def main() -> None:
    runs = []
    for path in sys.argv[1:]:
        with open(path) as f:
            runs.append(json.load(f))
    res = runs[0]
    for other in runs[1:]:
        res = merge(res, other)
    if len(runs) > 1:
        res["report_argv"] = ".venv/bin/python -m bench.peers_report " + " ".join(sys.argv[1:])
    sys.stdout.write(render(res))


if __name__ == "__main__":
    main()
