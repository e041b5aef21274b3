"""Business calendars in the namespace: built here, read by the evaluator as plain dates.

A calendar is resolved when it is stored: the `holidays` package's dates for a country (and
subdivision) over the years `HORIZON` around the year it is stored in, the explicit dates, and
the all-day events of an iCalendar file (`icalendar`; a VEVENT's RRULE is expanded over the
same years with dateutil, which icalendar depends on), so the scheduler process needs neither
package: it reads `<ns>:calendar:<name>` (common/time/calendar.py). Storing a changed
calendar bumps its version; schedules that use it apply it from their next occurrence that
has no run yet.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from duetime.common.connection import server_time_ms, translated
from duetime.common.errors import DuetimeError, InvalidInput, InvalidSchedule
from duetime.common.keys import Keyspace
from duetime.common.names import check_name
from duetime.common.time.calendar import Calendar, parse_weekdays

# years resolved around the current one: last year (a backfill) to five years ahead
HORIZON = (-1, 5)


class CalendarNotFound(DuetimeError, LookupError):
    pass


@dataclass(frozen=True)
class CalendarInfo:
    calendar: Calendar
    country: str | None
    subdiv: str | None
    explicit: tuple[date, ...]  # the dates given by hand
    ics_dates: int  # how many excluded dates came from an iCalendar file
    updated: datetime | None

    @property
    def name(self) -> str:
        return self.calendar.name

    @property
    def version(self) -> int:
        return self.calendar.version


def _date(value: date | str) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value).strip())
    except ValueError:
        raise InvalidInput(f"calendar date {value!r} is not YYYY-MM-DD") from None


def holiday_dates(country: str, subdiv: str | None, years: range) -> set[date]:
    """The public holidays of a country (and subdivision) in `years`, from `holidays`."""
    try:
        import holidays
    except ImportError:
        raise DuetimeError("a calendar from a country needs the holidays package: "
                           "pip install 'duetime[calendars]'") from None
    try:
        found = holidays.country_holidays(country, subdiv=subdiv, years=list(years))
    except (NotImplementedError, KeyError) as exc:
        raise InvalidInput(f"holidays: unknown country or subdivision {country!r}/{subdiv!r}: "
                           f"{exc}") from None
    return set(found.keys())


def ics_dates(ics: str | bytes | Path, years: range) -> set[date]:
    """The days of an iCalendar file's all-day VEVENTs (DTSTART a date; DTEND exclusive,
    one day without one), RRULEs expanded over `years` (EXDATE honoured)."""
    try:
        import icalendar
        rrulestr = importlib.import_module("dateutil.rrule").rrulestr  # icalendar's dependency
    except ImportError:
        raise DuetimeError("a calendar from an iCalendar file needs the icalendar package: "
                           "pip install 'duetime[calendars]'") from None
    if isinstance(ics, Path) or (isinstance(ics, str) and not ics.lstrip().startswith("BEGIN:")):
        ics = Path(ics).read_bytes()
    try:
        cal = icalendar.Calendar.from_ical(ics)
    except ValueError as exc:
        raise InvalidInput(f"not an iCalendar file: {exc}") from None
    lo, hi = date(years.start, 1, 1), date(years.stop - 1, 12, 31)
    out: set[date] = set()
    for ev in cal.walk("VEVENT"):
        start = ev.get("DTSTART")
        if start is None:
            continue
        d0 = start.dt
        if isinstance(d0, datetime) or not isinstance(d0, date):
            continue  # a timed event does not exclude a day
        end = ev.get("DTEND")
        length = max(1, ((end.dt - d0).days if end is not None and not isinstance(end.dt, datetime)
                         else 1))
        starts = [d0]
        if ev.get("RRULE") is not None:
            midnight = datetime.min.time()
            text = ev["RRULE"].to_ical()
            text = text.decode() if isinstance(text, bytes) else str(text)
            rule = rrulestr(text, dtstart=datetime.combine(d0, midnight))
            window = (datetime.combine(lo, midnight) - timedelta(days=length),
                      datetime.combine(hi, midnight))
            starts = [x.date() for x in rule.between(*window, inc=True)]
            ex = ev.get("EXDATE")
            for exd in (ex if isinstance(ex, list) else [ex] if ex is not None else []):
                for item in exd.dts:
                    drop = item.dt.date() if isinstance(item.dt, datetime) else item.dt
                    starts = [s for s in starts if s != drop]
        for s in starts:
            for k in range(length):
                day = s + timedelta(days=k)
                if lo <= day <= hi:
                    out.add(day)
    return out


class CalendarStore:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        with translated(self.url):
            return fn(*args, **kw)

    def put(self, name: str, country: str | None = None, subdiv: str | None = None,
            dates: Iterable[date | str] = (), ics: str | bytes | Path | None = None,
            weekdays: Iterable[int | str] | str | None = None,
            year: int | None = None) -> tuple[str, int]:
        """Store (create or change) calendar `name`; → ('created' | 'updated' | 'unchanged',
        version). Holidays and iCalendar repeats are resolved over `year` + HORIZON (the
        server's current year by default)."""
        check_name("calendar", name)
        if subdiv and not country:
            raise InvalidInput("a subdivision needs its country")
        try:
            days = parse_weekdays(weekdays)
        except InvalidSchedule as exc:
            raise InvalidInput(str(exc)) from None
        if year is None:
            year = datetime.fromtimestamp(self._call(server_time_ms, self.client) / 1000).year
        years = range(year + HORIZON[0], year + HORIZON[1] + 1)
        explicit = sorted({_date(d) for d in dates})
        excluded = set(explicit)
        if country:
            excluded |= holiday_dates(country, subdiv, years)
        from_ics: set[date] = set()
        if ics is not None:
            from_ics = ics_dates(ics, years)
            excluded |= from_ics
        resolved = Calendar(name, 0, days, frozenset(excluded), years.start, years.stop - 1)
        fields = {**resolved.fields(), "country": country or "", "subdiv": subdiv or "",
                  "explicit": ",".join(d.isoformat() for d in explicit),
                  "ics_dates": str(len(from_ics))}
        key = self.keys.calendar(name)
        current = {k.decode(): v.decode() for k, v in self._call(self.client.hgetall, key).items()}
        if current and all(current.get(k) == v for k, v in fields.items()):
            return "unchanged", int(current.get("version") or 0)
        now = self._call(server_time_ms, self.client)
        version = int(self._call(self.client.hincrby, key, "seq", 1))
        self._call(self.client.hset, key, mapping={**fields, "version": version, "updated": now})
        self._call(self.client.zadd, self.keys.calendars, {name: now})
        self._nudge(name, now)
        return ("created" if not current else "updated"), version

    def _nudge(self, name: str, now: int) -> None:
        """Bring the schedules using calendar `name` due now, so an evaluator re-plans their
        cursor with the new version (materialize.lua puts the cursor back)."""
        from duetime.client.schedules import ScheduleStore

        store = ScheduleStore(self.client, self.keys, self.url)
        for info in store.list(payload=False):
            # paused, ended or quarantined ones (at +inf in the due set) stay where they are
            if info.calendar == name and not (info.paused or info.quarantined
                                              or info.next_fire is None):
                p = self.keys.partition_of_schedule(info.name)
                self._call(self.client.zadd, self.keys.sched_due(p), {info.name: now}, xx=True,
                           lt=True)

    def get(self, name: str) -> CalendarInfo:
        check_name("calendar", name)
        raw = self._call(self.client.hgetall, self.keys.calendar(name))
        if not raw:
            raise CalendarNotFound(f"no calendar {name!r} in namespace {self.keys.namespace!r}")
        return decode_info(name, raw)

    def names(self) -> builtins.list[str]:
        return sorted(n.decode() for n in self._call(self.client.zrange, self.keys.calendars, 0, -1))

    def list(self) -> builtins.list[CalendarInfo]:
        out = []
        for n in self.names():
            try:
                out.append(self.get(n))
            except CalendarNotFound:
                continue
        return out

    def delete(self, name: str) -> None:
        """Remove a calendar; schedules naming it are quarantined by the evaluator until it is
        stored again or they are registered without it."""
        check_name("calendar", name)
        n = self._call(self.client.delete, self.keys.calendar(name))
        self._call(self.client.zrem, self.keys.calendars, name)
        if not n:
            raise CalendarNotFound(f"no calendar {name!r}")


def decode_info(name: str, raw: dict[bytes, bytes]) -> CalendarInfo:
    h = {k.decode(): v.decode(errors="replace") for k, v in raw.items()}
    cal = Calendar.from_fields(name, h)
    try:
        updated_ms = int(h.get("updated") or 0)
    except ValueError:
        updated_ms = 0
    from duetime.common.models import from_ms

    return CalendarInfo(cal, h.get("country") or None, h.get("subdiv") or None,
                        tuple(date.fromisoformat(x) for x in (h.get("explicit") or "").split(",") if x),
                        int(h.get("ics_dates") or 0) if (h.get("ics_dates") or "0").isdigit() else 0,
                        from_ms(updated_ms or None))

