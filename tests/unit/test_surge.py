"""Stagger and the surge profile (`schedule lint`): pure functions, no Redis."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import timedelta

import pytest
from duetime.common.errors import DuetimeError
from duetime.common.schedules import (
    ScheduleDef,
    effective_stagger_ms,
    jitter_for,
    parse_stagger,
    plan,
    seeded,
    stagger_for,
    stored_stagger,
)
from duetime.common.time.parse import from_ms, to_ms
from duetime.common.time.spec import Cron, Every

from duetime.ops.surge import (
    LADDER_S,
    LintSchedule,
    collapse_key,
    occurrences_ms,
    profile,
    suggest_stagger,
    walk,
)

START = 1_764_547_200_123  # 2026-12-01T00:00:00.123Z: not on a second
DAY = 86_400_000


def hourly(n: int, prefix: str = "s", **kw) -> list[LintSchedule]:
    return [LintSchedule(f"{prefix}{i}", seeded(Cron("0 * * * *"), f"{prefix}{i}"), **kw)
            for i in range(n)]


def brute_force(schedules: list[LintSchedule], start: int, horizon: int, policy_ms: int
                ) -> Counter[int]:
    """Every schedule walked on its own, due times as the evaluator computes them."""
    counts: Counter[int] = Counter()
    for s in schedules:
        offset = stagger_for(s.name, effective_stagger_ms(s.stagger_ms, policy_ms))
        for o in s.trigger.occurrences(from_ms(start), from_ms(start + horizon)):
            ms = to_ms(o, ceil=True)
            counts[(ms + offset + jitter_for(s.name, ms, s.jitter_ms)) // 1000] += 1
    return counts


# -- stagger ----------------------------------------------------------------------------------
def test_stagger_is_stable_per_schedule_and_within_its_width():
    offsets = {stagger_for(f"job-{i}", 30_000) for i in range(2000)}
    assert all(0 <= o < 30_000 for o in offsets)
    assert len(offsets) > 1500  # spread, not a handful of values
    assert stagger_for("job-1", 30_000) == stagger_for("job-1", 30_000)
    assert stagger_for("job-1", 0) == 0


def test_parse_stagger_auto_duration_and_refusals():
    for auto in (None, "auto", "default", " AUTO "):
        assert parse_stagger(auto) is None
    assert parse_stagger("30s") == 30_000 and parse_stagger(0) == 0
    assert parse_stagger(timedelta(minutes=2)) == 120_000
    for bad in ("soon", "2d", -1):
        with pytest.raises(DuetimeError):
            parse_stagger(bad)
    assert stored_stagger(None) is None and stored_stagger(b"auto") is None
    assert stored_stagger(b"1500") == 1500 and stored_stagger(b"junk") is None
    assert effective_stagger_ms(None, 9000) == 9000 and effective_stagger_ms(0, 9000) == 0


def test_plan_shifts_every_run_of_a_schedule_by_its_one_offset():
    every = Every(timedelta(seconds=10))
    pl = plan(every, 1_000_000, 1_000_000 + 35_000, 0, name="nightly", catchup="all",
              max_catchup=100, tolerance_ms=DAY, stagger_ms=30_000)
    offset = stagger_for("nightly", 30_000)
    assert offset and len(pl.runs) == 4
    assert all(r.due_ms - r.occurrence_ms == offset for r in pl.runs)


def test_stagger_in_the_definition_hash_only_when_the_schedule_has_its_own():
    base = dict(name="n", trigger=Every(timedelta(seconds=5)), task="t", queue="default",
                payload=b"")
    auto, zero, own = (ScheduleDef(**base, stagger_ms=v) for v in (None, 0, 30_000))
    assert auto.fields()["stagger_ms"] == "auto"
    # the hash of a definition from before staggers existed (no such field) is `auto`'s, so an
    # upgrade re-versions no stored schedule
    legacy = {k: v for k, v in auto.fields().items() if k not in ("stagger_ms", "miss_tolerance_ms")}
    h = hashlib.sha256()
    for k in sorted(legacy):
        v = legacy[k]
        h.update(k.encode() + b"\0" + (v if isinstance(v, bytes) else str(v).encode()) + b"\0")
    assert auto.def_hash() == h.hexdigest()[:16]
    assert len({auto.def_hash(), zero.def_hash(), own.def_hash()}) == 3


# -- collapsing -------------------------------------------------------------------------------
def test_crons_without_h_collapse_whatever_their_seed():
    assert collapse_key(Cron("0 * * * *", seed="a")) == collapse_key(Cron("0 * * * *", seed="b"))
    h = [Cron("H * * * *", seed=f"s{i}") for i in range(200)]
    # H picks one of 60 minutes: as many keys as distinct firing minutes
    assert len({collapse_key(c) for c in h}) == len({c.next_after(from_ms(START)) for c in h}) <= 60
    for a in h[:20]:
        for b in h[:20]:  # equal keys, equal instants
            same = a.next_after(from_ms(START)) == b.next_after(from_ms(START))
            assert (collapse_key(a) == collapse_key(b)) == same
    assert collapse_key(Cron("0 * * * *")) == collapse_key(Cron("0 */1 * * *"))
    assert collapse_key(Cron("0 * * * *", dst_fold="first")) != collapse_key(Cron("0 * * * *"))
    # THU holds an H that is not the hash item
    assert collapse_key(Cron("0 9 * * THU", seed="a")) == collapse_key(Cron("0 9 * * THU", seed="b"))
    assert collapse_key(Cron("0 * * * *", tz="Europe/Paris")) != collapse_key(Cron("0 * * * *"))


def test_occurrences_are_the_trigger_s_own_and_capped():
    occs, cut = occurrences_ms(Cron("0 * * * *"), START, START + DAY)
    assert not cut and len(occs) == 24 and all(o % 3_600_000 == 0 for o in occs)
    occs, cut = occurrences_ms(Every(timedelta(seconds=1)), START, START + DAY, limit=100)
    assert cut and len(occs) == 100


# -- the profile ------------------------------------------------------------------------------
def test_10000_hourly_schedules_pile_up_at_every_hour_and_are_walked_once():
    scheds = hourly(10_000)
    prof = profile(scheds, START, DAY, max_per_second=500)
    assert prof.evaluations == 1 and prof.runs == 240_000
    assert prof.peak == 10_000 and prof.over == 24 and prof.busy_seconds == 24
    assert len(prof.hot) == 10 and all(h.count == 10_000 for h in prof.hot)
    assert all(h.second_ms % 3_600_000 == 0 for h in prof.hot)
    assert prof.hot[0].schedules == tuple(sorted(s.name for s in scheds)[:5])
    assert prof.hot[0].more == 9_995 and not prof.flat


def test_the_collapsed_profile_equals_walking_each_schedule():
    scheds = (hourly(40, "plain") + hourly(30, "own", stagger_ms=20_000)
              + hourly(20, "jit", jitter_ms=7_000)
              + [LintSchedule(f"h{i}", seeded(Cron("H/15 * * * *"), f"h{i}")) for i in range(15)]
              + [LintSchedule(f"e{i}", Every(timedelta(minutes=10)), stagger_ms=0) for i in range(5)]
              + [LintSchedule("every-333ms", Every(timedelta(milliseconds=333)))])
    for policy in (0, 45_000):
        want = brute_force(scheds, START, 6 * 3_600_000, policy)
        prof = profile(scheds, START, 6 * 3_600_000, max_per_second=10, policy_ms=policy, top=20)
        assert prof.runs == sum(want.values())
        assert prof.peak == max(want.values()) and prof.busy_seconds == len(want)
        assert prof.over == sum(1 for n in want.values() if n > 10)
        assert [(h.second_ms // 1000, h.count) for h in prof.hot] == sorted(
            want.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
        for h in prof.hot:  # the names given are schedules that do have a run there
            assert h.count == len(h.schedules) + h.more


def test_the_policy_spreads_only_schedules_without_their_own_stagger():
    scheds = hourly(1000) + hourly(200, "pinned", stagger_ms=0)
    prof = profile(scheds, START, DAY, max_per_second=100, policy_ms=60_000)
    spread = brute_force(hourly(1000), START, DAY, 60_000)
    assert max(spread.values()) < 100
    # the pinned ones stay at :00, joined only by the spread ones whose offset is under 1 s
    assert all(h.second_ms % 3_600_000 == 0 for h in prof.hot)
    assert [h.count for h in prof.hot] == [200 + spread[h.second_ms // 1000] for h in prof.hot]


# -- the suggestion ---------------------------------------------------------------------------
def test_the_suggested_stagger_is_the_narrowest_round_one_that_flattens():
    scheds = hourly(10_000)
    walks = walk(scheds, START, DAY)
    sugg = suggest_stagger(scheds, START, DAY, max_per_second=500, walks=walks)
    assert sugg.needed and sugg.stagger_ms is not None and sugg.stagger_ms // 1000 in LADDER_S
    assert sugg.stagger_ms >= 20_000  # at least 10,000 / 500 seconds wide
    after = profile(scheds, START, DAY, max_per_second=500, policy_ms=sugg.stagger_ms, walks=walks)
    assert after.flat and after.peak == sugg.peak_after <= 500
    narrower = [w for w in LADDER_S if 20 <= w < sugg.stagger_ms // 1000]
    for w in narrower:  # each narrower candidate leaves a second above the target
        assert not profile(scheds, START, DAY, max_per_second=500, policy_ms=w * 1000,
                           walks=walks).flat


def test_the_suggestion_does_not_depend_on_the_policy_in_force():
    scheds = hourly(10_000)
    walks = walk(scheds, START, DAY)
    bare = suggest_stagger(scheds, START, DAY, max_per_second=200, walks=walks)
    for policy_s in (5, 30):  # a policy too narrow for this target: the same advice
        under = suggest_stagger(scheds, START, DAY, max_per_second=200, walks=walks,
                                policy_ms=policy_s * 1000)
        assert under.needed and under.stagger_ms == bare.stagger_ms
        assert under.peak_after == bare.peak_after <= 200


def test_no_suggestion_when_flat_or_when_the_policy_changes_nothing():
    flat = suggest_stagger(hourly(50), START, DAY, max_per_second=100)
    assert not flat.needed and flat.stagger_ms is None
    pinned = suggest_stagger(hourly(500, stagger_ms=0), START, DAY, max_per_second=100)
    assert pinned.needed and pinned.stagger_ms is None and "own stagger" in pinned.reason
    dense = [LintSchedule(f"d{i}", Every(timedelta(milliseconds=10))) for i in range(2)]
    hopeless = suggest_stagger(dense, START, 600_000, max_per_second=100)
    assert hopeless.needed and hopeless.stagger_ms is None and "load itself" in hopeless.reason
