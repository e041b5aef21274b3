"""Read-only views of a namespace for operators: run listings, leases, workers, queue stats.

Everything is read from the partition indexes (`T:due:<q>`, `T:retry:<q>`, `T:leases`,
`T:dead`, `T:uncertain`, `T:done`) with pipelines — never KEYS/SCAN over run keys — so a
listing costs O(partitions × queues + runs examined), whatever the size of the keyspace.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import redis

from duetime.client.fields import LARGE, hashes_without
from duetime.client.runs import decode_read_run, read_run
from duetime.common.connection import translated
from duetime.common.errors import InvalidInput
from duetime.common.models import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    DEFAULT_QUEUE_B,
    STATES,
    Run,
    from_ms,
)
from duetime.common.names import check_name
from duetime.common.overview import (  # noqa: F401 - re-exported for listings' users
    NamespaceReader,
    Overview,
    QueueStats,
    SchedulerInfo,
    WorkerInfo,
)

SUMMARY_FIELDS = (
    "state", "task", "queue", "schedule", "due", "created", "started", "finished",
    "attempt", "max_attempts", "worker", "error", "reason", "owner", "retry_at", "replay_of",
    "replayed_by", "cancel_requested", "tenant",
)
# Listing order: what needs attention or is about to happen first, then finished runs.
# (index, states it holds, newest first?)
GROUPS: tuple[tuple[str, frozenset[str], bool], ...] = (
    ("leases", frozenset({"running"}), False),
    ("retry", frozenset({"retrying"}), False),
    ("due", frozenset({"scheduled"}), False),
    ("waiting", frozenset({"waiting"}), False),
    ("uncertain", frozenset({"uncertain"}), True),
    ("dead", frozenset({"dead"}), True),
    ("done", frozenset({"succeeded", "cancelled", "skipped", "missed", "dead"}), True),
)
STATE_INDEX = {"running": "leases", "retrying": "retry", "scheduled": "due", "waiting": "waiting",
               "uncertain": "uncertain",
               "dead": "dead", "succeeded": "done", "cancelled": "done", "skipped": "done",
               "missed": "done"}
READ_BATCH = 200


@dataclass(frozen=True)
class RunSummary:
    """A run as listings show it: the record's plain fields, never the payload."""

    id: str
    state: str
    task: str
    queue: str
    schedule: str | None
    due: datetime | None
    created: datetime | None
    started: datetime | None
    finished: datetime | None
    attempt: int
    max_attempts: int
    worker: str | None
    error: str | None
    reason: str | None
    owner: str | None
    retry_at: datetime | None
    replay_of: str | None
    replayed_by: str | None
    cancel_requested: bool
    tenant: str | None = None

    @classmethod
    def decode(cls, run_id: str, values: list[bytes | None]) -> RunSummary:
        """Absent fields hold their defaults (see lua/enqueue.lua); the id is the key's. A
        record damaged by hand still decodes (text replaced, numbers defaulted): one bad
        record must not fail a listing."""
        v = dict(zip(SUMMARY_FIELDS, (x.decode(errors="replace") if x else None for x in values),
                     strict=True))

        def n(name: str, default: int) -> int:
            try:
                return int(v[name] or default)
            except ValueError:
                return default

        err = v["error"]
        return cls(
            id=run_id, state=v["state"] or "", task=v["task"] or "", queue=v["queue"] or DEFAULT_QUEUE,
            schedule=v["schedule"], due=from_ms(v["due"]), created=from_ms(v["created"] or v["due"]),
            started=from_ms(v["started"]), finished=from_ms(v["finished"]),
            attempt=n("attempt", 0), max_attempts=n("max_attempts", DEFAULT_MAX_ATTEMPTS),
            worker=v["worker"], error=err.splitlines()[0] if err else None, reason=v["reason"],
            owner=v["owner"], retry_at=from_ms(v["retry_at"]), replay_of=v["replay_of"],
            replayed_by=v["replayed_by"], cancel_requested=v["cancel_requested"] is not None,
            tenant=v["tenant"],
        )


@dataclass
class RunListing:
    runs: list[RunSummary]
    examined: int
    truncated: bool  # the scan budget ran out before `limit` runs matched


@dataclass(frozen=True)
class LeaseInfo:
    run_id: str
    task: str
    queue: str
    schedule: str | None
    worker: str | None  # the holder (the run's worker); None once the lease expired
    fence: int
    attempt: int
    lease_left_s: float | None  # None: the lease expired, the reaper will recover the run
    heartbeat: datetime | None
    heartbeat_age_s: float | None
    started: datetime | None
    running_s: float | None
    cancel_requested: bool


