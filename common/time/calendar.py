"""Business calendars: which local days a schedule may fire on, and what happens to an
occurrence that falls on another day.

Pure (no Redis, no clock, no holiday library): a `Calendar` is a set of weekly business days
and a set of excluded dates, already resolved when it was stored (duetime/client/calendars.py
builds it from the `holidays` package, explicit dates or an iCalendar file), so the
scheduler process only reads dates. Evaluation is a pure function of (trigger, calendar
version, instant): `Calendared` wraps a trigger into the trigger whose instants are the
occurrences after the calendar is applied, so the planner, `schedule show`, the console and
backfill all ask the same `next_after`.

An occurrence is judged by its local date in the schedule's own zone (a cron's `tz`, UTC for
`every` and `at`). On an excluded day (not a business weekday, or an excluded date) it is:

- `skip`: dropped (the evaluator records it as a `skipped` run, see `skipped_between`);
- `next` / `previous`: moved to the same local wall time on the next / previous business day
  (within `MAX_ROLL_DAYS`; none there: dropped as for `skip`). The moved wall time is read
  with the trigger's DST policies: in a spring-forward gap, `dst_gap="shift"` reads it with
  the offset before the change and `"skip"` drops the occurrence; in a fall-back fold it is
  the first of the two instants. Two occurrences moved onto one instant (or onto an instant
  the trigger fires at anyway) are one occurrence, so they make one run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from duetime.common.errors import InvalidSchedule
from duetime.common.time.spec import At, Cron, Trigger

WEEKDAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DEFAULT_WEEKDAYS = frozenset(range(5))  # Monday to Friday
ON_EXCLUDED = ("skip", "next", "previous")
# A roll looks this many days ahead (or back) for a business day; none there: the occurrence
# is dropped. A month covers every holiday run a real calendar has.
MAX_ROLL_DAYS = 31
# `skip` gives up looking for a business-day occurrence this far past the asked instant
# (a trigger that only fires on excluded days, `0 9 * * SAT` on a Monday-Friday calendar)
MAX_SCAN_DAYS = 3660
_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)


def parse_weekdays(value: Iterable[int | str] | str | None) -> frozenset[int]:
    """Weekly business days from numbers (0 = Monday) or names (`mon`, `Tue`, ...), a comma
    list (`"mon,tue,wed"`), or a range of names (`"mon-fri"`); None: Monday to Friday."""
    if value is None:
        return DEFAULT_WEEKDAYS
    items: list[int | str] = (list(value.replace(" ", "").split(",")) if isinstance(value, str)
                              else list(value))
    out: set[int] = set()
    for item in items:
        if isinstance(item, bool):
            raise InvalidSchedule(f"weekday {item!r} is not a day")
        if isinstance(item, int):
            if not 0 <= item <= 6:
                raise InvalidSchedule(f"weekday {item} is outside 0 (Monday)..6 (Sunday)")
            out.add(item)
            continue
        text = str(item).strip().lower()
        if not text:
            continue
        if "-" in text:
            lo, _, hi = text.partition("-")
            a, b = _weekday(lo), _weekday(hi)
            if b < a:
                raise InvalidSchedule(f"weekday range {item!r} runs backwards")
            out.update(range(a, b + 1))
        else:
            out.add(_weekday(text))
    if not out:
        raise InvalidSchedule("a calendar needs at least one business weekday")
    return frozenset(out)


def _weekday(text: str) -> int:
    if text.isdigit() and 0 <= int(text) <= 6:
        return int(text)
    key = text[:3]
    if key not in WEEKDAY_NAMES or not WEEKDAY_NAMES[WEEKDAY_NAMES.index(key)].startswith(key):
        raise InvalidSchedule(f"unknown weekday {text!r} (mon..sun or 0..6)")
    return WEEKDAY_NAMES.index(key)


@dataclass(frozen=True)
class Calendar:
    """A named calendar at one version: the business weekdays and the excluded dates.

    `first_year`..`last_year` is the horizon its holidays were resolved over (0..0: explicit
    dates only); outside it only the weekdays and the explicit dates apply."""

    name: str
    version: int
    weekdays: frozenset[int] = DEFAULT_WEEKDAYS
    excluded: frozenset[date] = frozenset()
    first_year: int = 0
    last_year: int = 0

    def is_business_day(self, d: date) -> bool:
        return d.weekday() in self.weekdays and d not in self.excluded

    def roll(self, d: date, direction: int) -> date | None:
        """The first business day after (direction 1) or before (-1) `d`, within
        MAX_ROLL_DAYS; None when there is none."""
        for n in range(1, MAX_ROLL_DAYS + 1):
            try:
                c = d + direction * n * _DAY
            except OverflowError:
                return None
            if self.is_business_day(c):
                return c
        return None

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def reason(self) -> str:
        """What a skipped run records."""
        return f"excluded by calendar {self.label}"

    # -- stored form (hash fields of `<ns>:calendar:<name>`) ------------------------------
    def fields(self) -> dict[str, str]:
        return {
            "weekdays": ",".join(str(d) for d in sorted(self.weekdays)),
            "dates": ",".join(d.isoformat() for d in sorted(self.excluded)),
            "first_year": str(self.first_year), "last_year": str(self.last_year),
        }

    @classmethod
    def from_fields(cls, name: str, h: dict[str, str]) -> Calendar:
        """From the decoded hash; a damaged field raises InvalidSchedule naming it."""
        try:
            version = int(h.get("version") or 0)
        except ValueError:
            raise InvalidSchedule(f"calendar {name}: field version is {h.get('version')!r}") from None
        try:
            weekdays = parse_weekdays([int(x) for x in (h.get("weekdays") or "").split(",") if x])
        except ValueError as exc:
            raise InvalidSchedule(f"calendar {name}: field weekdays: {exc}") from None
        try:
            dates = frozenset(date.fromisoformat(x) for x in (h.get("dates") or "").split(",") if x)
        except ValueError as exc:
            raise InvalidSchedule(f"calendar {name}: field dates: {exc}") from None
        try:
            years = int(h.get("first_year") or 0), int(h.get("last_year") or 0)
        except ValueError:
            years = (0, 0)
        return cls(name, version, weekdays, dates, *years)


def trigger_zone(trigger: Trigger) -> ZoneInfo:
    """The zone a trigger's days are read in: a cron's own, UTC for `every` and `at`."""
    return ZoneInfo(trigger.tz) if isinstance(trigger, Cron) else ZoneInfo("UTC")


class Calendared(Trigger):
    """`trigger` with `calendar` applied under `on_excluded` (see the module docstring)."""

    kind = "calendared"

    def __init__(self, trigger: Trigger, calendar: Calendar, on_excluded: str = "skip") -> None:
        if on_excluded not in ON_EXCLUDED:
            raise InvalidSchedule(f"on_excluded must be one of {', '.join(ON_EXCLUDED)}; "
                                  f"got {on_excluded!r}")
        self.raw, self.calendar, self.on_excluded = trigger, calendar, on_excluded
        self.zone = trigger_zone(trigger)
        self._skip_gap = isinstance(trigger, Cron) and trigger.dst_gap == "skip"
        self._days: OrderedDict[date, list[datetime]] = OrderedDict()

    # -- days and walls -----------------------------------------------------------------
    def local_date(self, t: datetime) -> date:
        return t.astimezone(self.zone).date()

    def _start(self, d: date) -> datetime:
        """The first instant whose local date is `d` (a midnight in a DST gap: the change)."""
        x = datetime.combine(d, time(0), self.zone).astimezone(UTC)
        if x.astimezone(self.zone).date() != d:  # midnight skipped forward into d's 01:00
            x = datetime.combine(d, time(0), self.zone).replace(fold=1).astimezone(UTC)
        return x

    def _end(self, d: date) -> datetime:
        """The last microsecond whose local date is `d`."""
        try:
            return self._start(d + _DAY) - _US
        except OverflowError:
            return datetime.max.replace(tzinfo=UTC)

    def _wall_on(self, raw: datetime, d: date) -> datetime | None:
        """The instant of `raw`'s local wall time on day `d` (DST policies applied)."""
        wall = datetime.combine(d, raw.astimezone(self.zone).time().replace(fold=0))
        x = wall.replace(tzinfo=self.zone)
        utc = x.astimezone(UTC)
        if self._skip_gap and utc.astimezone(self.zone).replace(tzinfo=None) != wall:
            return None  # in a spring-forward gap, under dst_gap="skip"
        return utc  # fold=0: the pre-change offset (gap: shifted; fold: the first instant)

    def _raws_on(self, d: date) -> list[datetime]:
        """Every raw occurrence on local day `d` (cached: rolled days are asked repeatedly)."""
        got = self._days.get(d)
        if got is None:
            got = list(self.raw.occurrences(self._start(d) - _US, self._end(d)))
            self._days[d] = got
            if len(self._days) > 64:
                self._days.popitem(last=False)
        return got

    def effective(self, raw: datetime) -> datetime | None:
        """Where the raw occurrence `raw` fires once the calendar applies (None: dropped)."""
        d = self.local_date(raw)
        if self.calendar.is_business_day(d):
            return raw
        if self.on_excluded == "skip":
            return None
        target = self.calendar.roll(d, 1 if self.on_excluded == "next" else -1)
        return None if target is None else self._wall_on(raw, target)

    def _rolled_onto(self, src: date, target: date, after: datetime) -> datetime | None:
        """The first instant > `after` that raws of excluded day `src` move to on `target`."""
        best: datetime | None = None
        for r in self._raws_on(src):
            e = self._wall_on(r, target)
            if e is not None and e > after and (best is None or e < best):
                best = e
        return best

    def _roll_candidate(self, src: date, direction: int, after: datetime,
                        best: datetime | None) -> datetime | None:
        """The earlier of `best` and the first instant after `after` that excluded day `src`'s
        raws fire at once rolled (`direction` +1: onto the next business day, -1: the one
        before); `best` when the roll finds no business day or nothing after `after`."""
        target = self.calendar.roll(src, direction)
        if target is None:
            return best
        e = self._rolled_onto(src, target, after)
        return e if e is not None and (best is None or e < best) else best

    # -- the trigger ----------------------------------------------------------------------
    def next_after(self, t: datetime) -> datetime | None:
        t = t.astimezone(UTC)
        if self.on_excluded == "skip":
            return self._next_skip(t)
        if self.on_excluded == "next":
            return self._next_forward(t)
        return self._next_backward(t)

    def _next_skip(self, t: datetime) -> datetime | None:
        limit = t + MAX_SCAN_DAYS * _DAY if t < datetime.max.replace(tzinfo=UTC) - MAX_SCAN_DAYS * _DAY \
            else datetime.max.replace(tzinfo=UTC)
        r = self.raw.next_after(t)
        while r is not None and r <= limit:
            d = self.local_date(r)
            if self.calendar.is_business_day(d):
                return r
            r = self.raw.next_after(max(r, self._end(d)))
        return None

    def _next_forward(self, t: datetime) -> datetime | None:
        """`next`: an instant on business day E comes from E's own raws or from the run of
        excluded days just before E, so the candidates are the excluded days just before t's
        day (rolled past t) and the raws after t, scanned a day at a time until one fires."""
        best: datetime | None = None
        day = self.local_date(t)
        back = day
        for _ in range(MAX_ROLL_DAYS + 1):  # the excluded days whose roll lands at or after day
            if self.calendar.is_business_day(back) and back < day:
                break
            if not self.calendar.is_business_day(back):
                best = self._roll_candidate(back, 1, t, best)
            try:
                back -= _DAY
            except OverflowError:
                break
        r = self.raw.next_after(t)
        scanned = 0
        while r is not None and (best is None or r < best) and scanned < MAX_SCAN_DAYS:
            d = self.local_date(r)
            if self.calendar.is_business_day(d):
                return r if best is None or r < best else best  # later raws fire no earlier
            best = self._roll_candidate(d, 1, t, best)
            r, scanned = self.raw.next_after(max(r, self._end(d))), scanned + 1
        return best

    def _next_backward(self, t: datetime) -> datetime | None:
        """`previous`: an instant on business day B comes from B's own raws or from the run of
        excluded days just after B; raws at or before t fire at or before t. Scan raws after
        t a day at a time; once a candidate is found, only the excluded days right after its
        day can still beat it."""
        best: datetime | None = None
        r = self.raw.next_after(t)
        scanned = 0
        while r is not None and scanned < MAX_SCAN_DAYS:
            d = self.local_date(r)
            if self.calendar.is_business_day(d):
                if best is not None and d > self.local_date(best):
                    break
                if best is None or r < best:
                    best = r  # the day's first raw after t; its later raws fire later
            else:
                best = self._roll_candidate(d, -1, t, best)
            r, scanned = self.raw.next_after(max(r, self._end(d))), scanned + 1
        return best

    def skipped_between(self, lo: datetime, hi: datetime, limit: int = 100) -> list[datetime]:
        """Raw occurrences r with lo <= r < hi that the calendar drops (at most `limit`)."""
        out: list[datetime] = []
        r = self.raw.next_after(lo.astimezone(UTC) - _US)
        while r is not None and r < hi and len(out) < limit:
            d = self.local_date(r)
            if self.calendar.is_business_day(d):
                r = self.raw.next_after(max(r, self._end(d)))  # nothing dropped on this day
                continue
            if self.effective(r) is None:
                out.append(r)
            r = self.raw.next_after(r)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**self.raw.to_dict(), "calendar": self.calendar.label,
                "on_excluded": self.on_excluded}

    def describe(self) -> str:
        return f"{self.raw.describe()} (calendar {self.calendar.label}, on_excluded={self.on_excluded})"

    def _key(self) -> tuple[Any, ...]:
        return (self.raw, self.calendar.name, self.calendar.version, self.on_excluded)


