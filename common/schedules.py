"""Schedules: their definition and the pure planning of which occurrences become runs.

Planning is a pure function of (trigger, cursor, server now, policies), so the evaluator's
I/O stays thin and every catch-up rule is unit-testable without Redis.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from duetime.common.errors import InvalidInput, InvalidSchedule
from duetime.common.keys import Keyspace
from duetime.common.names import check_name
from duetime.common.time.fmt import format_duration
from duetime.common.time.parse import (
    MAX_DURATION,
    MAX_MS,
    Span,
    duration_ms,
    from_ms,
    parse_instant,
    to_ms,
)
from duetime.common.time.spec import Cron, Every, Trigger, trigger_from_dict

CATCHUP = ("all", "latest", "skip")
OVERLAP = ("allow", "skip", "buffer_one", "cancel_other")
# An occurrence is missed (downtime, a pause) when its successor is already due, or when it is
# evaluated more than its schedule's miss tolerance after its instant; missed occurrences
# follow the catch-up policy. The default tolerance covers a scheduler restart or failover
# (seconds) so a daily job is not dropped for it, and does not matter for a 1-second schedule,
# whose successor is due long before a minute passes.
MISS_TOLERANCE_MS = 60_000
# Bounds of a schedule's durations (API and CLI alike)
LATENESS = JITTER = MISS_TOLERANCE = Span(timedelta(0), timedelta(days=365))
# A stagger is a fixed offset within a day: wider would move a daily job to another day
STAGGER = Span(timedelta(0), timedelta(days=1))
# A schedule's stagger written this way (or not given) follows the namespace's policy
STAGGER_AUTO = ("auto", "default")
# Runs are identified by (schedule, occurrence ms): occurrences closer than 1 ms would share one
MIN_INTERVAL = timedelta(milliseconds=1)
EVERY = Span(MIN_INTERVAL, MAX_DURATION)
# Bound on the occurrences one evaluation walks; a longer backlog is finished next tick.
MAX_WALK = 100_000


def run_id_for(name: str, occurrence_ms: int) -> str:
    """The id of a schedule's run for one occurrence: the same whoever materialises it."""
    return f"{name}@{occurrence_ms}"


def jitter_for(name: str, occurrence_ms: int, jitter_ms: int) -> int:
    """A stable per-occurrence delay in [0, jitter): spreads a herd, same on every scheduler."""
    if jitter_ms <= 0:
        return 0
    h = hashlib.sha256(f"{name}@{occurrence_ms}".encode()).digest()
    return int.from_bytes(h[:8], "big") % jitter_ms


def stagger_for(name: str, stagger_ms: int) -> int:
    """A schedule's own stable offset in [0, stagger): the same for every occurrence (unlike
    jitter), so a schedule keeps its phase and many schedules written alike spread out."""
    if stagger_ms <= 0:
        return 0
    h = hashlib.sha256(f"stagger\0{name}".encode()).digest()
    return int.from_bytes(h[:8], "big") % stagger_ms


def parse_stagger(value: timedelta | float | str | None) -> int | None:
    """A stagger argument → ms, or None for "follow the namespace policy" (not given, `auto`
    or `default`); 0 pins the schedule to its exact instants whatever the policy says."""
    if value is None or (isinstance(value, str) and value.strip().lower() in STAGGER_AUTO):
        return None
    return duration_ms(STAGGER.parse(value, "stagger"))


def effective_stagger_ms(own: int | None, policy_ms: int) -> int:
    """The stagger a schedule applies: its own, else the namespace policy's."""
    return policy_ms if own is None else own


def stored_stagger(raw: bytes | str | None) -> int | None:
    """The `stagger_ms` field of a schedule record: absent or `auto` → None (the policy); a
    damaged value also reads as the policy rather than stopping the schedule."""
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        return max(0, int(text))
    except ValueError:
        return None


