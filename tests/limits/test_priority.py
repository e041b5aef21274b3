"""Per-run priority within a queue: among runs already due, higher priority first."""

from __future__ import annotations

import pytest
from duetime.common import transitions as tr
from duetime.common.connection import sync_client
from duetime.common.scripts import Scripts

import duetime
from tests.apps import basic


def _claim(app, p: int, n: int) -> list[str]:
    r = sync_client(app.redis_url)
    keys, args = tr.claim(app.keys, p, "default", "w1", n, 60_000)
    return [c.run_id for c in tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs]


def test_due_runs_of_higher_priority_are_claimed_first(app):
    p = app.keys.partition_of_tenant("acme")  # one partition: one due set to compare in
    plain = [app.enqueue(basic.noop, [i], tenant="acme") for i in range(10)]
    low = app.enqueue(basic.noop, tenant="acme", priority=5)
    high = app.enqueue(basic.noop, tenant="acme", priority=50)
    later = app.enqueue(basic.noop, tenant="acme", priority=99, delay=60)  # not due yet
    assert _claim(app, p, 2) == [high, low]
    nxt = _claim(app, p, 3)  # then the queue's own order (due time; ties by id)
    assert len(nxt) == 3 and set(nxt) <= set(plain)
    assert app.get_run(later).state == "scheduled"
    r = sync_client(app.redis_url)
    assert r.zrange(app.keys.prio(p, "default"), 0, -1) == [later.encode()]


def test_a_cancelled_priority_run_is_dropped_from_the_index(app):
    p = app.keys.partition_of_tenant("acme")
    gone = app.enqueue(basic.noop, tenant="acme", priority=10)
    app.enqueue(basic.noop, tenant="acme")
    app.cancel(gone)
    assert len(_claim(app, p, 5)) == 1
    assert sync_client(app.redis_url).zcard(app.keys.prio(p, "default")) == 0


@pytest.mark.parametrize("bad", [-1, 101, 1.5, True])
def test_bad_priority_is_refused(app, bad):
    with pytest.raises(duetime.InvalidInput):
        app.enqueue(basic.noop, priority=bad)