class Inspector(NamespaceReader):
    """Run listings, leases and pages of one namespace for operators, on top of the queue-level
    reader the scheduler uses."""

    # -- runs -------------------------------------------------------------------------
    def get_run(self, run_id: str, large: bool = True) -> Run:
        """One run with its attempt history (reads only; never writes the namespace's meta).
        `large=False` leaves its payload and result in Redis (args, kwargs, result empty),
        for a page that does not show them."""
        if large:
            with translated(self.url):
                return read_run(self.client, self.keys, run_id)
        check_name("run id", run_id)
        k = self.keys
        p = k.partition_of_run(run_id)
        h = hashes_without(self.client, [k.run(p, run_id)], LARGE, self._exec)[0]
        pipe = self.client.pipeline(transaction=False)
        pipe.lrange(k.attempts(p, run_id), 0, -1)
        pipe.zscore(k.leases(p), run_id)
        attempts, lease_expiry = self._exec(pipe)
        return decode_read_run(k, run_id, [h, attempts, lease_expiry])

    def _index_keys(self, index: str, parts: Iterable[int], queues: list[str]) -> list[str]:
        k = self.keys
        if index in ("due", "retry"):
            fn = k.due if index == "due" else k.retry
            return [fn(p, q) for p in parts for q in queues]
        return [getattr(k, index)(p) for p in parts]

    def _merged(self, zkeys: list[str], newest_first: bool, page: int) -> Iterator[tuple[str, float]]:
        """The members of several sorted sets in one score order, read page by page."""
        cursor = dict.fromkeys(zkeys, 0)
        more = dict.fromkeys(zkeys, True)
        bufs: dict[str, list[tuple[bytes, float]]] = {}

        def fetch(which: list[str]) -> None:
            pipe = self.client.pipeline(transaction=False)
            for key in which:
                start = cursor[key]
                if newest_first:
                    pipe.zrevrange(key, start, start + page - 1, withscores=True)
                else:
                    pipe.zrange(key, start, start + page - 1, withscores=True)
            for key, items in zip(which, self._exec(pipe), strict=True):
                cursor[key] += len(items)
                more[key] = len(items) == page
                bufs[key] = items

        heap: list[tuple[float, int, str]] = []
        sign = -1 if newest_first else 1
        fetch(zkeys)
        for i, key in enumerate(zkeys):
            if bufs[key]:
                heapq.heappush(heap, (sign * bufs[key][0][1], i, key))
        pos = dict.fromkeys(zkeys, 0)
        order = {key: i for i, key in enumerate(zkeys)}
        while heap:
            _, _, key = heapq.heappop(heap)
            member, score = bufs[key][pos[key]]
            yield member.decode(), score
            pos[key] += 1
            if pos[key] >= len(bufs[key]) and more[key]:
                fetch([key])
                pos[key] = 0
            if pos[key] < len(bufs[key]):
                heapq.heappush(heap, (sign * bufs[key][pos[key]][1], order[key], key))

    def _summaries(self, ids: list[str]) -> list[RunSummary | None]:
        pipe = self.client.pipeline(transaction=False)
        keys = [self.keys.run(self.keys.partition_of_run(run_id), run_id) for run_id in ids]
        for key in keys:
            pipe.hmget(key, *SUMMARY_FIELDS)
        out: list[RunSummary | None] = []
        for run_id, key, v in zip(ids, keys, self._exec(pipe), strict=True):
            if key in self.damaged:
                # its record key is not a hash: the reaper dead-lettered the id as found
                none: list[bytes | None] = [None] * len(SUMMARY_FIELDS)
                s = RunSummary.decode(run_id, none)
                out.append(dataclasses.replace(s, state="dead",
                                               reason=f"record key {key} is not a hash"))
            else:
                out.append(RunSummary.decode(run_id, v) if v[0] else None)
        return out

    def list_runs(self, state: str | None = None, schedule: str | None = None,
                  queue: str | None = None, limit: int = 50, budget: int = 100_000) -> RunListing:
        """Runs by index: running, retrying, scheduled (soonest first), then uncertain, dead and
        finished (newest first). `budget` caps the index entries examined (filters on finished
        runs may otherwise walk a whole retention window)."""
        if state is not None and state not in STATE_INDEX:
            raise InvalidInput(f"unknown state {state!r}; one of {', '.join(STATES)}")
        parts = ([self.keys.partition_of_schedule(schedule)] if schedule
                 else list(range(self.keys.partitions)))
        queues = [queue] if queue else self.queues()
        groups = [g for g in GROUPS if state is None or g[0] == STATE_INDEX[state]]
        out: list[RunSummary] = []
        seen: set[str] = set()
        examined = 0
        page = min(max(limit, 100), 1000)
        for index, states, newest_first in groups:
            wanted = {state} if state else states
            stream = self._merged(self._index_keys(index, parts, queues), newest_first, page)
            if index == "due" and schedule:
                stream = self._with_buffered(schedule, stream)
            batch: list[str] = []
            exhausted = False
            while len(out) < limit and not exhausted:
                batch.clear()
                for run_id, _ in stream:
                    examined += 1
                    if run_id in seen or (schedule and run_id.rsplit("@", 1)[0] != schedule):
                        continue
                    seen.add(run_id)
                    batch.append(run_id)
                    if len(batch) >= READ_BATCH or examined >= budget:
                        break
                else:
                    exhausted = True
                for summary in self._summaries(batch):
                    if summary is None or summary.state not in wanted:
                        continue  # swept by retention, or moved on since the index was read
                    if queue and summary.queue != queue:
                        continue
                    out.append(summary)
                    if len(out) >= limit:
                        break
                if examined >= budget:
                    return RunListing(out, examined, len(out) < limit)
            if len(out) >= limit:
                break
        return RunListing(out, examined, False)

    def _with_buffered(self, schedule: str, stream: Iterator[tuple[str, float]]
                       ) -> Iterator[tuple[str, float]]:
        """A run held back by its schedule's overlap policy waits outside the due set."""
        p = self.keys.partition_of_schedule(schedule)
        with translated(self.url):
            # replies are bytes: no duetime client sets decode_responses
            buffered = cast(bytes | None, self.client.hget(self.keys.sched(p, schedule), "buffered"))
        if buffered:
            yield buffered.decode(), 0.0
        yield from stream

    # -- leases and processes ---------------------------------------------------------
    def leases(self) -> list[LeaseInfo]:
        """The leases zset is the lease (score = expiry); the run hash names the holder."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.zrange(k.leases(p), 0, -1, withscores=True)
        held = [(p, m.decode(), expiry) for p, ms in enumerate(self._exec(pipe)) for m, expiry in ms]
        now = self.now_ms()
        pipe = self.client.pipeline(transaction=False)
        fields = ("task", "queue", "schedule", "fence", "attempt", "heartbeat", "started",
                  "cancel_requested", "state", "worker")
        for p, run_id, _ in held:
            pipe.hmget(k.run(p, run_id), *fields)
        out = []
        for (_, run_id, expiry), f in zip(held, self._exec(pipe), strict=True):
            v = dict(zip(fields, (x.decode() if x else None for x in f), strict=True))
            if v["state"] != "running":
                continue  # finished between the two reads
            hb = int(v["heartbeat"]) if v["heartbeat"] else None
            started = int(v["started"]) if v["started"] else None
            alive = expiry > now
            out.append(LeaseInfo(
                run_id=run_id, task=v["task"] or "", queue=v["queue"] or DEFAULT_QUEUE,
                schedule=v["schedule"],
                worker=v["worker"] if alive else None,
                fence=int(v["fence"] or 0), attempt=int(v["attempt"] or 0),
                lease_left_s=(expiry - now) / 1000 if alive else None,
                heartbeat=from_ms(hb), heartbeat_age_s=(now - hb) / 1000 if hb else None,
                started=from_ms(started), running_s=(now - started) / 1000 if started else None,
                cancel_requested=v["cancel_requested"] is not None,
            ))
        out.sort(key=lambda lease: (lease.running_s is None, -(lease.running_s or 0), lease.run_id))
        return out

# -- pages by index ranges (the web console) ------------------------------------------------
# A page of a listing starts where the previous one ended, found by score in each index
# (O(log N + page) per index), never by walking from the top: page 1,000 of a million runs
# costs what page 1 costs. Positions survive runs coming and going between two pages.
PAGE_BUDGET = 5000  # index entries a page may examine before it ends early (filters)
FILTER_FIELDS = ("state", "queue", "task", "owner")


class _Desc(str):
    """A member compared in reverse, for newest-first merges (ties: reverse member order,
    as ZREVRANGEBYSCORE returns them)."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return str.__gt__(self, other)  # type: ignore[operator]


