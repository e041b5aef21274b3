"""The client side of schedules: upsert, pause/resume, delete, trigger-now, backfill, list."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import redis

from duetime.client.fields import hashes_without
from duetime.common import transitions as tr
from duetime.common.codec import unpack_payload
from duetime.common.connection import server_time_ms, translated
from duetime.common.errors import DuetimeError, InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.models import from_ms as stored_ms
from duetime.common.names import check_name
from duetime.common.schedules import (
    CURSOR_FIELDS,
    MISS_TOLERANCE_MS,
    POLICY_STAGGER,
    TRIGGER_FIELDS,
    ScheduleDef,
    first_cursor,
    guardrail_state,
    kept_cursor,
    merged_record,
    pack_definition,
    read_stagger_policy,
    run_id_for,
    same_definition,
    stored_stagger,
    trigger_from_fields,
    unpack_record,
)
from duetime.common.scripts import Scripts
from duetime.common.time.parse import from_ms, parse_instant, to_ms
from duetime.common.time.spec import Trigger

BACKFILL_CHUNK = 500
class ScheduleNotFound(DuetimeError, LookupError):
    pass


def _reraise(exc: Exception) -> None:
    raise exc


def _int(raw: bytes | None) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        return 0  # damaged by hand: start from now


class UnreadableTrigger(Trigger):
    """Stands in for a stored trigger this process cannot read, so listings still show the
    schedule (marked) instead of failing as a whole; it has no occurrences."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def next_after(self, t: datetime) -> datetime | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "unreadable", "reason": self.reason}

    def describe(self) -> str:
        return f"<unreadable trigger: {self.reason}>"

    def _key(self) -> tuple[Any, ...]:
        return ("unreadable", self.reason)


PAYLOAD = frozenset({b"payload"})  # what a listing leaves in Redis (client/fields.py)


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    trigger: Trigger
    task: str
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    catchup: str
    max_catchup: int
    miss_tolerance_s: float
    lateness_s: float
    overlap: str
    jitter_s: float
    owner: str | None
    paused: bool
    pause_note: str | None
    version: int
    next_fire: datetime | None
    last_occurrence: datetime | None
    skipped_count: int
    missed_count: int
    materialized_count: int
    created: datetime | None
    updated: datetime | None
    # set aside by the evaluator, with the reason (registering the schedule again clears it)
    quarantined: str | None = None
    tenant: str | None = None  # given to every run it creates
    problem: str | None = None  # what this process could not read in the stored record
    stagger_s: float | None = None  # its own stagger; None: the namespace policy
    calendar: str | None = None  # its business calendar's name (common/time/calendar.py)
    on_excluded: str = "skip"  # an occurrence on an excluded day: skip, next, previous
    excluded_count: int = 0  # occurrences its calendar excluded (also in skipped_count)
    # pause_after_failures, start_ms, end_ms, max_runs (0: none) and their state: fail_streak,
    # auto_paused, runs_made, ended (common/schedules.py guardrail_state)
    guardrails: dict[str, int | str] = field(default_factory=dict)

    @classmethod
    def decode(cls, h: dict[bytes, bytes]) -> ScheduleInfo:
        """Every field read defensively: one record damaged by hand shows as damaged (in
        `problem`) rather than failing a whole listing."""
        problems: list[str] = []

        def s(k: str) -> str:
            return h.get(k.encode(), b"").decode(errors="replace")

        def i(k: str) -> int:
            try:
                return int(s(k) or 0)
            except ValueError:
                problems.append(f"{k} {s(k)!r} is not a number")
                return 0

        try:
            args, kwargs = unpack_payload(h.get(b"payload"))
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            args, kwargs = [f"<unreadable payload: {exc!r}>"], {}
            problems.append("payload unreadable")
        trigger: Trigger
        try:
            trigger = trigger_from_fields({k: s(k) or None for k in TRIGGER_FIELDS})
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            trigger = UnreadableTrigger(f"{type(exc).__name__}: {exc}")
            problems.append(f"trigger unreadable ({exc})")
        info = cls(
            name=s("name"), trigger=trigger, task=s("task"),
            queue=s("queue"), args=args, kwargs=kwargs, catchup=s("catchup"),
            max_catchup=i("max_catchup"),
            miss_tolerance_s=int(s("miss_tolerance_ms") or MISS_TOLERANCE_MS) / 1000,
            lateness_s=i("lateness_ms") / 1000,
            overlap=s("overlap"), jitter_s=i("jitter_ms") / 1000, owner=s("owner") or None,
            paused=s("paused") == "1", pause_note=s("pause_note") or None, version=i("version"),
            next_fire=stored_ms(s("next_ms") or None), last_occurrence=stored_ms(s("last_ms") or None),
            skipped_count=i("skipped_count"), missed_count=i("missed_count"),
            materialized_count=i("materialized_count"),
            created=stored_ms(s("created") or None), updated=stored_ms(s("updated") or None),
            quarantined=s("quarantined") or None, tenant=s("tenant") or None,
            stagger_s=None if (st := stored_stagger(h.get(b"stagger_ms"))) is None else st / 1000,
            calendar=s("calendar") or None, on_excluded=s("on_excluded") or "skip",
            excluded_count=i("excluded_count"),
            guardrails=guardrail_state(h),
        )
        if s("next_ms") and info.next_fire is None:
            problems.append(f"next_ms {s('next_ms')!r} is not a time")
        return replace(info, problem="; ".join(problems) or None) if problems else info


