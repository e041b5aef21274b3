"""The cron grammar as docs/time.md writes it down: every example there, checked.

Each documented example's fire times are checked twice: against the dates the doc prints
(hand-computed), and against the brute-force oracle (tests/unit/cron_oracle.py), day by day over
2026-2027 in UTC and minute by minute across DST changes, wherever the oracle reads the form
(it has no H: those are checked as the union of their items). Each refused form is refused with
an InvalidSchedule naming the bad item. The croniter readings the doc contrasts with are pinned
too, so the doc's claim about them is evidence, not memory.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from duetime.common.time.spec import Cron, InvalidSchedule

from tests.unit.cron_oracle import OracleCron, fire_sets
from tests.unit.test_timespec import POLICIES, chain


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


JAN_1_2026 = utc(2026, 1, 1)


def fires(expr: str, n: int, start: datetime = JAN_1_2026, tz: str = "UTC",
          **kw: str) -> list[datetime]:
    c, out, t = Cron(expr, tz, **kw), [], start
    for _ in range(n):
        nxt = c.next_after(t)
        assert nxt is not None, expr
        out.append(nxt)
        t = nxt
    return out


def days(expr: str, n: int = 3) -> list[tuple[int, int]]:
    """(month, day) of the first n fires in 2026, as the doc's tables print them."""
    return [(x.month, x.day) for x in fires(expr, n)]


def oracle_days(expr: str, lo: datetime, hi: datetime) -> list[datetime]:
    """Fires of an expression with one fixed minute and hour, in UTC, by the oracle's own day
    matcher: every day in (lo, hi] at that time that the oracle says matches."""
    oracle = OracleCron(expr)
    (minute,), (hour,) = oracle.minutes, oracle.hours
    out, day = [], lo.replace(hour=0, minute=0, second=0, microsecond=0)
    while day <= hi:
        x = day.replace(hour=hour, minute=minute)
        if lo < x <= hi and oracle.matches(x.replace(tzinfo=None)):
            out.append(x)
        day += timedelta(days=1)
    return out


TWO_YEARS = (utc(2025, 12, 31), utc(2027, 12, 31, 23, 59))

# (expression, the first three fires of 2026 as docs/time.md prints them)
DOCUMENTED_DAYS = [
    ("0 9 L * *", [(1, 31), (2, 28), (3, 31)]),
    ("0 18 LW * *", [(1, 30), (2, 27), (3, 31)]),
    ("0 6 L-3 * *", [(1, 28), (2, 25), (3, 28)]),
    ("0 9 15W * *", [(1, 15), (2, 16), (3, 16)]),
    ("0 10 * * 1#2", [(1, 12), (2, 9), (3, 9)]),
    ("0 10 * * MON#2", [(1, 12), (2, 9), (3, 9)]),
    ("0 10 * * L5", [(1, 30), (2, 27), (3, 27)]),
    ("0 10 * * LFRI", [(1, 30), (2, 27), (3, 27)]),
    ("0 0 * * 1#5", [(3, 30), (6, 29), (8, 31)]),
    # lists are unions of their items
    ("0 9 1W,L * *", [(1, 1), (1, 31), (2, 2)]),
    ("0 10 * * 1#2,3", [(1, 7), (1, 12), (1, 14)]),
    # the day fields together: either when both are restricted, both when one starts with *
    ("0 0 13 * FRI", [(1, 2), (1, 9), (1, 13)]),
    ("0 0 8 * 1#2", [(1, 8), (1, 12), (2, 8)]),
    ("0 0 15W * 1", [(1, 5), (1, 12), (1, 15)]),
    ("0 0 */2 * L5", [(2, 27), (3, 27), (5, 29)]),
]


@pytest.mark.parametrize(("expr", "first"), DOCUMENTED_DAYS)
def test_documented_day_examples_fire_on_the_printed_days_and_agree_with_the_oracle(
        expr: str, first: list[tuple[int, int]]) -> None:
    assert days(expr) == first
    assert chain(Cron(expr), *TWO_YEARS) == oracle_days(expr, *TWO_YEARS)


def test_documented_seconds_example_and_five_fields_fire_at_second_0() -> None:
    expr = "*/20 * * * * */15"
    assert fires(expr, 6) == [
        utc(2026, 1, 1, 0, 0, 15), utc(2026, 1, 1, 0, 0, 30), utc(2026, 1, 1, 0, 0, 45),
        utc(2026, 1, 1, 0, 20), utc(2026, 1, 1, 0, 20, 15), utc(2026, 1, 1, 0, 20, 30)]
    window = (utc(2026, 1, 1), utc(2026, 1, 1, 2))
    assert chain(Cron(expr), *window) == fire_sets(OracleCron(expr), "UTC", *window)[("shift", "first")]
    # the first five fields mean the same with or without the sixth
    assert chain(Cron("*/20 * * * * 0"), *window) == chain(Cron("*/20 * * * *"), *window)