@dataclass(frozen=True)
class Position:
    """Where a page ended: the last entry's (score, member) in the listing's order, and the
    index group it belongs to. Encoded into links as `group|score|member`."""

    group: str
    score: float
    member: str

    def encode(self) -> str:
        score = int(self.score) if self.score == int(self.score) else self.score
        return f"{self.group}|{score}|{self.member}"

    @classmethod
    def decode(cls, text: str, groups: Iterable[str]) -> Position:
        group, _, rest = text.partition("|")
        score, _, member = rest.partition("|")
        try:
            value = float(score)
        except ValueError:
            value = None
        if group not in set(groups) or not member or value is None or value != value:  # NaN
            raise InvalidInput(f"not a page position: {text[:80]!r}")
        return cls(group, value, member)


def keyset_merge(client: redis.Redis, url: str, zkeys: list[str], newest_first: bool,
                 after: tuple[float, str] | None = None, batch: int = 200
                 ) -> Iterator[tuple[str, float]]:
    """The members of several sorted sets in one (score, member) order -- descending for
    `newest_first` -- strictly after `after`, read `batch` entries per set at a time by score
    range. Each set remembers how many of its entries share the last score it read, so a run
    of equal scores (a bulk enqueue) is skipped by offset, not read again."""
    # per set: (bound score, bound member) of the last entry taken, entries read at that score
    bound: dict[str, tuple[float, str] | None] = dict.fromkeys(zkeys, after)
    ties = dict.fromkeys(zkeys, 0)
    done = dict.fromkeys(zkeys, False)

    def later(score: float, member: str, b: tuple[float, str] | None) -> bool:
        if b is None:
            return True
        if newest_first:
            return score < b[0] or (score == b[0] and member < b[1])
        return score > b[0] or (score == b[0] and member > b[1])

    def fetch(which: list[str]) -> dict[str, deque[tuple[str, float]]]:
        out: dict[str, deque[tuple[str, float]]] = {key: deque() for key in which}
        todo = list(which)
        while todo:
            pipe = client.pipeline(transaction=False)
            for key in todo:
                b = bound[key]
                edge = "+inf" if newest_first else "-inf"
                edge = edge if b is None else repr(b[0])
                if newest_first:
                    pipe.zrevrangebyscore(key, edge, "-inf", start=ties[key], num=batch, withscores=True)
                else:
                    pipe.zrangebyscore(key, edge, "+inf", start=ties[key], num=batch, withscores=True)
            with translated(url):
                replies = pipe.execute()
            again = []
            for key, items in zip(todo, replies, strict=True):
                b = bound[key]
                kept = [(m.decode(), s) for m, s in items if later(s, m.decode(), b)]
                # the entries read at the bound's score, kept or not, are skipped next time
                at_bound = sum(1 for _, s in items if b is not None and s == b[0])
                if len(items) < batch:
                    done[key] = True
                if kept:
                    last = kept[-1][1]
                    ties[key] = sum(1 for _, s in items if s == last) + (
                        ties[key] if b is not None and last == b[0] else 0)
                    bound[key] = (last, kept[-1][0])
                    out[key] = deque(kept)
                elif items and not done[key]:
                    ties[key] += at_bound  # a run of equal scores longer than a batch
                    again.append(key)
            todo = again
        return out

    heap: list[tuple[float, str, int, str]] = []
    bufs = fetch(list(zkeys))
    order = {key: i for i, key in enumerate(zkeys)}

    def push(key: str) -> None:
        member, score = bufs[key][0]
        if newest_first:
            heapq.heappush(heap, (-score, _Desc(member), order[key], key))
        else:
            heapq.heappush(heap, (score, member, order[key], key))

    for key in zkeys:
        if bufs[key]:
            push(key)
    while heap:
        _, _, _, key = heapq.heappop(heap)
        member, score = bufs[key].popleft()
        yield member, score
        if not bufs[key] and not done[key]:
            bufs[key] = fetch([key])[key]
        if bufs[key]:
            push(key)


