"""Time semantics for duetime triggers: when does a schedule fire?

Everything here is pure (no Redis, no clock reads) so the scheduler can ask the same question
twice and get the same answer.  A trigger is a *set* of UTC instants; ``next_after(t)`` returns
the smallest member strictly greater than ``t``.  Chaining ``next_after`` therefore never repeats
and never goes backwards, whatever the time zone does.

Cron expressions are evaluated on the local wall clock of an IANA zone.  Wall times that do not
exist (spring-forward gap) or occur twice (fall-back fold) are resolved by explicit policies
instead of whatever a library happens to do; see :class:`Cron`.

Who does what for cron: duetime parses every field itself, so each error names its field and
item, ranges never wrap, ``H`` keeps its stable sha256 hashing, and the zone/DST resolution is
its own. croniter computes the days named by the calendar items (``L``, ``nW``, ``d#n``,
``Ld``), month by month on the zone-free calendar. croniter is not used for plain fields or
for zones: croniter 7 reads an equal range ``5-5`` as the whole field and ``5-5/2`` as every
even minute, reads ``22-2`` as a wrapping range, hashes ``H`` with crc32 (other values than
the ones stored schedules already fire at), and, given a zone, fires twice in a fall-back hour
and moves a spring-forward time.
"""

from __future__ import annotations

import calendar
import hashlib
import re
from abc import ABC, abstractmethod
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from duetime.common.errors import InvalidSchedule
from duetime.common.time.fmt import format_duration as _format_duration
from duetime.common.time.fmt import iso
from duetime.common.time.parse import MAX_DURATION, parse_duration, parse_instant

__all__ = [
    "At",
    "Cron",
    "Every",
    "InvalidSchedule",
    "Trigger",
    "parse_duration",
    "trigger_from_dict",
]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST = datetime.min.replace(tzinfo=UTC)
_LAST = datetime.max.replace(tzinfo=UTC)
_MINUTE = timedelta(minutes=1)
_SECOND = timedelta(seconds=1)
_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)
_MIN_PLUS_DAY = datetime.min + _DAY
_MAX_MINUS_DAY = datetime.max - _DAY
# The sparsest valid expression (Feb 29 that is also a given weekday, e.g. "0 0 29 2 */7") recurs
# at most every 40 years, so this bound only stops pathological cases such as a wall time that
# always falls in a DST gap under dst_gap="skip".
_HORIZON_YEARS = 50
_MAX_YEAR = 9999


def _utc(t: datetime, what: str = "t") -> datetime:
    """Normalise an aware datetime to UTC; naive input is ambiguous, so refuse it."""
    if not isinstance(t, datetime):
        raise TypeError(f"{what} must be a datetime, got {type(t).__name__}")
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {t.isoformat()}")
    return t.astimezone(UTC)


def _iso(t: datetime) -> str:
    text = iso(t)
    assert text is not None
    return text


def _parse_instant(value: Any, what: str) -> datetime:
    """A stored instant (written by ``_iso``); any year datetime can hold is valid here."""
    if not isinstance(value, str):
        raise InvalidSchedule(f"{what} must be an ISO-8601 string, got {value!r}")
    return parse_instant(value, what=what, lo=_FIRST, hi=_LAST)


# --------------------------------------------------------------------------------------------
# Trigger interface
# --------------------------------------------------------------------------------------------


