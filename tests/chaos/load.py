"""The chaos run's application side: ad-hoc runs at a steady rate, and the schedules.

Every ad-hoc run carries an idempotency key, so its id is known before the first try and a
call whose reply was lost (server down, connection reset, OOM) is simply sent again until the
server acknowledges it: the checker then knows exactly which runs must exist. A run given up
on (never acknowledged) may exist or not.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from duetime.common.errors import DuetimeError, EnqueueIncomplete

import duetime
from duetime.client.runs import keyed_run_id
from tests.apps import chaos as chaos_app

# (task, weight, args factory): the mix of ad-hoc runs
MIX: list[tuple[duetime.Task, int, object]] = [
    (chaos_app.quick, 40, lambda rnd: [rnd.uniform(0.0, 0.05)]),
    (chaos_app.aquick, 20, lambda rnd: [rnd.uniform(0.0, 0.05)]),
    (chaos_app.slow, 6, lambda rnd: [rnd.uniform(1.0, 3.0)]),
    (chaos_app.failing, 6, lambda rnd: []),
    (chaos_app.flaky, 14, lambda rnd: []),
    (chaos_app.nonidem, 14, lambda rnd: [rnd.uniform(0.1, 0.6)]),
]

NOWHERE = "chaos-nowhere"  # a queue no worker serves: its schedule's runs are all missed


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    trigger: object
    task: duetime.Task
    args: tuple = ()
    queue: str | None = None
    overlap: str = "allow"
    lateness: float | None = None


def schedules() -> list[ScheduleSpec]:
    """A cron, two intervals (one whose runs outlast it, overlap skip) and one whose runs no
    worker serves (all missed); catch-up `all`, so every occurrence gets its run even after a
    scheduler outage."""
    return [
        ScheduleSpec("chaos-cron", duetime.Cron("* * * * *"), chaos_app.tick),
        ScheduleSpec("chaos-every", duetime.Every(timedelta(seconds=1)), chaos_app.tick),
        ScheduleSpec("chaos-skip", duetime.Every(timedelta(seconds=1)), chaos_app.long_tick,
                     args=(2.5,), overlap="skip"),
        ScheduleSpec("chaos-missed", duetime.Every(timedelta(seconds=2)), chaos_app.tick,
                     queue=NOWHERE, lateness=0.3),
    ]


@dataclass
class Submitted:
    run_id: str
    task: str
    key: str
    first_try: float
    acked: float | None = None  # when the server acknowledged it; None: given up
    tries: int = 0


class LoadGenerator(threading.Thread):
    """Enqueues `rate` runs a second (best effort: a call retried while the server is down
    delays the next ones), at most `limit`, until `stop()`."""

    def __init__(self, app: duetime.App, rate: float, seed: int, limit: int = 10**9,
                 give_up_s: float = 60.0) -> None:
        super().__init__(name="chaos-load", daemon=True)
        self.app, self.rate, self.limit, self.give_up_s = app, rate, limit, give_up_s
        self.rnd = random.Random(seed)
        self.submitted: list[Submitted] = []
        self.refusals: dict[str, int] = {}
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        tasks = [t for t, _, _ in MIX]
        weights = [w for _, w, _ in MIX]
        argf = {t.name: f for t, _, f in MIX}
        next_t = time.monotonic()
        seq = 0
        while not self._halt.is_set() and seq < self.limit:
            task = self.rnd.choices(tasks, weights)[0]
            args = argf[task.name](self.rnd)  # type: ignore[operator]
            delay = self.rnd.choice([0.0, 0.0, 0.0, self.rnd.uniform(0.1, 2.0)])
            key = f"L{seq}"
            seq += 1
            self._submit(task, args, key, delay)
            next_t += 1 / self.rate
            self._halt.wait(max(0.0, next_t - time.monotonic()))
            if time.monotonic() - next_t > 5:  # fell behind during an outage: no burst after
                next_t = time.monotonic()

    def burst(self, n: int, task: duetime.Task | None = None) -> int:
        """`n` runs at once (a backlog), in one bulk enqueue; returns how many were created.
        Ids come from keys, so a bulk call stopped part way still says which exist."""
        task = task or chaos_app.quick
        base = f"B{time.monotonic_ns()}-"
        subs = [Submitted(keyed_run_id(task.name, base + str(i)), task.name, base + str(i),
                          time.time()) for i in range(n)]
        self.submitted.extend(subs)
        try:
            self.app.enqueue_many([{"task": task, "args": [0.01], "key": s.key} for s in subs])
            created = {s.run_id for s in subs}
        except EnqueueIncomplete as exc:
            created = set(exc.created)
        except DuetimeError:
            created = set()
        now = time.time()
        for s in subs:
            s.tries = 1
            if s.run_id in created:
                s.acked = now
        return len(created)

    def _submit(self, task: duetime.Task, args: list, key: str, delay: float) -> None:
        s = Submitted(keyed_run_id(task.name, key), task.name, key, time.time())
        self.submitted.append(s)
        deadline = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline:
            s.tries += 1
            try:
                run_id = self.app.enqueue(task, args, key=key, delay=delay or None)
            except DuetimeError as exc:
                name = type(exc).__name__
                self.refusals[name] = self.refusals.get(name, 0) + 1
                time.sleep(0.1)
                continue
            assert run_id == s.run_id, (run_id, s.run_id)
            s.acked = time.time()
            return


def register_schedules(app: duetime.App) -> None:
    for s in schedules():
        app.schedule(s.name, s.trigger, s.task, args=list(s.args), queue=s.queue, catchup="all",
                     overlap=s.overlap, lateness=s.lateness)
