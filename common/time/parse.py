"""Every duration and instant that enters duetime is read and bounded here.

One parser serves the CLI options, the API arguments (``delay=``, ``lateness=``, ``jitter=``,
``Every(...)``) and stored fields, so ``--delay 1h30m``, ``delay="1h30m"``, ``Every("1h30m")``
and ``--every 1h30m`` mean the same thing and fail with the same message.

Durations: a ``timedelta``; a number of seconds (int or float, finite); or a string —
plain seconds (``30``, ``1.5``), units largest first, each at most once (``500ms``, ``1.5s``,
``90s``, ``1h30m``, ``7d``), or ISO-8601 (``PT1H30M``, ``P2DT3H``, ``P1W``; years and months are
refused, having no fixed length). Instants: an aware ``datetime`` or an ISO-8601 string with a
UTC offset (``2026-03-08T02:30:00Z``, ``2026-03-08 02:30+01:00``, ``20260308T023000Z``).

Every value is checked against bounds: NaN and infinities are refused, every duration has a
[lo, hi] :class:`Span`, and instants lie in 1970-01-01 .. 9999-12-31 UTC, so any due time fits
Redis scores and Lua numbers exactly (< 2**53 ms) and converts back to a ``datetime``.
Conversions to and from epoch milliseconds are exact integer arithmetic (no float rounding).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from fractions import Fraction
from typing import Any

from duetime.common.errors import InvalidTime
from duetime.common.time.fmt import format_duration, iso

__all__ = [
    "EPOCH", "MAX_INSTANT", "MAX_MS", "MIN_INSTANT", "InvalidTime", "Span", "duration_ms",
    "due_text", "from_ms", "parse_duration", "parse_instant", "to_ms", "to_us",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_INSTANT = EPOCH
MAX_INSTANT = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
_US = timedelta(microseconds=1)
_MS = timedelta(milliseconds=1)
ZERO = timedelta(0)
MAX_DURATION = timedelta(days=36500)  # a hundred years: far beyond any sane delay or period

_UNIT_US = {"d": 86_400_000_000, "h": 3_600_000_000, "m": 60_000_000, "s": 1_000_000, "ms": 1_000}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"  # ASCII only: int() would also take '５' and '٥'
_PLAIN = re.compile(_NUMBER, re.ASCII)
_PART = re.compile(rf"({_NUMBER})([A-Za-z]*)", re.ASCII)


# -- milliseconds ------------------------------------------------------------------------
def to_ms(dt: datetime, *, ceil: bool = False) -> int:
    """Epoch ms of an aware datetime, exactly; ``ceil`` for due times and occurrences, so a
    run is never due before its instant and distinct instants >= 1 ms apart never share one."""
    if not isinstance(dt, datetime):
        raise TypeError(f"expected a datetime, got {type(dt).__name__}")
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"naive datetime {dt!r}: give an aware datetime (e.g. tzinfo=UTC)")
    ms, rest = divmod((dt - EPOCH) // _US, 1000)
    return ms + 1 if ceil and rest else ms


def from_ms(ms: float) -> datetime:
    """The UTC datetime of epoch ms, exactly (``datetime.fromtimestamp`` goes through a float
    and is off by microseconds far from 1970); a due time kept to the microsecond (a float,
    see `due_text`) to the nearest microsecond, which is the instant it was made from."""
    try:
        if isinstance(ms, float) and not ms.is_integer():  # exact at any magnitude
            return EPOCH + timedelta(microseconds=round(Fraction(ms) * 1000))
        return EPOCH + timedelta(milliseconds=ms)
    except (OverflowError, ValueError):
        raise InvalidTime(f"{ms} ms is outside the datetime range") from None


def due_text(dt: datetime) -> str:
    """A run's due time as a client sends it to Redis: epoch ms, a whole ms as an integer, else
    kept to the microsecond (``1765000000123.457``; enqueue.lua stores it so from namespace
    format 4, and rounds it up where the namespace is older).

    The text is the shortest one of the double nearest the instant, or of the next double up
    when the nearest lies below it: Redis reads a sorted-set score as a double, and a run must
    never become due before its instant, not even by a fraction of a microsecond. Until 2109
    (epoch ms below 2**42) a double names every microsecond, so the text reads back as the
    instant itself; past it, as the next double up (at most 31 µs later, in the year 9999).
    """
    ms, rest = divmod(to_us(dt), 1000)
    if not rest:
        return str(ms)
    us = ms * 1000 + rest
    d = us / 1000  # correctly rounded (int / int)
    num, den = d.as_integer_ratio()
    if num * 1000 < us * den:  # the nearest double is below the instant: the next one up
        d = math.nextafter(d, math.inf)
    return repr(d)


def to_us(dt: datetime) -> int:
    """Epoch microseconds of an aware datetime, exactly."""
    to_ms(dt)  # the same checks
    return (dt - EPOCH) // _US


MAX_MS = to_ms(MAX_INSTANT)


def duration_ms(d: timedelta) -> int:
    """Whole milliseconds of a duration, rounded to the nearest (half up)."""
    return (d // _US + 500) // 1000


# -- durations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """Inclusive bounds of one kind of duration; ``str()`` is the range as help text shows it."""

    lo: timedelta = ZERO
    hi: timedelta = MAX_DURATION

    def parse(self, value: Any, what: str = "duration") -> timedelta:
        return parse_duration(value, what=what, lo=self.lo, hi=self.hi)

    def __str__(self) -> str:
        return f"{format_duration(self.lo)} to {format_duration(self.hi)}"


def parse_duration(value: Any, *, what: str = "duration", lo: timedelta = ZERO,
                   hi: timedelta = MAX_DURATION) -> timedelta:
    """A duration from any accepted form (see the module docstring), within [lo, hi].

    Raises :class:`InvalidTime` naming the bad part: ``invalid duration '5x': unknown unit
    'x'``, ``duration '0' is too small (at least 500ms)``. Sub-microsecond digits round.

    Answers are cached by (value and its exact type, what, lo, hi): a producer enqueueing
    with `debounce=0.5, max_wait=2` parses the same two values for every event, and the
    exact Fraction arithmetic was a third of such a producer's CPU (bench/RESULTS.md). The
    type is part of the key, so `True` is never taken for `1`; a refusal is not cached."""
    if type(value) in _CACHEABLE:
        try:
            return _parse_cached(value, type(value).__name__, what, lo, hi)
        except TypeError:  # unhashable after all: parse it as it comes
            pass
    return _parse_duration(value, what=what, lo=lo, hi=hi)


_CACHEABLE = frozenset({int, float, str, timedelta})


@functools.lru_cache(maxsize=512)
def _parse_cached(value: Any, _type: str, what: str, lo: timedelta, hi: timedelta) -> timedelta:
    return _parse_duration(value, what=what, lo=lo, hi=hi)


def _parse_duration(value: Any, *, what: str, lo: timedelta, hi: timedelta) -> timedelta:
    if isinstance(value, timedelta):
        us, shown = Fraction(value // _US), format_duration(value)
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidTime(f"{what} must be a timedelta, a number of seconds or a string like "
                          f"'1h30m', got {value!r}")
    elif isinstance(value, str):
        us, shown = _text_us(value, what), repr(value)
    else:
        if not math.isfinite(value):
            raise InvalidTime(f"{what} must be a finite number of seconds, got {value!r}")
        us, shown = Fraction(value) * 1_000_000, f"{value!r}s"
    if us < 0 and lo >= ZERO:
        raise InvalidTime(f"{what} must not be negative, got {shown}")
    if us < lo // _US:
        raise InvalidTime(f"{what} {shown} is too small (at least {format_duration(lo)})")
    if us > hi // _US:
        raise InvalidTime(f"{what} {shown} is too large (at most {format_duration(hi)})")
    return timedelta(microseconds=math.floor(us + Fraction(1, 2)))


def _text_us(text: str, what: str) -> Fraction:
    s = text.strip()
    if not s:
        raise InvalidTime(f"empty {what}")
    if s.startswith("P"):
        return _iso_duration_us(s, text, what)
    if _PLAIN.fullmatch(s):
        return Fraction(s) * 1_000_000
    total, last, pos = Fraction(0), None, 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise InvalidTime(f"invalid {what} {text!r}: expected a number at {s[pos:]!r}")
        number, unit = m.groups()
        size = _UNIT_US.get(unit)
        if size is None:
            problem = f"unknown unit {unit!r}" if unit else f"missing unit after {number!r}"
            raise InvalidTime(f"invalid {what} {text!r}: {problem} "
                              "(use d, h, m, s, ms, e.g. 1h30m, or ISO-8601 like PT1H30M)")
        if last is not None and size >= last:
            raise InvalidTime(f"invalid {what} {text!r}: unit {unit!r} repeated or out of order "
                              "(write largest unit first)")
        last = size
        total += Fraction(number) * size
        pos = m.end()
    return total


def _iso_duration_us(s: str, text: str, what: str) -> Fraction:
    import pendulum  # imported here: 30 ms, paid only when an ISO string is given

    try:
        d = pendulum.parse(s, exact=True)
    except Exception:  # ParserError, ValueError, and TypeError on some intervals: all bad input
        d = None
    if not isinstance(d, pendulum.Duration):
        raise InvalidTime(f"invalid {what} {text!r}: not an ISO-8601 duration (e.g. PT1H30M, P2D)")
    if d.years or d.months:
        raise InvalidTime(f"invalid {what} {text!r}: years and months have no fixed length; "
                          "use weeks or days (e.g. P30D)")
    return Fraction(timedelta(days=d.days, seconds=d.seconds, microseconds=d.microseconds) // _US)


# The bounds of every duration duetime takes (help texts print them from here). Chosen so
# that no value can make a process spin (a lease or tick of 0 sent ~17k-64k commands/s) or
# wait forever, and every due time stays a sane instant.
_S = timedelta(seconds=1)
DELAY = Span(ZERO, MAX_DURATION)                              # enqueue --delay / delay=
LEASE = Span(timedelta(milliseconds=500), timedelta(days=1))  # worker --lease (heartbeat: 1/3)
GRACE = Span(ZERO, timedelta(days=1))                         # worker --grace
CLAIM_AHEAD = Span(ZERO, _S)                                  # worker --claim-ahead
UNKNOWN_GRACE = Span(_S, timedelta(days=30))                  # worker --unknown-task-grace
KILL_GRACE = Span(ZERO, timedelta(hours=1))                   # worker --kill-grace
TICK = Span(timedelta(milliseconds=10), timedelta(minutes=10))  # scheduler/reaper ticks
GAUGES_EVERY = Span(timedelta(milliseconds=100), timedelta(hours=1))
LEAD = Span(ZERO, timedelta(hours=1))                         # scheduler --lead
RETENTION = Span(_S, timedelta(days=3650))                    # finished runs kept
WAIT = Span(ZERO, timedelta(days=7))                          # --timeout of waiting commands
REFRESH = Span(timedelta(milliseconds=100), timedelta(hours=1))  # top --interval
WINDOW = Span(_S, timedelta(days=1))                          # top --window


# -- instants ----------------------------------------------------------------------------
def parse_instant(value: Any, *, what: str = "instant", lo: datetime = MIN_INSTANT,
                  hi: datetime = MAX_INSTANT) -> datetime:
    """An instant (aware datetime or ISO-8601 string with a UTC offset) as an aware UTC
    datetime within [lo, hi]; a naive one is ambiguous and refused."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidTime(f"{what} {value.isoformat()} is naive; give it a UTC offset "
                              "(e.g. tzinfo=UTC)")
        dt, shown = value, value.isoformat()
    elif isinstance(value, str):
        dt, shown = _iso_instant(value, what), repr(value)
    else:
        raise InvalidTime(f"{what} must be an aware datetime or an ISO-8601 string, got {value!r}")
    try:
        utc = dt.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not lo <= utc <= hi:
        raise InvalidTime(f"{what} {shown} is out of range: instants must lie between "
                          f"{iso(lo, compact=True)} and {iso(hi, compact=True)}")
    return utc


def _iso_instant(text: str, what: str) -> datetime:
    # the low-level parser: pendulum.parse would read a string without offset as UTC
    from pendulum.parsing import parse as parse_iso

    s = text.strip()
    example = "e.g. 2026-03-08T02:30:00Z"
    parsed: Any = None
    if s:
        try:
            parsed = parse_iso(s, exact=True)
        except Exception:  # ParserError, ValueError, OverflowError...: all bad input
            parsed = None
    if isinstance(parsed, datetime):
        offset = parsed.utcoffset()
        if offset is None:
            raise InvalidTime(f"{what} {text!r} has no UTC offset; add one (e.g. +00:00 or Z)")
        return datetime(parsed.year, parsed.month, parsed.day, parsed.hour, parsed.minute,
                         parsed.second, parsed.microsecond, tzinfo=timezone(offset))
    if isinstance(parsed, date | time):
        raise InvalidTime(f"{what} {text!r} is not an instant: give a date, a time and a UTC "
                          f"offset ({example})")
    raise InvalidTime(f"{what} {text!r} is not an ISO-8601 instant ({example})")
