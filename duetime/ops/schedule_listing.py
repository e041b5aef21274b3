"""Schedules as operators list and lint them: the surge profile's reader (`duetime schedule
lint`, `doctor`), the console's pages of schedules and its occurrence lookups. Read-only; the
producer side (upsert, pause, delete, backfill) is duetime/client/schedules.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from duetime.client.schedules import ScheduleInfo, ScheduleStore
from duetime.common.errors import InvalidInput
from duetime.common.schedules import (
    TRIGGER_FIELDS,
    record_fields,
    run_id_for,
    stored_stagger,
    trigger_from_fields,
)
from duetime.common.time.spec import Trigger
from duetime.ops.inspect import Position, keyset_merge
from duetime.ops.surge import H_ITEM, LintSchedule

# -- the surge profile (`duetime schedule lint`) ----------------------------------------------
LINT_FIELDS = ("paused", "quarantined", "jitter_ms", "stagger_ms", *TRIGGER_FIELDS)
LINT_CHUNK = 1000
_SEED = TRIGGER_FIELDS.index("t.seed")
_EXPR = TRIGGER_FIELDS.index("t.expr")


def lint_schedules(store: ScheduleStore, progress: Callable[[int], None] | None = None
                   ) -> tuple[list[LintSchedule], int, int]:
    """The active schedules as the surge profile needs them, read in pipelined chunks (only
    the fields it uses; `progress(n)` per chunk) → (schedules, paused or quarantined,
    unreadable). A trigger is parsed once per distinct definition: schedules whose cron has
    no `H` share one parse whatever their seed."""
    k = store.keys
    names = sorted(store.names())
    parsed: dict[tuple[Any, ...], Trigger | None] = {}
    out: list[LintSchedule] = []
    inactive = unreadable = 0
    for i in range(0, len(names), LINT_CHUNK):
        chunk = names[i : i + LINT_CHUNK]
        pipe = store.client.pipeline(transaction=False)
        for n in chunk:
            p = k.partition_of_schedule(n)
            pipe.hmget(k.sched(p, n), *LINT_FIELDS)
            pipe.hget(k.scheds(p), n)  # the packed record (both layouts read)
        res = store._replies(pipe, None)
        rows = [record_fields(n, LINT_FIELDS, side or [None] * len(LINT_FIELDS), packed)
                for n, side, packed in zip(chunk, res[::2], res[1::2], strict=True)]
        for n, values in zip(chunk, rows, strict=True):
            paused, quarantined, jitter, stagger, *raw = values
            if paused == b"1" or quarantined:
                inactive += 1
                continue
            expr = raw[_EXPR] or b""
            key = tuple(raw if H_ITEM.search(expr.decode(errors="replace"))
                        else raw[:_SEED] + [None] + raw[_SEED + 1:])
            if key not in parsed:
                try:
                    parsed[key] = trigger_from_fields(list(key))
                except Exception:  # noqa: BLE001 - counted; `schedule list` shows why
                    parsed[key] = None
            trigger = parsed[key]
            if trigger is None:
                unreadable += 1
                continue
            try:
                jitter_ms = max(0, int(jitter or 0))
            except ValueError:
                jitter_ms = 0
            out.append(LintSchedule(n, trigger, jitter_ms, stored_stagger(stagger)))
        if progress:
            progress(len(chunk))
    return out, inactive, unreadable


# -- pages and occurrence lookups (the web console) -----------------------------------------
# every schedule is in its partition's due index (paused, ended and quarantined ones at +inf,
# by name); `created` is the same listing under the name pages and links used before the
# packed layout dropped the creation index (docs/keys.md)
SCHEDULE_ORDERS = {"next": "sched_due", "created": "sched_due"}
OCCURRENCE_FIELDS = ("state", "due", "started", "finished", "attempt", "coalesced",
                     "coalesced_from", "reason", "error")


def page_schedules(store: ScheduleStore, order: str = "created", after: Position | None = None,
                   limit: int = 50) -> tuple[list[ScheduleInfo], Position | None]:
    """One page of schedules, soonest next fire first (paused, ended and quarantined ones
    after, by name), from the partitions' due indexes by score, so any page of 100,000
    schedules costs what the first costs. Schedules written before the packed layout that
    are paused or ended appear once converted (their next upsert, `duetime schedule
    migrate`); `duetime schedule list` shows them meanwhile."""
    if order not in SCHEDULE_ORDERS:
        raise InvalidInput(f"order must be one of {', '.join(SCHEDULE_ORDERS)}; got {order!r}")
    if after is not None and after.group != order:
        raise InvalidInput(f"page position {after.encode()!r} does not belong to this listing")
    k = store.keys
    index = getattr(k, SCHEDULE_ORDERS[order])
    zkeys = [index(p) for p in range(k.partitions)]
    bound = (after.score, after.member) if after else None
    names: list[tuple[str, float]] = []
    for name, score in keyset_merge(store.client, store.url, zkeys, False, bound,
                                    min(limit + 1, 500)):
        names.append((name, score))
        if len(names) > limit:
            break
    more = len(names) > limit
    names = names[:limit]
    hashes = store.records([n for n, _ in names], payload=False)  # the page shows none
    infos = [ScheduleInfo.decode(h) for h in hashes if h]
    nxt = Position(order, names[-1][1], names[-1][0]) if more and names else None
    return infos, nxt


def occurrence_runs(store: ScheduleStore, name: str, occurrences_ms: list[int]
                    ) -> dict[int, dict[str, str] | None]:
    """The runs of given occurrences of a schedule, by their derived ids (`<name>@<ms>`): one
    pipelined HMGET each, no listing. None where no run exists (never created, or removed by
    retention)."""
    p, _ = store._where(name)
    pipe = store.client.pipeline(transaction=False)
    for o in occurrences_ms:
        pipe.hmget(store.keys.run(p, run_id_for(name, o)), *OCCURRENCE_FIELDS)
    out: dict[int, dict[str, str] | None] = {}
    for o, values in zip(occurrences_ms, store._call(pipe.execute), strict=True):
        out[o] = None if values[0] is None else {
            f: v.decode(errors="replace") for f, v in zip(OCCURRENCE_FIELDS, values, strict=True) if v}
    return out


def oldest_finished_ms(store: ScheduleStore, name: str) -> int | None:
    """The finish time of the oldest run the schedule's partition still keeps: a run that
    finished before it may have been removed by retention."""
    p, _ = store._where(name)
    head = store._call(store.client.zrange, store.keys.done(p), 0, 0, withscores=True)
    return int(head[0][1]) if head else None
