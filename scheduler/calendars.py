"""The evaluator's side of business calendars and data intervals.

Calendars are read as stored dates (`<ns>:calendar:<name>`, resolved when stored), once per
evaluation batch that has a schedule using one; the holiday library is never imported here.
What the calendar does to a schedule is a pure function (common/time/calendar.py) of the
trigger, the calendar at its version and the instants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from duetime.common.errors import InvalidSchedule
from duetime.common.keys import Keyspace
from duetime.common.schedules import PlannedRun, run_id_for
from duetime.common.time.calendar import Calendar, Calendared, interval_starts
from duetime.common.time.parse import from_ms, to_ms
from duetime.common.time.spec import Trigger

# the schedule fields this module reads (after the evaluator's own)
CALENDAR_FIELDS = ("calendar", "on_excluded", "cal_v", "last_ms", "created")
# skipped runs recorded per evaluation of one schedule: a trigger firing more often than this
# on the excluded days between two of its runs records the first ones (all are dropped)
MAX_EXCLUDED_RECORDS = 1000


def read_calendars(client: redis.Redis, keys: Keyspace, names: set[str]
                   ) -> dict[str, Calendar | InvalidSchedule]:
    """The named calendars as stored (an error for one missing or damaged)."""
    if not names:
        return {}
    ordered = sorted(names)
    pipe = client.pipeline(transaction=False)
    for n in ordered:
        pipe.hgetall(keys.calendar(n))
    out: dict[str, Calendar | InvalidSchedule] = {}
    for n, raw in zip(ordered, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, Exception):
            out[n] = InvalidSchedule(f"calendar {n}: key {keys.calendar(n)} is damaged: {raw}")
        elif not raw:
            out[n] = InvalidSchedule(f"calendar {n} does not exist (duetime calendar add {n} ...)")
        else:
            try:
                out[n] = Calendar.from_fields(n, {k.decode(): v.decode(errors="replace")
                                                  for k, v in raw.items()})
            except InvalidSchedule as exc:
                out[n] = exc
    return out


@dataclass
class Applied:
    trigger: Trigger  # what the planner walks: the calendared trigger, or the trigger itself
    cursor_ms: int | None  # the cursor to plan from (moved when the calendar changed)
    label: str  # 'NAME vN' ('' without a calendar)
    last_ms: int  # the newest occurrence that has a run (0: none)
    created_ms: int = 0  # when the schedule was created


def apply(trigger: Trigger, rec: dict[str, bytes | None], cursor_ms: int, now_ms: int,
          calendars: dict[str, Calendar | InvalidSchedule]) -> Applied:
    """The schedule's trigger with its calendar applied, and the cursor to plan from: a
    calendar changed since the cursor was computed (`cal_v`) applies from the next occurrence
    without a run yet (after the newest run, and not before what was already handled)."""
    try:
        last = int(rec.get("last_ms") or 0)
        created = int(rec.get("created") or 0)
    except ValueError:
        last = created = 0
    name = (rec.get("calendar") or b"").decode(errors="replace")
    if not name:
        return Applied(trigger, cursor_ms, "", last, created)
    cal = calendars.get(name)
    if cal is None or isinstance(cal, InvalidSchedule):
        raise cal or InvalidSchedule(f"calendar {name} was not read")
    wrapped = Calendared(trigger, cal, (rec.get("on_excluded") or b"skip").decode(errors="replace"))
    if (rec.get("cal_v") or b"").decode(errors="replace") == cal.label:
        return Applied(wrapped, cursor_ms, cal.label, last, created)
    since = max(last, min(cursor_ms, now_ms) - 1)
    nxt = wrapped.next_after(from_ms(since))
    return Applied(wrapped, None if nxt is None else to_ms(nxt, ceil=True), cal.label, last,
                   created)


def extras(name: str, applied: Applied, runs: list[PlannedRun], new_cursor: int | None,
           horizon_ms: int) -> tuple[list[int], list[Any]]:
    """Each planned run's data interval start, and flat (run id, occurrence ms) of the
    occurrences the calendar dropped since the newest run, up to the new cursor (and the
    lead's horizon), to be recorded as skipped runs: they are recorded when the schedule is
    next evaluated, that is when its next business-day occurrence is materialised."""
    starts = interval_starts(applied.trigger, [r.coalesced_from_ms for r in runs],
                             [r.occurrence_ms for r in runs], applied.last_ms)
    excluded: list[Any] = []
    t = applied.trigger
    if isinstance(t, Calendared) and applied.cursor_ms is not None:
        # from the newest run on (before the first run: from the schedule's creation)
        lo = applied.last_ms + 1 if applied.last_ms else (applied.created_ms or applied.cursor_ms)
        hi = min(horizon_ms + 1, new_cursor if new_cursor is not None else horizon_ms + 1)
        if lo < hi:
            for r in t.skipped_between(from_ms(lo), from_ms(hi), MAX_EXCLUDED_RECORDS):
                ms = to_ms(r, ceil=True)
                excluded += [run_id_for(name, ms), ms]
    return starts, excluded
