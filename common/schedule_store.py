"""The client side of schedules: upsert, pause/resume, delete, trigger-now, backfill, list."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from duetime.common.codec import unpack_payload
from duetime.common.connection import server_time_ms, translated
from duetime.common.errors import DuetimeError, InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.models import from_ms as stored_ms
from duetime.common.names import check_name
from duetime.common.schedules import (
    MISS_TOLERANCE_MS,
    TRIGGER_FIELDS,
    ScheduleDef,
    run_id_for,
    trigger_from_fields,
)
from duetime.common.scripts import Scripts
from duetime.common.timeparse import from_ms, parse_instant, to_ms
from duetime.common.timespec import Trigger

BACKFILL_CHUNK = 500


class ScheduleNotFound(DuetimeError, LookupError):
    pass


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

    @classmethod
    def decode(cls, h: dict[bytes, bytes]) -> ScheduleInfo:
        def s(k: str) -> str:
            return h.get(k.encode(), b"").decode()

        def i(k: str) -> int:
            return int(s(k) or 0)

        args, kwargs = unpack_payload(h.get(b"payload"))
        return cls(
            name=s("name"), trigger=trigger_from_fields({k: s(k) or None for k in TRIGGER_FIELDS}),
            task=s("task"),
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
        )


class ScheduleStore:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url
        self.scripts = Scripts(client)

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        with translated(self.url):
            return fn(*args, **kw)

    def _where(self, name: str) -> tuple[int, str]:
        check_name("schedule name", name)
        p = self.keys.partition_of_schedule(name)
        return p, self.keys.sched(p, name)

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
            pipe = self.client.pipeline(transaction=False)
            for _, key in where:
                pipe.hmget(key, "version", "last_ms", "def_hash")
            current = self._call(pipe.execute)
            now = self._call(server_time_ms, self.client)
            pipe = self.client.pipeline(transaction=False)
            sent = []
            for i, (p, key), (version, last, stored_hash) in zip(todo, where, current, strict=True):
                d, version = defs[i], int(version or 0)
                def_hash = d.def_hash()
                if version and stored_hash and stored_hash.decode() == def_hash:
                    out[i] = ("unchanged", version)
                    continue
                # the next occurrence after the newest one that already has a run (or now)
                nxt = d.trigger.next_after(from_ms(max(now, int(last or 0))))
                flat: list[Any] = []
                for k, v in d.fields().items():
                    flat += [k, v]
                self.scripts.schedule_upsert(
                    keys=[key, self.keys.sched_due(p), self.keys.schedules(p)],
                    args=[d.name, def_hash, version, "" if nxt is None else to_ms(nxt, ceil=True),
                          int(paused), *flat],
                    client=pipe)
                sent.append(i)
            todo = []
            for i, (status, version) in zip(sent, self._call(pipe.execute) if sent else [],
                                             strict=True):
                if status == b"conflict":
                    todo.append(i)
                else:
                    out[i] = (status.decode(), int(version))
        if todo:
            raise DuetimeError(f"schedule {defs[todo[0]].name!r} kept changing under us; try again")
        return [out[i] for i in range(len(defs))]

    def get(self, name: str) -> ScheduleInfo:
        _, key = self._where(name)
        h = self._call(self.client.hgetall, key)
        if not h:
            raise ScheduleNotFound(f"no schedule {name!r} in namespace {self.keys.namespace!r}")
        return ScheduleInfo.decode(h)

    def names(self) -> Iterator[str]:
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.zrange(self.keys.schedules(p), 0, -1)
        for names in self._call(pipe.execute):
            for n in names:
                yield n.decode()

    def list(self) -> list[ScheduleInfo]:
        names = sorted(self.names())
        out = []
        for i in range(0, len(names), 500):
            pipe = self.client.pipeline(transaction=False)
            for n in names[i : i + 500]:
                pipe.hgetall(self._where(n)[1])
            out += [ScheduleInfo.decode(h) for h in self._call(pipe.execute) if h]
        return out

    def set_paused(self, name: str, paused: bool, note: str = "") -> None:
        p, key = self._where(name)
        res = self._call(self.scripts.schedule_pause, keys=[key, self.keys.sched_due(p)],
                         args=[name, int(paused), note])
        if res == b"missing":
            raise ScheduleNotFound(f"no schedule {name!r}")

    def delete(self, name: str) -> None:
        p, key = self._where(name)
        if not self._call(self.scripts.schedule_delete,
                          keys=[key, self.keys.sched_due(p), self.keys.schedules(p)], args=[name]):
            raise ScheduleNotFound(f"no schedule {name!r}")

    # -- runs outside the evaluator ------------------------------------------------------
    def _create(self, name: str, runs: list[tuple[str, int]]) -> int:
        """Create runs (id, occurrence ms), due at their occurrence, without compare-and-set."""
        info = self.get(name)
        p, key = self._where(name)
        k = self.keys
        flat: list[Any] = []
        for run_id, occ in runs:
            flat += [run_id, occ, occ, 1, occ]
        status, created = self._call(
            self.scripts.materialize,
            keys=[key, k.sched_due(p), k.due(p, info.queue), k.deadlines(p), k.events(p)],
            args=[k.prefix(p) + "run:", name, "", "", "", 0, k.wake_channel, f"{p}|{info.queue}",
                  *flat])
        if status == b"missing":
            raise ScheduleNotFound(f"no schedule {name!r}")
        return int(created)

    def trigger(self, name: str) -> str:
        """Run the schedule now, outside its trigger (the id marks it as manual: `@m`)."""
        now = self._call(server_time_ms, self.client)
        run_id = f"{name}@m{now}"
        self._create(name, [(run_id, now)])
        return run_id

    def backfill(self, name: str, start: datetime | str, end: datetime | str,
                 progress: Callable[[int], None] | None = None) -> tuple[int, int]:
        """Runs for every occurrence in [start, end] (aware datetimes or ISO-8601 strings,
        1970..9999); existing ones are not created again. → (occurrences, runs created)."""
        start = parse_instant(start, what="backfill start")
        end = parse_instant(end, what="backfill end")
        if end < start:
            raise InvalidInput("backfill: --to is before --from")
        trigger = self.get(name).trigger
        occs = [to_ms(o, ceil=True) for o in trigger.occurrences(start - timedelta(microseconds=1), end)]
        created = 0
        for i in range(0, len(occs), BACKFILL_CHUNK):
            chunk = occs[i : i + BACKFILL_CHUNK]
            created += self._create(name, [(run_id_for(name, o), o) for o in chunk])
            if progress:
                progress(len(chunk))
        return len(occs), created
