"""What a schedule did at each of its past occurrences: ran, late, skipped, missed, coalesced.

The occurrences come from the schedule's own trigger (so a DST change shows as the instants
the trigger really produced, on the zone's clock and in UTC); each occurrence's run is read by
its derived id `<schedule>@<ms>`, one HMGET each, so the timeline of any schedule costs the
same whatever the size of the namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from duetime.client.schedules import ScheduleInfo, ScheduleStore
from duetime.common.models import from_ms, to_ms
from duetime.common.schedules import run_id_for
from duetime.ops.render import schedule_zone
from duetime.ops.schedule_listing import occurrence_runs, oldest_finished_ms

LATE_S = 1.0  # a run that started more than this after its due time is shown as late
MAX_WINDOW = timedelta(days=400)
MAX_WALK = 20_000  # trigger steps per timeline, whatever the trigger's frequency


@dataclass(frozen=True)
class Occurrence:
    ms: int
    utc: datetime
    local: datetime
    run_id: str | None  # the run standing for it (its own, or the run it was coalesced into)
    status: str  # ran late skipped missed coalesced moved running waiting retrying dead uncertain
    #              cancelled pending no-record
    state: str | None
    lateness_s: float | None
    detail: str
    zone_changed: bool  # its UTC offset differs from the previous (older) occurrence's


def _window(info: ScheduleInfo, until: datetime, count: int, floor: datetime | None) -> list[int]:
    """The newest `count` occurrences at or before `until` (and after `floor`), found by
    widening a window backwards: the trigger only steps forwards."""
    width = timedelta(minutes=1)
    while True:
        start = until - width
        if floor is not None and start < floor:
            start = floor
        found: list[int] = []
        steps = 0
        for o in info.trigger.occurrences(start, until):
            found.append(to_ms(o))
            steps += 1
            if steps >= MAX_WALK:
                break
        if steps >= MAX_WALK:  # too dense for this width: the newest are past the cap
            width = width / 4
            continue
        if len(found) >= count or start == floor or width >= MAX_WINDOW:
            return found[-count:]
        width *= 4


def _later(info: ScheduleInfo, after_ms: int, limit_ms: int, count: int) -> list[int]:
    out: list[int] = []
    t = from_ms(after_ms)
    while t is not None and len(out) < count:
        t = info.trigger.next_after(t)
        if t is None or to_ms(t) > limit_ms:
            break
        out.append(to_ms(t))
    return out


def timeline(store: ScheduleStore, info: ScheduleInfo, until: datetime, now: datetime,
             count: int = 48) -> tuple[list[Occurrence], datetime | None]:
    """The newest `count` occurrences at or before `until`, newest first, and the `until` of
    the page before them (None: nothing older to show)."""
    floor = None
    if info.created is not None and until > info.created:
        floor = info.created - timedelta(milliseconds=1)
    occ = _window(info, until, count, floor)
    cursor = to_ms(info.next_fire) if info.next_fire else None
    now_ms = to_ms(now)
    # runs after the window may stand for occurrences inside it (catch-up `latest`)
    ahead = _later(info, occ[-1], min(now_ms, cursor or now_ms), count) if occ else []
    runs = occurrence_runs(store, info.name, occ + ahead)
    covered: dict[int, str] = {}
    for o in [*occ, *ahead]:
        r = runs.get(o)
        if r and int(r.get("coalesced", "1") or 1) > 1:
            first = int(r.get("coalesced_from", o) or o)
            for x in occ:
                if first <= x < o:
                    covered[x] = run_id_for(info.name, o)
    horizon = oldest_finished_ms(store, info.name)
    zone = ZoneInfo(schedule_zone(info))
    out: list[Occurrence] = []
    previous_offset = None
    for o in occ:
        utc = from_ms(o)
        assert utc is not None
        local = utc.astimezone(zone)
        changed = previous_offset is not None and local.utcoffset() != previous_offset
        previous_offset = local.utcoffset()
        r = runs.get(o)
        out.append(_classify(info, o, utc, local, r, covered.get(o), cursor, horizon, now_ms, changed))
    out = _calendar_moves(store, info, out)
    out.reverse()
    older = None
    if occ and (floor is None or from_ms(occ[0]) > floor):  # type: ignore[operator]
        before = from_ms(occ[0] - 1)
        if before is not None and _window(info, before, 1, floor):
            older = before
    return out, older


def _calendar_moves(store: ScheduleStore, info: ScheduleInfo, out: list[Occurrence]) -> list[Occurrence]:
    """An occurrence its calendar moved (on_excluded next/previous) has no run of its own:
    say where it went instead of "no record"."""
    if not info.calendar or info.on_excluded == "skip":
        return out
    from dataclasses import replace

    from duetime.common.time.calendar import Calendared

    eff = store.effective_trigger(info)
    if not isinstance(eff, Calendared):
        return out
    moved = []
    for o in out:
        if o.run_id is None and o.status in ("no-record", "skipped"):
            to = eff.effective(o.utc)
            if to is not None and to != o.utc:
                o = replace(o, status="moved", run_id=run_id_for(info.name, to_ms(to)),
                            detail=f"excluded by calendar {eff.calendar.label}: moved to "
                                   f"{to.astimezone(o.local.tzinfo).isoformat()} "
                                   f"(on_excluded={info.on_excluded})")
        moved.append(o)
    return moved


def _classify(info: ScheduleInfo, o: int, utc: datetime, local: datetime, r: dict[str, str] | None,
              covered_by: str | None, cursor: int | None, horizon: int | None, now_ms: int,
              changed: bool) -> Occurrence:
    def occ(status: str, run_id: str | None, detail: str, state: str | None = None,
            lateness: float | None = None) -> Occurrence:
        return Occurrence(o, utc, local, run_id, status, state, lateness, detail, changed)

    if r is None:
        if covered_by:
            return occ("coalesced", covered_by, "missed while down or paused; one catch-up run "
                       "stood for it (catchup=latest)")
        if info.created is not None and o < to_ms(info.created):
            return occ("no-record", None, "before the schedule was created (a backfill makes runs "
                       "for such occurrences)")
        if cursor is not None and o >= cursor:
            why = "paused" if info.paused else ("in the future" if o > now_ms else
                                                "no scheduler has evaluated it yet")
            return occ("pending", None, f"not evaluated: {why}")
        if horizon is None or o < horizon:
            return occ("no-record", None, "no run: skipped by the catch-up policy, or removed by "
                       "retention")
        return occ("skipped", None, f"no run was created: skipped by the catch-up policy "
                   f"(catchup={info.catchup})")
    state = r.get("state", "")
    run_id = run_id_for(info.name, o)
    lateness = None
    if r.get("started") and r.get("due") and r.get("attempt") == "1":
        lateness = max(0.0, (int(r["started"]) - float(r["due"])) / 1000)
    n = int(r.get("coalesced", "1") or 1)
    extra = f"; stood for {n} occurrences (catch-up)" if n > 1 else ""
    reason = r.get("reason") or (r.get("error") or "").split("\n", 1)[0]
    if state == "succeeded":
        if lateness is not None and lateness > LATE_S:
            return occ("late", run_id, f"started {lateness:.1f}s after its due time{extra}", state, lateness)
        retried = int(r.get("attempt", "1") or 1) > 1
        return occ("ran", run_id, ("succeeded after retries" if retried else "succeeded") + extra,
                   state, lateness)
    if state in ("skipped", "missed"):
        return occ(state, run_id, reason or state, state)
    if state == "scheduled":
        return occ("waiting", run_id, "created, waiting for a worker", state)
    return occ(state or "unknown", run_id, (reason or state) + extra, state, lateness)