TRIGGER_PREFIX = "t."
# every key a trigger's dict form may have (Cron, Every, At), as stored hash fields
TRIGGER_FIELDS = tuple(TRIGGER_PREFIX + k for k in (
    "kind", "expr", "tz", "dst_gap", "dst_fold", "seed", "interval_us", "anchor", "instant"))


def trigger_fields(trigger: Trigger) -> dict[str, Any]:
    """A trigger as flat hash fields (`t.kind`, `t.expr`, ...): short values keep the schedule
    hash in Redis' compact listpack encoding (a JSON blob over 64 bytes would not)."""
    return {TRIGGER_PREFIX + k: v for k, v in trigger.to_dict().items()}


def trigger_from_fields(values: list[bytes | None] | dict[str, Any]) -> Trigger:
    """From `HMGET key *TRIGGER_FIELDS` values (or a decoded dict of the hash)."""
    if isinstance(values, dict):
        values = [values.get(f) for f in TRIGGER_FIELDS]
    d: dict[str, Any] = {}
    for f, v in zip(TRIGGER_FIELDS, values, strict=True):
        if v is not None:
            text = v.decode() if isinstance(v, bytes) else v
            key = f[len(TRIGGER_PREFIX):]
            d[key] = int(text) if key == "interval_us" else text
    return trigger_from_dict(d)


def seeded(trigger: Trigger, name: str) -> Trigger:
    """A cron's `H` fields hash the schedule name unless the trigger brought its own seed."""
    if isinstance(trigger, Cron) and not trigger.seed:
        d = trigger.to_dict()
        d["seed"] = name
        return trigger_from_dict(d)
    return trigger


def _millis(value: timedelta | float | str | None, what: str, span: Span) -> int:
    return 0 if value is None else duration_ms(span.parse(value, what))


ON_EXCLUDED = ("skip", "next", "previous")


def check_calendar_options(calendar: str, on_excluded: str) -> None:
    if calendar:
        check_name("calendar", calendar)
    if on_excluded not in ON_EXCLUDED:
        raise InvalidSchedule(f"on_excluded must be one of {', '.join(ON_EXCLUDED)}; "
                              f"got {on_excluded!r}")


def calendar_fields(calendar: str, on_excluded: str) -> dict[str, str]:
    """A schedule's calendar as hash fields: absent without one (so the definition hash of a
    schedule without a calendar is the one it had before calendars existed); the store
    writes '' then, clearing an old one."""
    return {"calendar": calendar, "on_excluded": on_excluded} if calendar else {}


