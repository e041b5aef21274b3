"""Calendar items (L, nW, d#n, Ld) and the optional seconds field, checked against the
brute-force oracle across DST changes; errors that name the bad part; H unchanged; and
hypothesis property tests of the cron parser (fixed seed, small budget)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from duetime.common.time.spec import Cron, InvalidSchedule
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cron_oracle import OracleCron, fire_sets, offset_changes
from tests.unit.test_timespec import POLICIES, chain

DST_ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe"]
OTHER_ZONES = ["Pacific/Chatham", "America/Santiago", "UTC"]
NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def first_fires(expr: str, tz: str, start: datetime, n: int, **kw: str) -> list[datetime]:
    c, out, t = Cron(expr, tz, **kw), [], start
    for _ in range(n):
        t = c.next_after(t)
        assert t is not None
        out.append(t)
    return out


# -- named examples across DST ------------------------------------------------------------------


def test_second_sunday_of_march_is_new_yorks_spring_forward_day() -> None:
    # 0#2: 2026-03-08, when 02:30 does not exist. shift -> 03:30 EDT; skip -> it never exists.
    shift = Cron("30 2 * 3 0#2", "America/New_York")
    assert first_fires("30 2 * 3 0#2", "America/New_York", utc(2026, 1, 1), 2) == [
        utc(2026, 3, 8, 7, 30), utc(2027, 3, 14, 7, 30)]
    assert shift.next_after(utc(2026, 1, 1)) == utc(2026, 3, 8, 7, 30)
    assert Cron("30 2 * 3 SUN#2", "America/New_York", dst_gap="skip").next_after(utc(2026, 1, 1)) is None


def test_last_sunday_of_october_is_londons_fall_back_day() -> None:
    # L0 on 2026-10-25: 01:30 happens at 00:30Z (BST) and 01:30Z (GMT)
    window = (utc(2026, 10, 24), utc(2026, 10, 26))
    assert chain(Cron("30 1 * 10 L0", "Europe/London"), *window) == [utc(2026, 10, 25, 0, 30)]
    both = Cron("30 1 * 10 LSUN", "Europe/London", dst_fold="both")
    assert chain(both, *window) == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)]
    # and the last Sunday of March, 01:30 never exists: shift reads it as GMT
    assert Cron("30 1 * 3 L0", "Europe/London").next_after(utc(2026, 3, 1)) == utc(2026, 3, 29, 1, 30)


def test_last_day_of_the_month_on_a_fold() -> None:
    # 2027-10-31 is a Sunday: London's fall-back day is also the month's last day
    window = (utc(2027, 10, 30), utc(2027, 11, 1))
    assert chain(Cron("30 1 L 10 *", "Europe/London"), *window) == [utc(2027, 10, 31, 0, 30)]
    both = Cron("30 1 L 10 *", "Europe/London", dst_fold="both")
    assert chain(both, *window) == [utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30)]


def test_lord_howe_first_sunday_gap_and_fold() -> None:
    # 2026-10-04 (first Sunday) 02:00 +10:30 -> 02:30 +11:00: 02:15 does not exist
    assert Cron("15 2 * 10 0#1", "Australia/Lord_Howe").next_after(utc(2026, 9, 1)) == \
        utc(2026, 10, 3, 15, 45)
    # 2026-04-05 (first Sunday) 02:00 +11:00 -> 01:30 +10:30: 01:45 happens twice
    both = Cron("45 1 * 4 SUN#1", "Australia/Lord_Howe", dst_fold="both")
    assert chain(both, utc(2026, 4, 4), utc(2026, 4, 6)) == [utc(2026, 4, 4, 14, 45),
                                                              utc(2026, 4, 4, 15, 15)]


def test_nearest_weekday_moves_off_the_transition_sunday() -> None:
    # Nov 1 2026 (New York's fall-back day) is a Sunday: 1W is Monday Nov 2, no fold
    assert first_fires("30 1 1W 11 *", "America/New_York", utc(2026, 10, 1), 1) == [
        utc(2026, 11, 2, 6, 30)]
    # plain day 1 fires on the fold, once (daily job: auto = first)
    assert first_fires("30 1 1 11 *", "America/New_York", utc(2026, 10, 1), 1) == [
        utc(2026, 11, 1, 5, 30)]


def test_nearest_weekday_never_leaves_the_month() -> None:
    # June 2024: the 1st is a Saturday -> Monday 3rd (not Friday May 31)
    assert first_fires("0 9 1W * *", "UTC", utc(2024, 5, 31), 1) == [utc(2024, 6, 3, 9)]
    # March 2024: the 31st is a Sunday -> Friday 29th (not Monday April 1)
    assert first_fires("0 9 31W 3 *", "UTC", utc(2024, 3, 1), 1) == [utc(2024, 3, 29, 9)]
    # a day past the month's end counts as its last day: 31W is the last weekday of every month
    got = first_fires("0 9 31W * *", "UTC", utc(2026, 1, 1), 3)
    assert got == [utc(2026, 1, 30, 9), utc(2026, 2, 27, 9), utc(2026, 3, 31, 9)]
    # and 15W on a Saturday is Friday 14th, on a Sunday Monday 16th
    assert first_fires("0 9 15W * *", "UTC", utc(2026, 2, 1), 2) == [utc(2026, 2, 16, 9),
                                                                      utc(2026, 3, 16, 9)]


def test_calendar_items_combine_by_the_vixie_rule() -> None:
    # both day fields restricted: either matches (last day OR a Monday)
    got = first_fires("0 0 L * MON", "UTC", utc(2026, 1, 25), 3)
    assert got == [utc(2026, 1, 26), utc(2026, 1, 31), utc(2026, 2, 2)]
    # day-of-month written with '*': both must match (a last Friday on an odd day; Jan 30 is not)
    got = first_fires("0 0 */2 * L5", "UTC", utc(2026, 1, 1), 2)
    assert got == [utc(2026, 2, 27), utc(2026, 3, 27)]
    # lists mix plain and calendar items
    got = first_fires("0 12 1,L * *", "UTC", utc(2026, 2, 1), 3)
    assert got == [utc(2026, 2, 1, 12), utc(2026, 2, 28, 12), utc(2026, 3, 1, 12)]
    got = first_fires("0 12 * * 1#1,LFRI", "UTC", utc(2026, 1, 1), 3)
    assert got == [utc(2026, 1, 5, 12), utc(2026, 1, 30, 12), utc(2026, 2, 2, 12)]


def test_fifth_weekday_only_in_months_that_have_one() -> None:
    got = first_fires("0 0 * * 1#5", "UTC", utc(2026, 1, 1), 3)
    assert got == [utc(2026, 3, 30), utc(2026, 6, 29), utc(2026, 8, 31)]
    # a fifth Monday in February needs a leap year whose Feb 1 is a Monday
    assert first_fires("0 0 * 2 MON#5", "UTC", utc(2026, 1, 1), 1) == [utc(2044, 2, 29)]


def test_seconds_field_is_last_and_keeps_the_dst_contract() -> None:
    assert first_fires("*/20 * * * * */15", "UTC", utc(2026, 1, 1), 5) == [
        utc(2026, 1, 1, 0, 0, 15), utc(2026, 1, 1, 0, 0, 30), utc(2026, 1, 1, 0, 0, 45),
        utc(2026, 1, 1, 0, 20, 0), utc(2026, 1, 1, 0, 20, 15)]
    # spring gap in New York: 02:30:xx does not exist; shift keeps every second of it
    got = chain(Cron("30 2 * * * */20", "America/New_York"), utc(2026, 3, 8, 6), utc(2026, 3, 8, 8))
    assert got == [utc(2026, 3, 8, 7, 30, s) for s in (0, 20, 40)]
    # fall back: an hourly job (hour '*') fires in both copies of 01:15:xx, a daily one once
    hourly = chain(Cron("15 * * * * 0,30", "America/New_York"), utc(2026, 11, 1, 5), utc(2026, 11, 1, 7))
    assert hourly == [utc(2026, 11, 1, 5, 15), utc(2026, 11, 1, 5, 15, 30),
                      utc(2026, 11, 1, 6, 15), utc(2026, 11, 1, 6, 15, 30)]
    daily = chain(Cron("15 1 * * * 0,30", "America/New_York"), utc(2026, 11, 1), utc(2026, 11, 2))
    assert daily == [utc(2026, 11, 1, 5, 15), utc(2026, 11, 1, 5, 15, 30)]
    # Lord Howe's half-hour gap
    assert Cron("10 2 * * * 5", "Australia/Lord_Howe").next_after(utc(2026, 10, 3, 12)) == \
        utc(2026, 10, 3, 15, 40, 5)
    # a five-field expression is second 0, exactly as before
    assert Cron("* * * * *").next_after(utc(2026, 1, 1, 0, 0, 30)) == utc(2026, 1, 1, 0, 1)
    assert Cron("* * * * * 0") == Cron("* * * * * 0") != Cron("* * * * *")


def test_h_expressions_are_unchanged() -> None:
    # golden values from the implementation before croniter and seconds: stored H schedules
    # must keep their times
    golden = {
        ("H H * * *", "UTC", "nightly-backup"): ["2026-03-01T05:49:00Z", "2026-03-02T05:49:00Z"],
        ("H/15 * * * *", "Europe/Berlin", "job-7"): ["2026-03-01T00:11:00Z", "2026-03-01T00:26:00Z"],
        ("H H(0-5) H * H", "America/New_York", "report-42"):
            ["2026-03-02T06:12:00Z", "2026-03-09T05:12:00Z", "2026-03-16T05:12:00Z"],
        ("H(10-20)/5 H(9-17) * * MON-FRI", "Australia/Lord_Howe", "x"):
            ["2026-03-02T01:13:00Z", "2026-03-02T01:18:00Z"],
        ("0 H * * H", "Europe/London", "weekly-sync"): ["2026-03-01T15:00:00Z", "2026-03-08T15:00:00Z"],
        ("H 2 * * *", "America/New_York", "nightly-backup"): ["2026-03-01T07:49:00Z"],
        ("H H H H *", "Pacific/Chatham", "yearly"): ["2026-12-26T05:04:00Z", "2027-12-26T05:04:00Z"],
        ("H/7 H/3 * * *", "Asia/Kathmandu", "s"): ["2026-03-01T00:16:00Z", "2026-03-01T00:23:00Z"],
    }
    for (expr, tz, seed), want in golden.items():
        got = first_fires(expr, tz, utc(2026, 3, 1), len(want), seed=seed)
        assert [x.isoformat().replace("+00:00", "Z") for x in got] == want, expr
    # H in the seconds field hashes the field name 'second', so it does not move the others
    assert Cron("H H * * * H", seed="nightly-backup").next_after(utc(2026, 3, 1)).replace(second=0) \
        == utc(2026, 3, 1, 5, 49)


INVALID = [
    ("0 0 L-28 * *", "'day-of-month' days before the last day 28 out of range 1-27 in 'L-28'"),
    ("0 0 L-2W * *", "'day-of-month' has invalid item 'L-2W' (use L-n, n days before the last"),
    ("0 0 W * *", "'day-of-month' has invalid item 'W'"),
    ("0 0 32W * *", "'day-of-month' nearest-weekday day 32 out of range 1-31 in '32W'"),
    ("0 0 0W * *", "nearest-weekday day 0 out of range 1-31"),
    ("0 0 L/2 * *", "'day-of-month' has invalid item 'L/2'"),
    ("0 0 * * 5L", "'day-of-week' has unsupported item '5L' (for the last such weekday of the "
                   "month write L5, as croniter does)"),
    ("0 0 * * 5#6", "'day-of-week' nth-weekday 6 out of range 1-5 in '5#6'"),
    ("0 0 * * 5#0", "nth-weekday 0 out of range 1-5"),
    ("0 0 * * 8#1", "'day-of-week' value 8 out of range 0-7"),
    ("0 0 * * 1-5#2", "'day-of-week' has invalid nth-weekday item '1-5#2': # takes a single day, "
                     "not a range"),
    ("0 0 * * FRI#", "has invalid nth-weekday item 'FRI#'"),
    ("0 0 * * JAN#1", "'day-of-week' does not accept name 'JAN'"),
    ("0 0 * * LXYZ", "'day-of-week' has invalid last-weekday item 'LXYZ' (use L<day>"),
    ("0 0 * * L9", "has invalid last-weekday item 'L9'"),
    ("0 0 * * L", "'day-of-week' has invalid value 'L'"),
    ("0 0 * L * ", "'month' has invalid value 'L'"),
    ("L * * * *", "'minute' has invalid value 'L'"),
    ("* * * * * 60", "cron field 'second' value 60 out of range 0-59"),
    ("* * * * * */0", "'second' step 0 must be >= 1"),
    ("* * * * * 5-2", "'second' range '5-2' is reversed"),
    ("* * * * * * *", "has 7 fields, expected 5 (minute hour day-of-month month day-of-week) "
                      "or 6 (the same, then second)"),
    ("0 0 * * * ?", "'second' has invalid value '?'"),
]


@pytest.mark.parametrize(("expr", "message"), INVALID)
def test_bad_calendar_and_seconds_items_name_the_bad_part(expr: str, message: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        Cron(expr)
    assert message in str(info.value)


# -- generated cases, compared with the oracle ---------------------------------------------------


@cache
def transitions(zone: str) -> tuple[datetime, ...]:
    return tuple(offset_changes(zone, utc(2025, 1, 1), utc(2028, 1, 1)))


def make_case(i: int) -> tuple[str, str, datetime, datetime]:
    """A (zone, expression, window) whose day fields use calendar items, mostly on a DST day."""
    rng = random.Random(f"calendar-case-{i}")
    zone = rng.choice(DST_ZONES * 3 + OTHER_ZONES)
    changes = transitions(zone)
    if changes and rng.random() < 0.85:
        start = rng.choice(changes) + timedelta(minutes=rng.randint(-30 * 60, 6 * 60))
    else:
        start = utc(2025, 1, 1) + timedelta(minutes=rng.randrange(3 * 365 * 24 * 60))
    local = (start + timedelta(hours=rng.randrange(24))).astimezone(ZoneInfo(zone))
    dow, nth = local.isoweekday() % 7, (local.day - 1) // 7 + 1
    dom = rng.choice(["*", "L", f"{local.day}W", f"W{local.day}", f"L,{local.day}", "1W", "31W",
                      "15W", f"{max(1, local.day - 1)}W", "*", "*/2"])
    dow_field = rng.choice(["*", f"{dow}#{nth}", f"{NAMES[dow]}#{nth}", f"L{dow}",
                            f"L{NAMES[dow].lower()}", f"{dow}#5", f"0#1,{(dow + 1) % 7}", "MON-FRI",
                            f"{dow}#{nth},L{(dow + 3) % 7}", "*"])
    if dom == "*" and dow_field == "*":
        dom = "L" if rng.random() < 0.5 else f"{local.day}W"
    month = rng.choice(["*", "*", str(local.month), f"{local.month},{local.month % 12 + 1}"])
    hour = rng.choice(["*", str(local.hour), f"{max(0, local.hour - 2)}-{min(23, local.hour + 2)}",
                       "0-4", "1,2,3", "*/2"])
    minute = rng.choice(["0", "30", "*/15", "15,45", "0-59/20", "5-10"])
    seconds = rng.choice([None, None, "0", "*/20", "10-20/5", "59", "0,30"])
    expr = " ".join([minute, hour, dom, month, dow_field] + ([seconds] if seconds else []))
    span = timedelta(days=1 if seconds else 2)
    return zone, expr, start, start + span


N_CASES = 150


def _check_against_oracle(zone: str, expr: str, start: datetime, end: datetime) -> None:
    oracle = OracleCron(expr)
    expected = fire_sets(oracle, zone, start, end)
    ctx = f"{expr!r} in {zone} over ({start.isoformat()}, {end.isoformat()}]"
    for gap, fold in POLICIES:
        got = chain(Cron(expr, zone, dst_gap=gap, dst_fold=fold), start, end)
        assert got == expected[(gap, fold)], f"{ctx} gap={gap} fold={fold}"
    auto = "both" if oracle.hour_wild else "first"
    assert list(Cron(expr, zone).occurrences(start, end)) == expected[("shift", auto)], ctx


@pytest.mark.parametrize("case", range(N_CASES))
def test_generated_calendar_cases_match_the_oracle(case: int) -> None:
    _check_against_oracle(*make_case(case))


def test_generated_calendar_cases_hit_transitions_and_fire() -> None:
    cases = [make_case(i) for i in range(N_CASES)]
    assert {zone for zone, *_ in cases} >= set(DST_ZONES)
    on_change = [c for c in cases if any(c[2] <= tr <= c[3] for tr in transitions(c[0]))]
    assert len(on_change) > N_CASES // 2
    # enough of them really fire inside the window on a transition day, with seconds too
    firing = [c for c in on_change if fire_sets(OracleCron(c[1]), c[0], c[2], c[3])[("shift", "both")]]
    assert len(firing) > N_CASES // 5
    assert sum(1 for c in firing if len(c[1].split()) == 6) >= 10
    assert {item for c in firing for item in ("#", "L", "W") if item in c[1]} == {"#", "L", "W"}


# -- property tests -----------------------------------------------------------------------------

FAST = settings(max_examples=300, derandomize=True, deadline=None)
SLOW = settings(max_examples=40, derandomize=True, deadline=None)


@given(st.text(alphabet=" */,-#LWH()?@0123456789MONFRIJANlw", max_size=24))
@FAST
def test_any_expression_is_a_cron_or_an_invalid_schedule(text: str) -> None:
    try:
        c = Cron(text, "America/New_York", seed="p")
    except InvalidSchedule as exc:
        assert "\n" not in str(exc)
        return
    t = utc(2026, 3, 8, 6)
    x = c.next_after(t)
    assert x is None or x > t


def _field(values: st.SearchStrategy[str], lo: int, hi: int) -> st.SearchStrategy[str]:
    single = st.integers(lo, hi).map(str)
    rng = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda t: f"{min(t)}-{max(t)}")
    step = st.tuples(st.sampled_from(["*", f"{lo}-{hi}"]), st.integers(1, 20)).map(
        lambda t: f"{t[0]}/{t[1]}")
    item = st.one_of(single, rng, step, values)
    return st.one_of(st.just("*"), st.lists(item, min_size=1, max_size=3).map(",".join))


EXPRESSIONS = st.tuples(
    _field(st.sampled_from(["0", "30"]), 0, 59),
    _field(st.sampled_from(["1", "2"]), 0, 23),
    _field(st.sampled_from(["L", "15W", "1W", "31W", "W8", "LW", "L-3"]), 1, 31),
    _field(st.sampled_from(["MAR", "nov", "APR-OCT"]), 1, 12),
    _field(st.sampled_from(["0#2", "SUN#1", "L0", "lsun", "1#5", "MON-FRI"]), 0, 7),
    st.one_of(st.none(), _field(st.sampled_from(["0", "59"]), 0, 59)),
).map(lambda f: " ".join(x for x in f if x is not None))


@given(EXPRESSIONS, st.sampled_from(DST_ZONES), st.integers(0, 5), st.integers(-600, 600))
@SLOW
def test_generated_expressions_match_the_oracle_near_transitions(
        expr: str, zone: str, which: int, shift_min: int) -> None:
    oracle = OracleCron(expr)
    try:
        Cron(expr, zone)
    except InvalidSchedule:
        assert not oracle.can_ever_fire(), expr
        return
    start = transitions(zone)[which] + timedelta(minutes=shift_min - 12 * 60)
    _check_against_oracle(zone, expr, start, start + timedelta(hours=24))
