"""A due time asked for as an instant is kept to the microsecond (namespace format 4;
docs/keys.md "Namespace format", docs/time.md "Starting on time").

On every path a run becomes due by (a plain run, one with a priority, one in a tenant's lane,
one that waited for a dependency), the record's `due`, the due-set score and the claim carry
the instant itself: the score is never below it, so no worker is handed the run before it, and
the attempt's recorded start is the first whole ms at or after it. In a namespace of format 3
(the previous release's workers may serve it) the same instant is rounded up to the whole ms.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from duetime.common import transitions as tr
from duetime.common.connection import mark_partitions_format
from duetime.common.scripts import Scripts
from duetime.common.time.parse import due_text, from_ms, to_ms, to_us

from tests.apps import basic

pytestmark = pytest.mark.scripts


def _future(r, seconds: float, us: int) -> datetime:
    """An instant `seconds` ahead of the server's clock, at `us` microseconds into its ms."""
    sec, _ = r.time()
    return datetime.fromtimestamp(sec + seconds, UTC).replace(microsecond=us)


def _claim_all(app, r, ahead_ms: int) -> dict[str, tr.Claimed]:
    scripts, k, out = Scripts(r), app.keys, {}
    for p in range(k.partitions):
        keys, args = tr.claim(k, p, "default", "w", 100, 60_000, ahead_ms)
        out.update({c.run_id: c for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs})
    return out


def _runs_on_every_path(app, r, at: list[datetime]) -> list[str]:
    """Four runs due at the four instants: plain, with a priority, in a tenant's lane, and
    released by hold.lua once its dependency (finished already) let it through."""
    dep = app.enqueue(basic.noop)
    [c] = _claim_all(app, r, 0).values()
    keys, args = tr.complete(app.keys, app.keys.partition_of_run(dep), [(c.run_id, c.fence)])
    Scripts(r).complete(keys=keys, args=args)
    assert app.get_run(dep).state == "succeeded"
    return [app.enqueue(basic.noop, at=at[0]),
            app.enqueue(basic.noop, at=at[1], priority=5),
            app.enqueue(basic.noop, at=at[2], tenant="acme"),
            app.enqueue(basic.noop, at=at[3], depends_on=[dep])]


def test_an_instant_is_the_due_time_to_the_microsecond_on_every_path(app, r):
    at = [_future(r, 3, us) for us in (1, 457_457, 999_999, 500_001)]
    ids = _runs_on_every_path(app, r, at)
    k = app.keys
    for rid, t in zip(ids, at, strict=True):
        run = app.get_run(rid)
        assert run.state == "scheduled" and run.due == t, (run.state, run.due, t)
        score = r.zscore(k.due(k.partition_of_run(rid), "default"), rid)
        assert Fraction(score) * 1000 >= to_us(t) and from_ms(score) == t, (score, t)
    # claimed ahead: each run's claim says the instant itself (never a double below it)
    claimed = _claim_all(app, r, 10_000)
    assert set(claimed) == set(ids)
    for rid, t in zip(ids, at, strict=True):
        c = claimed[rid]
        assert Fraction(c.ready_ms) * 1000 >= to_us(t), (c.ready_ms, t)
        assert from_ms(c.ready_ms) == t and from_ms(c.due_ms) == t
        run = app.get_run(rid)  # its attempt starts at the first whole ms at or after it
        assert run.started == from_ms(to_ms(t, ceil=True)), (run.started, t)


def test_a_format_3_namespace_gets_the_instant_rounded_up_to_the_whole_ms(app, r):
    """Where the previous release's workers may still serve the namespace (format 3, which
    they took any fraction in for a damaged record), every path stores the next whole ms."""
    r.hset(app.keys.meta, "format", 3)
    mark_partitions_format(r, app.keys, 3)
    at = [_future(r, 3, us) for us in (1, 457_457, 999_999, 500_001)]
    ids = _runs_on_every_path(app, r, at)
    k = app.keys
    for rid, t in zip(ids, at, strict=True):
        whole = to_ms(t, ceil=True)
        p = k.partition_of_run(rid)
        assert r.hget(k.run(p, rid), "due") == str(whole).encode()
        assert r.zscore(k.due(p, "default"), rid) == whole
    claimed = _claim_all(app, r, 10_000)
    for rid, t in zip(ids, at, strict=True):
        assert claimed[rid].ready_ms == to_ms(t, ceil=True)
        assert isinstance(claimed[rid].ready_ms, int)  # what that release's int() reads


@pytest.mark.parametrize("us", [0, 1, 457, 999, 123_457, 999_999])
@pytest.mark.parametrize("when", ["2026-12-07T04:20:17", "1970-01-01T00:00:00",
                                  "9999-12-31T23:59:58"])
def test_due_text_names_a_double_never_below_the_instant_and_reads_back_exactly(when, us):
    t = datetime.fromisoformat(when).replace(tzinfo=UTC) + timedelta(microseconds=us)
    text = due_text(t)
    if us % 1000 == 0:
        assert text == str(to_ms(t))  # a whole ms: an integer, as before
        return
    value = float(text)  # as Redis and Lua read a score: strtod, correctly rounded
    assert Fraction(value) * 1000 >= to_us(t)
    if t.year < 2109:  # epoch ms below 2**42: a double names every microsecond
        assert from_ms(value) == t
    else:  # past it, the next double up: a little later (31 µs in 9999), never earlier
        assert t <= from_ms(value) <= t + timedelta(microseconds=32)
