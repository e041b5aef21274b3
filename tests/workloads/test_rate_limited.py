"""Back-pressure from inside a run (duetime.RateLimited, lua/rate_limited.lua): the run goes
back to its queue without spending an attempt, and the scope's hold (T:holds, every partition
for a task or queue) keeps claim.lua from admitting the scope's other runs until it ends. The
hold is proven with direct claim calls against a hold the test sets and ends itself (never by
sleeping); the end-to-end test runs 100 runs against a fake API that answers 429 until the test
lets it through."""

from __future__ import annotations

import asyncio
import threading

import pytest
from duetime.common import transitions as tr
from duetime.common.connection import sync_client
from duetime.common.errors import InvalidInput
from duetime.common.metrics import RATE_LIMITED
from duetime.common.scripts import Scripts

import duetime
from tests.apps import basic
from tests.integration.inproc import serving, until

pytestmark = pytest.mark.scripts


class FakeApi:
    """A partner API: answers 429 while `limited`, counting every call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.limited = True
        self.calls = self.refused = 0
        self.served: list[int] = []

    def call(self, i: int) -> int:
        with self.lock:
            self.calls += 1
            if self.limited:
                self.refused += 1
                return 429
            self.served.append(i)
            return 200


API = FakeApi()


@basic.app.task(name="wl-partner-call", retries=2)
def partner_call(i: int) -> None:
    if API.call(i) == 429:
        raise duetime.RateLimited(retry_after="150ms", scope="task")


def server_ms(r) -> int:
    s, us = r.time()
    return s * 1000 + us // 1000


def claim(app, r, p: int, queue: str = "default", n: int = 100) -> tr.ClaimReply:
    keys, args = tr.claim(app.keys, p, queue, "probe", n, 60_000)
    return tr.parse_claim(Scripts(r).claim(keys=keys, args=args))


def claim_everywhere(app, r, queue: str = "default") -> list[str]:
    return [c.run_id for p in range(app.keys.partitions) for c in claim(app, r, p, queue).runs]


def give_back(app, r, c: tr.Claimed, queue: str, retry_after_ms: int, scope: str,
              name: str) -> bytes:
    """What the worker's reporter sends for a RateLimited: the run's call, then the hold in
    every other partition."""
    k, p = app.keys, app.keys.partition_of_run(c.run_id)
    keys, args = tr.rate_limited(k, p, queue, c.run_id, c.fence, retry_after_ms, scope, name, "w")
    reply = Scripts(r).rate_limited(keys=keys, args=args)
    if name:
        for other in range(k.partitions):
            if other != p:
                keys, args = tr.rate_limited(k, other, queue, "", 0, retry_after_ms, scope, name,
                                             "w")
                assert Scripts(r).rate_limited(keys=keys, args=args) == b"rate_limited"
    return reply


def end_holds(app, r) -> None:
    """The hold's end, reached by moving it to the past (time controlled, not slept)."""
    for p in range(app.keys.partitions):
        for f in r.hkeys(app.keys.holds(p)):
            r.hset(app.keys.holds(p), f, server_ms(r) - 1)


def first_claimed(app, r, run_id: str) -> tr.Claimed:
    got = claim(app, r, app.keys.partition_of_run(run_id), n=1)
    assert [c.run_id for c in got.runs] == [run_id], got
    return got.runs[0]


def test_a_task_scope_hold_keeps_the_tasks_other_runs_and_nothing_else(app, r):
    first = app.enqueue(partner_call, [0])
    c = first_claimed(app, r, first)
    held = [app.enqueue(partner_call, [i]) for i in range(1, 40)]  # on every partition
    others = [app.enqueue(basic.noop, [i]) for i in range(10)]
    assert give_back(app, r, c, "default", 60_000, "task", "wl-partner-call") == b"rate_limited"

    run = app.get_run(first)
    assert run.state == "scheduled" and run.attempt == 0  # no attempt spent
    assert int(r.zscore(app.keys.due(app.keys.partition_of_run(first), "default"), first)) \
        >= server_ms(r) + 50_000  # due again once the hold ends
    # every partition holds the task; a claim there admits only the other task's runs
    assert all(r.hget(app.keys.holds(p), "task:wl-partner-call")
               for p in range(app.keys.partitions))
    assert sorted(claim_everywhere(app, r)) == sorted(others)
    assert all(app.get_run(x).state == "scheduled" for x in held)
    assert {app.get_run(x).limited_by for x in held} == {"task:wl-partner-call:held"}

    end_holds(app, r)  # the hold is over: the held runs are claimable again
    assert sorted(claim_everywhere(app, r)) == sorted(held)
    assert all(not r.hexists(app.keys.holds(p), "task:wl-partner-call")
               for p in range(app.keys.partitions))  # an ended hold is dropped by the claim


def test_a_queue_scope_hold_claims_nothing_of_the_queue_until_its_end(app, r):
    first = app.enqueue(basic.noop, [0])
    c = first_claimed(app, r, first)
    rest = [app.enqueue(basic.noop, [i]) for i in range(1, 20)]
    other_q = app.enqueue(basic.noop, [0], queue="other")
    before = server_ms(r)
    assert give_back(app, r, c, "default", 30_000, "queue", "default") == b"rate_limited"
    for p in range(app.keys.partitions):
        reply = claim(app, r, p)
        assert reply.runs == []
        assert reply.next_due_ms >= before + 30_000  # the worker sleeps until the hold ends
    assert claim_everywhere(app, r, "other") == [other_q]
    end_holds(app, r)
    assert sorted(claim_everywhere(app, r)) == sorted(rest)


