"""Throttle by key (lua/enqueue/coalesce.lua): the first enqueue of each window creates the
run, the later ones of that window return its id (whatever state it is in); the next window
makes a new run. The window starts at the run's `created` (server time): a test ends a window
by moving that back, never by sleeping."""

from __future__ import annotations

import pytest
from duetime.common.connection import sync_client

from tests.apps import basic
from tests.integration.inproc import burst
from tests.workloads.test_debounce import runs_of

pytestmark = pytest.mark.scripts


def end_window(app, run_id: str, by_ms: int) -> None:
    r = sync_client(app.redis_url)
    try:
        k = app.keys.run(app.keys.partition_of_run(run_id), run_id)
        r.hset(k, "created", int(r.hget(k, "created")) - by_ms)
    finally:
        r.close()


def test_n_enqueues_in_a_window_make_one_run_and_all_return_its_id(app):
    ids = [app.enqueue(basic.noop, [i], key="report", throttle="1h") for i in range(200)]
    assert set(ids) == {ids[0]}
    assert runs_of(app) == [ids[0]]
    assert app.get_run(ids[0]).args == [0]  # the first enqueue's arguments: nothing replaced
    assert app.get_run(ids[0]).state == "scheduled"


def test_the_next_window_makes_a_new_run(app):
    first = app.enqueue(basic.noop, [1], key="report", throttle="60s")
    end_window(app, first, 59_000)  # still inside: 1 s left
    assert app.enqueue(basic.noop, [2], key="report", throttle="60s") == first
    end_window(app, first, 2_000)  # now past the window
    second = app.enqueue(basic.noop, [3], key="report", throttle="60s")
    assert second != first
    assert [app.enqueue(basic.noop, [i], key="report", throttle="60s") for i in range(5)] == \
        [second] * 5
    assert sorted(runs_of(app)) == sorted([first, second])
    assert app.get_run(second).args == [3]


def test_a_finished_run_still_holds_its_window(app):
    rid = app.enqueue(basic.noop, [1], key="t", throttle="1h")
    assert burst(app).processed == 1
    assert app.get_run(rid).state == "succeeded"
    assert app.enqueue(basic.noop, [2], key="t", throttle="1h") == rid
    assert burst(app).processed == 0  # nothing new to run inside the window
    assert basic.r().hgetall(basic.count_key()) == {rid.encode(): b"1"}


def test_keys_and_tasks_are_throttled_apart(app):
    a = app.enqueue(basic.noop, [1], key="a", throttle="1h")
    b = app.enqueue(basic.noop, [1], key="b", throttle="1h")
    c = app.enqueue(basic.anoop, [1], key="a", throttle="1h")
    assert len({a, b, c}) == 3
    assert app.enqueue_many([{"task": basic.noop, "args": [9], "key": "a", "throttle": "1h"},
                             (basic.noop, [8])])[0] == a


def test_throttle_keeps_its_own_delay(app, r):
    rid = app.enqueue(basic.noop, [1], key="d", throttle="1h", delay="30m")
    k = app.keys.run(app.keys.partition_of_run(rid), rid)
    created, due = int(r.hget(k, "created")), int(r.hget(k, "due"))
    assert due == created + 30 * 60_000
    assert app.enqueue(basic.noop, [2], key="d", throttle="1h", delay="30m") == rid
    assert int(r.hget(k, "due")) == due  # a throttled run is never moved
