"""Brute-force reference for cron-in-a-time-zone semantics.

Deliberately shares no code with ``common.timespec``: it walks every UTC minute, converts it to
the local wall clock with zoneinfo and applies its own tiny matcher (no ``H`` support) and its own
reading of the DST rules.  Slow but obviously correct, which is the point.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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


class OracleCron:
    """Plain 5-field cron (no H) matched against naive local wall times."""

    def __init__(self, expression: str) -> None:
        expression = SHORTCUTS.get(expression.strip(), expression)
        fields = expression.split()
        assert len(fields) == 5, expression
        self.minutes = _expand(fields[0], 0, 59, [], 0)
        self.hours = _expand(fields[1], 0, 23, [], 0)
        self.doms = _expand(fields[2], 1, 31, [], 0)
        self.months = _expand(fields[3], 1, 12, MONTHS, 1)
        self.dows = {d % 7 for d in _expand(fields[4], 0, 7, DAYS, 0)}
        self.dom_wild = fields[2][0] == "*"
        self.dow_wild = fields[4][0] == "*"
        self.hour_wild = fields[1][0] == "*"

    def day_ok(self, wall: datetime) -> bool:
        in_dom = wall.day in self.doms
        in_dow = (wall.isoweekday() % 7) in self.dows
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
                    shifted.append((missing - last_offset).replace(tzinfo=UTC))
                missing += ONE_MINUTE
        if cron.matches(wall):
            (repeats if wall in seen else first_seen).append(u)
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
