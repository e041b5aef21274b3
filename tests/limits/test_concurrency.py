"""Concurrency limits hold across workers: counted in Redis at claim time, freed when an
attempt ends or its lease expires (a SIGKILLed worker never leaks a slot)."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime, timedelta

import pytest
from duetime.common import limit_fields
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms, sync_client
from duetime.common.scripts import Scripts

import duetime
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.inproc import drain, serving, until
from tests.integration.opkit import as_json, cli, ok
from tests.limits.journal import entries, max_running


def test_tenant_limit_3_with_10_slots_over_two_workers(app):
    app.set_limit("tenant", "acme", concurrency=3)
    ids = app.enqueue_many([(basic.limited, [0.15]) for _ in range(30)])

    async def main() -> None:  # two workers, each its own connections, until both are idle
        await asyncio.gather(drain(app, concurrency=5), drain(app, concurrency=5))

    asyncio.run(main())
    r = sync_client(app.redis_url)
    assert len(entries(r)) == 60  # 30 runs started and ended
    assert max_running(r) == 3  # never more, and the limit was reached (10 slots were free)
    assert all(app.get_run(i).state == "succeeded" for i in ids)
    held = [app.get_run(i).limited_by for i in ids]
    assert "tenant:acme:concurrency" in held
    # every slot was given back
    home = app.keys.partition_of_tenant("acme")
    assert r.zcard(app.keys.limrun(home, "tenant:acme")) == 0


def test_other_tenants_are_not_held_by_a_full_tenant(app):
    app.set_limit("tenant", "acme", concurrency=1)
    # acme's runs last until the gate opens: the other tenant's must all end before any of
    # them (0.3 s runs let a slow machine end a third one before globex's were seen done)
    busy = app.enqueue_many([(basic.limited_gated, ["busy"]) for _ in range(4)])
    free = [app.enqueue(basic.limited, [0], tenant="globex") for _ in range(3)]
    r = sync_client(app.redis_url)

    async def main() -> None:
        async with serving(app, concurrency=8):
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in free), 20,
                        what="the other tenant's runs")
            assert sum(app.get_run(i).state == "succeeded" for i in busy) == 0
            r.set(basic.gate_key("busy"), 1)
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in busy), 20,
                        what="the limited tenant's runs")

    asyncio.run(main())
    assert max_running(r, set(busy)) == 1


def test_slot_of_a_sigkilled_worker_frees_through_its_lease(app, procs):
    app.set_limit("tenant", "acme", concurrency=1)
    stuck = app.enqueue(basic.limited, [60])
    w = procs.worker("--concurrency", "4", "--lease", "1s")
    r = sync_client(app.redis_url)
    wait_for(lambda: len(entries(r)) >= 1, 20, what="the first run to start")
    nxt = app.enqueue(basic.limited, [0])
    wait_for(lambda: app.get_run(nxt).limited_by == "tenant:acme:concurrency", 10,
             what="the second run to be held back")
    assert app.get_run(nxt).state == "scheduled"
    w.send_signal(signal.SIGKILL)
    w.wait()

    async def main() -> None:  # another worker; no reaper runs: the claim frees the slot
        async with serving(app, concurrency=4, lease_ms=1000):
            await until(lambda: app.get_run(nxt).state == "succeeded", 20,
                        what="the held run to run")

    asyncio.run(main())
    assert app.get_run(stuck).state == "running"  # not reaped; its slot freed all the same


def test_queue_limit_is_shared_over_partitions(app):
    """A queue spans partitions: its limit is split into shares summing to it."""
    r = sync_client(app.redis_url)
    app.set_limit("queue", "default", concurrency=20)
    field = limit_fields.field("queue:default", "concurrency")
    shares = [int(r.hget(app.keys.limits(p), field)) for p in range(app.keys.partitions)]
    assert sum(shares) == 20 and max(shares) - min(shares) <= 1
    app.set_limit("queue", "default", concurrency=3)  # fewer than partitions: 1 each
    assert {int(r.hget(app.keys.limits(p), field)) for p in range(app.keys.partitions)} == {1}
    app.set_limit("queue", "default")
    assert not any(r.exists(app.keys.limits(p)) for p in range(app.keys.partitions))


def test_queue_concurrency_share_is_enforced_in_the_claim(app):
    """Direct claims: a partition never hands out more than its share, and an ended attempt
    gives its slot back at once."""
    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    app.set_limit("queue", "default", concurrency=k.partitions * 2)  # 2 per partition
    ids = [app.enqueue(basic.noop, tenant="acme") for _ in range(5)]
    p = k.partition_of_tenant("acme")
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    reply = tr.parse_claim(scripts.claim(keys=keys, args=args))
    assert len(reply.runs) == 2 and reply.held_concurrency == 3
    assert reply.next_due_ms is not None  # told when to look again, not "due now" forever
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    again = tr.parse_claim(scripts.claim(keys=keys, args=args))
    assert again.runs == [] and again.held_concurrency == 0  # counted once per run
    c = reply.runs[0]
    keys, args = tr.complete(k, p, [(c.run_id, c.fence)])
    scripts.complete(keys=keys, args=args)
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    third = tr.parse_claim(scripts.claim(keys=keys, args=args))
    assert len(third.runs) == 1 and third.runs[0].limited_by == "queue:default:concurrency"
    assert {app.get_run(i).state for i in ids} == {"running", "succeeded", "scheduled"}


def test_limits_cli_and_bad_input(app):
    url, ns = app.redis_url, app.keys.namespace
    ok(cli(url, ns, "limits", "set", "tenant", "acme", "--concurrency", "3"))
    ok(cli(url, ns, "limits", "set", "task", "noop", "--rate", "10", "--per", "1s"))
    rows = as_json(cli(url, ns, "limits", "list", "--json"))
    assert {(x["kind"], x["name"], x["concurrency"], x["rate"]) for x in rows} == {
        ("tenant", "acme", 3, None), ("task", "noop", None, 10.0)}
    res = cli(url, ns, "limits", "set", "tenant", "a{b}", "--concurrency", "3")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    res = cli(url, ns, "limits", "set", "tenant", "acme", "--concurrency", "0")
    assert res.exit_code == 2
    ok(cli(url, ns, "limits", "clear", "tenant", "acme"))
    assert [x["name"] for x in as_json(cli(url, ns, "limits", "list", "--json"))] == ["noop"]
    with pytest.raises(duetime.InvalidInput):
        app.set_limit("planet", "mars", concurrency=1)
    with pytest.raises(duetime.InvalidInput):
        app.set_limit("tenant", "acme", rate=-1)


def _sample(metric, label: str, suffix: str = "") -> float:
    for fam in metric.collect():
        for s in fam.samples:
            if s.name.endswith(suffix) and label in s.labels.values():
                return s.value
    return 0.0


def test_limited_runs_are_counted_and_their_delay_kept_apart(app):
    import asyncio

    from duetime.common import metrics

    from tests.integration.inproc import serving, until

    app.set_limit("tenant", "acme", concurrency=1)
    held0 = _sample(metrics.RUNS_LIMITED, "concurrency", "_total")
    delayed0 = _sample(metrics.LIMITED_DELAY, "default", "_count")
    queue0 = _sample(metrics.QUEUE_DELAY, "default", "_count")
    ids = app.enqueue_many([(basic.limited, [0.05]) for _ in range(4)])

    async def main() -> None:
        async with serving(app, concurrency=4):
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in ids),
                        what="the runs to succeed")

    asyncio.run(main())
    held = [i for i in ids if app.get_run(i).limited_by]
    assert len(held) >= 2  # with one slot, most of the four waited
    assert _sample(metrics.RUNS_LIMITED, "concurrency", "_total") - held0 == len(held)
    assert _sample(metrics.LIMITED_DELAY, "default", "_count") - delayed0 == len(held)
    assert _sample(metrics.QUEUE_DELAY, "default", "_count") - queue0 == 4 - len(held)


def test_runs_behind_held_ones_are_claimed_and_a_full_batch_says_come_back_now(app):
    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    p = k.partition_of_tenant("acme")
    other = next(f"t{i}" for i in range(10_000) if k.partition_of_tenant(f"t{i}") == p)
    app.set_limit("tenant", "acme", concurrency=1)
    # due an hour ago, a millisecond apart, ahead of b: runs due in one millisecond are ordered
    # by id, so enqueue times alone would not fix which comes first
    past = datetime.now(UTC) - timedelta(hours=1)
    a = [app.enqueue(basic.noop, tenant="acme", at=past + timedelta(milliseconds=i))
         for i in range(3)]
    b = [app.enqueue(basic.noop, tenant=other) for _ in range(5)]
    keys, args = tr.claim(k, p, "default", "w1", 3, 60_000)
    now = server_time_ms(r)
    first = tr.parse_claim(scripts.claim(keys=keys, args=args))
    assert [c.run_id for c in first.runs][0] == a[0] and len(first.runs) == 3
    assert first.next_due_ms is not None and first.next_due_ms <= now  # more may be claimable
    keys, args = tr.claim(k, p, "default", "w1", 10, 60_000)
    now = server_time_ms(r)
    second = tr.parse_claim(scripts.claim(keys=keys, args=args))
    assert {c.run_id for c in second.runs} | {c.run_id for c in first.runs[1:]} == set(b)
    assert second.next_due_ms is not None and second.next_due_ms > now  # only held runs left


def test_a_long_run_keeps_its_slot_past_its_first_lease(app):
    """The slot entry is scored with the lease at claim time; heartbeats extend the lease, and
    a claim that meets the old score re-scores the entry instead of freeing the slot."""
    app.set_limit("tenant", "acme", concurrency=1)
    # five lease lengths of 1 s (600 ms was lapsed by a heartbeat a loaded machine delayed,
    # which freed the slot for a short run beside it)
    long_run = app.enqueue(basic.limited, [5.0])
    r = sync_client(app.redis_url)

    async def main() -> None:
        async with serving(app, concurrency=4, lease_ms=1000):
            await until(lambda: len(entries(r)) >= 1, 20, what="the long run to start")
            short = [app.enqueue(basic.limited, [0]) for _ in range(3)]
            await until(lambda: app.get_run(long_run).state == "succeeded", 20,
                        what="the long run")
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in short), 20,
                        what="the short runs")

    asyncio.run(main())
    assert max_running(r) == 1  # nothing started beside it over five lease lengths
    assert app.get_run(long_run).attempt == 1