class ScheduleStore:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url
        self.scripts = Scripts(client)

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        with translated(self.url):
            return fn(*args, **kw)

    def _replies(self, pipe: Any, empty: Any) -> builtins.list[Any]:
        """A reading pipeline's replies, a key of the wrong type (damaged by hand; the
        evaluator quarantines its schedule, `doctor` names it) read as `empty`: one damaged
        schedule key must not fail a listing of all of them."""
        out = []
        for res in self._call(pipe.execute, raise_on_error=False):
            if isinstance(res, redis.ResponseError) and str(res).startswith("WRONGTYPE"):
                res = empty
            elif isinstance(res, Exception):
                self._call(_reraise, res)
            out.append(res)
        return out

    def _where(self, name: str) -> tuple[int, str]:
        check_name("schedule name", name)
        p = self.keys.partition_of_schedule(name)
        return p, self.keys.sched(p, name)

    # -- the namespace's stagger policy ---------------------------------------------------
    def stagger_policy(self) -> int:
        """The default stagger (ms) of schedules registered without their own (0: none)."""
        policy: int = self._call(read_stagger_policy, self.client, self.keys)
        return policy

    def set_stagger_policy(self, stagger_ms: int) -> None:
        """Set (0: clear) the default stagger; evaluators apply it within seconds."""
        if stagger_ms:
            self._call(self.client.hset, self.keys.meta, POLICY_STAGGER, stagger_ms)
        else:
            self._call(self.client.hdel, self.keys.meta, POLICY_STAGGER)

    # -- definition ---------------------------------------------------------------------
    def upsert(self, d: ScheduleDef, paused: bool = False) -> tuple[str, int]:
        """→ ('created' | 'updated' | 'unchanged', version)."""
        return self.upsert_many([d], paused)[0]

    def upsert_many(self, defs: list[ScheduleDef], paused: bool = False) -> list[tuple[str, int]]:
        """Pipelined upserts: one round trip reads every current version, one writes all
        changed definitions (compare-and-set on the version; a lost race is redone)."""
        out: dict[int, tuple[str, int]] = {}
        todo = list(range(len(defs)))
        for _ in range(10):
            if not todo:
                break
            where = [self._where(defs[i].name) for i in todo]
            raw = self._raw_records([defs[i].name for i in todo])
            pipe = self.client.pipeline(transaction=False)
            for (p, _key), i in zip(where, todo, strict=True):
                pipe.zscore(self.keys.sched_due(p), defs[i].name)
            indexed = [s is not None for s in self._replies(pipe, None)]
            now = self._call(server_time_ms, self.client)
            pipe = self.client.pipeline(transaction=False)
            sent = []
            for i, (p, _key), (side, packed), listed in zip(todo, where, raw, indexed, strict=True):
                d = defs[i]
                m = merged_record(d.name, side, packed)
                version, quarantined = _int(m.get(b"version")), m.get(b"quarantined")
                fields = d.fields()
                if packed is not None:  # the packed layout: its definition compared
                    try:
                        same = same_definition(unpack_record(packed), d.name, fields, side)
                    except ValueError:
                        same = False  # undecodable: replaced
                    if version and same and not quarantined and listed:
                        out[i] = ("unchanged", version)
                        continue
                    # out of its due index (a scheduler of the previous version, meeting a
                    # record it cannot read, drops it from there): put back, version kept
                    keep = bool(version and same and not quarantined)
                else:  # written before it: the same definition is converted, version kept
                    stored_hash = m.get(b"def_hash")
                    keep = bool(version and stored_hash and stored_hash.decode() == d.def_hash()
                                and not quarantined)
                stored = [m.get(f.encode()) for f in CURSOR_FIELDS]
                if keep:  # a conversion: the cursor stays exactly where it is
                    cursor: int | None = _int(stored[0]) if stored[0] else None
                else:
                    # the next occurrence after the newest one that already has a run (or now)
                    cursor = first_cursor(d, max(now, _int(m.get(b"last_ms"))),  # start/end
                                          self.calendared(d.trigger, d.calendar, d.on_excluded))
                    # the same trigger (and no calendar, whose edits the evaluator re-plans):
                    # occurrences not yet evaluated stay due
                    if not quarantined and not d.calendar:
                        cursor = kept_cursor(d, stored, cursor)
                keys, args = tr.schedule_upsert(self.keys, p, d.name, pack_definition(d.name, fields),
                                                version, cursor, paused, keep)
                self.scripts.schedule_upsert(keys=keys, args=args, client=pipe)
                sent.append(i)
            todo = []
            for i, res in zip(sent, self._call(pipe.execute) if sent else [], strict=True):
                status, written = tr.status_detail(res)
                if status == "conflict":
                    todo.append(i)
                else:
                    out[i] = (status, int(written))
        if todo:
            raise DuetimeError(f"schedule {defs[todo[0]].name!r} kept changing under us; try again")
        return [out[i] for i in range(len(defs))]

    def legacy_names(self) -> builtins.list[str]:
        """Schedules whose record is still in the layout before the packed one (their index,
        `T:schedules`, lists them until they are converted)."""
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.zrange(self.keys.schedules(p), 0, -1)
        return sorted({n.decode(errors="replace") for names in self._replies(pipe, [])
                       for n in names})

    def migrate(self, dry_run: bool = False, progress: Callable[[int], None] | None = None
                ) -> dict[str, int]:
        """Convert every schedule of the layout before the packed record in place (the same
        definition, version, cursor, counters and pause; docs/keys.md), in chunks, each one a
        compare-and-set on its version (a schedule changed meanwhile is converted by that
        change). Quarantined ones are left for the registration that fixes them. → counts:
        old, converted, quarantined (left), gone (deleted meanwhile)."""
        names = self.legacy_names()
        counts = {"old": 0, "converted": 0, "quarantined": 0, "gone": 0}
        for i in range(0, len(names), BACKFILL_CHUNK):
            chunk = names[i : i + BACKFILL_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            sent = 0
            for name, (side, packed) in zip(chunk, self._raw_records(chunk), strict=True):
                p = self.keys.partition_of_schedule(name)
                if packed is not None or not side.get(b"version"):
                    # converted meanwhile (an upsert), or an index entry without a record
                    counts["gone"] += packed is None
                    if not dry_run:
                        pipe.zrem(self.keys.schedules(p), name)
                    continue
                counts["old"] += 1
                if side.get(b"quarantined"):
                    counts["quarantined"] += 1
                    continue
                flat = {k.decode(errors="replace"): v for k, v in side.items()}
                nxt = side.get(b"next_ms")
                keys, args = tr.schedule_upsert(
                    self.keys, p, name, pack_definition(name, flat), side[b"version"].decode(),
                    _int(nxt) if nxt else None, False, keep=True)
                if not dry_run:
                    self.scripts.schedule_upsert(keys=keys, args=args, client=pipe)
                sent += 1
            if not dry_run and len(pipe):
                for res in self._call(pipe.execute):
                    if isinstance(res, builtins.list) and tr.status_detail(res)[0] != "conflict":
                        counts["converted"] += 1
            elif dry_run:
                counts["converted"] += sent
            if progress:
                progress(len(chunk))
        return counts

    def get(self, name: str, payload: bool = True) -> ScheduleInfo:
        """One schedule; `payload=False` leaves its payload in Redis (args/kwargs empty)."""
        self._where(name)
        h = self.records([name], payload)[0]
        if not h:
            raise ScheduleNotFound(f"no schedule {name!r} in namespace {self.keys.namespace!r}")
        return ScheduleInfo.decode(h)

    def _raw_records(self, names: builtins.list[str], payload: bool = True
                     ) -> builtins.list[tuple[dict[bytes, bytes], bytes | None]]:
        """(side hash, packed record) of each schedule: both layouts (common/schedules.py);
        a key of the wrong type (damaged by hand) reads as absent. `payload=False` leaves a
        payload kept in a side hash in Redis (a long one; every one of the old layout)."""
        pipe = self.client.pipeline(transaction=False)
        for n in names:
            pipe.hget(self.keys.scheds(self.keys.partition_of_schedule(n)), n)
        packed = self._replies(pipe, None)
        keys = [self.keys.sched(self.keys.partition_of_schedule(n), n) for n in names]
        if payload:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            sides = [s or {} for s in self._replies(pipe, None)]
        else:
            sides = hashes_without(self.client, keys, PAYLOAD, self._exec)
        return list(zip(sides, packed, strict=True))

    def records(self, names: builtins.list[str], payload: bool = True
                ) -> builtins.list[dict[bytes, bytes]]:
        """Each schedule as the named fields of docs/keys.md, whichever layout holds it ({}:
        no such schedule); `payload=False`: without its payload."""
        out = []
        for n, (side, packed) in zip(names, self._raw_records(names, payload), strict=True):
            h = merged_record(n, side, packed) if side or packed is not None else {}
            if not payload:
                h.pop(b"payload", None)
            out.append(h)
        return out

    def names(self) -> Iterator[str]:
        """Every schedule: the packed records' names, and those written before that layout
        (their index, `T:schedules`), each once."""
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.hkeys(self.keys.scheds(p))
            pipe.zrange(self.keys.schedules(p), 0, -1)
        seen: set[bytes] = set()
        for names in self._replies(pipe, []):
            for n in names:
                if n not in seen:
                    seen.add(n)
                    yield n.decode(errors="replace")

    def list(self, payload: bool = True) -> list[ScheduleInfo]:
        """Every schedule by name; `payload=False` for a listing that does not show them."""
        names = sorted(self.names())
        out = []
        for i in range(0, len(names), 500):
            # names read from the index: no check, no refusal
            hashes = self.records(names[i : i + 500], payload)
            out += [ScheduleInfo.decode(h) for h in hashes if h]
        return out

    def _exec(self, pipe: Any) -> builtins.list[Any]:
        """A reading pipeline (HKEYS, HMGET): a damaged key reads as no fields."""
        return self._replies(pipe, [])

    def set_paused(self, name: str, paused: bool, note: str = "") -> None:
        p, _ = self._where(name)
        keys, args = tr.schedule_pause(self.keys, p, name, paused, note)
        res = self._call(self.scripts.schedule_pause, keys=keys, args=args)
        if tr.status(res) == b"missing":
            raise ScheduleNotFound(f"no schedule {name!r}")

    def delete(self, name: str) -> None:
        p, _ = self._where(name)
        keys, args = tr.schedule_delete(self.keys, p, name)
        if not tr.counts(self._call(self.scripts.schedule_delete, keys=keys, args=args))[0]:
            raise ScheduleNotFound(f"no schedule {name!r}")

    # -- runs outside the evaluator ------------------------------------------------------
    def _create(self, name: str, runs: builtins.list[tuple[str, int]],
                intervals: builtins.list[int] | None = None, queue: str | None = None) -> int:
        """Create runs (id, occurrence ms), due at their occurrence, without compare-and-set;
        `intervals`: each one's data interval start ms (0: none)."""
        if queue is None:
            queue = self.get(name, payload=False).queue
        p, _ = self._where(name)
        flat: list[Any] = []
        for run_id, occ in runs:
            flat += [run_id, occ, occ, 1, occ]
        keys, args = tr.materialize(self.keys, p, name, queue, flat, intervals=intervals)
        status, created = tr.status_detail(
            self._call(self.scripts.materialize, keys=keys, args=args))
        if status == "missing":
            raise ScheduleNotFound(f"no schedule {name!r}")
        return int(created)

    def calendared(self, trigger: Trigger, calendar: str | None, on_excluded: str) -> Trigger:
        """`trigger` with its business calendar applied (itself without one). A calendar
        that is not stored (yet) applies none here; the evaluator quarantines such a schedule."""
        if not calendar:
            return trigger
        from duetime.common.time.calendar import Calendar, Calendared

        raw = self._call(self.client.hgetall, self.keys.calendar(calendar))
        if not raw:
            return trigger
        cal = Calendar.from_fields(calendar, {k.decode(): v.decode(errors="replace")
                                              for k, v in raw.items()})
        return Calendared(trigger, cal, on_excluded)

    def effective_trigger(self, info: ScheduleInfo) -> Trigger:
        """The instants a schedule fires at: its trigger with its calendar applied."""
        return self.calendared(info.trigger, info.calendar, info.on_excluded)

    def trigger(self, name: str) -> str:
        """Run the schedule now, outside its trigger (the id marks it as manual: `@m`)."""
        now = self._call(server_time_ms, self.client)
        run_id = f"{name}@m{now}"
        self._create(name, [(run_id, now)])
        return run_id

    def backfill_intervals(self, name: str, start: datetime | str, end: datetime | str
                           ) -> builtins.list[tuple[int, int]]:
        """The (interval start ms, occurrence ms) of every occurrence in [start, end], its
        calendar applied, ascending: what `backfill` creates, and its dry run lists."""
        from duetime.common.time.calendar import previous_before

        start = parse_instant(start, what="backfill start")
        end = parse_instant(end, what="backfill end")
        if end < start:
            raise InvalidInput("backfill: --to is before --from")
        trigger = self.effective_trigger(self.get(name, payload=False))
        occs = [to_ms(o, ceil=True) for o in trigger.occurrences(start - timedelta(microseconds=1), end)]
        if not occs:
            return []
        first = previous_before(trigger, from_ms(occs[0]))
        starts = [0 if first is None else to_ms(first, ceil=True), *occs[:-1]]
        return list(zip(starts, occs, strict=True))

    def backfill(self, name: str, start: datetime | str, end: datetime | str,
                 progress: Callable[[int], None] | None = None) -> tuple[int, int]:
        """Runs for every occurrence in [start, end] (aware datetimes or ISO-8601 strings,
        1970..9999), in order, each with its data interval (the previous occurrence to its
        own, calendar applied); existing ones are not created again (their ids are derived
        from the occurrence). → (occurrences, runs created)."""
        intervals = self.backfill_intervals(name, start, end)
        queue = self.get(name, payload=False).queue
        created = 0
        for i in range(0, len(intervals), BACKFILL_CHUNK):
            chunk = intervals[i : i + BACKFILL_CHUNK]
            created += self._create(name, [(run_id_for(name, o), o) for _, o in chunk],
                                    [s for s, _ in chunk], queue)
            if progress:
                progress(len(chunk))
        return len(intervals), created
