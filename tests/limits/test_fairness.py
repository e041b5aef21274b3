"""Fair share: a tenant's backlog does not hold back another tenant's runs, and weighted
queues (`--queues high:5,low:1`) never starve the lighter queue."""

from __future__ import annotations

from duetime.common.connection import sync_client
from duetime.common.models import to_ms
from duetime.worker.config import parse_queues

from tests.apps import basic
from tests.conftest import wait_for

BOUND_MS = 1000  # docs/fairness.md


def _succeeded(app, ids) -> int:
    return sum(app.get_run(i).state == "succeeded" for i in ids)


def test_a_20000_run_backlog_does_not_delay_another_tenant(app, procs):
    k = app.keys
    assert k.partition_of_tenant("acme") != k.partition_of_tenant("globex")
    backlog = app.enqueue_many([{"task": basic.anoop, "args": [i], "tenant": "acme"}
                                for i in range(20_000)])
    procs.worker("--concurrency", "16")
    r = sync_client(app.redis_url)
    wait_for(lambda: r.hlen(basic.count_key()) >= 200, 30, what="the backlog to drain a bit")
    small = [app.enqueue(basic.anoop, [i], tenant="globex") for i in range(10)]
    wait_for(lambda: _succeeded(app, small) == 10, 20, what="the small tenant's runs")
    waits = [to_ms(run.started) - to_ms(run.created) for run in map(app.get_run, small)]
    assert max(waits) <= BOUND_MS, waits
    assert r.hlen(basic.count_key()) < 20_000  # the backlog was still there meanwhile
    assert app.get_run(backlog[-1]).state == "scheduled"


def test_weighted_queues_drain_the_light_queue_under_load_on_the_heavy_one(app, procs):
    heavy = app.enqueue_many([{"task": basic.anoop, "args": [i], "queue": "high"}
                              for i in range(6000)])
    light = app.enqueue_many([{"task": basic.anoop, "args": [i], "queue": "low"}
                              for i in range(20)])
    procs.worker("--queues", "high:5,low:1", "--concurrency", "8")
    wait_for(lambda: _succeeded(app, light) == 20, 30, what="the light queue to drain")
    r = sync_client(app.redis_url)
    done_heavy = sum(1 for i in heavy if r.hexists(basic.count_key(), i))
    assert done_heavy < 6000  # the heavy queue still had work: the light one was not starved
    assert done_heavy >= 20  # and it got the larger share meanwhile


def test_queue_weights_parse():
    assert parse_queues("a,b") == (["a", "b"], None)
    assert parse_queues("high:5, low") == (["high", "low"], {"high": 5, "low": 1})
    assert parse_queues("x:y:3") == (["x:y"], {"x:y": 3})


def _same_home(app, tenant: str) -> str:
    k = app.keys
    return next(f"t{i}" for i in range(10_000)
                if k.partition_of_tenant(f"t{i}") == k.partition_of_tenant(tenant))


def test_tenants_sharing_a_partition_are_claimed_round_robin(app):
    from duetime.common import transitions as tr
    from duetime.common.scripts import Scripts

    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    other = _same_home(app, "acme")
    p = k.partition_of_tenant("acme")
    app.enqueue_many([{"task": basic.noop, "args": [i], "tenant": "acme"} for i in range(100)])
    small = [app.enqueue(basic.noop, tenant=other) for _ in range(3)]
    plain = app.enqueue(basic.noop)  # no tenant, placed by its id
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    got = [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
    assert len(got) >= 8 and set(small) <= set(got)  # not behind the 100 earlier runs
    assert k.partition_of_run(plain) != p or plain in got
    # lanes and the laned index hold exactly the runs still waiting
    left = r.zcard(k.due(p, "default"))
    assert r.zcard(k.laned(p, "default")) == left
    assert r.zcard(k.lane(p, "default", "acme")) == left


def test_a_backlog_does_not_delay_a_tenant_sharing_its_partition(app, procs):
    other = _same_home(app, "acme")
    app.enqueue_many([{"task": basic.anoop, "args": [i], "tenant": "acme"}
                      for i in range(20_000)])
    procs.worker("--concurrency", "16")
    r = sync_client(app.redis_url)
    wait_for(lambda: r.hlen(basic.count_key()) >= 200, 30, what="the backlog to drain a bit")
    small = [app.enqueue(basic.anoop, [i], tenant=other) for i in range(10)]
    wait_for(lambda: _succeeded(app, small) == 10, 20, what="the small tenant's runs")
    waits = [to_ms(run.started) - to_ms(run.created) for run in map(app.get_run, small)]
    assert max(waits) <= BOUND_MS, waits
    assert r.hlen(basic.count_key()) < 20_000


def test_a_cancelled_laned_run_leaves_its_lane_at_the_next_claim(app):
    from duetime.common import transitions as tr
    from duetime.common.scripts import Scripts

    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    p = k.partition_of_tenant("acme")
    gone, kept = app.enqueue(basic.noop, tenant="acme"), app.enqueue(basic.noop, tenant="acme")
    app.cancel(gone)
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    got = [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
    assert got == [kept] and app.get_run(gone).state == "cancelled"
    assert r.zcard(k.lane(p, "default", "acme")) == 0 and r.zcard(k.laned(p, "default")) == 0
    # an emptied lane leaves the tenant index at the next claim
    tr_keys, tr_args = tr.claim(k, p, "default", "w1", 10, 60_000)
    scripts.claim(keys=tr_keys, args=tr_args)
    assert not r.exists(k.lanes(p, "default"))


def test_tenant_weights_split_a_claim_between_lanes(app):
    from duetime.common import transitions as tr
    from duetime.common.scripts import Scripts

    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    other = _same_home(app, "acme")
    p = k.partition_of_tenant("acme")
    app.set_limit("tenant", "acme", weight=3)
    heavy = set(app.enqueue_many([{"task": basic.noop, "tenant": "acme"} for _ in range(50)]))
    light = set(app.enqueue_many([{"task": basic.noop, "tenant": other} for _ in range(50)]))
    for _ in range(3):
        keys, args = tr.claim(k, p, "default", "w1", 8, 60_000)
        got = {c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs}
        assert (len(got & heavy), len(got & light)) == (6, 2)
    assert [x["weight"] for x in app_limits(app)] == [3]


def app_limits(app):
    from tests.integration.opkit import as_json, cli

    return as_json(cli(app.redis_url, app.keys.namespace, "limits", "list", "--json"))
