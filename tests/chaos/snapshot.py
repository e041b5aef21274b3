"""A read of everything a namespace holds about its runs and schedules, for the checker: every
run record (found by SCAN, not through an index, so a run missing from every index is still
found), its attempt history, and every index set."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis
from duetime.common.connection import server_time_ms
from duetime.common.keys import Keyspace
from duetime.common.schedules import merged_record

INDEXES = ("leases", "dead", "uncertain", "done", "deadlines")


@dataclass
class Entry:
    """One attempt-history entry (docs/keys.md), times in epoch seconds."""

    n: int
    fence: int
    worker: str
    start: float | None
    end: float | None
    outcome: str
    error: str
    late: bool
    late_outcome: str

    @classmethod
    def decode(cls, raw: bytes) -> Entry:
        a = json.loads(raw)
        return cls(int(a.get("n", 0)), int(a.get("fence", 0)), a.get("worker", ""),
                   a["start"] / 1000 if a.get("start") else None,
                   a["end"] / 1000 if a.get("end") else None, a.get("outcome", ""),
                   a.get("error") or "", bool(a.get("late")), a.get("late_outcome") or "")


def with_inline(entries: list[Entry], f: dict[str, str]) -> list[Entry]:
    """The history as docs/keys.md defines it: the attempt that succeeded a run is inline in
    its hash (namespace format 2) unless an entry of its fence was pushed."""
    fence = int(f.get("fence") or 0)
    if f.get("state") != "succeeded" or fence <= 0 or any(e.fence == fence for e in entries):
        return entries
    ms = [int(f[x]) / 1000 if f.get(x) else None for x in ("started", "finished")]
    return [*entries, Entry(int(f.get("attempt") or 0), fence, f.get("worker", ""), ms[0], ms[1],
                            "succeeded", "", False, "")]


@dataclass
class Record:
    id: str
    partition: int
    f: dict[str, str]  # the run hash, payload left out
    attempts: list[Entry]

    @property
    def state(self) -> str:
        return self.f.get("state", "")

    @property
    def task(self) -> str:
        return self.f.get("task", "")

    @property
    def queue(self) -> str:
        return self.f.get("queue", "")

    @property
    def schedule(self) -> str:
        return self.f.get("schedule", "")

    def ms(self, name: str) -> float | None:
        v = self.f.get(name)
        try:
            return int(v) / 1000 if v else None
        except ValueError:
            return None

    def entry(self, fence: int) -> Entry | None:
        """The attempt entry of the claim with this fence."""
        for e in self.attempts:
            if e.fence == fence:
                return e
        return None


@dataclass
class Snapshot:
    now: float
    runs: dict[str, Record]
    # index name -> run id -> score; 'due:<q>' and 'retry:<q>' per queue, the others as named
    index: dict[str, dict[str, float]] = field(default_factory=dict)
    schedules: dict[str, dict[str, str]] = field(default_factory=dict)

    def member(self, name: str, run_id: str) -> bool:
        return run_id in self.index.get(name, {})


def _s(b: Any) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else str(b)


def take(client: redis.Redis, keys: Keyspace, queues: list[str]) -> Snapshot:
    runs: dict[str, Record] = {}
    index: dict[str, dict[str, float]] = {}
    schedules: dict[str, dict[str, str]] = {}
    for p in range(keys.partitions):
        prefix = keys.prefix(p)
        pattern = prefix.replace("[", "\\[") + "*"
        run_keys, sched_keys = [], []
        run_tag, sched_tag = keys.run(p, ""), keys.sched(p, "")
        for k in client.scan_iter(match=pattern, count=1000):
            ks = _s(k)
            if ks.startswith(run_tag):
                run_keys.append(ks)
            elif ks.startswith(sched_tag):
                sched_keys.append(ks)
        pipe = client.pipeline(transaction=False)
        for k in run_keys:
            pipe.hgetall(k)
            pipe.lrange(keys.attempts(p, k[len(run_tag):]), 0, -1)
        for k in sched_keys:
            pipe.hgetall(k)
        pipe.hgetall(keys.scheds(p))  # the packed records (docs/keys.md)
        for name in INDEXES:
            pipe.zrange(getattr(keys, name)(p), 0, -1, withscores=True)
        for q in queues:
            pipe.zrange(keys.due(p, q), 0, -1, withscores=True)
            pipe.zrange(keys.retry(p, q), 0, -1, withscores=True)
        res = pipe.execute()
        i = 0
        for k in run_keys:
            h, att = res[i], res[i + 1]
            i += 2
            rid = k[len(run_tag):]
            f = {_s(a): _s(b) for a, b in h.items() if a != b"payload"}
            runs[rid] = Record(rid, p, f, with_inline([Entry.decode(x) for x in att], f))
        sides = {k[len(sched_tag):]: res[i + j] for j, k in enumerate(sched_keys)}
        i += len(sched_keys)
        packed = {_s(n): v for n, v in res[i].items()}
        i += 1
        for n in set(sides) | set(packed):
            rec = merged_record(n, sides.get(n), packed.get(n))
            schedules[n] = {_s(a): _s(b) for a, b in rec.items() if a != b"payload"}
        for name in INDEXES:
            index.setdefault(name, {}).update({_s(m): s for m, s in res[i]})
            i += 1
        for q in queues:
            index.setdefault(f"due:{q}", {}).update({_s(m): s for m, s in res[i]})
            index.setdefault(f"retry:{q}", {}).update({_s(m): s for m, s in res[i + 1]})
            i += 2
    return Snapshot(server_time_ms(client) / 1000, runs, index, schedules)
