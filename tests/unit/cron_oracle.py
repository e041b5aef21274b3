"""Brute-force reference for cron-in-a-time-zone semantics.

Deliberately shares no code with ``common/time/spec.py`` (nor croniter): it walks every UTC minute,
converts it to the local wall clock with zoneinfo and applies its own tiny matcher (no ``H``
support) and its own reading of the DST rules.  Slow but obviously correct, which is the point.

Beyond plain fields it reads the optional sixth (second) field and the calendar items, each
by brute force over the days of the month: ``L`` (last day), ``LW`` (its last
Monday-Friday), ``L-n`` (n days before the last day), ``nW``/``Wn`` (the weekday,
Monday-Friday, of the month nearest day n, n clamped to the month's last day), ``d#n`` (n-th
weekday d) and ``Ld`` (last weekday d); the day fields still combine by the Vixie rule.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

ONE_MINUTE = timedelta(minutes=1)

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]

SHORTCUTS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _number(token: str, names: list[str], offset: int) -> int:
    up = token.upper()
    if up in names:
        return names.index(up) + offset
    return int(token)


def _expand(text: str, low: int, high: int, names: list[str], offset: int) -> set[int]:
    result: set[int] = set()
    for piece in text.split(","):
        step = 1
        if "/" in piece:
            piece, step_text = piece.split("/")
            step = int(step_text)
        if piece == "*":
            first, last = low, high
        elif "-" in piece:
            a, b = piece.split("-")
            first, last = _number(a, names, offset), _number(b, names, offset)
        else:
            first = last = _number(piece, names, offset)
        value = first
        while value <= last:
            result.add(value)
            value += step
    return result


def _month_days(year: int, month: int) -> list[datetime]:
    return [datetime(year, month, d) for d in range(1, calendar.monthrange(year, month)[1] + 1)]


def _weekday(day: datetime) -> int:
    return day.isoweekday() % 7  # cron: Sunday == 0


@cache
def _special_dom(item: str, year: int, month: int) -> int | None:
    days = _month_days(year, month)
    if item.upper() == "L":
        return days[-1].day
    if item.upper().startswith("L-"):  # n days before the last day
        return days[-1].day - int(item[2:])
    weekdays = [d.day for d in days if 1 <= _weekday(d) <= 5]
    if item.upper() == "LW":  # the last Monday-Friday of the month
        return weekdays[-1]
    n = int(item.upper().strip("W"))
    target = min(n, days[-1].day)
    return min(weekdays, key=lambda d: (abs(d - target), d))


@cache
def _special_dow(item: str, year: int, month: int) -> int | None:
    up = item.upper()
    if "#" in up:
        name, nth = up.split("#")
        wanted = _number(name, DAYS, 0) % 7
        matching = [d.day for d in _month_days(year, month) if _weekday(d) == wanted]
        return matching[int(nth) - 1] if len(matching) >= int(nth) else None
    wanted = _number(up[1:], DAYS, 0) % 7  # 'L<day>'
    return [d.day for d in _month_days(year, month) if _weekday(d) == wanted][-1]


def _is_special(field: str, item: str) -> bool:
    if field == "dom":
        return re.fullmatch(r"L|LW|L-[0-9]+|[0-9]+W|W[0-9]+", item.upper()) is not None
    return "#" in item or (item[:1].upper() == "L" and len(item) > 1)


def _split(text: str, field: str) -> tuple[str, list[str]]:
    """(plain items joined, calendar items) of one day field; plain part '' if none."""
    items = text.split(",")
    special = [i for i in items if _is_special(field, i)]
    plain = [i for i in items if not _is_special(field, i)]
    return ",".join(plain), special


class OracleCron:
    """5-field cron, or 6 with seconds last (no H), matched against naive local wall times."""

    def __init__(self, expression: str) -> None:
        expression = SHORTCUTS.get(expression.strip(), expression)
        fields = expression.split()
        assert len(fields) in (5, 6), expression
        self.minutes = _expand(fields[0], 0, 59, [], 0)
        self.hours = _expand(fields[1], 0, 23, [], 0)
        dom_plain, self.dom_special = _split(fields[2], "dom")
        dow_plain, self.dow_special = _split(fields[4], "dow")
        self.doms = _expand(dom_plain, 1, 31, [], 0) if dom_plain else set()
        self.months = _expand(fields[3], 1, 12, MONTHS, 1)
        self.dows = {d % 7 for d in _expand(dow_plain, 0, 7, DAYS, 0)} if dow_plain else set()
        self.seconds = sorted(_expand(fields[5], 0, 59, [], 0)) if len(fields) == 6 else [0]
        self.dom_wild = fields[2][0] == "*"
        self.dow_wild = fields[4][0] == "*"
        self.hour_wild = fields[1][0] == "*"

    def day_ok(self, wall: datetime) -> bool:
        y, m = wall.year, wall.month
        in_dom = wall.day in self.doms or any(
            _special_dom(i, y, m) == wall.day for i in self.dom_special)
        in_dow = (wall.isoweekday() % 7) in self.dows or any(
            _special_dow(i, y, m) == wall.day for i in self.dow_special)
        if self.dom_wild or self.dow_wild:
            return in_dom and in_dow
        return in_dom or in_dow

    def matches(self, wall: datetime) -> bool:
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_ok(wall)
        )

    def can_ever_fire(self) -> bool:
        """Independent existence check over a whole 400-year Gregorian cycle of dates."""
        day = datetime(2000, 1, 1)
        while day.year < 2400:
            if day.month in self.months and self.day_ok(day):
                return True
            day += timedelta(days=1)
        return False


def fire_sets(
    cron: OracleCron, zone_name: str, lo: datetime, hi: datetime
) -> dict[tuple[str, str], list[datetime]]:
    """Fire instants x with lo < x <= hi for every (gap, fold) policy pair.

    Walks UTC minutes from six hours before ``lo`` (so the first sighting of a repeated wall time
    is seen; folds in the tested zones are at most an hour) up to ``hi``.  A wall time already
    seen is a fold repeat; a jump of the wall clock by more than a minute skips wall times, which
    under 'shift' fire at wall - (offset before jump).
    """
    zone = ZoneInfo(zone_name)
    u = (lo - timedelta(hours=6)).astimezone(UTC).replace(second=0, microsecond=0)
    end = hi.astimezone(UTC)
    seen: set[datetime] = set()
    first_seen: list[datetime] = []
    repeats: list[datetime] = []
    shifted: list[datetime] = []
    last_wall: datetime | None = None
    last_offset: timedelta | None = None
    while u <= end:
        local = u.astimezone(zone)
        wall = local.replace(tzinfo=None)
        if last_wall is not None and wall - last_wall > ONE_MINUTE:
            assert last_offset is not None
            missing = last_wall + ONE_MINUTE
            while missing < wall:
                if cron.matches(missing):
                    shifted += [(missing - last_offset).replace(tzinfo=UTC) + timedelta(seconds=s)
                                for s in cron.seconds]
                missing += ONE_MINUTE
        if cron.matches(wall):
            (repeats if wall in seen else first_seen).extend(
                u + timedelta(seconds=s) for s in cron.seconds)
        seen.add(wall)
        last_wall, last_offset = wall, local.utcoffset()
        u += ONE_MINUTE

    out = {}
    for gap in ("shift", "skip"):
        for fold in ("first", "both"):
            chosen = list(first_seen)
            if fold == "both":
                chosen += repeats
            if gap == "shift":
                chosen += shifted
            out[(gap, fold)] = sorted({x for x in chosen if lo < x <= hi})
    return out


def offset_changes(zone_name: str, start: datetime, stop: datetime) -> list[datetime]:
    """UTC instants (to the minute) where the zone's offset changes; 6-hourly scan, then minutes.

    Assumes no two changes within six hours, true for every zone and year the tests use.
    """
    zone = ZoneInfo(zone_name)
    found = []
    u = start
    before = u.astimezone(zone).utcoffset()
    while u < stop:
        nxt = u + timedelta(hours=6)
        after = nxt.astimezone(zone).utcoffset()
        if after != before:
            m = u
            while m.astimezone(zone).utcoffset() == before:
                m += ONE_MINUTE
            found.append(m)
        before, u = after, nxt
    return found