class Trigger(ABC):
    """A set of fire instants.  Subclasses only define ``next_after``; the rest derives from it."""

    kind: ClassVar[str]

    @abstractmethod
    def next_after(self, t: datetime) -> datetime | None:
        """Smallest fire instant strictly after ``t`` (aware UTC), or None if there is none."""

    def occurrences(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """Fire instants x with ``start < x <= end``, ascending.

        Half-open on the left so that windows chain like ``next_after``: a scheduler that has
        handled everything up to ``start`` asks for ``(start, end]`` and never double-fires.
        """
        start = _utc(start, "start")
        end = _utc(end, "end")
        return self._occurrences(start, end)

    def _occurrences(self, start: datetime, end: datetime) -> Iterator[datetime]:
        x = self.next_after(start)
        while x is not None and x <= end:
            yield x
            x = self.next_after(x)

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form with a ``kind`` field; inverse of :func:`trigger_from_dict`."""

    @abstractmethod
    def describe(self) -> str:
        """Short human-readable text for logs and the CLI."""

    @abstractmethod
    def _key(self) -> tuple[Any, ...]: ...

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Trigger)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


# --------------------------------------------------------------------------------------------
# Every / At
# --------------------------------------------------------------------------------------------


class Every(Trigger):
    """Fixed instants ``anchor + k*interval`` for every integer k.

    Deliberately timezone-free: "every 15m" keeps a constant period across DST changes, and the
    anchor makes the phase explicit so that restarts do not drift.
    """

    kind = "every"

    def __init__(self, interval: timedelta | float | str, anchor: datetime = _EPOCH) -> None:
        if not isinstance(interval, timedelta):
            # seconds or a duration string ("1h30m", "PT1H30M"), read like every other duration
            interval = parse_duration(interval, what="every interval", lo=_US, hi=MAX_DURATION)
        if interval <= timedelta(0):
            raise InvalidSchedule(f"every interval must be positive, got {interval!r}")
        if not isinstance(anchor, datetime):
            raise InvalidSchedule(f"every anchor must be a datetime, got {anchor!r}")
        if anchor.tzinfo is None or anchor.utcoffset() is None:
            raise InvalidSchedule(f"every anchor {anchor.isoformat()} is naive; give a UTC offset")
        self.interval = interval
        self.anchor = anchor.astimezone(UTC)

    def next_after(self, t: datetime) -> datetime | None:
        t = _utc(t)
        k = (t - self.anchor) // self.interval + 1
        try:
            return self.anchor + k * self.interval
        except OverflowError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "interval_us": self.interval // timedelta(microseconds=1),
            "anchor": _iso(self.anchor),
        }

    def describe(self) -> str:
        text = f"every {_format_duration(self.interval)}"
        if self.anchor != _EPOCH:
            text += f" from {_iso(self.anchor)}"
        return text

    def _key(self) -> tuple[Any, ...]:
        return (self.interval, self.anchor)


class At(Trigger):
    """A single instant: one-shot jobs."""

    kind = "at"

    def __init__(self, instant: datetime | str) -> None:
        if isinstance(instant, str):  # ISO-8601 with a UTC offset, read like every instant
            instant = parse_instant(instant, what="at instant", lo=_FIRST, hi=_LAST)
        if not isinstance(instant, datetime):
            raise InvalidSchedule(f"at instant must be a datetime, got {instant!r}")
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise InvalidSchedule(f"at instant {instant.isoformat()} is naive; give a UTC offset")
        self.instant = instant.astimezone(UTC)

    def next_after(self, t: datetime) -> datetime | None:
        return self.instant if self.instant > _utc(t) else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "instant": _iso(self.instant)}

    def describe(self) -> str:
        return f"once at {_iso(self.instant)}"

    def _key(self) -> tuple[Any, ...]:
        return (self.instant,)


# --------------------------------------------------------------------------------------------
# Cron parsing
# --------------------------------------------------------------------------------------------

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Longest month length per month, counting Feb 29: used to reject expressions that never fire.
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True)
class _Field:
    name: str
    lo: int
    hi: int
    names: dict[str, int] | None
    h_hi: int  # upper bound for a bare H (day-of-week excludes 7, the duplicate Sunday)


_FIELDS = (
    _Field("minute", 0, 59, None, 59),
    _Field("hour", 0, 23, None, 23),
    _Field("day-of-month", 1, 31, None, 31),
    _Field("month", 1, 12, _MONTH_NAMES, 12),
    _Field("day-of-week", 0, 7, _DOW_NAMES, 6),
    _Field("second", 0, 59, None, 59),  # optional 6th field, last as in croniter
)
_W_ITEM = re.compile(r"([0-9]+)W|W([0-9]+)", re.ASCII | re.IGNORECASE)
# H as a part of a calendar item (HW, WH, H#2, 1#H, LH, L-H, H(1-5)W), not the H of THU
_H_IN_CALENDAR_ITEM = re.compile(r"H[(W#/]|H$|^L-?H|#H|^WH", re.ASCII)
_QUARTZ_LAST = re.compile(r"([0-9]+|[A-Za-z]{3})L", re.ASCII | re.IGNORECASE)


def _h_hash(seed: str, field: str) -> int:
    """Stable across processes and Python versions (unlike ``hash()``), so H never moves."""
    digest = hashlib.sha256(f"{seed}\x00{field}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class _Parser:
    def __init__(self, expr: str, seed: str) -> None:
        self.expr = expr
        self.seed = seed

    def fail(self, field: _Field, msg: str) -> InvalidSchedule:
        return InvalidSchedule(f"cron field {field.name!r} {msg} in {self.expr!r}")

    def value(self, f: _Field, tok: str) -> int:
        if re.fullmatch(r"[0-9]+", tok):  # explicit ASCII: str.isdigit()/int() accept '５'
            v = int(tok)
        elif not re.fullmatch(r"[A-Za-z]{3}", tok):  # ASCII only: 'ſun'.upper() == 'SUN'
            raise self.fail(f, f"has invalid value {tok!r}" if tok else "has an empty value")
        elif f.names is not None and tok.upper() in f.names:
            v = f.names[tok.upper()]
        elif tok.upper() in _MONTH_NAMES or tok.upper() in _DOW_NAMES:
            raise self.fail(f, f"does not accept name {tok!r}")
        else:
            raise self.fail(f, f"has invalid value {tok!r}")
        if not f.lo <= v <= f.hi:
            raise self.fail(f, f"value {v} out of range {f.lo}-{f.hi}")
        return v

    def bounds(self, f: _Field, text: str) -> tuple[int, int]:
        lo_txt, dash, hi_txt = text.partition("-")
        lo = self.value(f, lo_txt)
        hi = self.value(f, hi_txt) if dash else lo
        if hi < lo:
            raise self.fail(f, f"range {text!r} is reversed (ranges never wrap)")
        return lo, hi

    def item(self, f: _Field, item: str) -> set[int]:
        base, slash, step_txt = item.partition("/")
        step: int | None = None
        if slash:
            if not re.fullmatch(r"[0-9]+", step_txt):
                raise self.fail(f, f"has invalid step {step_txt!r} in {item!r}")
            step = int(step_txt)
            if step < 1:
                raise self.fail(f, f"step {step} must be >= 1 in {item!r}")
        if base == "*":
            return set(range(f.lo, f.hi + 1, step or 1))
        if base.startswith("H"):
            if base == "H":
                lo, hi = f.lo, f.h_hi
            else:
                m = re.fullmatch(r"H\(([^()]*)\)", base)
                if m is None:
                    raise self.fail(f, f"has invalid hash item {item!r} (use H, H(a-b), H/n)")
                lo, hi = self.bounds(f, m.group(1))
            h = _h_hash(self.seed, f.name)
            width = hi - lo + 1
            if step is None:
                return {lo + h % width}
            return set(range(lo + h % min(step, width), hi + 1, step))
        if step is not None and "-" not in base:
            raise self.fail(f, f"step on a single value {item!r} (use a range 'a-b/s' or '*/s')")
        lo, hi = self.bounds(f, base)
        return set(range(lo, hi + 1, step or 1))

    def special(self, f: _Field, item: str) -> str | None:
        """A calendar item (L, LW, L-n, nW in day-of-month; d#n, Ld in day-of-week) as the
        token ``_special_day`` reads, or None for an ordinary item.

        Each is one item of its field's list, so ``1W,L`` and ``1#2,3`` are unions. ``H`` never
        combines with them inside one item (``HW``, ``H#2``, ``LH``): a hashed day that moves
        to the nearest weekday or to an n-th weekday would hide which day it really is."""
        up = item.upper()
        if any(c in up for c in "LW#") and _H_IN_CALENDAR_ITEM.search(up):
            raise self.fail(f, f"has invalid item {item!r}: H does not combine with L, W or # "
                            "(write H as an item of its own, e.g. H,L)")
        if f.name == "day-of-month":
            if up == "L":
                return "L"
            if up == "LW":
                return "31W"  # the weekday nearest the last day: W never leaves the month
            if up.startswith("L-"):
                if not re.fullmatch(r"[0-9]+", item[2:]):
                    raise self.fail(f, f"has invalid item {item!r} (use L-n, n days before the "
                                    "last day, e.g. L-3)")
                back = int(item[2:])
                if not 1 <= back <= 27:
                    raise self.fail(f, f"days before the last day {back} out of range 1-27 in "
                                    f"{item!r} (so that the day exists in every month)")
                return f"L-{back}"
            m = _W_ITEM.fullmatch(item)
            if m is not None:
                day = int(m.group(1) or m.group(2))
                if not 1 <= day <= 31:
                    raise self.fail(f, f"nearest-weekday day {day} out of range 1-31 in {item!r}")
                return f"{day}W"
            if "#" in item:
                raise self.fail(f, f"has invalid item {item!r} (# belongs to day-of-week, "
                                "e.g. 1#2)")
            if "L" in up or "W" in up:
                raise self.fail(f, f"has invalid item {item!r} (use L, LW, L-n or nW, "
                                "e.g. 15W; W takes a single day, not a range or a step)")
        elif f.name == "day-of-week":
            if "#" in item:
                day_txt, _, nth_txt = item.partition("#")
                if re.fullmatch(r"([0-9]+|[A-Za-z]{3})-([0-9]+|[A-Za-z]{3})", day_txt):
                    raise self.fail(f, f"has invalid nth-weekday item {item!r}: # takes a single "
                                    "day, not a range (list them, e.g. 1#2,2#2)")
                if not re.fullmatch(r"[0-9]+|[A-Za-z]{3}", day_txt) or not re.fullmatch(
                        r"[0-9]", nth_txt):
                    raise self.fail(f, f"has invalid nth-weekday item {item!r} (use <day>#<n>, "
                                    "e.g. 5#3 or FRI#3)")
                day, nth = self.value(f, day_txt) % 7, int(nth_txt)
                if not 1 <= nth <= 5:
                    raise self.fail(f, f"nth-weekday {nth} out of range 1-5 in {item!r}")
                return f"{day}#{nth}"
            if item[:1] in ("L", "l") and len(item) > 1:
                try:
                    return f"L{self.value(f, item[1:]) % 7}"
                except InvalidSchedule:
                    raise self.fail(f, f"has invalid last-weekday item {item!r} (use L<day>, "
                                    "e.g. L5 or LFRI)") from None
            m = _QUARTZ_LAST.fullmatch(item)
            if m is not None:
                raise self.fail(f, f"has unsupported item {item!r} (for the last such weekday "
                                f"of the month write L{m.group(1)}, as croniter does)")
        return None

    def field(self, f: _Field, text: str) -> tuple[frozenset[int], frozenset[str]]:
        """(plain values, calendar items) of one field."""
        values: set[int] = set()
        specials: set[str] = set()
        for item in text.split(","):
            if not item:
                raise self.fail(f, f"has an empty list item in {text!r}")
            token = self.special(f, item)
            if token is not None:
                specials.add(token)
            else:
                values |= self.item(f, item)
        if f.name == "day-of-week" and 7 in values:
            values = (values - {7}) | {0}
        return frozenset(values), frozenset(specials)


class _CronSpec:
    """Parsed cron fields plus a naive (zone-free) wall-clock search."""

    def __init__(self, expr: str, seed: str) -> None:
        if not isinstance(expr, str):
            raise InvalidSchedule(f"cron expression must be a string, got {expr!r}")
        text = expr.strip(" \t\r\n")
        if not text:
            raise InvalidSchedule("empty cron expression")
        parts = re.split(r"[ \t]+", text)  # ASCII separators only, like the digits and names
        if parts[0].startswith("@"):
            if parts[0] not in _MACROS:
                raise InvalidSchedule(f"unknown cron macro {parts[0]!r} in {expr!r}")
            if len(parts) > 1:
                raise InvalidSchedule(
                    f"cron macro {parts[0]!r} takes nothing after it, got "
                    f"{' '.join(parts[1:])!r} in {expr!r}"
                )
            parts = _MACROS[parts[0]].split()
        if len(parts) not in (5, 6):
            raise InvalidSchedule(
                f"cron expression {expr!r} has {len(parts)} fields, expected 5 "
                "(minute hour day-of-month month day-of-week) or 6 (the same, then second)"
            )
        p = _Parser(expr, seed)
        fields = [p.field(f, part) for f, part in zip(_FIELDS, parts, strict=False)]
        sets = [values for values, _ in fields]
        self.minutes = tuple(sorted(sets[0]))
        self.hours = tuple(sorted(sets[1]))
        self.dom = sets[2]
        self.months = tuple(sorted(sets[3]))
        self.dow = sets[4]
        self.seconds = tuple(sorted(sets[5])) if len(sets) == 6 else (0,)
        # L / nW and d#n / Ld items: their days come from croniter, month by month
        self.dom_special = tuple(sorted(fields[2][1]))
        self.dow_special = tuple(sorted(fields[4][1]))
        # Vixie/cronie: a day field written starting with '*' does not restrict on its own;
        # if both are restricted, either may match.
        self.dom_star = parts[2].startswith("*")
        self.dow_star = parts[4].startswith("*")
        self.either_day = not self.dom_star and not self.dow_star
        self.hour_star = parts[1].startswith("*")
        self._days_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        if not self.either_day and not self.dom_special and not any(
            d <= _MAX_DAYS[m - 1] for m in self.months for d in self.dom
        ):
            raise InvalidSchedule(
                f"cron expression {expr!r} can never fire: day-of-month "
                f"{sorted(self.dom)} never occurs in month {list(self.months)}"
            )

    def days(self, year: int, month: int) -> tuple[int, ...]:
        """Matching days of one month (cached: the search asks for the same months repeatedly)."""
        key = (year, month)
        hit = self._days_cache.get(key)
        if hit is not None:
            return hit
        first_dow, ndays = calendar.monthrange(year, month)  # Monday == 0
        first_dow = (first_dow + 1) % 7  # cron: Sunday == 0
        dom, dow = self.dom, self.dow
        if self.dom_special:
            dom = dom | {_special_day(t, "dom", year, month) for t in self.dom_special}
        nth = {_special_day(t, "dow", year, month) for t in self.dow_special}
        out = []
        for d in range(1, ndays + 1):
            dom_ok = d in dom
            dow_ok = (first_dow + d - 1) % 7 in dow or d in nth
            if (dom_ok or dow_ok) if self.either_day else (dom_ok and dow_ok):
                out.append(d)
        if len(self._days_cache) > 4096:
            self._days_cache.clear()
        result = self._days_cache[key] = tuple(out)
        return result

    def next_wall(self, w: datetime, limit_year: int) -> datetime | None:
        """Smallest matching naive wall second >= w (w must be second-aligned)."""
        y, mo, d, h, mi, s = w.year, w.month, w.day, w.hour, w.minute, w.second
        months, hours, minutes, seconds = self.months, self.hours, self.minutes, self.seconds
        while y <= limit_year:
            i = bisect_left(months, mo)
            if i == len(months):
                y, mo, d, h, mi, s = y + 1, months[0], 1, 0, 0, 0
                continue
            if months[i] != mo:
                mo, d, h, mi, s = months[i], 1, 0, 0, 0
            days = self.days(y, mo)
            j = bisect_left(days, d)
            if j == len(days):
                mo, d, h, mi, s = mo + 1, 1, 0, 0, 0
                continue
            if days[j] != d:
                d, h, mi, s = days[j], 0, 0, 0
            k = bisect_left(hours, h)
            if k == len(hours):
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if hours[k] != h:
                h, mi, s = hours[k], 0, 0
            m = bisect_left(minutes, mi)
            if m == len(minutes):
                h, mi, s = h + 1, 0, 0
                continue
            if minutes[m] != mi:
                mi, s = minutes[m], 0
            n = bisect_left(seconds, s)
            if n == len(seconds):
                mi, s = mi + 1, 0
                continue
            return datetime(y, mo, d, h, mi, seconds[n])
        return None


@lru_cache(maxsize=1024)
def _cron_spec(expr: str, seed: str) -> _CronSpec:
    return _CronSpec(expr, seed)


@lru_cache(maxsize=65536)
def _special_day(token: str, field: str, year: int, month: int) -> int:
    """The day of (year, month) named by one calendar item (L, nW, d#n, Ld), or 0 if none
    (a fifth Monday in a month with four).

    ``L-n`` (n days before the last day) is plain arithmetic; for the others croniter
    computes it, on the naive calendar only: the item alone in its field, everything
    else '*', iterated from the first of the month. It never sees a zone, so its DST handling
    (which fires twice in a fall-back hour and moves spring-forward times) never enters; zones
    stay duetime's. The Gregorian calendar, weekdays included, repeats every 400 years, so
    any year maps into 2000-2399, which keeps croniter away from the ends of datetime.
    """
    if token.startswith("L-"):
        return calendar.monthrange(year, month)[1] - int(token[2:])
    from croniter import croniter  # imported here: 75 ms, paid only by expressions with L/W/#

    cycle_year = 2000 + (year - 2000) % 400
    expr = f"0 0 {token} * *" if field == "dom" else f"0 0 * * {token}"
    found = croniter(expr, datetime(cycle_year, month, 1) - _MINUTE).get_next(datetime)
    return found.day if (found.year, found.month) == (cycle_year, month) else 0


# --------------------------------------------------------------------------------------------
# Zone transitions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Transition:
    at: datetime  # naive UTC instant where the offset changes
    before: timedelta
    after: timedelta


@lru_cache(maxsize=8192)
def _year_transitions(key: str, year: int) -> tuple[tuple[datetime, ...], tuple[_Transition, ...]]:
    """Offset changes whose wall time (fold=0 view) falls in (Jan 1 of year, Jan 1 of year+1].

    zoneinfo exposes no transition list, so sample the wall-clock offset hourly and bisect each
    change to the second.  ``utcoffset`` on a naive wall is cheap (~0.1 us); with fold=0 it
    reports the pre-transition offset inside a gap or fold, so the first wall reporting the new
    offset is ``at + max(before, after)``.
    """
    zone = ZoneInfo(key)
    w = datetime(year, 1, 1)
    end = datetime(year + 1, 1, 1) if year < 9999 else datetime(9999, 12, 31, 23)
    step = timedelta(hours=1)
    cur = zone.utcoffset(w)
    found: list[_Transition] = []
    while w < end:
        nxt = min(w + step, end)
        off = zone.utcoffset(nxt)
        if off == cur:
            w = nxt
            continue
        lo, hi = w, nxt
        while hi - lo > _SECOND:
            mid = lo + _SECOND * (((hi - lo) // _SECOND) // 2)
            if zone.utcoffset(mid) == cur:
                lo = mid
            else:
                hi = mid
        new = zone.utcoffset(hi)
        assert cur is not None and new is not None
        found.append(_Transition(hi - max(cur, new), cur, new))
        w, cur = hi, new
    found.sort(key=lambda tr: tr.at)
    return tuple(tr.at for tr in found), tuple(found)


def _year_range(lo: datetime, hi: datetime) -> range:
    """Wall-years that can hold transitions with UTC instants in [lo, hi] (offsets are < 1 day)."""
    first = (lo - _DAY).year if lo > _MIN_PLUS_DAY else 1
    last = (hi + _DAY).year if hi < _MAX_MINUS_DAY else 9999
    return range(first, last + 1)


def _prev_transition(key: str, t: datetime) -> _Transition | None:
    """Latest transition at or before t, if recent enough (2 days) to still affect walls."""
    best: _Transition | None = None
    since = t - 2 * _DAY if t > datetime.min + 2 * _DAY else datetime.min
    for year in _year_range(since, t):
        ats, trs = _year_transitions(key, year)
        i = bisect_right(ats, t)
        if i and ats[i - 1] > since and (best is None or ats[i - 1] > best.at):
            best = trs[i - 1]
    return best


def _next_transition(key: str, after: datetime, upto: datetime) -> _Transition | None:
    """First transition with ``after < at <= upto``."""
    best: _Transition | None = None
    for year in _year_range(after, upto):
        if best is not None and datetime(year, 1, 1) - _DAY > best.at:
            break  # this and later wall-years only hold later transitions
        ats, trs = _year_transitions(key, year)
        i = bisect_right(ats, after)
        if i < len(ats) and ats[i] <= upto and (best is None or ats[i] < best.at):
            best = trs[i]
    return best


def _naive(t: datetime, tz: tzinfo | None = None) -> datetime:
    """Same fields with tzinfo swapped; cheaper than ``replace(tzinfo=...)`` on the hot path."""
    return datetime(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tz)


def _floor_second(t: datetime) -> datetime:
    # The constructor is ~3x faster than datetime.replace(); this sits on the hot path.
    return datetime(t.year, t.month, t.day, t.hour, t.minute, t.second)


def _wall_after(t: datetime, offset: timedelta) -> datetime:
    """Smallest whole wall second strictly after instant t read with offset (clamped at year 1)."""
    try:
        return _floor_second(t + offset) + _SECOND
    except OverflowError:
        if offset < timedelta(0) and t < datetime(1, 1, 2):
            return datetime.min
        raise


def _ceil_second(t: datetime) -> datetime:
    f = _floor_second(t)
    return f if f == t else f + _SECOND


# --------------------------------------------------------------------------------------------
# Cron trigger
# --------------------------------------------------------------------------------------------

_GAP_POLICIES = ("shift", "skip")
_FOLD_POLICIES = ("auto", "first", "both")


class Cron(Trigger):
    """Cron evaluated on the wall clock of an IANA zone.

    Fields: ``minute hour day-of-month month day-of-week [second]``. The optional seconds field
    comes last, as in croniter (whose users this syntax serves): the first five fields then
    mean the same with or without it, where the seconds-first form (Quartz, Spring) would read
    ``0 */5 * * * *`` differently. A five-field expression fires at second 0.

    Besides numbers, names, ``*``, ranges, steps, lists and ``H`` (see ``seed``), the day
    fields take calendar items: ``L`` (last day of the month); ``LW`` (its last weekday);
    ``L-n`` (n days before the last day, n 1-27); ``nW`` or ``Wn``
    (the weekday, Monday to Friday, nearest day n, never leaving the month: Saturday the 1st
    gives Monday the 3rd, Sunday the 31st gives Friday the 29th; an n past the month's end
    counts as its last day, so ``31W`` is ``LW``); ``d#n`` (the n-th
    weekday d, n 1-5: ``5#3`` or ``FRI#3``, absent in months without one); ``Ld`` (the last
    weekday d: ``L5``, ``LFRI``). They mix with plain items and H in lists (``1,15,L``, ``H,L``,
    ``1#2,3``: a list is a union), never with H inside one item, and the two
    day fields combine by cron's rule: when both are restricted (neither starts with ``*``)
    either may match, otherwise both must.

    ``dst_gap`` decides what happens to a matching wall time that does not exist:
    ``"shift"`` reads it with the offset in force before the change (02:30 -> 03:30 in New York),
    ``"skip"`` drops it.  ``dst_fold`` decides a wall time that occurs twice: ``"first"`` fires at
    the earlier instant, ``"both"`` at both, ``"auto"`` is ``"both"`` when the hour field starts
    with ``*`` (an hourly job should keep running hourly) and ``"first"`` otherwise (a daily job
    should run once a day).  ``seed`` (the schedule name) feeds ``H`` so that many schedules
    written ``H * * * *`` spread over the hour instead of stampeding at :00.
    """

    kind = "cron"

    def __init__(
        self,
        expr: str,
        tz: str = "UTC",
        dst_gap: str = "shift",
        dst_fold: str = "auto",
        seed: str = "",
    ) -> None:
        if not isinstance(seed, str):
            raise InvalidSchedule(f"cron seed must be a string, got {seed!r}")
        if dst_gap not in _GAP_POLICIES:
            raise InvalidSchedule(f"dst_gap must be 'shift' or 'skip', got {dst_gap!r}")
        if dst_fold not in _FOLD_POLICIES:
            raise InvalidSchedule(f"dst_fold must be 'auto', 'first' or 'both', got {dst_fold!r}")
        if not isinstance(tz, str):
            raise InvalidSchedule(f"time zone must be a string, got {tz!r}")
        try:
            self._zone = ZoneInfo(tz)
        except (KeyError, ValueError, OSError, TypeError):
            raise InvalidSchedule(f"unknown time zone {tz!r}") from None
        self._spec = _cron_spec(expr, seed)
        self.expr = expr
        self.tz = tz
        self.dst_gap = dst_gap
        self.dst_fold = dst_fold
        self.seed = seed
        self._shift = dst_gap == "shift"
        fold = dst_fold if dst_fold != "auto" else ("both" if self._spec.hour_star else "first")
        self._fold_first = fold == "first"

    def next_after(self, t: datetime) -> datetime | None:
        """Walk constant-offset stretches of UTC time; within one, cron is a naive wall search.

        In a stretch starting at transition ``a`` (offset ``p`` -> ``o``) the fire instants are
        (1) instants x with x+o a matching wall, minus the repeated walls [a+o, a+p) of a fold
        under the "first" policy, and (2) under "shift", for a gap, x = w-p for each matching
        nonexistent wall w in [a+p, a+o).
        """
        aware = _utc(t)
        t = _naive(aware)
        key, spec = self.tz, self._spec
        try:
            limit_year = min(t.year + _HORIZON_YEARS, _MAX_YEAR)
            horizon = datetime(limit_year, 12, 31)
            try:
                o = aware.astimezone(self._zone).utcoffset()
            except OverflowError:  # local time before year 1 / after 9999: no transitions there
                o = self._zone.utcoffset(t)
            assert o is not None
            prev = _prev_transition(key, t)
            a = prev.at if prev else None
            p = prev.before if prev else o
            while True:
                seg_start = t if a is None or a < t else a
                cand: datetime | None = None
                nxt: _Transition | None
                wall_lo = _wall_after(t, o)
                if a is not None:
                    first = a + (p if (p > o and self._fold_first) else o)
                    wall_lo = max(wall_lo, _ceil_second(first))
                w = spec.next_wall(wall_lo, limit_year)
                if w is not None:
                    x = w - o
                    nxt = _next_transition(key, seg_start, x)
                    if nxt is None:
                        cand = x
                else:
                    nxt = _next_transition(key, seg_start, horizon)
                if a is not None and o > p and self._shift:
                    gap_lo = max(_wall_after(t, p), _ceil_second(a + p))
                    w2 = spec.next_wall(gap_lo, limit_year)
                    if w2 is not None and w2 < a + o and (cand is None or w2 - p < cand):
                        cand = w2 - p
                if cand is not None:
                    return _naive(cand, UTC)
                if nxt is None:
                    return None
                a, p, o = nxt.at, nxt.before, nxt.after
        except OverflowError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "expr": self.expr,
            "tz": self.tz,
            "dst_gap": self.dst_gap,
            "dst_fold": self.dst_fold,
            "seed": self.seed,
        }

    def instants_key(self) -> tuple[Any, ...]:
        """Equal for crons that fire at the same instants: the zone, the DST policies and the
        matching values after parsing, so `H * * * *` with two seeds that hash to the same
        minute compare equal, and `0 * * * *` equals `0 */1 * * *`."""
        sp = self._spec
        return (self.tz, self.dst_gap, self._fold_first, sp.seconds, sp.minutes, sp.hours,
                tuple(sorted(sp.dom)), sp.months, tuple(sorted(sp.dow)), sp.dom_special,
                sp.dow_special, sp.dom_star, sp.dow_star)

    def describe(self) -> str:
        text = f"cron {self.expr!r} in {self.tz}"
        extras = []
        if self.dst_gap != "shift":
            extras.append(f"dst_gap={self.dst_gap}")
        if self.dst_fold != "auto":
            extras.append(f"dst_fold={self.dst_fold}")
        return f"{text} ({', '.join(extras)})" if extras else text

    def _key(self) -> tuple[Any, ...]:
        return (self.expr, self.tz, self.dst_gap, self.dst_fold, self.seed)


# --------------------------------------------------------------------------------------------
# Serialisation
# --------------------------------------------------------------------------------------------

_DICT_KEYS = {
    "cron": ({"kind", "expr"}, {"tz", "dst_gap", "dst_fold", "seed"}),
    "every": ({"kind", "interval_us"}, {"anchor"}),
    "at": ({"kind", "instant"}, set()),
}


def trigger_from_dict(d: dict[str, Any]) -> Trigger:
    """Rebuild a trigger stored by ``to_dict``; unknown or missing keys are errors, not guesses."""
    if not isinstance(d, dict):
        raise InvalidSchedule(f"trigger must be a dict, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in _DICT_KEYS:
        raise InvalidSchedule(f"unknown trigger kind {kind!r} (expected 'cron', 'every' or 'at')")
    required, optional = _DICT_KEYS[kind]
    missing = sorted(required - d.keys())
    if missing:
        raise InvalidSchedule(f"{kind} trigger is missing {', '.join(map(repr, missing))}")
    unknown = sorted(d.keys() - required - optional, key=str)
    if unknown:
        raise InvalidSchedule(f"{kind} trigger has unknown key(s) {', '.join(map(repr, unknown))}")
    if kind == "cron":
        for name in ("expr", "tz", "dst_gap", "dst_fold", "seed"):
            if name in d and not isinstance(d[name], str):
                raise InvalidSchedule(f"cron trigger field {name!r} must be a string")
        return Cron(
            d["expr"],
            tz=d.get("tz", "UTC"),
            dst_gap=d.get("dst_gap", "shift"),
            dst_fold=d.get("dst_fold", "auto"),
            seed=d.get("seed", ""),
        )
    if kind == "every":
        us = d["interval_us"]
        if not isinstance(us, int) or isinstance(us, bool):
            raise InvalidSchedule(f"every trigger 'interval_us' must be an integer, got {us!r}")
        try:
            interval = timedelta(microseconds=us)
        except OverflowError:
            raise InvalidSchedule(f"every trigger 'interval_us' {us} is too large") from None
        anchor = _parse_instant(d["anchor"], "every anchor") if "anchor" in d else _EPOCH
        return Every(interval, anchor)
    return At(_parse_instant(d["instant"], "at instant"))