@dataclass(frozen=True)
class ScheduleDef:
    """What the user declares; stored in `T:sched:<name>` with the evaluation state."""

    name: str
    trigger: Trigger
    task: str
    queue: str
    payload: bytes
    catchup: str = "latest"
    max_catchup: int = 100
    lateness_ms: int = 0
    overlap: str = "allow"
    jitter_ms: int = 0
    owner: str = ""
    task_options: dict[str, int] = field(default_factory=dict)
    miss_tolerance_ms: int = MISS_TOLERANCE_MS
    stagger_ms: int | None = None  # None: the namespace's stagger policy (`schedule policy`)
    tenant: str = ""  # given to every run it creates ('' = none)
    # a business calendar by name ('' = none) and what an occurrence on an excluded day does
    # (common/time/calendar.py): 'skip', or roll to the 'next' / 'previous' business day
    calendar: str = ""
    on_excluded: str = "skip"
    # guardrails (0 = none): pause after N consecutive dead occurrences; the first and last
    # instants (ms) an occurrence may have; stop after N runs made by the evaluator
    pause_after_failures: int = 0
    start_ms: int = 0
    end_ms: int = 0
    max_runs: int = 0

    def __post_init__(self) -> None:
        check_name("schedule name", self.name)
        check_name("queue", self.queue)
        if self.tenant:
            check_name("tenant", self.tenant)
        check_calendar_options(self.calendar, self.on_excluded)
        if self.catchup not in CATCHUP:
            raise InvalidSchedule(f"catchup must be one of {', '.join(CATCHUP)}; got {self.catchup!r}")
        if self.overlap not in OVERLAP:
            raise InvalidSchedule(f"overlap must be one of {', '.join(OVERLAP)}; got {self.overlap!r}")
        if self.max_catchup < 1:
            raise InvalidSchedule(f"max_catchup must be >= 1, got {self.max_catchup}")
        check_guardrails(self.pause_after_failures, self.start_ms, self.end_ms, self.max_runs)
        if isinstance(self.trigger, Every) and self.trigger.interval < MIN_INTERVAL:
            raise InvalidSchedule(
                f"every interval {format_duration(self.trigger.interval)} is shorter than 1ms: runs are "
                "identified by their occurrence's millisecond, so two would share one")

    @staticmethod
    def durations(lateness: timedelta | float | str | None, jitter: timedelta | float | str | None,
                  miss_tolerance: timedelta | float | str | None = None) -> tuple[int, int, int]:
        """(lateness_ms, jitter_ms, miss_tolerance_ms) from any duration form, bounds checked
        (None: no deadline, no jitter, the default tolerance)."""
        tolerance = (MISS_TOLERANCE_MS if miss_tolerance is None
                     else _millis(miss_tolerance, "miss tolerance", MISS_TOLERANCE))
        return (_millis(lateness, "lateness", LATENESS), _millis(jitter, "jitter", JITTER),
                tolerance)

    def fields(self) -> dict[str, Any]:
        """The definition as hash fields (plain text, payload msgpack)."""
        f: dict[str, Any] = {
            "name": self.name, **trigger_fields(self.trigger), "task": self.task,
            "queue": self.queue,
            "payload": self.payload, "catchup": self.catchup, "max_catchup": self.max_catchup,
            "lateness_ms": self.lateness_ms, "overlap": self.overlap, "jitter_ms": self.jitter_ms,
            "owner": self.owner, **self.task_options, "miss_tolerance_ms": self.miss_tolerance_ms,
            "stagger_ms": "auto" if self.stagger_ms is None else self.stagger_ms,
        }
        if self.tenant:  # absent when unset (the store writes '' then, clearing an old one)
            f["tenant"] = self.tenant
        f.update(calendar_fields(self.calendar, self.on_excluded))
        f.update(guardrail_fields(self))  # likewise: only those set (hashed only then)
        return f

    def def_hash(self) -> str:
        f = self.fields()
        if f["miss_tolerance_ms"] == MISS_TOLERANCE_MS:
            # added later: hashed only when set away from its default, so upgrading does not
            # re-version every stored schedule (a record without it means the default)
            del f["miss_tolerance_ms"]
        if self.stagger_ms is None:
            del f["stagger_ms"]  # likewise: a record without it follows the policy
        h = hashlib.sha256()
        for k in sorted(f):
            v = f[k]
            h.update(k.encode() + b"\0" + (v if isinstance(v, bytes) else str(v).encode()) + b"\0")
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class PlannedRun:
    occurrence_ms: int
    due_ms: int
    coalesced: int = 1  # how many occurrences this run stands for (catch-up "latest")
    coalesced_from_ms: int = 0


@dataclass(frozen=True)
class Plan:
    runs: list[PlannedRun]
    skipped: int
    next_ms: int | None  # the new cursor: first occurrence not yet handled (None: no more)