def test_lw_is_31w_and_lower_case_items_are_accepted() -> None:
    assert Cron("0 0 LW * *").instants_key() == Cron("0 0 31W * *").instants_key()
    assert chain(Cron("0 0 lw * *"), *TWO_YEARS) == chain(Cron("0 0 31W * *"), *TWO_YEARS)
    assert chain(Cron("0 0 l-3 * *"), *TWO_YEARS) == chain(Cron("0 0 L-3 * *"), *TWO_YEARS)
    assert chain(Cron("0 0 * * lfri"), *TWO_YEARS) == chain(Cron("0 0 * * L5"), *TWO_YEARS)


def test_l_minus_n_stops_at_27_so_february_has_it() -> None:
    # L-27 is Feb 1 in a common year and Feb 2 in a leap year, the 4th of a 31-day month
    assert [x.date().isoformat() for x in fires("0 0 L-27 2 *", 3)] == [
        "2026-02-01", "2027-02-01", "2028-02-02"]
    assert fires("0 0 L-27 1 *", 1) == [utc(2026, 1, 4)]


def test_calendar_items_across_dst_agree_with_the_oracle_for_every_policy() -> None:
    cases = [
        # London, 2026-03-29: L-2 of March is the spring-forward Sunday, 01:30 does not exist
        ("30 1 L-2 3 *", "Europe/London", utc(2026, 3, 28), utc(2026, 3, 31)),
        # New York, 2026-03-08 is the second Sunday; Wednesdays too (a plain day beside #)
        ("30 2 * 3 0#2,3", "America/New_York", utc(2026, 3, 7), utc(2026, 3, 12)),
        # New York, 2026-11-01: the fall-back Sunday is the first day; LW of October beside it
        ("30 1 1,LW 10,11 *", "America/New_York", utc(2026, 10, 29), utc(2026, 11, 3)),
    ]
    for expr, zone, lo, hi in cases:
        expected = fire_sets(OracleCron(expr), zone, lo, hi)
        assert any(expected.values()), expr
        for gap, fold in POLICIES:
            got = chain(Cron(expr, zone, dst_gap=gap, dst_fold=fold), lo, hi)
            assert got == expected[(gap, fold)], (expr, gap, fold)
    # London's spring gap by hand: shift reads 01:30 with GMT, skip waits for 2027's L-2
    assert fires("30 1 L-2 3 *", 1, utc(2026, 3, 1), "Europe/London") == [utc(2026, 3, 29, 1, 30)]
    assert fires("30 1 L-2 3 *", 1, utc(2026, 3, 1), "Europe/London", dst_gap="skip") == [
        utc(2027, 3, 29, 0, 30)]


def test_h_beside_calendar_items_is_the_union_of_its_items() -> None:
    for seed in ("nightly-backup", "report-42", "x"):
        got = chain(Cron("0 0 H,L * *", seed=seed), *TWO_YEARS)
        h_only = chain(Cron("0 0 H * *", seed=seed), *TWO_YEARS)
        assert got == sorted(set(h_only) | set(chain(Cron("0 0 L * *"), *TWO_YEARS)))
        assert len(got) > len(h_only)
        got = chain(Cron("0 0 * * H,1#2", seed=seed), *TWO_YEARS)
        h_only = chain(Cron("0 0 * * H", seed=seed), *TWO_YEARS)
        assert got == sorted(set(h_only) | set(chain(Cron("0 0 * * 1#2"), *TWO_YEARS)))
    # the H of a list item keeps the value it has alone (stored schedules keep their times)
    assert Cron("0 0 H,L * *", seed="x").instants_key()[5] == Cron("0 0 H * *", seed="x").instants_key()[5]