@dataclass
class RunPage:
    runs: list[RunSummary]
    examined: int  # index entries looked at for this page
    next: Position | None  # where the next page starts; None: this was the last
    filtered: bool  # task/owner/schedule/queue filters applied to what was examined


def _page_groups(state: str | None) -> list[tuple[str, frozenset[str], bool]]:
    if state is not None and state not in STATE_INDEX:
        raise InvalidInput(f"unknown state {state!r}; one of {', '.join(STATES)}")
    return [g for g in GROUPS if state is None or g[0] == STATE_INDEX[state]]


def page_runs(insp: Inspector, state: str | None = None, queue: str | None = None,
               task: str | None = None, schedule: str | None = None, owner: str | None = None,
               after: Position | None = None, limit: int = 50, budget: int = PAGE_BUDGET) -> RunPage:
    """One page of runs, in the order of `Inspector.list_runs`, starting after `after`.
    Filters on fields of the record (task, owner, and queue outside the due and retry sets)
    are applied to the entries examined; a page that examined `budget` entries ends early,
    with fewer runs and a position to go on from, so a rare match never costs a full scan."""
    groups = _page_groups(state)
    names = [g[0] for g in groups]
    if after is not None and after.group not in names:
        raise InvalidInput(f"page position {after.encode()!r} does not belong to this listing")
    k = insp.keys
    parts = [k.partition_of_schedule(schedule)] if schedule else list(range(k.partitions))
    queues = [queue] if queue else insp.queues()
    out: list[str] = []
    examined = 0
    filtered = bool(task or owner or schedule or queue)
    queue_b, task_b, owner_b = (x.encode() if x else None for x in (queue, task, owner))
    start = names.index(after.group) if after else 0
    batch = min(max(limit, 50), 500)
    for index, states, newest_first in groups[start:]:
        wanted = {state} if state else states
        bound = (after.score, after.member) if after and after.group == index else None
        stream = keyset_merge(insp.client, insp.url, insp._index_keys(index, parts, queues),
                              newest_first, bound, batch)
        if index == "due" and schedule and bound is None:
            stream = insp._with_buffered(schedule, stream)
        last: Position | None = None
        exhausted = False
        while True:
            chunk: list[tuple[str, float]] = []
            for run_id, score in stream:
                examined += 1
                chunk.append((run_id, score))
                if len(chunk) >= READ_BATCH or examined >= budget:
                    break
            else:
                exhausted = True
            keep = [rid for rid, _ in chunk if not schedule or rid.rsplit("@", 1)[0] == schedule]
            # the fields filters need first (a few bytes a run); whole summaries of matches only
            pipe = insp.client.pipeline(transaction=False)
            for rid in keep:
                pipe.hmget(k.run(k.partition_of_run(rid), rid), *FILTER_FIELDS)
            matching = {rid for rid, (st, q, t, o) in zip(keep, insp._exec(pipe), strict=True)
                        if st is not None and st.decode() in wanted
                        and (not queue or (q or DEFAULT_QUEUE_B) == queue_b)
                        and (not task or t == task_b) and (not owner or o == owner_b)}
            for run_id, score in chunk:
                last = Position(index, score, run_id)
                if run_id not in matching:
                    continue
                out.append(run_id)
                if len(out) >= limit:
                    return _page(insp, out, examined, last, filtered)
            if exhausted:
                break
            if examined >= budget:
                return _page(insp, out, examined, last, filtered)
    return _page(insp, out, examined, None, filtered)


