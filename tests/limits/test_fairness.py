"""Fair share: a tenant's backlog does not hold back another tenant's runs, and weighted
queues (`--queues high:5,low:1`) never starve the lighter queue."""

from __future__ import annotations

import asyncio

from duetime.common.connection import sync_client
from duetime.worker.config import parse_queues

from tests.apps import basic
from tests.integration.inproc import serving, until

# Runs of the backlog that may start between another tenant's enqueue and that tenant's last
# start: the claims in flight then (2 x 16) and the ones the fair order puts before it, with
# room for the test's own polling; an unfair claim order would run the whole backlog (20,000)
# first. How long the other tenant waits in ms (docs/fairness.md) is measured in bench/limits.py.
BOUND_RUNS = 400


def _succeeded(app, ids) -> int:
    return sum(app.get_run(i).state == "succeeded" for i in ids)


def _backlog_runs_before_the_small_tenant(app, small_tenant: str) -> int:
    """With a 20,000-run backlog of tenant acme being worked through, enqueue 10 runs of
    `small_tenant`: → how many backlog runs ran meanwhile, until the 10 had all run."""
    r = sync_client(app.redis_url)

    async def main() -> int:
        async with serving(app, concurrency=16):
            await until(lambda: r.hlen(basic.count_key()) >= 200, 30,
                        what="the backlog to drain a bit")
            before = r.hlen(basic.count_key())
            small = [app.enqueue(basic.anoop, [i], tenant=small_tenant) for i in range(10)]
            await until(lambda: all(r.hexists(basic.count_key(), i) for i in small), 20,
                        interval=0.002, what="the small tenant's runs")
            meanwhile = r.hlen(basic.count_key()) - before - 10
        assert _succeeded(app, small) == 10
        return meanwhile

    return asyncio.run(main())


def test_a_20000_run_backlog_does_not_delay_another_tenant(app):
    k = app.keys
    assert k.partition_of_tenant("acme") != k.partition_of_tenant("globex")
    backlog = app.enqueue_many([{"task": basic.anoop, "args": [i], "tenant": "acme"}
                                for i in range(20_000)])
    meanwhile = _backlog_runs_before_the_small_tenant(app, "globex")
    assert meanwhile <= BOUND_RUNS, meanwhile
    r = sync_client(app.redis_url)
    assert r.hlen(basic.count_key()) < 20_000  # the backlog was still there meanwhile
    assert app.get_run(backlog[-1]).state == "scheduled"


def test_weighted_queues_drain_the_light_queue_under_load_on_the_heavy_one(app):
    heavy = app.enqueue_many([{"task": basic.anoop, "args": [i], "queue": "high"}
                              for i in range(6000)])
    light = app.enqueue_many([{"task": basic.anoop, "args": [i], "queue": "low"}
                              for i in range(20)])
    r = sync_client(app.redis_url)

    async def main() -> int:
        queues, weights = parse_queues("high:5,low:1")
        async with serving(app, queues=queues, queue_weights=weights, concurrency=8):
            await until(lambda: all(r.hexists(basic.count_key(), i) for i in light), 30,
                        interval=0.002, what="the light queue to drain")
            return sum(1 for i in heavy if r.hexists(basic.count_key(), i))

    done_heavy = asyncio.run(main())
    assert _succeeded(app, light) == 20
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


def test_a_backlog_does_not_delay_a_tenant_sharing_its_partition(app):
    other = _same_home(app, "acme")
    app.enqueue_many([{"task": basic.anoop, "args": [i], "tenant": "acme"}
                      for i in range(20_000)])
    meanwhile = _backlog_runs_before_the_small_tenant(app, other)
    assert meanwhile <= BOUND_RUNS, meanwhile
    r = sync_client(app.redis_url)
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