def plan(trigger: Trigger, cursor_ms: int, now_ms: int, lead_ms: int, *, name: str,
         catchup: str, max_catchup: int, jitter_ms: int = 0,
         tolerance_ms: int = MISS_TOLERANCE_MS, stagger_ms: int = 0) -> Plan:
    """Which occurrences from `cursor_ms` (itself an occurrence) up to now + lead become runs.

    An occurrence is missed (downtime, pause) when its successor is already due, whatever
    the tolerance, or when it is older than now - tolerance. Missed occurrences follow the
    catch-up policy: `all` keeps the newest `max_catchup` (older ones are skipped), `latest`
    makes one run for the newest that stands for all of them, `skip` makes none.

    An occurrence's ms is the first millisecond at or after its instant (a run is never due
    early), so an interval that is not a whole number of ms (`Every(timedelta(minutes=1)/7)`)
    still advances the cursor by one occurrence per step.
    """
    horizon = now_ms + lead_ms
    offset = stagger_for(name, stagger_ms)
    missed: list[int] = []
    ontime: list[int] = []
    cur: int | None = cursor_ms
    walked = 0
    while cur is not None and cur <= horizon and walked < MAX_WALK:
        after = trigger.next_after(from_ms(cur))
        nxt = None if after is None else to_ms(after, ceil=True)
        successor_due = nxt is not None and nxt <= now_ms
        (missed if successor_due or cur < now_ms - tolerance_ms else ontime).append(cur)
        cur = nxt
        walked += 1

    def run(o: int, n: int = 1, first: int = 0) -> PlannedRun:
        return PlannedRun(o, o + offset + jitter_for(name, o, jitter_ms), n, first or o)

    runs: list[PlannedRun] = []
    skipped = 0
    if missed:
        if catchup == "all":
            keep = missed[-max_catchup:]
            skipped = len(missed) - len(keep)
            runs += [run(o) for o in keep]
        elif catchup == "latest":
            runs.append(run(missed[-1], len(missed), missed[0]))
        else:
            skipped = len(missed)
    runs += [run(o) for o in ontime]
    return Plan(runs, skipped, cur)


# the namespace's default stagger, a field of `<ns>:meta` (absent: none)
POLICY_STAGGER = "stagger_ms"


def read_stagger_policy(client: redis.Redis, keys: Keyspace) -> int:
    """The namespace's default stagger (ms; 0 when none is set or the field is damaged)."""
    return stored_stagger(client.hget(keys.meta, POLICY_STAGGER)) or 0


# The fields of a stored schedule the evaluator checks before it plans or materialises it:
# a field edited by hand (or by another client) is refused with a reason naming it, and the
# schedule is quarantined, instead of crashing the evaluator or writing runs nobody can run.
CHECKED_FIELDS = ("queue", "task", "catchup", "overlap", "paused", "max_catchup", "jitter_ms",
                  "miss_tolerance_ms", "lateness_ms", "payload")
_MAX_FIELD_MS = int(LATENESS.hi / timedelta(milliseconds=1))


def _count(raw: bytes | None, field_name: str, lo: int, hi: int, default: int | None) -> int:
    if raw is None or raw == b"":
        if default is None:
            raise InvalidSchedule(f"field {field_name} is missing")
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidSchedule(f"field {field_name} is {raw[:40]!r}, not an integer") from None
    if not lo <= n <= hi:
        raise InvalidSchedule(f"field {field_name} is {n}, outside {lo}..{hi}")
    return n


