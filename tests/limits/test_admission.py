"""Admission inside tenant lanes: a run a limit holds back never blocks the runs behind it
(within a lane, across lanes, across priorities), and every held run a claim reads records
the limit that held it (`limited_by`). The claim reads past at most HELD_SCAN held runs per
call (docs/fairness.md); these tests stay within that bound."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms, sync_client
from duetime.common.scripts import Scripts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duetime
from tests.apps import basic
from tests.integration.inproc import serving, until

HELD_SCAN = 32  # lua/claim/limits.lua


def _runs(app: duetime.App, ids: list[str]) -> list[Any]:
    return [app.get_run(i) for i in ids]


@pytest.mark.parametrize("concurrency", [2, 8])
def test_every_run_a_limit_holds_in_a_lane_records_the_limit(app: duetime.App,
                                                            concurrency: int) -> None:
    """8 runs of a tenant limited to 1 per hour: 1 starts, and all 7 held runs say why (a
    worker's claim asks for about half its concurrency: the lane is read past its share)."""
    app.set_limit("tenant", "acme", rate=1, per="1h", burst=1)
    ids = app.enqueue_many([{"task": basic.anoop, "args": [i], "tenant": "acme"} for i in range(8)])

    def settled() -> bool:
        runs = _runs(app, ids)
        return (sum(r.state == "succeeded" for r in runs) == 1
                and all(r.limited_by for r in runs if r.state == "scheduled"))

    async def main() -> None:
        async with serving(app, concurrency=concurrency):
            await until(settled, timeout=20, what="1 run to start and 7 to record their limit")

    asyncio.run(main())
    held = [r for r in _runs(app, ids) if r.state == "scheduled"]
    assert len(held) == 7
    assert {r.limited_by for r in held} == {"tenant:acme:rate"}


@pytest.mark.parametrize("tenant", ["acme", None])
def test_a_tenants_unlimited_runs_start_behind_its_held_ones(app: duetime.App,
                                                             tenant: str | None) -> None:
    """19 runs held by a task's rate limit ahead of 5 runs of another task of the same tenant
    (its lane): the 5 start; the held ones wait, each saying why."""
    app.set_limit("task", "noop", rate=1, per="1h", burst=1)
    limited = app.enqueue_many([{"task": basic.noop, "args": [i], "tenant": tenant}
                                for i in range(20)])
    free = app.enqueue_many([{"task": basic.anoop, "args": [i], "tenant": tenant}
                             for i in range(5)])

    async def main() -> None:
        async with serving(app, concurrency=8):
            await until(lambda: all(r.state == "succeeded" for r in _runs(app, free)),
                        timeout=20, what="the 5 unlimited runs to run")
            if tenant is not None:  # in one partition: its burst of 1 lets one start
                await until(lambda: sum(r.state == "succeeded" for r in _runs(app, limited)) == 1,
                            timeout=20, what="one run of the limited task to run")

    asyncio.run(main())
    if tenant is not None:
        held = [r for r in _runs(app, limited) if r.state == "scheduled"]
        assert len(held) == 19 and {r.limited_by for r in held} == {"task:noop:rate"}


def test_held_priority_runs_do_not_block_a_startable_run_behind_them(app: duetime.App) -> None:
    """Priority runs come first in a claim; when a limit holds them, the claim reads on."""
    r = sync_client(app.redis_url)
    k, scripts = app.keys, Scripts(r)
    p = k.partition_of_tenant("acme")
    app.set_limit("task", "noop", concurrency=k.partitions)  # one slot in each partition
    urgent = app.enqueue_many([{"task": basic.noop, "tenant": "acme", "priority": 50}
                               for _ in range(10)])
    plain = app.enqueue(basic.anoop, tenant="acme")
    keys, args = tr.claim(k, p, "default", "w1", 4, 60_000)
    got = [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
    assert len(got) == 2 and got[0] in urgent and got[1] == plain
    held = [x for x in _runs(app, urgent) if x.state == "scheduled"]
    assert len(held) == 9 and {x.limited_by for x in held} == {"task:noop:concurrency"}


# -- the property: admission over random mixes, against the real scripts ----------------------
papp = duetime.App(partitions=1)  # one partition: every run, laned or not, meets in one claim
TASKS = ("pa", "pb")


@papp.task(name="pa")
def pa() -> None:
    pass


@papp.task(name="pb")
def pb() -> None:
    pass


TASK_OF = {"pa": pa, "pb": pb}
TENANTS = ("ta", "tb", "tc")
# a limit: (concurrency or None, rate burst or None); rates are 1 per hour, so a claim's own
# refill is negligible and a spent bucket stays spent
limit_st = st.tuples(st.none() | st.integers(1, 3), st.none() | st.integers(1, 3))
mix_st = st.fixed_dictionaries({
    "tenants": st.dictionaries(st.sampled_from(TENANTS),
                               st.tuples(limit_st, st.integers(1, 3)), max_size=3),
    "queue": limit_st,
    "tasks": st.dictionaries(st.sampled_from(TASKS), limit_st, max_size=2),
    # runs enqueued before any tenant's: not laned (the due-order path)
    "unlaned": st.lists(st.sampled_from(TASKS), max_size=3),
    "runs": st.lists(st.tuples(st.sampled_from(TASKS), st.none() | st.sampled_from(TENANTS),
                               st.sampled_from([0, 0, 0, 5, 50])), min_size=1, max_size=22),
    "claims": st.lists(st.integers(1, 8), min_size=1, max_size=3),
})


def _set(kind: str, name: str, lim: tuple[int | None, int | None], weight: int | None = None
         ) -> None:
    conc, burst = lim
    if conc is None and burst is None and weight in (None, 1):
        return
    papp.set_limit(kind, name, concurrency=conc, rate=None if burst is None else 1,
                   per="1h", burst=burst, weight=weight)


def _s(v: Any) -> str:
    return "" if v is None else v.decode() if isinstance(v, bytes) else str(v)


def _blocking(r: redis.Redis, k: Any, task: str, tenant: str | None) -> set[str]:
    """The limits that hold a run of `task` and `tenant` back right now, as `limited_by`
    names them (read from the partition's counts and buckets, not from the script)."""
    lims = {_s(a): _s(b) for a, b in r.hgetall(k.limits(0)).items()}
    now = server_time_ms(r)
    scopes = ["queue:default", f"task:{task}"] + ([f"tenant:{tenant}"] if tenant else [])
    out = set()
    for s in scopes:
        if f"{s}:c" in lims and r.zcard(k.limrun(0, s)) >= int(lims[f"{s}:c"]):
            out.add(f"{s}:concurrency")
        if f"{s}:r" in lims:
            rate, burst = map(float, lims[f"{s}:r"].split())
            tokens, ts = (_s(v) for v in r.hmget(k.bucket(0, s), "tokens", "ts"))
            left = burst if not tokens else min(burst, float(tokens) + (now - int(ts)) * rate)
            if left < 1:
                out.add(f"{s}:rate")
    return out


@pytest.fixture
def prop_r(url: str) -> Iterator[redis.Redis]:
    client = sync_client(url)
    yield client
    client.close()
    papp.close()


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mix=mix_st)
def test_a_run_a_limit_allows_never_waits_behind_held_ones(prop_r: redis.Redis, url: str,
                                                           mix: dict[str, Any]) -> None:
    r, ns = prop_r, f"adm{uuid.uuid4().hex[:8]}"
    papp.configure(redis_url=url, namespace=ns)
    k, scripts = papp.keys, Scripts(r)
    try:
        for tenant, (lim, weight) in mix["tenants"].items():
            _set("tenant", tenant, lim, weight)
        _set("queue", "default", mix["queue"])
        for task, lim in mix["tasks"].items():
            _set("task", task, lim)
        items = [{"task": TASK_OF[t]} for t in mix["unlaned"]]
        items += [{"task": TASK_OF[t], "priority": prio, **({"tenant": ten} if ten else {})}
                  for t, ten, prio in mix["runs"]]
        assert len(items) < HELD_SCAN  # within the bound every run is read by each claim
        # unlaned first: once a tenant's run makes lanes, a run without one gets a lane too
        papp.enqueue_many(items[: len(mix["unlaned"])])
        papp.enqueue_many(items[len(mix["unlaned"]):])
        for n in mix["claims"]:
            keys, args = tr.claim(k, 0, "default", "w1", n, 600_000)
            got = tr.parse_claim(scripts.claim(keys=keys, args=args)).runs
            for scope in [f"tenant:{t}" for t in TENANTS] + ["queue:default", "task:pa", "task:pb"]:
                mx = r.hget(k.limits(0), f"{scope}:c")
                assert mx is None or r.zcard(k.limrun(0, scope)) <= int(mx), scope
            if len(got) == n:
                continue  # a full batch: what it did not read waits for the next claim
            for run_id in r.zrange(k.due(0, "default"), 0, -1):
                state, task, tenant, why = (_s(v) for v in r.hmget(
                    k.run(0, _s(run_id)), "state", "task", "tenant", "limited_by"))
                assert state == "scheduled"
                blocking = _blocking(r, k, task, tenant or None)
                # it may not start (no run a limit allows was left behind), and says why
                assert blocking, (run_id, task, tenant, len(got), n)
                assert why in blocking, (run_id, why, blocking)
    finally:
        for key in r.scan_iter(f"{ns}:*", count=1000):
            r.delete(key)


def test_an_unlaned_run_behind_laned_ones_is_claimed(prop_r: redis.Redis, url: str) -> None:
    """The due-order path passes laned runs by; a window of the due set full of them does not
    end it: a run without a lane (enqueued before the lanes existed) due after them is still
    claimed by a claim the lanes' shares leave room in. (Same due times, ordered by random run
    ids, made this intermittent in the property test above.)"""
    ns = f"adm{uuid.uuid4().hex[:8]}"
    papp.configure(redis_url=url, namespace=ns)
    k, scripts = papp.keys, Scripts(prop_r)
    t0 = server_time_ms(prop_r) - 10_000
    at = datetime.fromtimestamp(t0 / 1000, UTC)
    try:
        plain = papp.enqueue(pa, at=at + timedelta(milliseconds=1))  # no lanes yet: unlaned
        acme = papp.enqueue_many([{"task": pa, "tenant": "acme", "at": at} for _ in range(5)])
        beta = papp.enqueue(pb, tenant="beta", at=at)
        # a claim of 4: a share of 2 per lane (acme gives 2, beta 1), the due set's first window
        # of 4 is all laned runs: the unlaned one behind them fills the batch
        keys, args = tr.claim(k, 0, "default", "w1", 4, 60_000)
        got = [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
        assert len(got) == 4 and plain in got and beta in got
        assert len(set(got) & set(acme)) == 2
    finally:
        for key in prop_r.scan_iter(f"{ns}:*", count=1000):
            prop_r.delete(key)


def test_a_claim_with_room_reads_the_lanes_past_their_shares(prop_r: redis.Redis,
                                                            url: str) -> None:
    """No limit holds anything, yet a lane's share can run short of the batch: a priority run,
    taken first, is also the head of its lane (its share spent on it), or a lane has fewer
    runs than its share. A claim with room left reads the lanes past their shares, so it is
    full while runs are due."""
    ns = f"adm{uuid.uuid4().hex[:8]}"
    papp.configure(redis_url=url, namespace=ns)
    k, scripts = papp.keys, Scripts(prop_r)
    try:
        ids = papp.enqueue_many([{"task": pa, "tenant": "ta"}, {"task": pa, "tenant": "ta"},
                                 {"task": pa, "priority": 50}])  # the last laned in '|'
        keys, args = tr.claim(k, 0, "default", "w1", 3, 60_000)
        got = [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
        assert got[0] == ids[2] and sorted(got) == sorted(ids)
        # a lane short of its share (ta: 1 run, '': 3, a claim of 4 gives each a share of 2)
        more = papp.enqueue_many([{"task": pa, "tenant": "ta"}] + [{"task": pa}] * 3)
        keys, args = tr.claim(k, 0, "default", "w1", 4, 60_000)
        got = [c.run_id for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
        assert sorted(got) == sorted(more)
    finally:
        for key in prop_r.scan_iter(f"{ns}:*", count=1000):
            prop_r.delete(key)