def _page(insp: Inspector, ids: list[str], examined: int, nxt: Position | None,
          filtered: bool) -> RunPage:
    runs = [s for s in insp._summaries(ids) if s is not None]  # a run swept meanwhile drops out
    return RunPage(runs, examined, nxt, filtered)



def newest_field_counts(insp: Inspector, index: str, field: str, sample: int = 1000
                        ) -> tuple[dict[str, int], int]:
    """How the newest `sample` entries of a newest-first index (dead, uncertain, done) spread
    over one record field (owner, task, queue) → (counts, entries read). One HGET each."""
    k = insp.keys
    zkeys = insp._index_keys(index, range(k.partitions), [])
    ids = [m for (m, _), _ in zip(keyset_merge(insp.client, insp.url, zkeys, True, None,
                                               min(sample, 500)), range(sample), strict=False)]
    pipe = insp.client.pipeline(transaction=False)
    for rid in ids:
        pipe.hget(k.run(k.partition_of_run(rid), rid), field)
    counts: dict[str, int] = {}
    absent = DEFAULT_QUEUE if field == "queue" else ""  # format 3 leaves the default out
    for value in insp._exec(pipe):
        name = value.decode(errors="replace") if value else absent
        counts[name] = counts.get(name, 0) + 1
    return counts, len(ids)