def check_stored(f: dict[str, bytes | None], trigger: Trigger) -> None:
    """Raise InvalidSchedule naming the first field of a stored schedule (HMGET values of
    CHECKED_FIELDS and next_ms, and its parsed trigger) that no valid ScheduleDef would have
    written."""
    from duetime.common.codec import unpack_payload  # the codec pulls in msgpack

    for name in ("queue", "task"):
        raw = f.get(name)
        try:
            check_name(name, raw.decode() if raw is not None else None)
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidSchedule(f"field {name}: {exc}") from None
    for name, allowed in (("catchup", CATCHUP), ("overlap", OVERLAP)):
        raw = f.get(name)
        if raw is None and name == "overlap":
            continue  # records written before overlap policies: allow
        if raw is None or raw.decode(errors="replace") not in allowed:
            raise InvalidSchedule(f"field {name} is {raw!r}, not one of {', '.join(allowed)}")
    if f.get("next_ms") is not None:
        # the cursor is an occurrence, an instant of 1970..9999; one past it (edited by hand:
        # 99999999999999999999) was planned from as if valid and parked the schedule's due
        # entry at that score for good, neither fired nor reported (and above 2**53 Lua's
        # numbers are not even exact)
        _count(f.get("next_ms"), "next_ms", 0, MAX_MS, None)
    if f.get("paused") not in (None, b"", b"0", b"1"):
        raise InvalidSchedule(f"field paused is {f.get('paused')!r}, not 0 or 1")
    _count(f.get("max_catchup"), "max_catchup", 1, MAX_WALK, None)
    for name in ("jitter_ms", "miss_tolerance_ms", "lateness_ms"):
        _count(f.get(name), name, 0, _MAX_FIELD_MS, 0)
    if isinstance(trigger, Every) and trigger.interval < MIN_INTERVAL:
        raise InvalidSchedule(f"field t.interval_us is {trigger.interval // timedelta(microseconds=1)}"
                              f", shorter than {MIN_INTERVAL // timedelta(microseconds=1)}")
    try:
        unpack_payload(f.get("payload"))
    except ValueError as exc:  # InvalidInput, PayloadTooLarge
        raise InvalidSchedule(f"field payload cannot be decoded: {exc}") from None


# -- guardrails: pause_after_failures, start, end, max_runs ---------------------------------
# Stored as schedule hash fields only when set (absent or '' = none), so a record written
# before them keeps its definition hash. The evaluation state beside them: `fail_streak`
# (consecutive dead occurrences, lua/_lib.lua schedule_dead), `auto_paused` (the count that
# paused it), `runs_made` (runs the evaluator made, lua/materialize.lua), `ended` ('end' or
# 'max_runs' once a bound stopped it).
GUARDRAIL_FIELDS = ("pause_after_failures", "start_ms", "end_ms", "max_runs")
GUARDRAIL_STATE = ("fail_streak", "auto_paused", "runs_made", "ended")
MAX_GUARDRAIL_COUNT = 1_000_000_000


def check_guardrails(pause_after_failures: int, start_ms: int, end_ms: int, max_runs: int) -> None:
    for what, n in (("pause_after_failures", pause_after_failures), ("max_runs", max_runs)):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_GUARDRAIL_COUNT:
            raise InvalidSchedule(f"{what} must be an integer in 1..{MAX_GUARDRAIL_COUNT} "
                                  f"(or 0/None: none), got {n!r}")
    if start_ms and end_ms and end_ms < start_ms:
        raise InvalidSchedule(f"end ({from_ms(end_ms).isoformat()}) is before start "
                              f"({from_ms(start_ms).isoformat()})")


def bound_ms(value: datetime | str | None, what: str) -> int:
    """`start=` / `end=` → ms (0: none). Aware datetimes (or ISO-8601 strings with an offset)
    only: a naive one would be read in some process's local zone, so it is refused."""
    if value is None:
        return 0
    if isinstance(value, datetime) and value.tzinfo is None:
        raise InvalidSchedule(f"{what} {value.isoformat()} is a naive datetime: give it a zone "
                              f"(datetime(..., tzinfo=ZoneInfo('Europe/Paris')) or UTC)")
    try:
        return to_ms(parse_instant(value, what=what))
    except InvalidInput as exc:
        raise InvalidSchedule(str(exc)) from None


def guardrail_fields(d: ScheduleDef) -> dict[str, int]:
    """The guardrails a definition sets, as hash fields (none set: no field)."""
    return {k: v for k in GUARDRAIL_FIELDS if (v := getattr(d, k))}


def cleared_guardrails(d: ScheduleDef) -> list[str]:
    """Field, value pairs an upsert writes so a guardrail removed from the definition (and a
    bound reached under the old one) is cleared: '' reads as none."""
    flat: list[str] = []
    for k in GUARDRAIL_FIELDS:
        if not getattr(d, k):
            flat += [k, ""]
    return flat + ["ended", ""]


