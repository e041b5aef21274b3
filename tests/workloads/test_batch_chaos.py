"""A batch under SIGKILL: worker processes killed every second while members run (the reaper
recovers their leases), members failing at random: on_complete is created and run exactly
once, and the batch's counts equal its members' final states."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.apps import workloads as w
from tests.conftest import wait_for
from tests.workloads.test_batches import released

pytestmark = [pytest.mark.scripts(memory="worker processes need a server they can reach"),
              pytest.mark.slow]


def test_a_batch_survives_sigkilled_workers_with_callbacks_exactly_once(wapp, procs):
    rnd = random.Random(3)
    n = 600
    fails = [rnd.random() < 0.1 for _ in range(n)]
    bid = wapp.batch([(w.busy, [i, f]) for i, f in enumerate(fails)],
                     on_complete=(w.callback, ["complete"]), on_failure=(w.callback, ["failure"]),
                     on_success=(w.callback, ["success"]))
    procs.reaper(tick="50ms")
    args, app_ref = ("--lease", "1s", "--concurrency", "8"), "tests.apps.workloads:app"
    workers = [procs.worker(*args, app=app_ref) for _ in range(2)]
    kills = 0
    deadline = time.monotonic() + 120
    while not wapp.get_batch(bid).finished and time.monotonic() < deadline:
        time.sleep(1.0)
        if kills < 6:
            victim = workers.pop(0)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills += 1
            workers.append(procs.worker(*args, app=app_ref))
    b = wapp.wait_batch(bid, timeout=60)
    assert kills >= 3  # the kills landed while the batch ran
    members = wapp.batch_members(bid, limit=n + 10)
    states = [wapp.get_run(m).state for m in members]
    assert len(members) == n
    assert b.succeeded == states.count("succeeded")
    assert b.failed == n - states.count("succeeded")
    assert b.failed == fails.count(True)
    # the on_failure callback is released at the first failure, while the kills go on: an
    # attempt of it may be killed and retried (w.callback has retries)
    wait_for(lambda: wapp.get_run(b.on_complete_run).state == "succeeded", timeout=60)
    wait_for(lambda: wapp.get_run(b.on_failure_run).state == "succeeded", timeout=60)
    assert wapp.get_run(b.on_success_run).state == "cancelled"
    # created once and released once (a kill may land while a callback runs: then the
    # callback's own attempt is retried, as any run's is; it is never created twice)
    for rid in (b.on_complete_run, b.on_failure_run):
        assert released(wapp, rid) == 1
        assert int(w.r().hget(w.ran_key(), rid) or 0) >= 1
