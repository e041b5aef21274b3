"""Property tests of business calendars (common/time/calendar.py) beside the time contract:
the calendared trigger's instants are exactly what an independent per-occurrence oracle
says -- excluded days dropped or rolled to the same wall time on the next / previous business
day, across month ends and DST transitions, two occurrences rolled onto one instant counted
once -- and a calendar edited mid-way applies from the next occurrence without a run."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from duetime.common.time.calendar import (
    MAX_ROLL_DAYS,
    Calendar,
    Calendared,
    interval_starts,
    previous_before,
)
from duetime.common.time.parse import to_ms
from duetime.common.time.spec import At, Cron, Every, Trigger
from duetime.scheduler.calendars import apply
from hypothesis import given, settings
from hypothesis import strategies as st

Case = tuple[Trigger, Calendar, str, datetime, datetime]
CI = settings(derandomize=True, max_examples=150, deadline=None)
ZONES = ["America/New_York", "Europe/London", "UTC", "Australia/Lord_Howe", "Asia/Kathmandu"]
EXPRS = ["0 9 * * *", "30 2 * * *", "30 1 * * *", "0 9,17 * * *", "0 17 * * SAT",
         "0 * * * *", "0 9 L * *", "0 9 1 * *", "15 8 * * MON-FRI", "0 23 * * *"]
# windows around DST transitions (northern March/April and October/November, southern
# April and October) and month ends
STARTS = [datetime(2026, 2, 20, tzinfo=UTC), datetime(2026, 3, 20, tzinfo=UTC),
          datetime(2026, 10, 15, tzinfo=UTC), datetime(2026, 12, 20, tzinfo=UTC)]


@st.composite
def calendars(draw: st.DrawFn, start: datetime) -> Calendar:
    weekdays = draw(st.sets(st.integers(0, 6), min_size=1, max_size=7))
    base = start.date()
    dates = draw(st.sets(st.integers(-5, 45), max_size=12))
    return Calendar("c", draw(st.integers(1, 9)), frozenset(weekdays),
                    frozenset(base + timedelta(days=d) for d in dates))


@st.composite
def cases(draw: st.DrawFn) -> tuple[Trigger, Calendar, str, datetime, datetime]:
    start = draw(st.sampled_from(STARTS)) + timedelta(hours=draw(st.integers(0, 72)))
    if draw(st.integers(0, 5)) == 0:
        trigger: Trigger = Every(timedelta(hours=draw(st.sampled_from([5, 7, 24]))))
    else:
        trigger = Cron(draw(st.sampled_from(EXPRS)), tz=draw(st.sampled_from(ZONES)),
                       dst_gap=draw(st.sampled_from(["shift", "skip"])))
    return (trigger, draw(calendars(start)), draw(st.sampled_from(["skip", "next", "previous"])),
            start, start + timedelta(days=draw(st.integers(3, 30))))


def _oracle(trigger: Trigger, cal: Calendar, policy: str, lo: datetime, hi: datetime) -> list[datetime]:
    """Every raw occurrence near the window, each judged on its own: its effective instant."""
    zone = ZoneInfo(trigger.tz) if isinstance(trigger, Cron) else ZoneInfo("UTC")
    gap_skip = isinstance(trigger, Cron) and trigger.dst_gap == "skip"
    margin = timedelta(days=MAX_ROLL_DAYS + 2)
    out: set[datetime] = set()
    for raw in trigger.occurrences(lo - margin, hi + margin):
        local = raw.astimezone(zone)
        d = local.date()
        if d.weekday() in cal.weekdays and d not in cal.excluded:
            out.add(raw)
            continue
        if policy == "skip":
            continue
        step = 1 if policy == "next" else -1
        target = None
        for n in range(1, MAX_ROLL_DAYS + 1):
            c = d + timedelta(days=step * n)
            if c.weekday() in cal.weekdays and c not in cal.excluded:
                target = c
                break
        if target is None:
            continue
        wall = datetime.combine(target, local.time().replace(fold=0))
        inst = wall.replace(tzinfo=zone).astimezone(UTC)
        if inst.astimezone(zone).replace(tzinfo=None) != wall and gap_skip:
            continue  # a wall time in a spring-forward gap, dst_gap="skip"
        out.add(inst)
    return sorted(x for x in out if lo < x <= hi)


@CI
@given(cases())
def test_calendared_instants_are_the_oracles(case: Case) -> None:
    trigger, cal, policy, lo, hi = case
    got = list(Calendared(trigger, cal, policy).occurrences(lo, hi))
    assert got == _oracle(trigger, cal, policy, lo, hi)
    assert got == sorted(set(got))  # never repeats, never goes back


@CI
@given(cases())
def test_previous_before_is_the_one_just_before(case: Case) -> None:
    trigger, cal, policy, lo, hi = case
    c = Calendared(trigger, cal, policy)
    got = list(c.occurrences(lo, hi))
    for a, b in zip(got, got[1:], strict=False):
        assert previous_before(c, b) == a
    # data intervals chain: each run's interval starts where the previous one ended
    ms = [to_ms(x, ceil=True) for x in got]
    starts = interval_starts(c, ms, ms)
    assert starts[1:] == ms[:-1]


@CI
@given(cases())
def test_skipped_are_the_raws_that_fire_nowhere(case: Case) -> None:
    trigger, cal, policy, lo, hi = case
    c = Calendared(trigger, cal, policy)
    dropped = set(c.skipped_between(lo, hi, limit=10_000))
    for raw in trigger.occurrences(lo - timedelta(microseconds=1), hi - timedelta(microseconds=1)):
        assert (raw in dropped) == (c.effective(raw) is None)


def test_excluded_days_across_a_month_end_roll_into_the_next_month() -> None:
    cal = Calendar("m", 1, excluded=frozenset({date(2026, 7, 31)}))  # a Friday
    c = Calendared(Cron("0 9 L * *", tz="Europe/London"), cal, "next")
    got = list(c.occurrences(datetime(2026, 7, 1, tzinfo=UTC), datetime(2026, 8, 10, tzinfo=UTC)))
    assert [x.astimezone(ZoneInfo("Europe/London")).isoformat() for x in got] == [
        "2026-08-03T09:00:00+01:00"]  # Monday, over the weekend and the month end
    prev = Calendared(Cron("0 9 1 * *", tz="Europe/London"), Calendar("m", 1), "previous")
    got = list(prev.occurrences(datetime(2026, 7, 20, tzinfo=UTC), datetime(2026, 8, 2, tzinfo=UTC)))
    assert [x.date() for x in got] == [date(2026, 7, 31)]  # Saturday the 1st rolls back to Friday


def test_two_occurrences_rolled_onto_one_instant_are_one() -> None:
    """Saturday's and Sunday's 09:00 roll onto Monday's 09:00, which fires anyway: one."""
    c = Calendared(Cron("0 9 * * *", tz="America/New_York"), Calendar("w", 1), "next")
    got = list(c.occurrences(datetime(2026, 1, 9, 15, tzinfo=UTC), datetime(2026, 1, 12, 15, tzinfo=UTC)))
    assert got == [datetime(2026, 1, 12, 14, tzinfo=UTC)]