def first_cursor(d: ScheduleDef, after_ms: int, trigger: Trigger | None = None) -> int | None:
    """The first occurrence after `after_ms` (the newest one with a run, or now) within the
    schedule's start and end: the cursor an upsert stores (None: no more occurrences).
    `trigger`: the schedule's trigger with its calendar applied (default: `d.trigger`)."""
    after = from_ms(after_ms)
    if d.start_ms and d.start_ms > after_ms:
        after = from_ms(d.start_ms) - timedelta(microseconds=1)
    nxt = (trigger or d.trigger).next_after(after)
    if nxt is None:
        return None
    ms = to_ms(nxt, ceil=True)
    return None if d.end_ms and ms > d.end_ms else ms


def guardrail_state(h: dict[bytes, bytes]) -> dict[str, int | str]:
    """The guardrails of a stored record and their state, for listings (damage reads as 0)."""
    out: dict[str, int | str] = {}
    for k in (*GUARDRAIL_FIELDS, "fail_streak", "auto_paused", "runs_made"):
        try:
            out[k] = max(0, int(h.get(k.encode()) or 0))
        except ValueError:
            out[k] = 0
    out["ended"] = h.get(b"ended", b"").decode(errors="replace")
    return out


# -- the cursor of a changed definition ----------------------------------------------------
# What an upsert reads besides the version to decide where a changed definition goes on from.
CURSOR_FIELDS = ("next_ms", *TRIGGER_FIELDS, "start_ms")


def kept_cursor(d: ScheduleDef, stored: list[bytes | None], computed: int | None) -> int | None:
    """The cursor a changed definition takes: the stored one when its trigger and start are
    those stored (a changed payload, policy or task), so the occurrences the evaluator has
    not reached yet -- it may lag behind its lead under load -- are evaluated as before
    instead of skipped (the next occurrence after now would lose them); else `computed` (the
    next occurrence after the newest with a run). A cursor another evaluator moves meanwhile
    costs nothing: run ids are per occurrence, so an occurrence seen twice makes one run."""
    raw_next, *raw_trigger = stored[: 1 + len(TRIGGER_FIELDS)]
    raw_start = stored[1 + len(TRIGGER_FIELDS)] if len(stored) > len(TRIGGER_FIELDS) + 1 else None
    if raw_next is None or computed is None:
        return computed
    try:
        same = (trigger_from_fields(raw_trigger) == d.trigger
                and int(raw_start or 0) == d.start_ms)
        stored_next = int(raw_next)
    except Exception:  # noqa: BLE001 - a record damaged by hand: start from the computed one
        return computed
    if not same or (d.end_ms and stored_next > d.end_ms):
        return computed
    return min(stored_next, computed)


