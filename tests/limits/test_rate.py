"""Rate limits: token buckets refilled from the server clock inside claim.lua. A run held
back stays claimable, and the claim's reply tells the worker when the next token comes."""

from __future__ import annotations

import asyncio

import pytest
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms, sync_client
from duetime.common.models import to_ms
from duetime.common.scripts import Scripts

from tests.apps import basic
from tests.integration.inproc import serving, until
from tests.limits.journal import entries


def _evalsha_calls(r) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.scripts(memory="fakeredis has no INFO commandstats, which this test counts claims by")
def test_100_runs_under_10_per_second_start_at_most_10_per_window(app):
    app.set_limit("tenant", "acme", rate=10, per="1s", burst=1)
    ids = app.enqueue_many([(basic.limited, [0]) for _ in range(100)])
    r = sync_client(app.redis_url)
    calls_before = _evalsha_calls(r)

    async def main() -> None:  # two workers, each with its own connections
        async with serving(app, concurrency=16), serving(app, concurrency=16):
            await until(lambda: len(entries(r)) >= 200, 40, what="100 runs to run")
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in ids), 20,
                        what="every run to succeed")

    asyncio.run(main())
    # the attempt start claim.lua wrote (server clock): any 1 s window holds at most 10
    starts = sorted(to_ms(app.get_run(i).started) for i in ids)
    worst = max(sum(1 for t in starts[i:] if t < s + 1000) for i, s in enumerate(starts))
    assert worst <= 10, worst
    assert starts[-1] - starts[0] >= 9000  # 100 runs at 10/s take about 10 s
    assert len({run_id for k, run_id, _ in entries(r) if k == "s"}) == 100  # none lost
    # the workers slept until the next token instead of spinning on the held runs (a spin
    # makes tens of thousands of calls in 10 s; heartbeats, claims and completions are few)
    assert _evalsha_calls(r) - calls_before < 3000


def test_claim_reply_carries_the_next_token_time(app):
    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    app.set_limit("tenant", "acme", rate=10, per="1s", burst=1)
    ids = [app.enqueue(basic.noop, tenant="acme") for _ in range(3)]
    p = k.partition_of_tenant("acme")
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    before = server_time_ms(r)
    reply = tr.parse_claim(scripts.claim(keys=keys, args=args))
    after = server_time_ms(r)
    assert len(reply.runs) == 1 and reply.held_rate == 2
    # the next token, 100 ms after the claim took this one: between the clock reads around
    # the call (one read before it only put that bound as late as the machine was slow)
    assert reply.next_due_ms is not None
    assert before < reply.next_due_ms <= after + 110
    held = [app.get_run(i) for i in ids if i != reply.runs[0].run_id]
    assert {h.limited_by for h in held} == {"tenant:acme:rate"}
    assert {h.state for h in held} == {"scheduled"}


def test_task_and_queue_rates_are_shared_over_partitions(app):
    r = sync_client(app.redis_url)
    P = app.keys.partitions
    app.set_limit("task", "noop", rate=160, per="1s")
    rate, burst = r.hget(app.keys.limits(0), "task:noop:r").decode().split()
    assert abs(float(rate) - 160 / 1000 / P) < 1e-12 and float(burst) == 160 / P
    app.set_limit("tenant", "acme", rate=5, per="1m", burst=2)
    rate, burst = r.hget(app.keys.limits(3), "tenant:acme:r").decode().split()
    assert abs(float(rate) - 5 / 60_000) < 1e-12 and float(burst) == 2
