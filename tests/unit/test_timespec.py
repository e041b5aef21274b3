"""Tests for common/time/spec.py: cron-in-a-zone semantics checked against a brute-force oracle."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from duetime.common.time.spec import (
    At,
    Cron,
    Every,
    InvalidSchedule,
    Trigger,
    parse_duration,
    trigger_from_dict,
)

from tests.unit.cron_oracle import OracleCron, fire_sets, offset_changes

POLICIES = [(gap, fold) for gap in ("shift", "skip") for fold in ("first", "both")]
ZONES = [
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "America/Santiago",
    "Pacific/Auckland",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "America/Sao_Paulo",
    "UTC",
]
MONTH_NAMES = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAY_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def chain(trigger: Trigger, start: datetime, end: datetime) -> list[datetime]:
    """Fire instants in (start, end] by repeatedly calling next_after, checking invariants."""
    out = []
    x = trigger.next_after(start)
    while x is not None and x <= end:
        assert x.tzinfo is UTC
        assert not out or x > out[-1]
        out.append(x)
        x = trigger.next_after(x)
    assert x is None or x > end
    return out


def fires(expr: str, tz: str, start: datetime, n: int, **kw: str) -> list[datetime]:
    c = Cron(expr, tz, **kw)
    out: list[datetime] = []
    t = start
    for _ in range(n):
        nxt = c.next_after(t)
        assert nxt is not None
        out.append(nxt)
        t = nxt
    return out


# ----------------------------------------------------------------------------------------------
# Random cases around DST transitions, compared with the oracle
# ----------------------------------------------------------------------------------------------


@cache
def transitions(zone: str) -> tuple[datetime, ...]:
    return tuple(offset_changes(zone, utc(2025, 1, 1), utc(2028, 1, 1)))


def _minute_field(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        return f"*/{rng.choice([5, 7, 10, 15, 20, 30, 45])}"
    if kind == 1:
        return str(rng.randrange(60))
    if kind == 2:
        a = rng.randrange(55)
        return f"{a}-{min(59, a + rng.randrange(1, 20))}"
    if kind == 3:
        a = rng.randrange(40)
        return f"{a}-{rng.randrange(a, 60)}/{rng.randrange(1, 20)}"
    if kind == 4:
        return ",".join(str(v) for v in rng.sample(range(60), rng.randrange(2, 5)))
    if kind == 5:
        return rng.choice(["0,30", "15,45", "0", "30", "45", "*/30", "0-59/15"])
    return f"{rng.randrange(10)},{rng.randrange(20, 40)}-{rng.randrange(40, 60)}/7"


def _hour_field(rng: random.Random, near: int) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return "*"
    if kind == 1:
        return f"*/{rng.randrange(1, 7)}"
    if kind == 2:
        return str(near)
    if kind == 3:
        return str(rng.choice([0, 1, 2, 3, 22, 23, rng.randrange(24)]))
    if kind == 4:
        a = max(0, near - rng.randrange(3))
        return f"{a}-{min(23, near + rng.randrange(3))}"
    if kind == 5:
        return f"{max(0, near - 2)}-{min(23, near + 5)}/{rng.randrange(1, 4)}"
    if kind == 6:
        return ",".join(str(v) for v in sorted({near, rng.randrange(24), (near + 1) % 24}))
    return rng.choice(["22-23,0-3", "0-4", "1,2,3", "*/2", "1-23/2"])


def _dom_field(rng: random.Random, day: int) -> str:
    if rng.random() < 0.6:
        return "*"
    return rng.choice(
        [
            f"*/{rng.randrange(2, 4)}",
            str(day),
            f"{max(1, day - 1)}-{min(31, day + 1)}",
            f"1,15,{day}",
            f"{max(1, day - 6)}-{min(31, day + 6)}/{rng.randrange(1, 4)}",
            "29-31",
            "31",
        ]
    )


def _month_field(rng: random.Random, month: int) -> str:
    if rng.random() < 0.6:
        return "*"
    name = MONTH_NAMES[month - 1]
    return rng.choice(
        [
            str(month),
            rng.choice([name, name.lower(), name.title()]),
            f"{max(1, month - 1)}-{month}",
            f"JAN,{name.lower()}",
            "*/2",
            f"{name}-DEC",
            "1-12/3",
        ]
    )


def _dow_field(rng: random.Random, dow: int) -> str:
    if rng.random() < 0.6:
        return "*"
    name = DAY_NAMES[dow]
    return rng.choice(
        [
            rng.choice([name, name.lower()]),
            str(dow),
            "7" if dow == 0 else f"{dow},7",
            "MON-FRI",
            "0,6",
            "SAT,SUN",
            "1-5/2",
            "*/2",
            f"mon-{name.lower()}" if dow >= 1 else "sun-tue",
        ]
    )


def make_case(i: int) -> tuple[str, str, datetime, datetime]:
    """A deterministic (zone, expression, window) mostly straddling a 2025-2027 transition."""
    rng = random.Random(f"timespec-case-{i}")
    zone = rng.choice(ZONES)
    changes = transitions(zone)
    if changes and rng.random() < 0.9:
        start = rng.choice(changes) + timedelta(minutes=rng.randint(-36 * 60, 12 * 60))
    else:
        start = utc(2025, 1, 1) + timedelta(minutes=rng.randrange(3 * 365 * 24 * 60))
    if rng.random() < 0.3:
        start += timedelta(seconds=rng.randrange(60), microseconds=rng.randrange(1_000_000))
    local = (start + timedelta(hours=rng.randrange(36))).astimezone(ZoneInfo(zone))
    hours = _hour_field(rng, local.hour)
    while True:
        minutes = _minute_field(rng)
        oracle = OracleCron(f"{minutes} {hours} * * *")
        if len(oracle.minutes) * len(oracle.hours) <= 240:  # keep chained calls cheap
            break
    expr = " ".join(
        [
            minutes,
            hours,
            _dom_field(rng, local.day),
            _month_field(rng, local.month),
            _dow_field(rng, local.isoweekday() % 7),
        ]
    )
    return zone, expr, start, start + timedelta(days=2)


N_CASES = 300


@pytest.mark.parametrize("case", range(N_CASES))
def test_generated_cases_match_oracle_for_every_policy(case: int) -> None:
    zone, expr, start, end = make_case(case)
    oracle = OracleCron(expr)
    try:
        Cron(expr, zone)
    except InvalidSchedule as exc:
        assert not oracle.can_ever_fire(), f"{expr!r} rejected but can fire: {exc}"
        return
    expected = fire_sets(oracle, zone, start, end)
    ctx = f"{expr!r} in {zone} over ({start.isoformat()}, {end.isoformat()}]"
    for gap, fold in POLICIES:
        got = chain(Cron(expr, zone, dst_gap=gap, dst_fold=fold), start, end)
        assert got == expected[(gap, fold)], f"{ctx} gap={gap} fold={fold}"
    for gap in ("shift", "skip"):
        auto = "both" if oracle.hour_wild else "first"
        got = list(Cron(expr, zone, dst_gap=gap).occurrences(start, end))
        assert got == expected[(gap, auto)], f"{ctx} gap={gap} fold=auto"
    # Unchained probes from arbitrary instants inside the window.
    rng = random.Random(case)
    for gap, fold in POLICIES:
        c = Cron(expr, zone, dst_gap=gap, dst_fold=fold)
        want_all = expected[(gap, fold)]
        for _ in range(10):
            t = start + (end - start) * rng.random()
            want = next((x for x in want_all if x > t), None)
            got_one = c.next_after(t)
            if want is None:
                assert got_one is None or got_one > end, ctx
            else:
                assert got_one == want, f"{ctx} gap={gap} fold={fold} t={t.isoformat()}"


def test_generated_cases_cover_every_zone_and_many_transitions() -> None:
    cases = [make_case(i) for i in range(N_CASES)]
    assert {zone for zone, *_ in cases} == set(ZONES)
    straddling = sum(1 for zone, _, s, e in cases if any(s <= tr <= e for tr in transitions(zone)))
    assert straddling > N_CASES * 3 // 10


@pytest.mark.parametrize("case", range(0, N_CASES, 10))
def test_next_after_is_constant_between_consecutive_fires(case: int) -> None:
    """Every minute (with a random sub-minute part) maps to the next expected fire instant."""
    zone, expr, start, _ = make_case(case)
    end = start + timedelta(days=1)
    oracle = OracleCron(expr)
    if not oracle.can_ever_fire():
        pytest.skip("generated expression is (correctly) invalid")
    rng = random.Random(-case)
    gap, fold = POLICIES[case % 4]
    expected = fire_sets(oracle, zone, start, end + timedelta(hours=6))[(gap, fold)]
    c = Cron(expr, zone, dst_gap=gap, dst_fold=fold)
    t = start
    idx = 0
    while t < end:
        while idx < len(expected) and expected[idx] <= t:
            idx += 1
        got = c.next_after(t)
        if idx < len(expected):
            assert got == expected[idx], f"{expr!r} in {zone} {gap}/{fold} t={t.isoformat()}"
        else:
            assert got is None or got > end + timedelta(hours=6)
        t += timedelta(minutes=1, microseconds=rng.randrange(-999_999, 1_000_000))
    for x in expected:
        assert c.next_after(x - timedelta(microseconds=1)) == x


# ----------------------------------------------------------------------------------------------
# Named examples
# ----------------------------------------------------------------------------------------------


def test_new_york_spring_gap_shift_fires_at_0730z() -> None:
    got = fires("30 2 * * *", "America/New_York", utc(2026, 3, 7, 12), 2)
    assert got == [utc(2026, 3, 8, 7, 30), utc(2026, 3, 9, 6, 30)]


def test_new_york_spring_gap_skip_fires_next_day_0630z() -> None:
    got = fires("30 2 * * *", "America/New_York", utc(2026, 3, 7, 12), 1, dst_gap="skip")
    assert got == [utc(2026, 3, 9, 6, 30)]


def test_new_york_spring_gap_shift_collapses_onto_real_times_once() -> None:
    got = chain(
        Cron("*/30 * * * *", "America/New_York"), utc(2026, 3, 8, 6, 0), utc(2026, 3, 8, 8, 0)
    )
    # 02:00 and 02:30 EST do not exist; shifted they land on 03:00/03:30 EDT, fired once each.
    assert got == [
        utc(2026, 3, 8, 6, 30),
        utc(2026, 3, 8, 7),
        utc(2026, 3, 8, 7, 30),
        utc(2026, 3, 8, 8),
    ]


def test_new_york_fall_fold_daily_auto_fires_once_at_edt_0530z() -> None:
    c = Cron("30 1 * * *", "America/New_York")
    assert chain(c, utc(2026, 11, 1), utc(2026, 11, 1, 23)) == [utc(2026, 11, 1, 5, 30)]


def test_new_york_fall_fold_hourly_auto_fires_both_0530z_and_0630z() -> None:
    c = Cron("30 * * * *", "America/New_York")
    got = chain(c, utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 7, 0))
    assert got == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)]


def test_new_york_fall_fold_both_fires_twice_first_fires_once() -> None:
    window = (utc(2026, 11, 1), utc(2026, 11, 1, 23))
    both = Cron("30 1 * * *", "America/New_York", dst_fold="both")
    first = Cron("30 * * * *", "America/New_York", dst_fold="first")
    assert chain(both, *window) == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)]
    hourly = chain(first, utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 7, 45))
    assert hourly == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 30)]


def test_hourly_macro_counts_as_hour_star_for_auto_fold() -> None:
    c = Cron("@hourly", "America/New_York")
    got = chain(c, utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7, 30))
    assert got == [utc(2026, 11, 1, 5), utc(2026, 11, 1, 6), utc(2026, 11, 1, 7)]


def test_lord_howe_30_minute_gap_shift_and_skip() -> None:
    # 2026-10-04 02:00 +10:30 -> 02:30 +11:00; 02:15 does not exist.
    start = utc(2026, 10, 3, 12)
    assert fires("15 2 * * *", "Australia/Lord_Howe", start, 1) == [utc(2026, 10, 3, 15, 45)]
    skip = fires("15 2 * * *", "Australia/Lord_Howe", start, 1, dst_gap="skip")
    assert skip == [utc(2026, 10, 4, 15, 15)]


def test_lord_howe_30_minute_fold_first_and_both() -> None:
    # 2026-04-05 02:00 +11:00 -> 01:30 +10:30; 01:45 happens twice.
    window = (utc(2026, 4, 4, 12), utc(2026, 4, 5, 12))
    first = Cron("45 1 * * *", "Australia/Lord_Howe")
    both = Cron("45 1 * * *", "Australia/Lord_Howe", dst_fold="both")
    assert chain(first, *window) == [utc(2026, 4, 4, 14, 45)]
    assert chain(both, *window) == [utc(2026, 4, 4, 14, 45), utc(2026, 4, 4, 15, 15)]


def test_chatham_45_minute_offsets_gap_and_fold() -> None:
    # +12:45 -> +13:45 at 2026-09-27 02:45 local; 03:00 does not exist.
    start = utc(2026, 9, 26)
    assert fires("0 3 * * *", "Pacific/Chatham", start, 1) == [utc(2026, 9, 26, 14, 15)]
    skip = fires("0 3 * * *", "Pacific/Chatham", start, 1, dst_gap="skip")
    assert skip == [utc(2026, 9, 27, 13, 15)]
    # +13:45 -> +12:45 at 2026-04-05 03:45 local; 03:00 happens twice.
    both = Cron("0 3 * * *", "Pacific/Chatham", dst_fold="both")
    got = chain(both, utc(2026, 4, 4), utc(2026, 4, 5))
    assert got == [utc(2026, 4, 4, 13, 15), utc(2026, 4, 4, 14, 15)]


def test_kolkata_and_kathmandu_fractional_offsets() -> None:
    assert fires("30 9 * * *", "Asia/Kolkata", utc(2026, 3, 8), 2) == [
        utc(2026, 3, 8, 4),
        utc(2026, 3, 9, 4),
    ]
    assert fires("0 0 * * *", "Asia/Kathmandu", utc(2026, 3, 8), 1) == [utc(2026, 3, 8, 18, 15)]


def test_santiago_midnight_gap_and_late_evening_fold() -> None:
    # 2026-09-06 00:00 -04 -> 01:00 -03: midnight does not exist.
    start = utc(2026, 9, 5, 12)
    assert fires("0 0 * * *", "America/Santiago", start, 1) == [utc(2026, 9, 6, 4)]
    assert fires("0 0 * * *", "America/Santiago", start, 1, dst_gap="skip") == [utc(2026, 9, 7, 3)]
    # 2026-04-05 00:00 -03 -> 2026-04-04 23:00 -04: 23:30 happens twice.
    window = (utc(2026, 4, 4, 12), utc(2026, 4, 5, 12))
    assert chain(Cron("30 23 * * *", "America/Santiago"), *window) == [utc(2026, 4, 5, 2, 30)]
    both = Cron("30 23 * * *", "America/Santiago", dst_fold="both")
    assert chain(both, *window) == [utc(2026, 4, 5, 2, 30), utc(2026, 4, 5, 3, 30)]


def test_sydney_and_london_weekday_schedule_across_transition() -> None:
    got = fires("0 9 * * MON-FRI", "Europe/London", utc(2026, 3, 27), 2)
    assert got == [utc(2026, 3, 27, 9), utc(2026, 3, 30, 8)]
    got = fires("0 9 * * MON-FRI", "Australia/Sydney", utc(2026, 4, 2), 2)
    assert got == [utc(2026, 4, 2, 22), utc(2026, 4, 5, 23)]


def test_sparse_expressions_look_far_ahead() -> None:
    assert fires("0 0 29 2 *", "UTC", utc(2026, 1, 1), 2) == [utc(2028, 2, 29), utc(2032, 2, 29)]
    # Feb 29 that is also a Monday (dom is restricted, dow written with '*' -> both must match).
    assert fires("0 12 29 2 */7", "Europe/Berlin", utc(2026, 1, 1), 1) == [utc(2032, 2, 29, 11)]


def test_day_fields_or_rule_when_both_restricted() -> None:
    # Feb 30 never exists but every Monday in February still matches.
    c = Cron("0 0 30 2 MON", "UTC")
    assert c.next_after(utc(2026, 1, 1)) == utc(2026, 2, 2)
    # 13th OR Friday.
    got = fires("0 0 13 * 5", "UTC", utc(2026, 2, 1), 3)
    assert got == [utc(2026, 2, 6), utc(2026, 2, 13), utc(2026, 2, 20)]
    # dom written with '*' -> AND: odd days that are Fridays.
    got = fires("0 0 */2 * FRI", "UTC", utc(2026, 2, 1), 3)
    assert got == [utc(2026, 2, 13), utc(2026, 2, 27), utc(2026, 3, 13)]


def test_macros_expand_as_documented() -> None:
    start = utc(2026, 5, 5, 10, 30)
    assert Cron("@yearly").next_after(start) == utc(2027, 1, 1)
    assert Cron("@annually").next_after(start) == utc(2027, 1, 1)
    assert Cron("@monthly").next_after(start) == utc(2026, 6, 1)
    assert Cron("@weekly").next_after(start) == utc(2026, 5, 10)
    assert Cron("@daily").next_after(start) == utc(2026, 5, 6)
    assert Cron("@midnight").next_after(start) == utc(2026, 5, 6)
    assert Cron("@hourly").next_after(start) == utc(2026, 5, 5, 11)


def test_names_any_case_sunday_as_0_or_7_and_steps() -> None:
    a = Cron("0 0 * jan-Mar sun")
    b = Cron("0 0 * 1-3 7")
    c = Cron("0 0 * JAN,FEB,MAR 0")
    start = utc(2026, 1, 1)
    assert chain(a, start, utc(2026, 6, 1)) == chain(b, start, utc(2026, 6, 1))
    assert chain(a, start, utc(2026, 6, 1)) == chain(c, start, utc(2026, 6, 1))
    assert len(chain(a, start, utc(2026, 6, 1))) == 13
    got = chain(Cron("10-50/20 1-7/3 * * *"), utc(2026, 1, 1), utc(2026, 1, 1, 23, 59))
    assert [(x.hour, x.minute) for x in got] == [(h, m) for h in (1, 4, 7) for m in (10, 30, 50)]


def test_next_after_contract() -> None:
    c = Cron("0 * * * *", "Europe/Berlin")
    paris = timezone(timedelta(hours=2))
    t = datetime(2026, 6, 1, 12, 0, tzinfo=paris)  # 10:00Z, on a fire instant
    assert c.next_after(t) == utc(2026, 6, 1, 11)  # strictly after
    assert c.next_after(t).tzinfo is UTC
    assert c.next_after(t - timedelta(microseconds=1)) == utc(2026, 6, 1, 10)
    with pytest.raises(ValueError, match="naive"):
        c.next_after(datetime(2026, 6, 1))
    for trig in (c, Every(timedelta(minutes=5)), At(utc(2026, 1, 1))):
        with pytest.raises(ValueError):
            trig.next_after(datetime(2026, 6, 1))
        with pytest.raises(ValueError):
            list(trig.occurrences(datetime(2026, 6, 1), utc(2026, 7, 1)))
    assert list(c.occurrences(utc(2026, 6, 2), utc(2026, 6, 1))) == []
    assert list(c.occurrences(utc(2026, 6, 1, 10), utc(2026, 6, 1, 12))) == [
        utc(2026, 6, 1, 11),
        utc(2026, 6, 1, 12),
    ]


def test_sparsest_valid_expression_found_across_forty_year_gap() -> None:
    # Feb 29 on a Sunday: 2088, then 2128 (2100 is not a leap year).
    for tz in ("UTC", "America/New_York"):
        got = Cron("0 12 29 2 */7", tz).next_after(utc(2088, 3, 1))
        assert got is not None
        assert got.astimezone(ZoneInfo(tz)).replace(tzinfo=None) == datetime(2128, 2, 29, 12)


def test_pathological_always_in_gap_with_skip_returns_none() -> None:
    # March 8 that is a Sunday is always New York's spring-forward day; 02:30 never exists.
    c = Cron("30 2 8 3 */7", "America/New_York", dst_gap="skip")
    assert c.next_after(utc(2026, 1, 1)) is None
    shifted = Cron("30 2 8 3 */7", "America/New_York")
    assert shifted.next_after(utc(2026, 1, 1)) == utc(2026, 3, 8, 7, 30)


def test_extreme_datetimes_do_not_crash() -> None:
    top = datetime.max.replace(tzinfo=UTC)
    bottom = datetime.min.replace(tzinfo=UTC)
    for tz in ("UTC", "America/New_York", "Asia/Kolkata"):
        assert Cron("* * * * *", tz).next_after(top) is None
        first = Cron("* * * * *", tz).next_after(bottom)
        assert first is not None
        # Local 0001-01-01 00:00 is the first representable wall time (New York LMT is -4:56:02).
        local_first = first.astimezone(ZoneInfo(tz)).replace(tzinfo=None)
        assert first <= bottom + timedelta(minutes=1) or local_first == datetime(1, 1, 1)
    assert Every(timedelta(hours=1)).next_after(top) is None
    assert At(utc(2026, 1, 1)).next_after(top) is None


def test_next_after_is_fast() -> None:
    exprs = ["*/5 * * * *", "0 9 * * MON-FRI", "30 2 * * *", "H H(0-5) * * *", "@hourly"]
    calls = 0
    # this process's CPU time, not the wall clock: on a loaded machine the wall clock also
    # counts the time other processes had the core
    began = time.process_time()
    for tz in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        for expr in exprs:
            c = Cron(expr, tz, seed="perf")
            t = utc(2026, 1, 1)
            for _ in range(100):
                t = c.next_after(t)
                assert t is not None
                calls += 1
    per_call = (time.process_time() - began) / calls
    assert per_call < 1e-3, f"next_after took {per_call * 1e6:.0f} us of CPU per call"


# ----------------------------------------------------------------------------------------------
# Invalid input
# ----------------------------------------------------------------------------------------------

INVALID_CRON = [
    ("", "empty"),
    ("   ", "empty"),
    ("* * * *", "4 fields"),
    ("* * * * * * *", "7 fields"),  # 6 fields is minute..day-of-week then second
    ("0 24 * * *", "cron field 'hour' value 24 out of range 0-23 in '0 24 * * *'"),
    ("60 * * * *", "'minute' value 60 out of range 0-59"),
    ("* * 0 * *", "'day-of-month' value 0 out of range 1-31"),
    ("* * 32 * *", "'day-of-month' value 32 out of range 1-31"),
    ("* * * 13 *", "'month' value 13 out of range 1-12"),
    ("* * * 0 *", "'month' value 0 out of range 1-12"),
    ("* * * * 8", "'day-of-week' value 8 out of range 0-7"),
    ("5-2 * * * *", "'minute' range '5-2' is reversed"),
    ("* * * * FRI-MON", "'day-of-week' range 'FRI-MON' is reversed"),
    ("* 22-2 * * *", "'hour' range '22-2' is reversed"),
    ("*/0 * * * *", "'minute' step 0 must be >= 1"),
    ("* 1-5/0 * * *", "'hour' step 0 must be >= 1"),
    ("5/2 * * * *", "'minute' step on a single value '5/2'"),
    ("* * * * MON/2", "'day-of-week' step on a single value 'MON/2'"),
    ("* * * * JAN", "'day-of-week' does not accept name 'JAN'"),
    ("* * * MON *", "'month' does not accept name 'MON'"),
    ("* * * * MONDAY", "'day-of-week' has invalid value 'MONDAY'"),
    ("* * * * \u017fun", "'day-of-week' has invalid value '\u017fun'"),
    ("* * * * fr\u0131", "'day-of-week' has invalid value 'fr\u0131'"),
    ("0\u00a00 * * * *", "'minute' has invalid value '0\\xa00'"),
    ("\uff15 * * * *", "'minute' has invalid value '\uff15'"),
    ("* 1\uff15 * * *", "'hour' has invalid value '1\uff15'"),
    ("*/\u0665 * * * *", "'minute' has invalid step '\u0665'"),
    ("@daily 5", "'@daily' takes nothing after it, got '5'"),
    ("@fortnightly", "unknown cron macro '@fortnightly'"),
    ("@DAILY", "unknown cron macro '@DAILY'"),
    ("0 0 30 2 *", "'0 0 30 2 *' can never fire"),
    ("0 0 31 4,6 *", "'0 0 31 4,6 *' can never fire"),
    ("1,,2 * * * *", "'minute' has an empty list item"),
    ("x * * * *", "'minute' has invalid value 'x'"),
    ("-1 * * * *", "'minute' has an empty value"),
    ("1-2-3 * * * *", "'minute' has invalid value '2-3'"),
    ("*/x * * * *", "'minute' has invalid step 'x'"),
    ("H(5-2) * * * *", "'minute' range '5-2' is reversed"),
    ("H(0-60) * * * *", "'minute' value 60 out of range 0-59"),
    ("H/0 * * * *", "'minute' step 0 must be >= 1"),
    ("Hx * * * *", "'minute' has invalid hash item 'Hx'"),
    ("H(1,2) * * * *", "'minute' has invalid hash item 'H(1'"),
]


@pytest.mark.parametrize(("expr", "message"), INVALID_CRON)
def test_invalid_cron_expressions_name_the_bad_part(expr: str, message: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        Cron(expr)
    assert message in str(info.value)


def test_invalid_zone_and_policies_name_the_bad_part() -> None:
    for tz in ("Mars/Base", "", "america/new_york", "America", "../etc/passwd", "Utc"):
        with pytest.raises(InvalidSchedule, match=f"unknown time zone {tz!r}"):
            Cron("* * * * *", tz)
    with pytest.raises(InvalidSchedule, match="dst_gap must be 'shift' or 'skip', got 'Shift'"):
        Cron("* * * * *", dst_gap="Shift")
    with pytest.raises(InvalidSchedule, match="dst_fold must be .* got 'Both'"):
        Cron("* * * * *", dst_fold="Both")
    with pytest.raises(InvalidSchedule, match="got 'auto '"):
        Cron("* * * * *", dst_fold="auto ")
    with pytest.raises(InvalidSchedule, match="seed"):
        Cron("H * * * *", seed=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidSchedule, match="string"):
        Cron(None)  # type: ignore[arg-type]


def test_invalid_schedule_is_a_value_error_and_trigger_is_abstract() -> None:
    assert issubclass(InvalidSchedule, ValueError)
    with pytest.raises(TypeError):
        Trigger()  # type: ignore[abstract]


def test_valid_edge_expressions_are_accepted() -> None:
    for expr in [
        "0-59 0-23 1-31 1-12 0-7",
        "*/60 */24 */31 */12 */7",
        "59 23 31 12 SAT",
        "0 0 29 2 *",
        "0 0 31 1-12 *",
        "0 0 30 2 1",
        "  0   0\t* * *  ",
        "05 09 * * *",
        "0 0 * * sun-sat",
        "0 0 * * 5-7",
        "@weekly",
    ]:
        Cron(expr)
    assert fires("0 0 * * 5-7", "UTC", utc(2026, 2, 2), 3) == [
        utc(2026, 2, 6),
        utc(2026, 2, 7),
        utc(2026, 2, 8),
    ]


# ----------------------------------------------------------------------------------------------
# H (hashed values)
# ----------------------------------------------------------------------------------------------


def _minutes_in_hour(c: Cron) -> list[int]:
    start = utc(2026, 1, 1) - timedelta(microseconds=1)  # next_after is strict: include 00:00
    return [x.minute for x in chain(c, start, utc(2026, 1, 1, 1)) if x.hour == 0]


def test_h_is_pinned_so_upgrades_do_not_move_schedules() -> None:
    # Golden value: if this changes, every deployed H schedule would silently move.
    c = Cron("H H * * *", seed="nightly-backup")
    assert c.next_after(utc(2026, 1, 1)) == utc(2026, 1, 1, 5, 49)


def test_h_is_stable_across_processes_with_different_hash_seeds() -> None:
    code = (
        "from datetime import datetime, UTC\n"
        "from duetime.common.time.spec import Cron\n"
        "c = Cron('H H(0-5) H * H', seed='report-42')\n"
        "print(c.next_after(datetime(2026, 1, 1, tzinfo=UTC)).isoformat())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outputs = set()
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        outputs.add(run.stdout.strip())
    here = Cron("H H(0-5) H * H", seed="report-42").next_after(utc(2026, 1, 1))
    assert here is not None
    assert outputs == {here.isoformat()}


def test_h_spreads_different_seeds_and_is_deterministic() -> None:
    minutes = [_minutes_in_hour(Cron("H * * * *", seed=f"job-{i}"))[0] for i in range(200)]
    assert len(set(minutes)) >= 45  # ~58 expected for uniform hashing
    again = [_minutes_in_hour(Cron("H * * * *", seed=f"job-{i}"))[0] for i in range(200)]
    assert minutes == again
    assert Cron("H * * * *", seed="a") != Cron("H * * * *", seed="b")


def test_h_range_stays_within_bounds_and_covers_it() -> None:
    seen = set()
    for i in range(300):
        (m,) = _minutes_in_hour(Cron("H(10-20) * * * *", seed=f"s{i}"))
        assert 10 <= m <= 20
        seen.add(m)
    assert seen == set(range(10, 21))
    hours = {
        Cron("0 H(9-17) * * *", seed=f"s{i}").next_after(utc(2026, 1, 1)).hour for i in range(200)
    }
    assert hours == set(range(9, 18))
    dows = {
        Cron("0 0 * * H", seed=f"s{i}").next_after(utc(2026, 1, 1)).isoweekday() % 7
        for i in range(100)
    }
    assert dows == set(range(7))


def test_h_step_pattern() -> None:
    offsets = set()
    for i in range(100):
        got = _minutes_in_hour(Cron("H/15 * * * *", seed=f"s{i}"))
        o = got[0]
        assert 0 <= o < 15
        assert got == [o, o + 15, o + 30, o + 45]
        offsets.add(o)
    assert len(offsets) >= 10
    for i in range(100):
        got = _minutes_in_hour(Cron("H(20-40)/10 * * * *", seed=f"s{i}"))
        o = got[0]
        assert 20 <= o < 30
        assert got == [v for v in (o, o + 10, o + 20) if v <= 40]
    # Same seed: H/15 starts at the same hashed offset as H(0-14) would imply for minute.
    c = Cron("H/15 * * * *", seed="nightly-backup")
    assert _minutes_in_hour(c) == [4, 19, 34, 49]


def test_h_in_dst_zone_still_follows_gap_policy() -> None:
    c = Cron("H 2 * * *", "America/New_York", seed="nightly-backup")
    (m,) = {x.minute for x in chain(c, utc(2026, 3, 1), utc(2026, 3, 20))}
    oracle = OracleCron(f"{m} 2 * * *")
    expected = fire_sets(oracle, "America/New_York", utc(2026, 3, 7), utc(2026, 3, 10))
    assert chain(c, utc(2026, 3, 7), utc(2026, 3, 10)) == expected[("shift", "first")]


# ----------------------------------------------------------------------------------------------
# Every / At / serialisation / durations
# ----------------------------------------------------------------------------------------------


def test_every_fixed_grid_from_anchor_both_directions() -> None:
    e = Every(timedelta(minutes=15))
    assert e.next_after(utc(2026, 3, 8, 6, 59, 59)) == utc(2026, 3, 8, 7)
    assert e.next_after(utc(2026, 3, 8, 7)) == utc(2026, 3, 8, 7, 15)
    anchored = Every(timedelta(hours=1), anchor=utc(2026, 1, 1, 0, 20))
    assert anchored.next_after(utc(2025, 6, 1, 3, 0)) == utc(2025, 6, 1, 3, 20)  # before anchor
    assert anchored.next_after(utc(2026, 1, 1, 0, 20)) == utc(2026, 1, 1, 1, 20)
    odd = Every(timedelta(seconds=7), anchor=utc(2026, 1, 1))
    got = list(odd.occurrences(utc(2025, 12, 31, 23, 59, 50), utc(2026, 1, 1, 0, 0, 10)))
    assert got == [utc(2025, 12, 31, 23, 59, 53), utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 7)]
    micro = Every(timedelta(microseconds=1500))
    assert micro.next_after(utc(2026, 1, 1)) == utc(2026, 1, 1) + timedelta(microseconds=1500)


def test_every_ignores_dst_and_normalises_anchor_to_utc() -> None:
    ny = ZoneInfo("America/New_York")
    e = Every(timedelta(hours=1), anchor=datetime(2026, 1, 1, 0, 30, tzinfo=ny))
    assert e.anchor == utc(2026, 1, 1, 5, 30)
    got = list(e.occurrences(utc(2026, 3, 8, 5), utc(2026, 3, 8, 9)))
    assert got == [utc(2026, 3, 8, h, 30) for h in range(5, 9)]


def test_every_and_at_reject_bad_input() -> None:
    with pytest.raises(InvalidSchedule, match="positive"):
        Every(timedelta(0))
    with pytest.raises(InvalidSchedule, match="positive"):
        Every(timedelta(seconds=-5))
    with pytest.raises(InvalidSchedule, match="naive"):
        Every(timedelta(seconds=5), anchor=datetime(2026, 1, 1))
    with pytest.raises(InvalidSchedule, match="timedelta"):
        Every([5])  # type: ignore[arg-type]  (a number of seconds or a string is accepted)
    with pytest.raises(InvalidSchedule, match="naive"):
        At(datetime(2026, 1, 1))


def test_every_near_datetime_max_returns_none() -> None:
    e = Every(timedelta(days=365 * 1000))
    assert e.next_after(datetime(9990, 1, 1, tzinfo=UTC)) is None


def test_at_fires_once() -> None:
    a = At(datetime(2026, 3, 8, 3, 30, tzinfo=ZoneInfo("America/New_York")))
    assert a.instant == utc(2026, 3, 8, 7, 30)
    assert a.next_after(utc(2026, 1, 1)) == utc(2026, 3, 8, 7, 30)
    assert a.next_after(utc(2026, 3, 8, 7, 30)) is None
    assert list(a.occurrences(utc(2026, 1, 1), utc(2027, 1, 1))) == [utc(2026, 3, 8, 7, 30)]
    assert list(a.occurrences(utc(2026, 1, 1), utc(2026, 3, 8, 7, 29))) == []


@pytest.mark.parametrize(
    "trigger",
    [
        Cron("0 9 * * MON-FRI", "Europe/Paris"),
        Cron("H/15 2 * * *", "America/New_York", dst_gap="skip", dst_fold="both", seed="x"),
        Cron("@hourly", "Australia/Lord_Howe", dst_fold="first"),
        Every(timedelta(minutes=15)),
        Every(timedelta(seconds=1, microseconds=7), anchor=utc(2026, 1, 1, 0, 0, 3)),
        At(utc(2026, 3, 8, 7, 30, 0)),
        At(datetime(2026, 3, 8, 7, 30, 0, 123456, tzinfo=timezone(timedelta(hours=5)))),
    ],
    ids=lambda t: t.describe(),
)
def test_to_dict_round_trip_through_json(trigger: Trigger) -> None:
    d = trigger.to_dict()
    assert d["kind"] in ("cron", "every", "at")
    back = trigger_from_dict(json.loads(json.dumps(d)))
    assert back == trigger
    assert type(back) is type(trigger)
    assert back.to_dict() == d
    assert hash(back) == hash(trigger)
    t = utc(2026, 3, 7, 12)
    assert back.next_after(t) == trigger.next_after(t)


def test_describe() -> None:
    assert Cron("0 9 * * MON-FRI", "Europe/Paris").describe() == (
        "cron '0 9 * * MON-FRI' in Europe/Paris"
    )
    assert Cron("0 2 * * *", "UTC", dst_gap="skip").describe() == (
        "cron '0 2 * * *' in UTC (dst_gap=skip)"
    )
    assert Every(timedelta(minutes=90)).describe() == "every 1h30m"
    assert Every(timedelta(seconds=5), anchor=utc(2026, 1, 1)).describe() == (
        "every 5s from 2026-01-01T00:00:00Z"
    )
    assert At(utc(2026, 3, 8, 7, 30)).describe() == "once at 2026-03-08T07:30:00Z"
    assert "Every" in repr(Every(timedelta(seconds=5)))


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ("cron", "must be a dict"),
        ({}, "unknown trigger kind None"),
        ({"kind": "weekly"}, "unknown trigger kind 'weekly'"),
        ({"kind": "cron"}, "missing 'expr'"),
        ({"kind": "cron", "expr": "* * * * *", "tzz": "UTC"}, "unknown key(s) 'tzz'"),
        ({"kind": "cron", "expr": "* * * * *", "tz": 5}, "'tz' must be a string"),
        ({"kind": "cron", "expr": "0 24 * * *"}, "'hour' value 24"),
        ({"kind": "cron", "expr": "* * * * *", "tz": "Mars/Base"}, "'Mars/Base'"),
        ({"kind": "every", "interval_us": "60"}, "'interval_us' must be an integer"),
        ({"kind": "every", "interval_us": True}, "'interval_us' must be an integer"),
        ({"kind": "every", "interval_us": 0}, "positive"),
        ({"kind": "every", "interval_us": 10**30}, "too large"),
        ({"kind": "every", "interval_us": 5, "anchor": "2026-01-01T00:00"}, "no UTC offset"),
        ({"kind": "every", "interval_us": 5, "anchor": "yesterday"}, "'yesterday'"),
        ({"kind": "at"}, "missing 'instant'"),
        ({"kind": "at", "instant": 1700000000}, "ISO-8601"),
    ],
)
def test_trigger_from_dict_rejects_bad_data(d: object, message: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        trigger_from_dict(d)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_trigger_from_dict_defaults() -> None:
    assert trigger_from_dict({"kind": "cron", "expr": "@daily"}) == Cron("@daily")
    assert trigger_from_dict({"kind": "every", "interval_us": 1_000_000}) == Every(
        timedelta(seconds=1)
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2d", timedelta(days=2)),
        ("500ms", timedelta(milliseconds=500)),
        ("30", timedelta(seconds=30)),
        ("1d2h3m4s5ms", timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=5)),
        (" 10m ", timedelta(minutes=10)),
        ("0s", timedelta(0)),
        ("007s", timedelta(seconds=7)),
    ],
)
def test_parse_duration_accepts(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty duration"),
        ("   ", "empty duration"),
        ("abc", "expected a number at 'abc'"),
        ("5x", "unknown unit 'x'"),
        ("5H", "unknown unit 'H'"),
        ("1m30h", "unit 'h' repeated or out of order"),
        ("1h1h", "unit 'h' repeated or out of order"),
        ("-5s", "expected a number at '-5s'"),
        ("1.h", "missing unit after '1'"),
        ("\uff15s", "expected a number at '\uff15s'"),
        ("1h 30m", "expected a number at ' 30m'"),
        ("99999999999999d", "too large"),
        ("9" * 30, "too large"),
    ],
)
def test_parse_duration_rejects_and_names_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        parse_duration(text)
    assert message in str(info.value)
