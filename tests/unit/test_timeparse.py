"""The one duration/instant parser: every accepted form, every refused form and its message,
bounds, exact ms conversion; property tests with a fixed seed and a small budget."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from duetime.common.errors import InvalidInput, InvalidSchedule, InvalidTime
from duetime.common.stats import percentile
from duetime.common.time.fmt import format_duration, human_duration, iso, iso_local, relative
from duetime.common.time.parse import (
    LEASE,
    MAX_INSTANT,
    MAX_MS,
    Span,
    duration_ms,
    from_ms,
    parse_duration,
    parse_instant,
    to_ms,
)
from hypothesis import given, settings
from hypothesis import strategies as st

FAST = settings(max_examples=200, derandomize=True, deadline=None)

S, MS, US = timedelta(seconds=1), timedelta(milliseconds=1), timedelta(microseconds=1)


@pytest.mark.parametrize(("value", "expected"), [
    ("500ms", 500 * MS), ("1.5s", 1500 * MS), ("90s", 90 * S), ("1h30m", 90 * 60 * S),
    ("7d", timedelta(days=7)), ("30", 30 * S), ("1.5", 1500 * MS), ("0", timedelta(0)),
    ("1.5h", timedelta(minutes=90)), ("0.25ms", 250 * US), ("2d12h", timedelta(days=2.5)),
    ("1d2h3m4s5ms", timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=5)),
    ("  10m\t", 600 * S), ("007s", 7 * S), ("1.10s", 1100 * MS),
    ("PT1H30M", 90 * 60 * S), ("PT0.5S", 500 * MS), ("P2DT3H", timedelta(days=2, hours=3)),
    ("P1W", timedelta(days=7)), ("PT1,5H", 90 * 60 * S), ("PT36H", 36 * 3600 * S), ("PT", timedelta(0)),
    (90, 90 * S), (1.5, 1500 * MS), (0, timedelta(0)), (timedelta(minutes=3), 180 * S),
])
def test_accepted_forms(value: object, expected: timedelta) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("", "empty duration"),
    ("  ", "empty duration"),
    ("abc", "invalid duration 'abc': expected a number at 'abc'"),
    ("nan", "expected a number at 'nan'"),
    ("inf", "expected a number at 'inf'"),
    ("-5s", "expected a number at '-5s'"),
    ("1e3s", "unknown unit 'e'"),
    ("5x", "unknown unit 'x' (use d, h, m, s, ms"),
    ("5H", "unknown unit 'H'"),
    ("10 s", "missing unit after '10'"),
    ("1.h", "missing unit after '1'"),
    (".5s", "expected a number at '.5s'"),
    ("1m30h", "unit 'h' repeated or out of order (write largest unit first)"),
    ("1s1s", "unit 's' repeated or out of order"),
    ("1s500", "missing unit after '500'"),
    ("\uff15s", "expected a number at '\uff15s'"),
    ("P1M", "years and months have no fixed length; use weeks or days"),
    ("P1Y", "years and months have no fixed length"),
    ("PT-1H", "not an ISO-8601 duration"),
    ("P", "not an ISO-8601 duration"),
    ("P1D/2026-01-01", "not an ISO-8601 duration"),
    ("36501d", "duration '36501d' is too large (at most 36500d)"),
    ("9" * 40, "is too large"),
    (float("nan"), "must be a finite number of seconds, got nan"),
    (float("inf"), "must be a finite number of seconds, got inf"),
    (-1, "must not be negative, got -1s"),
    (-0.001, "must not be negative"),
    (timedelta(seconds=-1), "must not be negative, got -1s"),
    (1e16, "duration 1e+16s is too large (at most 36500d)"),
    (True, "must be a timedelta, a number of seconds or a string like '1h30m', got True"),
    (None, "got None"),
    (b"5s", "got b'5s'"),
])
def test_refused_forms_name_the_bad_part(value: object, message: str) -> None:
    with pytest.raises(InvalidTime) as info:
        parse_duration(value)
    assert message in str(info.value)


def test_bounds_and_what_appear_in_the_message() -> None:
    with pytest.raises(InvalidTime, match=r"^lease '0' is too small \(at least 500ms\)$"):
        LEASE.parse("0", "lease")
    with pytest.raises(InvalidTime, match=r"lease '2d' is too large \(at most 1d\)"):
        LEASE.parse("2d", "lease")
    assert LEASE.parse("500ms") == 500 * MS and LEASE.parse("1d") == timedelta(days=1)
    assert str(LEASE) == "500ms to 1d"
    with pytest.raises(InvalidTime, match="delay 'soon' is not|invalid delay 'soon'"):
        Span().parse("soon", "delay")


def test_invalid_time_is_input_and_schedule_error() -> None:
    assert issubclass(InvalidTime, InvalidInput) and issubclass(InvalidTime, InvalidSchedule)
    assert issubclass(InvalidTime, ValueError)


@pytest.mark.parametrize(("value", "expected"), [
    ("2026-03-08T02:30:00Z", datetime(2026, 3, 8, 2, 30, tzinfo=UTC)),
    ("2026-03-08T02:30:00-05:00", datetime(2026, 3, 8, 7, 30, tzinfo=UTC)),
    ("2026-03-08 02:30+01:00", datetime(2026, 3, 8, 1, 30, tzinfo=UTC)),
    ("20260308T023000Z", datetime(2026, 3, 8, 2, 30, tzinfo=UTC)),
    ("2026-W10-7T02:30Z", datetime(2026, 3, 8, 2, 30, tzinfo=UTC)),
    ("2026-03-08T02:30:00.123456Z", datetime(2026, 3, 8, 2, 30, 0, 123456, tzinfo=UTC)),
    ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=UTC)),
    ("9999-12-31T23:59:59Z", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ("9999-12-31T23:59:59+01:00", datetime(9999, 12, 31, 22, 59, 59, tzinfo=UTC)),
    (datetime(2026, 3, 8, 2, 30, tzinfo=timezone(timedelta(hours=2))),
     datetime(2026, 3, 8, 0, 30, tzinfo=UTC)),
])
def test_accepted_instants_come_back_in_utc(value: object, expected: datetime) -> None:
    got = parse_instant(value)
    assert got == expected and got.tzinfo is UTC


@pytest.mark.parametrize(("value", "message"), [
    ("2026-03-08T02:30:00", "'2026-03-08T02:30:00' has no UTC offset; add one (e.g. +00:00 or Z)"),
    ("2026-03-08", "is not an instant: give a date, a time and a UTC offset"),
    ("02:30Z", "is not an instant"),
    ("tomorrow", "'tomorrow' is not an ISO-8601 instant (e.g. 2026-03-08T02:30:00Z)"),
    ("now", "'now' is not an ISO-8601 instant"),
    ("", "is not an ISO-8601 instant"),
    ("2026-02-30T00:00Z", "is not an ISO-8601 instant"),
    ("P1D", "is not an ISO-8601 instant"),
    ("9999-12-31T23:59:59-14:00",
     "'9999-12-31T23:59:59-14:00' is out of range: instants must lie between "
     "1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z"),
    ("0001-01-01T00:00:00+14:00", "is out of range"),
    ("1969-12-31T23:59:59Z", "is out of range"),
    (datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-2))), "is out of range"),
    (datetime(2026, 1, 1), "is naive; give it a UTC offset"),
    (1700000000, "must be an aware datetime or an ISO-8601 string, got 1700000000"),
])
def test_refused_instants(value: object, message: str) -> None:
    with pytest.raises(InvalidTime) as info:
        parse_instant(value, what="instant")
    assert message in str(info.value)


def test_ms_conversions_are_exact_far_from_1970() -> None:
    top = MAX_INSTANT
    assert to_ms(top) == MAX_MS == 253402300799999 and from_ms(MAX_MS) == top
    assert MAX_MS < 2**53  # a Redis score and a Lua number hold every due time exactly
    t = datetime(9999, 12, 31, 23, 59, 59, 998001, tzinfo=UTC)
    assert to_ms(t) == MAX_MS - 1 and to_ms(t, ceil=True) == MAX_MS
    # fromtimestamp(n / 1000) is microseconds off this far out; the exact converter is not
    assert from_ms(MAX_MS - 1) == datetime(9999, 12, 31, 23, 59, 59, 998000, tzinfo=UTC)
    with pytest.raises(InvalidTime, match="outside the datetime range"):
        from_ms(10**15)
    assert duration_ms(timedelta(microseconds=1499)) == 1 and duration_ms(timedelta(microseconds=1500)) == 2


@given(st.integers(0, MAX_MS))
@FAST
def test_ms_round_trip(ms: int) -> None:
    assert to_ms(from_ms(ms)) == ms == to_ms(from_ms(ms), ceil=True)


_UNITS = [("d", 86400 * S), ("h", 3600 * S), ("m", 60 * S), ("s", S), ("ms", MS)]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9999), st.integers(0, 999)),
                min_size=1, max_size=5, unique_by=lambda t: t[0]))
@FAST
def test_unit_strings_sum_their_parts(parts: list[tuple[int, int, int]]) -> None:
    parts = sorted((i % 5, n, frac) for i, n, frac in parts)
    if len({i for i, _, _ in parts}) != len(parts):
        return
    text, total = "", timedelta(0)
    for i, n, frac in parts:
        unit, size = _UNITS[i]
        text += f"{n}.{frac:03d}{unit}"
        total += size * n + size * frac / 1000
    expected = timedelta(microseconds=round(total / US))
    if expected > timedelta(days=36500):
        with pytest.raises(InvalidTime, match="too large"):
            parse_duration(text)
    else:
        assert abs(parse_duration(text) - expected) <= US


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=36500)))
@FAST
def test_format_duration_parses_back(d: timedelta) -> None:
    d = d - d % MS  # the text form is exact to the millisecond
    assert parse_duration(format_duration(d)) == d


@given(st.floats(allow_nan=True, allow_infinity=True))
@FAST
def test_numbers_are_seconds_or_refused_cleanly(x: float) -> None:
    try:
        got = parse_duration(x)
    except InvalidTime:
        assert not math.isfinite(x) or x < 0 or x > 36500 * 86400
        return
    assert abs(got.total_seconds() - x) <= 1e-6 * max(1.0, x)


@given(st.text(max_size=20))
@FAST
def test_any_text_parses_or_raises_invalid_time(text: str) -> None:
    try:
        got = parse_duration(text)
    except InvalidTime as exc:
        assert "\n" not in str(exc)
        return
    assert timedelta(0) <= got <= timedelta(days=36500)


@given(st.text(max_size=30))
@FAST
def test_any_text_is_an_instant_or_invalid_time(text: str) -> None:
    try:
        got = parse_instant(text)
    except InvalidTime:
        return
    assert got.tzinfo is UTC and datetime(1970, 1, 1, tzinfo=UTC) <= got <= MAX_INSTANT


def test_formatters() -> None:
    t = datetime(2026, 3, 8, 7, 30, tzinfo=UTC)
    assert iso(t) == "2026-03-08T07:30:00Z" and iso(None) is None
    assert iso(t + 123 * MS) == "2026-03-08T07:30:00.123000Z"
    assert iso(t + 123 * MS, compact=True) == "2026-03-08T07:30:00.123Z"
    assert iso(t, compact=True) == "2026-03-08T07:30:00Z"
    from zoneinfo import ZoneInfo

    assert iso_local(t, ZoneInfo("America/New_York")) == "2026-03-08T03:30:00-04:00"
    assert format_duration(timedelta(minutes=90)) == "1h30m"
    assert format_duration(timedelta(microseconds=1500)) == "1500us"
    assert format_duration(timedelta(0)) == "0s" and format_duration(-S) == "-1s"
    assert human_duration(310) == "5m10s" and human_duration(None) == "-"
    assert relative(t + timedelta(minutes=3, seconds=10), t) == "in 3 minutes"
    assert relative(t - timedelta(hours=2), t) == "2 hours ago"
    assert relative(t - 5 * S, t) == "a few seconds ago"
    assert relative(None, t) == "-"


def test_one_percentile() -> None:
    assert percentile([], 50) is None
    values = list(range(1, 101))
    assert [percentile(values, p) for p in (0, 1, 50, 99, 100)] == [1, 1, 50, 99, 100]
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_task_durations_take_every_form_and_are_bounded() -> None:
    from duetime.common.tasks import TaskSpec

    spec = TaskSpec("t", fn=lambda: None, timeout="5m", backoff=("1.5s", timedelta(minutes=5)))
    assert spec.timeout == 300.0 and spec.backoff == (1.5, 300.0)
    assert TaskSpec("t", fn=lambda: None, timeout=0.3, backoff=(0.1, 0.2)).timeout == 0.3
    for kw, words in (({"timeout": float("nan")}, "timeout must be a finite number"),
                      ({"timeout": float("inf")}, "finite"), ({"timeout": 0}, "must be positive"),
                      ({"timeout": "8d"}, "too large (at most 7d)"),
                      ({"backoff": (1, float("nan"))}, "backoff must be a finite number"),
                      ({"backoff": (5, 1)}, "0 <= base <= max"), ({"backoff": 5}, "(base, max)"),
                      ({"backoff": ("1s", "31d")}, "too large (at most 30d)")):
        with pytest.raises(InvalidInput) as info:
            TaskSpec("t", fn=lambda: None, **kw)
        assert words in str(info.value) and str(info.value).startswith("task 't': ")


def test_one_time_trigger_takes_an_iso_string() -> None:
    from duetime.common.time.spec import At

    assert At("2026-03-08T03:30:00-04:00") == At(datetime(2026, 3, 8, 7, 30, tzinfo=UTC))
    with pytest.raises(InvalidSchedule, match="has no UTC offset"):
        At("2026-03-08T03:30:00")


def test_cached_durations_keep_their_type_and_refusals() -> None:
    """parse_duration caches its answers: the value's type is part of the key (True is never
    taken for 1, nor 1.5 for '1.5'), a refusal is raised every time, and the bounds count."""
    assert parse_duration(1) == parse_duration(1.0) == timedelta(seconds=1)
    for _ in range(2):
        with pytest.raises(InvalidTime):
            parse_duration(True)
        with pytest.raises(InvalidTime):
            parse_duration(1, lo=timedelta(seconds=2))
    assert parse_duration("90s") == timedelta(seconds=90) == parse_duration(timedelta(seconds=90))