REFUSED = [
    # # takes one day, never a range or a step, and lives in day-of-week
    ("0 0 * * 1-5#2", "cron field 'day-of-week' has invalid nth-weekday item '1-5#2': # takes a "
                      "single day, not a range (list them, e.g. 1#2,2#2)"),
    ("0 0 * * MON-FRI#2", "'day-of-week' has invalid nth-weekday item 'MON-FRI#2': # takes a "
                          "single day, not a range"),
    ("0 0 * * */2#1", "'day-of-week' has invalid nth-weekday item '*/2#1' (use <day>#<n>"),
    ("0 0 1#2 * *", "cron field 'day-of-month' has invalid item '1#2' (# belongs to day-of-week"),
    # W takes one day
    ("0 0 1-5W * *", "'day-of-month' has invalid item '1-5W' (use L, LW, L-n or nW, e.g. 15W; "
                     "W takes a single day, not a range or a step)"),
    ("0 0 */2W * *", "'day-of-month' has invalid item '*/2W'"),
    ("0 0 * * 1W", "'day-of-week' has invalid value '1W'"),
    # L-n: 1-27, no W after it
    ("0 0 L-0 * *", "'day-of-month' days before the last day 0 out of range 1-27 in 'L-0'"),
    ("0 0 L-28 * *", "days before the last day 28 out of range 1-27 in 'L-28' (so that the day "
                     "exists in every month)"),
    ("0 0 L-3W * *", "'day-of-month' has invalid item 'L-3W' (use L-n, n days before the last "
                     "day, e.g. L-3)"),
    ("0 0 L- * *", "has invalid item 'L-' (use L-n"),
    # H never inside a calendar item
    ("0 0 HW * *", "cron field 'day-of-month' has invalid item 'HW': H does not combine with "
                   "L, W or # (write H as an item of its own, e.g. H,L)"),
    ("0 0 WH * *", "'day-of-month' has invalid item 'WH': H does not combine"),
    ("0 0 H(1-5)W * *", "has invalid item 'H(1-5)W': H does not combine"),
    ("0 0 L-H * *", "has invalid item 'L-H': H does not combine"),
    ("0 0 * * H#2", "cron field 'day-of-week' has invalid item 'H#2': H does not combine"),
    ("0 0 * * 1#H", "'day-of-week' has invalid item '1#H': H does not combine"),
    ("0 0 * * LH", "'day-of-week' has invalid item 'LH': H does not combine"),
    # Quartz spellings that mean something else here, and ?
    ("0 0 * * L", "'day-of-week' has invalid value 'L'"),
    ("0 0 * * 5L", "'day-of-week' has unsupported item '5L' (for the last such weekday of the "
                   "month write L5"),
    ("0 0 ? * *", "'day-of-month' has invalid value '?'"),
    # never fires on the calendar
    ("0 0 30 FEB *", "can never fire: day-of-month [30] never occurs in month [2]"),
]


@pytest.mark.parametrize(("expr", "message"), REFUSED)
def test_refused_forms_name_the_bad_item(expr: str, message: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        Cron(expr)
    assert message in str(info.value)


def test_thu_is_a_name_not_an_h() -> None:
    # the H check must not catch the H of THU
    assert days("0 0 * * THU#2", 2) == [(1, 8), (2, 12)]
    assert days("0 0 * * LTHU", 2) == [(1, 29), (2, 26)]


def test_gap_only_expression_under_skip_is_accepted_and_has_no_next_fire() -> None:
    expr, zone = "30 2 * 3 0#2", "America/New_York"
    skip = Cron(expr, zone, dst_gap="skip")  # accepted: the zone's rules decide, date by date
    # before 2007 the spring change was in April, so 02:30 EST existed on the second Sunday
    assert skip.next_after(utc(2005, 6, 1)) == utc(2006, 3, 12, 7, 30)
    assert skip.next_after(utc(2006, 3, 12, 7, 30)) is None
    assert skip.next_after(utc(2026, 1, 1)) is None
    assert list(skip.occurrences(utc(2026, 1, 1), utc(2030, 1, 1))) == []
    # shift (the default) fires at 03:30 EDT every year
    assert fires(expr, 2, utc(2026, 1, 1), zone) == [utc(2026, 3, 8, 7, 30), utc(2027, 3, 14, 7, 30)]


def test_croniter_readings_the_doc_contrasts_with() -> None:
    """docs/time.md says croniter 7 reads these differently; if croniter changes, so must the doc."""
    from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

    def croniter_days(expr: str) -> list[tuple[int, int]]:
        it = croniter(expr, datetime(2026, 1, 1))
        return [(x.month, x.day) for x in (it.get_next(datetime) for _ in range(3))]

    assert croniter_days("0 0 8 * 1#2") == [(1, 12), (2, 9), (3, 9)]  # the 8th dropped
    assert days("0 0 8 * 1#2") == [(1, 8), (1, 12), (2, 8)]
    assert croniter_days("0 0 15W * 1") == [(1, 15), (2, 16), (3, 16)]  # Mondays dropped
    assert days("0 0 15W * 1") == [(1, 5), (1, 12), (1, 15)]
    with pytest.raises(CroniterBadDateError):
        croniter_days("0 0 L * 1#2")
    assert days("0 0 L * 1#2") == [(1, 12), (1, 31), (2, 9)]
    with pytest.raises(CroniterBadCronError):
        croniter_days("0 9 1W,L * *")
    with pytest.raises(CroniterError):
        croniter_days("0 10 * * 1#2,3")
