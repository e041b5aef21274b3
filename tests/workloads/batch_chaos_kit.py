"""A batch under chaos, one copy for the CI test (tests/workloads/test_batch_chaos.py, a bounded
size) and the 10,000-member soak (`python -m bench.batches --chaos`, `make soak-batches`):
worker processes SIGKILLed every few seconds while the members run (the reaper recovers their
leases), members failing for good at random, and some members adding members to their own
batch (`batch_add`, with ids fixed by keys, so a spawner killed after its add and run again
adds nothing twice and the batch's final size is known up front).

What is checked (`check`): the batch's counts equal its members' final states, every member
planned exists once, and each callback was created once (its run record exists, with its
role) and released once -- counted from the partition's event stream, tailed while the batch
runs, since a 10,000-member batch makes more events than the capped stream keeps.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.apps import workloads as w
from tests.conftest import wait_for

FINAL = ("succeeded", "dead", "cancelled", "missed", "skipped")


@dataclass
class Plan:
    """Members of the batch as created (`fails`: True fails for good) and, for the spawners
    among them, the members each adds (index -> their fail flags)."""

    fails: list[bool]
    spawns: dict[int, list[bool]]

    @property
    def total(self) -> int:
        return len(self.fails) + sum(len(c) for c in self.spawns.values())

    @property
    def failed(self) -> int:
        return sum(self.fails) + sum(sum(c) for c in self.spawns.values())

    def runs(self) -> list[Any]:
        return [(w.busy_spawner, [i, self.spawns[i]]) if i in self.spawns else (w.busy, [i, f])
                for i, f in enumerate(self.fails)]


def plan(originals: int, seed: int, fail_rate: float = 0.1, spawn_every: int = 50,
         per_spawn: int = 2) -> Plan:
    """Every `spawn_every`-th member (a spawner, which succeeds) adds `per_spawn` members."""
    rnd = random.Random(seed)
    spawns = {i: [rnd.random() < fail_rate for _ in range(per_spawn)]
              for i in range(0, originals, spawn_every)}
    fails = [i not in spawns and rnd.random() < fail_rate for i in range(originals)]
    return Plan(fails, spawns)


class EventTail(threading.Thread):
    """Counts (run id, event) for the given runs on one partition's event stream, read as it
    grows (XREAD from the start), so nothing is lost to the stream's cap."""

    def __init__(self, client: Any, stream: str, runs: set[str]) -> None:
        super().__init__(daemon=True)
        self.client, self.stream, self.runs = client, stream, {r.encode() for r in runs}
        self.counts: Counter[tuple[str, str]] = Counter()
        self.read = 0
        self._last = "0-0"
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.poll(block_ms=200)

    def poll(self, block_ms: int | None = None) -> None:
        got = self.client.xread({self.stream: self._last}, count=10_000, block=block_ms)
        for _, entries in got or []:
            for eid, e in entries:
                self._last = eid
                self.read += 1
                if e.get(b"run") in self.runs:
                    self.counts[(e[b"run"].decode(), e[b"event"].decode())] += 1

    def finish(self) -> None:
        self._done.set()
        self.join()
        self.poll()  # what arrived after the last blocking read


@dataclass
class Report:
    members: int
    planned: int
    kills: int
    seconds: float
    counts: dict[str, int]  # the batch record's total / succeeded / failed / pending
    states: dict[str, int]  # the members' final states, read from their runs
    retried: int  # members that took more than one attempt
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> what happened
    problems: list[str] = field(default_factory=list)


def _poll(pred: Callable[[], bool], until: float, interval: float) -> bool:
    """Whether `pred()` came true before the monotonic time `until` (checked every
    `interval` seconds): the end of a pause between kills is no failure, unlike
    tests.conftest.wait_for's deadline."""
    while time.monotonic() < until:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def _ended(b: Any) -> int:
    """Members of batch `b` that have ended (a finished batch: all of them)."""
    return int(b.total) if b.finished else int(b.total - b.pending)