def test_a_tenant_scope_hold_keeps_that_tenants_runs_only(app, r):
    first = app.enqueue(basic.noop, [0], tenant="acme")
    c = first_claimed(app, r, first)
    acme = [app.enqueue(basic.noop, [i], tenant="acme") for i in range(1, 10)]
    globex = [app.enqueue(basic.noop, [i], tenant="globex") for i in range(5)]
    plain = [app.enqueue(basic.noop, [i]) for i in range(5)]
    assert give_back(app, r, c, "default", 30_000, "tenant", "") == b"rate_limited"
    assert sorted(claim_everywhere(app, r)) == sorted(globex + plain)
    end_holds(app, r)
    assert sorted(claim_everywhere(app, r)) == sorted(acme)


def test_a_shorter_hold_never_shortens_a_longer_one_and_a_stale_fence_is_refused(app, r):
    a = app.enqueue(partner_call, [0])
    ca = first_claimed(app, r, a)
    give_back(app, r, ca, "default", 60_000, "task", "wl-partner-call")
    p = app.keys.partition_of_run(a)
    long_end = int(r.hget(app.keys.holds(p), "task:wl-partner-call"))
    keys, args = tr.rate_limited(app.keys, p, "default", "", 0, 10, "task", "wl-partner-call", "w")
    Scripts(r).rate_limited(keys=keys, args=args)
    assert int(r.hget(app.keys.holds(p), "task:wl-partner-call")) == long_end
    # the same report again (the run is no longer running under that fence): refused
    keys, args = tr.rate_limited(app.keys, p, "default", a, ca.fence, 10, "task", "", "w")
    assert Scripts(r).rate_limited(keys=keys, args=args) == b"stale"


def test_bad_arguments_are_refused_where_raised():
    with pytest.raises(InvalidInput, match="scope"):
        duetime.RateLimited(retry_after="1s", scope="world")
    with pytest.raises(InvalidInput):
        duetime.RateLimited(retry_after="soon")
    e = duetime.RateLimited(retry_after="500ms", scope="queue")
    assert (e.retry_after_ms, e.scope) == (500, "queue")


def test_a_hundred_runs_against_an_api_answering_429_spend_no_attempt_and_all_succeed(app, r):
    API.__init__()
    ids = app.enqueue_many([(partner_call, [i]) for i in range(100)])
    before = RATE_LIMITED.labels("wl-partner-call", "task")._value.get()

    async def scenario() -> None:
        async with serving(app, concurrency=8):
            # the API refused some calls, and the task's scope is held
            await until(lambda: API.refused >= 5, timeout=30, what="429s")
            await until(lambda: any(r.hget(app.keys.holds(p), "task:wl-partner-call")
                                    for p in range(app.keys.partitions)), what="a hold")
            API.limited = False  # the partner's limit is over
            await until(lambda: sorted(API.served) == list(range(100)), timeout=60,
                        what="every run served")
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in ids),
                        timeout=30, what="every run recorded")

    asyncio.run(scenario())
    runs = [app.get_run(i) for i in ids]
    assert all(x.state == "succeeded" for x in runs)  # none dead (retries=2 would be spent)
    assert all(x.attempt == 1 for x in runs)  # a 429 spends no attempt
    refused = sum(int(r.hget(app.keys.run(app.keys.partition_of_run(i), i), "rate_limited")
                      or 0) for i in ids)
    assert refused == API.refused  # every 429 was a hand-back, counted on its run
    assert RATE_LIMITED.labels("wl-partner-call", "task")._value.get() - before == API.refused
    assert sorted(API.served) == list(range(100))  # each served once


@basic.app.task(name="wl-always-limited")
def always_limited(i: int) -> None:
    raise duetime.RateLimited(retry_after="60s", scope="task")


@pytest.fixture(scope="module")
def cluster():
    from duetime.embedded import EmbeddedCluster

    with EmbeddedCluster("redis") as c:
        yield c


@pytest.mark.slow
def test_on_a_cluster_a_debounce_lands_once_and_a_hold_reaches_every_shard(cluster):
    """Three primaries: the debounced key's runs share its partition's slot, and a worker's
    RateLimited raises the hold in every partition, on every shard (its fan-out pipeline)."""
    import uuid

    app = basic.app
    app.configure(redis_url=cluster.url, namespace=f"c{uuid.uuid4().hex[:8]}")
    r = sync_client(cluster.url)
    try:
        ids = [app.enqueue(basic.noop, [i], key="c", debounce="600s") for i in range(100)]
        assert set(ids) == {ids[0]} and app.get_run(ids[0]).args == [99]
        assert app.enqueue(basic.noop, [0], key="t", throttle="1h") == \
            app.enqueue(basic.noop, [1], key="t", throttle="1h")

        rid = app.enqueue(always_limited, [0])
        k = app.keys

        async def scenario() -> None:
            async with serving(app, concurrency=4):
                await until(lambda: all(r.hget(k.holds(p), "task:wl-always-limited")
                                        for p in range(k.partitions)), timeout=30,
                            what="the hold in every partition")

        asyncio.run(scenario())
        run = app.get_run(rid)
        assert run.state == "scheduled" and run.attempt == 0
        later = [app.enqueue(always_limited, [i]) for i in range(1, 30)]
        for p in range(k.partitions):
            keys, args = tr.claim(k, p, "default", "probe", 100, 60_000)
            got = tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs
            assert not {c.run_id for c in got} & set(later)
    finally:
        r.close()
        app.close()