def test_a_roll_onto_a_dst_gap_follows_the_gap_policy() -> None:
    """02:30 on Sunday 8 March 2026 rolls (previous policy, Sunday excluded... and Saturday a
    business day) -- the other way: Saturday 7 March excluded, 02:30 rolls to Sunday 8 March,
    a wall time New York skips: shifted to 03:30, or dropped under dst_gap='skip'."""
    cal = Calendar("g", 1, weekdays=frozenset(range(7)), excluded=frozenset({date(2026, 3, 7)}))
    lo, hi = datetime(2026, 3, 6, 12, tzinfo=UTC), datetime(2026, 3, 8, 9, tzinfo=UTC)
    shift = Calendared(Cron("30 2 * * SAT", tz="America/New_York"), cal, "next")
    assert list(shift.occurrences(lo, hi)) == [datetime(2026, 3, 8, 7, 30, tzinfo=UTC)]  # 03:30 EDT
    skip = Calendared(Cron("30 2 * * SAT", tz="America/New_York", dst_gap="skip"), cal, "next")
    assert list(skip.occurrences(lo, hi)) == []
    assert skip.skipped_between(lo, hi) == [datetime(2026, 3, 7, 7, 30, tzinfo=UTC)]


@CI
@given(cases(), st.data())
def test_a_calendar_edited_mid_way_applies_from_the_next_occurrence_without_a_run(
        case: Case, data: st.DataObject) -> None:
    trigger, v1, policy, lo, hi = case
    v2 = data.draw(calendars(lo))
    v2 = Calendar("c", v1.version + 1, v2.weekdays, v2.excluded)
    first = Calendared(trigger, v1, policy)
    # the edit happens at `now`, 30 s past a minute (no trigger here fires then)
    now = lo + timedelta(hours=data.draw(st.integers(1, 24 * 3)), seconds=30)
    ran = list(first.occurrences(lo, now))  # the runs made on v1
    last = to_ms(ran[-1]) if ran else 0
    nxt = first.next_after(now)
    if nxt is None:
        return
    rec = {"calendar": b"c", "on_excluded": policy.encode(), "cal_v": v1.label.encode(),
           "last_ms": str(last).encode()}
    applied = apply(trigger, rec, to_ms(nxt), to_ms(now), {"c": v2})
    expect = Calendared(trigger, v2, policy).next_after(max(ran[-1] if ran else lo, now))
    assert applied.cursor_ms == (None if expect is None else to_ms(expect))
    assert applied.label == "c v" + str(v2.version)
    # the same version again: the cursor is left where it was
    same = apply(trigger, {**rec, "cal_v": v1.label.encode()}, to_ms(nxt), to_ms(now), {"c": v1})
    assert same.cursor_ms == to_ms(nxt)


@CI
@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
def test_previous_before_a_one_time_trigger_is_its_instant_if_earlier(at_s: int, t_s: int) -> None:
    """The fast path for At (no search) answers what the search over windows answers."""
    base = datetime(2026, 6, 1, tzinfo=UTC)
    trigger, t = At(base + timedelta(seconds=at_s)), base + timedelta(seconds=t_s)
    want = trigger.instant if trigger.instant < t else None
    assert previous_before(trigger, t) == want
    # the same trigger behind a calendar that excludes nothing takes the general search
    assert previous_before(Calendared(trigger, Calendar("all", 1, frozenset(range(7))), "skip"),
                           t) == want
