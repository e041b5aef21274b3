"""A tenant lane key of the wrong type (edited by hand) affects only itself: the claim that
meets it sets it aside, the tenant's waiting runs keep their due order, the other tenants'
lanes and the queue go on, nothing is dead-lettered, and an event names the key."""

from __future__ import annotations

from tests.apps import basic
from tests.integration.inproc import burst


def test_a_wrong_type_lane_is_set_aside_and_its_queue_keeps_flowing(app, r):
    k = app.keys
    a = "acme"
    p = k.partition_of_tenant(a)
    b = next(t for t in (f"tenant{i}" for i in range(5000)) if k.partition_of_tenant(t) == p)
    ids_a = [app.enqueue(basic.noop, [i], tenant=a) for i in range(5)]
    ids_b = [app.enqueue(basic.noop, [i], tenant=b) for i in range(5)]
    plain = [app.enqueue(basic.noop, [i]) for i in range(5)]
    lane = k.lane(p, "default", b)
    assert r.type(lane) == b"zset"
    r.delete(lane)
    r.set(lane, "hand-edited")
    burst(app, timeout=30)
    states = {i: app.get_run(i).state for i in ids_a + ids_b + plain}
    assert set(states.values()) == {"succeeded"}, states
    assert r.get(lane + "#damaged") == b"hand-edited"  # kept for the operator
    assert not r.exists(lane) and r.zscore(k.lanes(p, "default"), b) is None
    events = [f[b"detail"].decode() for _, f in r.xrange(k.events(p))
              if f.get(b"event") == b"lane_damaged"]
    assert len(events) == 1 and lane in events[0] and "is a string, not a zset" in events[0], events
    assert not r.zcard(k.dead(p))
    # the tenant enqueues and is served again (a fresh lane)
    again = app.enqueue(basic.noop, [9], tenant=b)
    burst(app, timeout=30)
    assert app.get_run(again).state == "succeeded"
