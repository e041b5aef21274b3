"""A batch under SIGKILL: worker processes killed each time 80 more members ended (the reaper
recovers their leases), members failing at random, members adding members from inside
(`batch_add`): on_complete is created and released exactly once (0 or 2 fails the test), and
the batch's counts equal its members' final states.

A bounded size for CI (600 members, 6 kills, one after every 80 members ended): what the
guarantee rests on -- a member's end and its counting in one script call, callbacks created up
front with derived ids -- does not depend on the size. The 10,000-member run of the issue's
size is the soak (`make soak-batches`, `python -m bench.batches --chaos`, result in
bench/RESULTS.md), with the same kit (tests/workloads/batch_chaos_kit.py) and the same checks."""

from __future__ import annotations

import pytest

from tests.workloads import batch_chaos_kit as kit

pytestmark = [pytest.mark.scripts(memory="worker processes need a server they can reach"),
              pytest.mark.slow]


def test_a_batch_survives_sigkilled_workers_with_callbacks_exactly_once(wapp, procs):
    the_plan = kit.plan(588, seed=3, spawn_every=98, per_spawn=2)  # 6 spawners: 600 members
    assert the_plan.total == 600 and the_plan.spawns and the_plan.failed
    procs.reaper(tick="50ms")
    rep = kit.run(wapp, lambda: procs.worker("--lease", "1s", "--concurrency", "8",
                                             app="tests.apps.workloads:app"),
                  the_plan, workers=2, kill_every_ended=80, max_kills=6, deadline_s=120)
    assert rep.kills == 6  # each after 80 more members ended: all while the batch ran
    assert rep.problems == []
    assert rep.callbacks["on_complete"]["released"] == 1
    assert rep.callbacks["on_failure"]["released"] == 1
    assert rep.callbacks["on_success"]["state"] == "cancelled"