# -- the stored record (docs/keys.md "The schedule record") ---------------------------------
# A schedule is one field of its partition's `T:scheds` hash, named by the schedule: its
# definition and cursor state as `<key><length>:<value>` entries under short keys, sorted
# (`k5:everyi7:1000000t4:noopv1:1...`: readable with redis-cli, parsed by a few lines of Lua
# on every server, fakeredis included), values equal to their default left out. What other
# transitions write about a schedule -- `paused` and its note, `buffered`, `fail_streak`,
# `auto_paused`, the skipped/missed/cancelled/excluded counters, `quarantined` -- lives in
# its side hash `T:sched:<name>`, which exists only while it has one of them. A schedule
# written before this layout has no `T:scheds` field and its side hash holds every field
# under its own name (detected per schedule: the side hash has `version`); every reader
# takes both, and its next upsert (or `duetime schedule migrate`) converts it. No
# namespace-wide format version is needed for it.
RECORD_KEYS: dict[str, str] = {
    "t.kind": "k", "t.expr": "x", "t.tz": "z", "t.dst_gap": "g", "t.dst_fold": "f",
    "t.seed": "s", "t.interval_us": "i", "t.anchor": "a", "t.instant": "at",
    "task": "t", "queue": "q", "payload": "p", "catchup": "cu", "max_catchup": "mc",
    "lateness_ms": "lt", "overlap": "o", "jitter_ms": "j", "owner": "ow",
    "max_attempts": "ma", "backoff_base": "bb", "backoff_max": "bm", "timeout": "to",
    "idempotent": "id", "miss_tolerance_ms": "mt", "stagger_ms": "st", "tenant": "tn",
    "calendar": "cal", "on_excluded": "oe", "pause_after_failures": "paf", "start_ms": "sa",
    "end_ms": "en", "max_runs": "mr",
}
# a payload longer than this waits in the side hash's `payload` field (the record has `pl`,
# its length): listings that show no payload leave it in Redis (lua/_lib.lua SCHED_INLINE)
SCHED_INLINE = 256
# the cursor state in the same map (materialize.lua and schedule_upsert.lua write them)
STATE_KEYS: dict[str, str] = {
    "version": "v", "next_ms": "n", "last_ms": "l", "created": "c", "updated": "u",
    "materialized_count": "m", "runs_made": "r", "cal_v": "cv", "ended": "ed",
}
# a definition value equal to its default is not stored (fixed for good: lua/_lib.lua
# SCHED_DEFAULTS holds the ones materialize.lua copies into runs); '' is never stored either
RECORD_DEFAULTS: dict[str, str] = {
    "queue": "default",
    "catchup": "latest", "max_catchup": "100", "lateness_ms": "0", "overlap": "allow",
    "jitter_ms": "0", "owner": "", "max_attempts": "4", "backoff_base": "1000",
    "backoff_max": "300000", "timeout": "0", "idempotent": "1",
    "miss_tolerance_ms": str(MISS_TOLERANCE_MS), "stagger_ms": "auto",
}
# a trigger's, by its kind (the other kinds have none of these fields)
KIND_DEFAULTS: dict[str, dict[str, str]] = {
    "cron": {"t.tz": "UTC", "t.dst_gap": "shift", "t.dst_fold": "auto"},
    "every": {"t.anchor": "1970-01-01T00:00:00Z"},
}
# the fields a record written before the packed layout holds in its side hash that the
# packed record replaces (an upsert converting it removes them from the side hash)
LEGACY_MOVED = ("name", *RECORD_KEYS, *STATE_KEYS, "def_hash", "evaluated")
_SHORT_TO_FIELD = {v: k for k, v in {**RECORD_KEYS, **STATE_KEYS}.items()}
_ENTRY = re.compile(rb"([a-z]+)(\d+):")


def encode_record(rec: dict[str, bytes]) -> bytes:
    """`<key><length>:<value>` per entry, keys sorted (lua/_lib.lua sched_encode alike)."""
    return b"".join(k.encode() + str(len(v)).encode() + b":" + v for k, v in sorted(rec.items()))


def unpack_record(raw: bytes) -> dict[bytes, bytes]:
    """A stored record as its short keys → values; ValueError when it is not one."""
    out: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(raw):
        m = _ENTRY.match(raw, pos)
        if m is None or m.end() + int(m.group(2)) > len(raw):
            raise ValueError(f"packed record cannot be read at byte {pos}: {raw[pos:pos + 20]!r}")
        out[m.group(1)] = raw[m.end():m.end() + int(m.group(2))]
        pos = m.end() + int(m.group(2))
    return out


def _bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, bool):
        return b"1" if v else b"0"
    return str(v).encode()


def definition_record(name: str, fields: dict[str, Any]) -> dict[str, bytes]:
    """A definition's stored fields (ScheduleDef.fields(), or a record of the old layout
    read back) as the packed record's entries: short keys, defaults and '' left out."""
    out: dict[str, bytes] = {}
    kind = _bytes(fields.get("t.kind", b"")).decode(errors="replace")
    for f, short in RECORD_KEYS.items():
        v = fields.get(f)
        if v is None:
            continue
        raw = _bytes(v)
        text = raw.decode(errors="replace")
        if raw == b"" or RECORD_DEFAULTS.get(f) == text or KIND_DEFAULTS.get(kind, {}).get(
                f) == text or (kind == "cron" and f == "t.seed" and text == name):
            continue
        out[short] = raw
    return out