def previous_before(trigger: Trigger, t: datetime, horizon: timedelta = timedelta(days=366 * 50)
                    ) -> datetime | None:
    """The latest instant of `trigger` strictly before `t` (None within `horizon`): triggers
    only step forwards, so a window before t is widened until it holds one. A one-time
    trigger has its one instant or none: answered at once (the widening search would step
    through every window out to the horizon, ~17 calls, for each run of a herd of them)."""
    t = t.astimezone(UTC)
    if isinstance(trigger, At):
        return trigger.instant if trigger.instant < t else None
    width = timedelta(seconds=1)
    while width <= horizon * 2:
        try:
            start = t - width
        except OverflowError:
            start = datetime.min.replace(tzinfo=UTC)
        x = trigger.next_after(start)
        if x is not None and x < t:
            while True:
                y = trigger.next_after(x)
                if y is None or y >= t:
                    return x
                x = y
        if start == datetime.min.replace(tzinfo=UTC):
            return None
        width *= 4
    return None


def interval_starts(trigger: Trigger, firsts: list[int], occurrences: list[int],
                    before: int = 0) -> list[int]:
    """For runs standing for the occurrences firsts[i]..occurrences[i] (ms, ascending), the
    start of each one's data interval: the trigger's occurrence just before firsts[i]
    (0: none). The occurrence before (the previous run's, or `before`, the newest one that
    had a run) is checked with one step; only otherwise is it searched for."""
    from duetime.common.time.parse import from_ms, to_ms

    out: list[int] = []
    for i, first in enumerate(firsts):
        hint = occurrences[i - 1] if i else before
        if 0 < hint < first:
            nxt = trigger.next_after(from_ms(hint))
            if nxt is not None and to_ms(nxt, ceil=True) == first:
                out.append(hint)
                continue
        prev = previous_before(trigger, from_ms(first))
        out.append(0 if prev is None else to_ms(prev, ceil=True))
    return out
