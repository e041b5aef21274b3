"""Pages by index ranges against a real Valkey: every entry exactly once, in order, whatever
the page size, the ties of a bulk enqueue and the filters."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from duetime.common.errors import InvalidInput

import duetime
from duetime.ops.inspect import GROUPS, Inspector, Position, keyset_merge, page_runs
from duetime.ops.schedule_listing import page_schedules
from tests.apps import webapp
from tests.integration.opkit import Driver


@pytest.mark.parametrize("newest_first", [False, True])
def test_keyset_merge_gives_every_member_once_in_order_across_ties(r, namespace, newest_first):
    rng = random.Random(7)
    keys = [f"{namespace}:z{i}" for i in range(4)]
    entries = {}
    for i, key in enumerate(keys):
        # few distinct scores: long runs of ties inside and across the sets
        members = {f"m{i}-{j:03d}": rng.choice([1.0, 2.0, 2.0, 3.0, 5.0]) for j in range(60)}
        r.zadd(key, members)
        entries.update(members)
    expected = sorted(entries.items(), key=lambda kv: (kv[1], kv[0]), reverse=newest_first)
    for batch in (1, 7, 500):
        got = list(keyset_merge(r, "redis://", keys, newest_first, None, batch))
        assert [m for m, _ in got] == [m for m, _ in expected], batch
    # starting after any entry gives exactly the rest
    for cut in (0, 1, 59, 60, 150, len(expected) - 1):
        member, score = expected[cut]
        rest = list(keyset_merge(r, "redis://", keys, newest_first, (score, member), 5))
        assert [m for m, _ in rest] == [m for m, _ in expected[cut + 1:]], cut


def _walk(insp: Inspector, **kw) -> tuple[list[str], int]:
    ids, pages, after = [], 0, None
    while True:
        page = page_runs(insp, after=after, **kw)
        ids += [s.id for s in page.runs]
        pages += 1
        assert pages < 1000
        if page.next is None:
            return ids, pages
        after = page.next


def test_pages_of_runs_cover_every_run_once_in_listing_order(wapp):
    d = Driver(wapp)
    dead = d.dead(webapp.charge, 30, [1])
    done = d.succeeded(webapp.tick, 40)
    # a bulk enqueue: runs of one script call share their due time
    due = wapp.enqueue_many([(webapp.slow, [0.1])] * 230)
    due += wapp.enqueue_many([{"task": webapp.slow, "args": [0.1], "queue": "other"}] * 20)
    insp = Inspector(wapp.store.client, wapp.keys, wapp.redis_url)
    everything = {s.id: s for s in insp.list_runs(limit=10_000).runs}
    assert len(everything) == len(dead) + len(done) + len(due)
    rank: dict[str, int] = {}
    for i, (_, states, _) in enumerate(GROUPS):
        for state in states:
            rank.setdefault(state, i)  # a dead letter not replayed is in the dead index
    for limit in (1, 17, 50):
        ids, pages = _walk(insp, limit=limit)
        assert len(ids) == len(set(ids)) and set(ids) == set(everything), limit
        # listing order: by state group, then due time (soonest first) or finish (newest first)
        order = [(rank[everything[i].state], everything[i].due if everything[i].state == "scheduled"
                  else -everything[i].finished.timestamp()) for i in ids]  # type: ignore[union-attr]
        assert all(a[0] < b[0] or (a[0] == b[0] and a[1] <= b[1])
                   for a, b in zip(order, order[1:], strict=False)), limit
    ids, _ = _walk(insp, state="dead", limit=7)
    assert sorted(ids) == sorted(dead)
    ids, _ = _walk(insp, queue="other", limit=9)
    assert len(ids) == 20 and set(ids) <= set(due)


def test_a_filter_on_the_record_ends_pages_early_but_finds_every_match(wapp):
    d = Driver(wapp)
    wanted = d.dead(webapp.charge, 5, [1])
    wapp.enqueue_many([(webapp.tick, [])] * 300)
    insp = Inspector(wapp.store.client, wapp.keys, wapp.redis_url)
    page = page_runs(insp, task="web.charge", limit=50, budget=100)
    assert page.examined == 100 and page.next is not None and page.filtered  # ran out of budget
    ids, pages = _walk(insp, task="web.charge", limit=50, budget=100)
    assert sorted(ids) == sorted(wanted) and pages >= 3
    ids, _ = _walk(insp, owner="payments", limit=2, budget=50)
    assert sorted(ids) == sorted(wanted)
    assert _walk(insp, owner="nobody", limit=50)[0] == []


def test_a_page_position_from_elsewhere_is_refused():
    groups = [g[0] for g in GROUPS]
    assert Position.decode("done|1712.5|abc", groups) == Position("done", 1712.5, "abc")
    assert Position("due", 1712.0, "a|b").encode() == "due|1712|a|b"
    assert Position.decode("due|1712|a|b", groups).member == "a|b"
    for bad in ("", "done", "done|x|abc", "nope|1|abc", "done|1|", "done|nan|a"):
        with pytest.raises(InvalidInput):
            Position.decode(bad, groups)


@pytest.mark.parametrize("order", ["created", "next"])
def test_pages_of_schedules_cover_every_schedule_once(wapp, order):
    defs = [wapp.schedule_def(f"s{i:03d}", duetime.Every(timedelta(minutes=1 + i % 7)), webapp.tick)
            for i in range(130)]
    wapp.schedule_many(defs)
    store = wapp.schedules
    seen, after, pages = [], None, 0
    while True:
        infos, after = page_schedules(store, order, after, 25)
        seen += [i.name for i in infos]
        pages += 1
        if after is None:
            break
    assert sorted(seen) == [d.name for d in defs] and len(seen) == len(set(seen)) and pages == 6
    if order == "next":
        fires = [wapp.get_schedule(n).next_fire for n in seen]
        assert fires == sorted(fires)