def pack_definition(name: str, fields: dict[str, Any]) -> bytes:
    """What schedule_upsert.lua is given: the definition's entries."""
    return encode_record(definition_record(name, fields))


def same_definition(stored: dict[bytes, bytes], name: str, fields: dict[str, Any],
                    side: dict[bytes, bytes] | None = None) -> bool:
    """Whether a packed record (and its side hash, which holds a long payload) holds this
    definition (state keys aside): an upsert of it changes nothing."""
    defs = {s.encode() for s in RECORD_KEYS.values()}
    if b"pl" in stored:
        stored = {**stored, b"p": (side or {}).get(b"payload", b"")}
    new = {k.encode(): v for k, v in definition_record(name, fields).items()}
    return {k: v for k, v in stored.items() if k in defs} == new


def expand_record(name: str, raw: bytes) -> dict[bytes, bytes]:
    """A packed record as the named fields of the old layout (defaults filled in), so every
    reader takes either layout alike."""
    rec = unpack_record(raw)
    out: dict[bytes, bytes] = {b"name": name.encode()}
    for f, default in RECORD_DEFAULTS.items():
        out[f.encode()] = default.encode()
    for k, v in rec.items():
        named = _SHORT_TO_FIELD.get(k.decode(errors="replace"))
        if named is None:
            continue  # a key a later version added: not this version's to read
        out[named.encode()] = v
    kind = out.get(b"t.kind", b"").decode(errors="replace")
    for f, default in KIND_DEFAULTS.get(kind, {}).items():
        out.setdefault(f.encode(), default.encode())
    if kind == "cron":
        out.setdefault(b"t.seed", name.encode())
    return out


def merged_record(name: str, side: dict[bytes, bytes] | None, packed: bytes | None
                  ) -> dict[bytes, bytes]:
    """One schedule as named fields, from its side hash and its packed record (either may be
    absent; a record of the old layout is its side hash alone). A packed record that cannot
    be decoded reads as none, with `problem` saying so (the evaluator quarantines it)."""
    out = dict(side or {})
    if packed is not None:
        out.setdefault(b"paused", b"0")  # its side hash has it only while paused (or resumed)
        try:
            out.update(expand_record(name, packed))
        except ValueError as exc:
            out[b"name"] = name.encode()
            out[b"problem"] = str(exc).encode()
    return out


def read_records(client: Any, keys: Keyspace, names: list[str]) -> list[dict[bytes, bytes]]:
    """The records of `names` (both layouts), two pipelined reads per schedule; a schedule
    that does not exist reads as {}; a side key of the wrong type (damaged by hand) as none."""
    pipe = client.pipeline(transaction=False)
    for n in names:
        p = keys.partition_of_schedule(n)
        pipe.hgetall(keys.sched(p, n))
        pipe.hget(keys.scheds(p), n)
    res = pipe.execute(raise_on_error=False)
    out = []
    for i, n in enumerate(names):
        side, packed = res[2 * i], res[2 * i + 1]
        for r in (side, packed):
            if isinstance(r, Exception) and not str(r).startswith("WRONGTYPE"):
                raise r
        side = {} if isinstance(side, Exception) else side
        packed = None if isinstance(packed, Exception) else packed
        out.append(merged_record(n, side, packed) if side or packed is not None else {})
    return out


def record_fields(name: str, fields: tuple[str, ...], side: list[Any],
                  packed: bytes | None) -> list[Any]:
    """HMGET-like values of `fields` for one schedule, from `HMGET side *fields` and its
    packed record (the evaluator's read; either layout)."""
    if packed is None:
        return side
    m = merged_record(name, {f.encode(): v for f, v in zip(fields, side, strict=True)
                             if v is not None}, packed)
    return [m.get(f.encode()) for f in fields]