def run(app: Any, worker: Callable[[], subprocess.Popen[bytes]], the_plan: Plan, *,
        workers: int = 2, kill_every: tuple[float, float] = (1.0, 1.0), max_kills: int | None = 6,
        kill_every_ended: int | None = None, deadline_s: float = 120.0, seed: int = 1,
        progress: Callable[[str], None] | None = None) -> Report:
    """Create the batch, run it on `workers` worker processes (started by `worker()`), SIGKILL
    one every `kill_every` seconds (uniform in the range) and start another, until the batch
    finished (or `max_kills`); then wait for the callbacks and `check`. The reaper is the
    caller's to start.

    `kill_every_ended=N` kills by progress instead: each time N more members have ended, so
    the kills land while the batch runs however fast the machine drains it (a fast run of
    600 members once finished between two time-driven kills)."""
    rnd = random.Random(seed)
    client = w.r()
    started = time.monotonic()
    bid = app.batch(the_plan.runs(), on_complete=(w.callback, ["complete"]),
                    on_failure=(w.callback, ["failure"]), on_success=(w.callback, ["success"]))
    b = app.get_batch(bid)
    cbs = {"on_complete": b.on_complete_run, "on_success": b.on_success_run,
           "on_failure": b.on_failure_run}
    k = app.keys
    # the batch is created before any worker runs: no member has ended, no callback has been
    # released yet, so tailing from the stream's start misses nothing (creation makes no
    # more events than the cap keeps: a created member emits none)
    tail = EventTail(client, k.events(k.partition_of_run(bid)), {c for c in cbs.values() if c})
    tail.start()
    procs = [worker() for _ in range(workers)]
    kills = 0
    deadline = started + deadline_s
    try:
        while max_kills is None or kills < max_kills:
            if kill_every_ended is None:  # the next kill after a time drawn from kill_every
                pause = min(deadline, time.monotonic() + rnd.uniform(*kill_every))
                _poll(lambda: app.get_batch(bid).finished, pause, 0.1)
            else:  # the next kill once kill_every_ended more members have ended
                goal = (kills + 1) * kill_every_ended
                _poll(lambda goal=goal: _ended(app.get_batch(bid)) >= goal, deadline, 0.01)
            if app.get_batch(bid).finished or time.monotonic() >= deadline:
                break
            victim = procs.pop(rnd.randrange(len(procs)))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills += 1
            procs.append(worker())
            if progress is not None:
                b = app.get_batch(bid)
                progress(f"{time.monotonic() - started:6.1f}s kill {kills}: {b.pending} pending, "
                         f"{b.succeeded} succeeded, {b.failed} failed of {b.total}")
        b = app.wait_batch(bid, timeout=max(1.0, deadline - time.monotonic()))
        # callbacks end as they end: released ones run (a kill may have landed in one: it is
        # retried like any run), the one the outcome rules out is cancelled
        wait_for(lambda: all(_state(app, c) in FINAL for c in cbs.values() if c), 120.0,
                 what="the batch's callbacks to finish")
    finally:
        tail.finish()
    seconds = time.monotonic() - started
    return check(app, bid, the_plan, b, cbs, tail, kills, seconds)


def check(app: Any, bid: str, the_plan: Plan, b: Any, cbs: dict[str, str | None],
          tail: EventTail, kills: int, seconds: float) -> Report:
    k = app.keys
    p = k.partition_of_run(bid)
    members = app.batch_members(bid, limit=the_plan.total + 1000)
    pipe = w.r().pipeline(transaction=False)
    for m in members:
        pipe.hmget(k.run(p, m), "state", "batch", "attempt")
    rows = pipe.execute()
    states = Counter((s or b"?").decode() for s, _, _ in rows)
    # members that took more than one attempt: a SIGKILL landed in one (its lease expired and
    # the reaper gave the run back), or it was a spawner whose add was repeated
    retried = sum(1 for _, _, a in rows if int(a or 0) > 1)
    rep = Report(members=len(members), planned=the_plan.total, kills=kills, seconds=seconds,
                 counts={"total": b.total, "succeeded": b.succeeded, "failed": b.failed,
                         "pending": b.pending},
                 states=dict(states), retried=retried)
    bad = rep.problems
    if len(members) != the_plan.total or len(set(members)) != len(members):
        bad.append(f"{len(members)} members, {the_plan.total} planned")
    if b.total != len(members):
        bad.append(f"batch total {b.total} != {len(members)} members")
    if any(bb != bid.encode() for _, bb, _ in rows):
        bad.append("a member's run does not name the batch")
    if b.pending != 0 or sum(states[s] for s in FINAL) != len(members):
        bad.append(f"unfinished members: pending {b.pending}, states {dict(states)}")
    if b.succeeded != states["succeeded"]:
        bad.append(f"batch succeeded {b.succeeded} != {states['succeeded']} members succeeded")
    if b.failed != len(members) - states["succeeded"]:
        bad.append(f"batch failed {b.failed} != {len(members) - states['succeeded']} members "
                   "that did not succeed")
    if b.failed != the_plan.failed:
        bad.append(f"batch failed {b.failed}, {the_plan.failed} planned to fail")
    failed = the_plan.failed > 0
    want = {"on_complete": ("succeeded", 1), "on_failure": ("succeeded", 1) if failed
            else ("cancelled", 0), "on_success": ("cancelled", 0) if failed else ("succeeded", 1)}
    for role, rid in cbs.items():
        if rid is None:
            bad.append(f"no {role} callback")
            continue
        raw = w.r().hmget(k.run(p, rid), "state", "batch_role", "attempt")
        state = (raw[0] or b"").decode()
        info = {"run_id": rid, "records": 1 if raw[0] else 0,
                "role": (raw[1] or b"").decode(), "state": state,
                "released": tail.counts[(rid, "released")],
                "executions": int(w.r().hget(w.ran_key(), rid) or 0),
                "attempts": int(raw[2] or 0)}
        rep.callbacks[role] = info
        if (state, info["released"]) != want[role] or info["records"] != 1 \
                or info["role"] != role:
            bad.append(f"{role}: {info}, wanted state and releases {want[role]}")
        if want[role][0] == "succeeded" and info["executions"] < 1:
            bad.append(f"{role} succeeded without running")
    return rep


def _state(app: Any, run_id: str) -> str:
    return str(app.get_run(run_id).state)
