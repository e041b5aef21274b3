"""Read-only views of a namespace for operators: run listings, leases, workers, queue stats.

Everything is read from the partition indexes (`T:due:<q>`, `T:retry:<q>`, `T:leases`,
`T:dead`, `T:uncertain`, `T:done`) with pipelines — never KEYS/SCAN over run keys — so a
listing costs O(partitions × queues + runs examined), whatever the size of the keyspace.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

import redis
from duetime.common.connection import server_time_ms, translated
from duetime.common.errors import InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.models import STATES, Run, from_ms
from duetime.common.retrycost import TaskCost
from duetime.common.retrycost import read as read_cost
from duetime.common.runs import read_run
from duetime.common.stats import percentile

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
    ("uncertain", frozenset({"uncertain"}), True),
    ("dead", frozenset({"dead"}), True),
    ("done", frozenset({"succeeded", "cancelled", "skipped", "missed", "dead"}), True),
)
STATE_INDEX = {"running": "leases", "retrying": "retry", "scheduled": "due", "uncertain": "uncertain",
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
            id=run_id, state=v["state"] or "", task=v["task"] or "", queue=v["queue"] or "",
            schedule=v["schedule"], due=from_ms(v["due"]), created=from_ms(v["created"]),
            started=from_ms(v["started"]), finished=from_ms(v["finished"]),
            attempt=n("attempt", 0), max_attempts=n("max_attempts", 1),
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


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int | None
    queues: list[str]
    concurrency: int
    inflight: int
    processed: int
    last_seen: datetime | None
    last_seen_age_s: float | None
    live: bool


@dataclass(frozen=True)
class SchedulerInfo:
    id: str
    last_seen: datetime | None
    last_seen_age_s: float
    partitions: list[int]


@dataclass
class QueueStats:
    """Per queue: `backlog` runs are claimable now (due or retry time passed)."""

    queue: str
    backlog: int = 0
    oldest_due_age_s: float = 0.0
    scheduled_later: int = 0
    retrying: int = 0
    running: int = 0
    finished_per_s: float = 0.0
    lateness_p50_s: float | None = None
    lateness_p99_s: float | None = None
    dead: int = 0
    next_due_ms: int | None = None  # the earliest due or retry time still ahead (server ms)


@dataclass
class Overview:
    """A namespace at one instant (server clock): what `top` and the gauges show."""

    now_ms: int
    queues: dict[str, QueueStats]
    leases: int
    dead: int
    uncertain: int
    partitions: int
    unowned_partitions: list[int]
    workers: int
    schedulers: int
    window_s: float = 60.0
    sampled: bool = False  # per-queue activity numbers extrapolate a sample
    # with activity: the cost of retries per task and owner (common/retrycost.py)
    cost: list[TaskCost] = field(default_factory=list)


def _s(b: bytes | None) -> str:
    return b.decode() if b else ""


class Inspector:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url

    def _exec(self, pipe: redis.client.Pipeline) -> list:
        with translated(self.url):
            return pipe.execute()

    def now_ms(self) -> int:
        with translated(self.url):
            return server_time_ms(self.client)

    # -- queues -----------------------------------------------------------------------
    def queues(self) -> list[str]:
        """Every queue the namespace knows: registered at enqueue/schedule time, or served by a
        live worker."""
        with translated(self.url):
            names = {_s(q) for q in self.client.smembers(self.keys.queues)}
        for w in self.workers():
            names.update(w.queues)
        return sorted(n for n in names if n)

    # -- runs -------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        """One run with its attempt history (reads only; never writes the namespace's meta)."""
        with translated(self.url):
            return read_run(self.client, self.keys, run_id)

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
        for run_id in ids:
            pipe.hmget(self.keys.run(self.keys.partition_of_run(run_id), run_id), *SUMMARY_FIELDS)
        return [RunSummary.decode(run_id, v) if v[0] else None
                for run_id, v in zip(ids, self._exec(pipe), strict=True)]

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
            buffered = self.client.hget(self.keys.sched(p, schedule), "buffered")
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
                run_id=run_id, task=v["task"] or "", queue=v["queue"] or "", schedule=v["schedule"],
                worker=v["worker"] if alive else None,
                fence=int(v["fence"] or 0), attempt=int(v["attempt"] or 0),
                lease_left_s=(expiry - now) / 1000 if alive else None,
                heartbeat=from_ms(hb), heartbeat_age_s=(now - hb) / 1000 if hb else None,
                started=from_ms(started), running_s=(now - started) / 1000 if started else None,
                cancel_requested=v["cancel_requested"] is not None,
            ))
        out.sort(key=lambda lease: (lease.running_s is None, -(lease.running_s or 0), lease.run_id))
        return out

    def workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        """Workers register on every heartbeat; the hash expires 3 lease lengths after the last
        one, so an entry without it belongs to a worker that is gone."""
        k = self.keys
        with translated(self.url):
            ids = [(m.decode(), score) for m, score in self.client.zrange(k.workers, 0, -1, withscores=True)]
        pipe = self.client.pipeline(transaction=False)
        for wid, _ in ids:
            pipe.hgetall(k.worker(wid))
        now = time.time() * 1000  # workers stamp their own clock; compare with ours
        out = []
        for (wid, score), h in zip(ids, self._exec(pipe), strict=True):
            if not h and not include_gone:
                continue
            d = {a.decode(): b.decode() for a, b in h.items()}
            seen = int(d.get("last_seen") or score)
            out.append(WorkerInfo(
                id=wid, host=d.get("host", ""), pid=int(d["pid"]) if d.get("pid") else None,
                queues=[q for q in d.get("queues", "").split(",") if q],
                concurrency=int(d.get("concurrency") or 0), inflight=int(d.get("inflight") or 0),
                processed=int(d.get("processed") or 0), last_seen=from_ms(seen),
                last_seen_age_s=max(0.0, (now - seen) / 1000), live=bool(h),
            ))
        return out

    def schedulers(self) -> list[SchedulerInfo]:
        """Live schedulers and the partitions each holds now (the `<ns>:owners` table)."""
        return self._owners()[0]

    def _owners(self) -> tuple[list[SchedulerInfo], list[int]]:
        """(live schedulers, unowned partitions), from one read of the owners table."""
        now = self.now_ms()
        with translated(self.url):
            table = self.client.hgetall(self.keys.owners)
        seen: dict[str, int] = {}
        held: dict[str, list[int]] = {}
        for f, v in table.items():
            field, value = f.decode(errors="replace"), v.decode(errors="replace")
            if field.startswith("s:"):
                seen[field[2:]] = int(value) if value.isdigit() else 0
            elif field.startswith("p:") and "|" in value:
                sid, _, expiry = value.rpartition("|")
                if expiry.isdigit() and int(expiry) > now and field[2:].isdigit():
                    held.setdefault(sid, []).append(int(field[2:]))
        out = [SchedulerInfo(sid, from_ms(t), max(0.0, (now - t) / 1000), sorted(held.get(sid, [])))
               for sid, t in sorted(seen.items()) if sid in held or now - t < 10_000]
        owned = {p for ps in held.values() for p in ps}
        return out, [p for p in range(self.keys.partitions) if p not in owned]

    # -- queue-level numbers ----------------------------------------------------------
    def overview(self, queues: list[str] | None = None, activity: bool = False,
                 window_s: float = 60.0, sample: int = 5000, cost: bool = False) -> Overview:
        """Cheap counts per queue (what the scheduler exports as gauges); with `activity`, also
        running, finish rate, start lateness and dead letters per queue, from a sample of at
        most `sample` recent runs (what `top` shows); with `cost`, the cost of retries per
        task and owner."""
        k = self.keys
        qs = queues if queues is not None else self.queues()
        now = self.now_ms()
        P = k.partitions
        pipe = self.client.pipeline(transaction=False)
        for p in range(P):
            for q in qs:
                for zkey in (k.due(p, q), k.retry(p, q)):
                    pipe.zcount(zkey, "-inf", now)
                    pipe.zcard(zkey)
                    pipe.zrange(zkey, 0, 0, withscores=True)
            pipe.zcard(k.leases(p))
            pipe.zcard(k.dead(p))
            pipe.zcard(k.uncertain(p))
        res = iter(self._exec(pipe))
        stats = {q: QueueStats(q) for q in qs}
        leases = dead = uncertain = 0
        for _ in range(P):
            for q in qs:
                st = stats[q]
                for kind in ("due", "retry"):
                    ready, total, head = next(res), next(res), next(res)
                    st.backlog += ready
                    if kind == "due":
                        st.scheduled_later += total - ready
                    else:
                        st.retrying += total
                    if ready and head:
                        st.oldest_due_age_s = max(st.oldest_due_age_s, (now - head[0][1]) / 1000)
                    elif head and head[0][1] > now and (st.next_due_ms is None
                                                        or head[0][1] < st.next_due_ms):
                        st.next_due_ms = int(head[0][1])
            leases += next(res)
            dead += next(res)
            uncertain += next(res)
        schedulers, unowned = self._owners()
        ov = Overview(now, stats, leases, dead, uncertain, P, unowned, len(self.workers()),
                      len(schedulers), window_s)
        if activity:
            self._activity(ov, window_s, sample)
        if cost:
            ov.cost = self._exec_cost(ov.now_ms, window_s)
        return ov

    def _exec_cost(self, now_ms: int, window_s: float) -> list[TaskCost]:
        with translated(self.url):
            return read_cost(self.client, self.keys, now_ms, window_s)

    def _activity(self, ov: Overview, window_s: float, sample: int) -> None:
        k = self.keys
        P = k.partitions
        since = ov.now_ms - int(window_s * 1000)
        per = max(1, sample // P)
        pipe = self.client.pipeline(transaction=False)
        for p in range(P):
            pipe.zrange(k.leases(p), 0, per - 1)
            pipe.zcount(k.done(p), f"({since}", "+inf")
            pipe.zrevrangebyscore(k.done(p), "+inf", f"({since}", start=0, num=per)
            pipe.zcount(k.dead(p), f"({since}", "+inf")
            pipe.zrevrangebyscore(k.dead(p), "+inf", f"({since}", start=0, num=per)
            pipe.zcard(k.dead(p))
            pipe.zrevrange(k.dead(p), 0, per - 1)
        res = self._exec(pipe)
        # (run id, partition, kind, weight): a sampled entry stands for `weight` entries
        picks: list[tuple[str, int, str, float]] = []
        for p in range(P):
            running, n_done, done, n_dead_recent, dead_recent, n_dead, dead = res[7 * p : 7 * p + 7]
            picks += [(m.decode(), p, "running", 1.0) for m in running]
            for n, ids in ((n_done, done), (n_dead_recent, dead_recent)):
                picks += [(m.decode(), p, "finished", n / len(ids)) for m in ids]
            picks += [(m.decode(), p, "dead", n_dead / len(dead)) for m in dead]
        ov.sampled = any(w > 1 for _, _, _, w in picks)
        pipe = self.client.pipeline(transaction=False)
        for run_id, p, _, _ in picks:
            pipe.hmget(k.run(p, run_id), "queue", "due", "started", "attempt")
        lateness: dict[str, list[float]] = {}
        for (_, _, kind, weight), (q, due, started, attempt) in zip(picks, self._exec(pipe), strict=True):
            if q is None:
                continue
            queue = q.decode(errors="replace")  # a damaged record counts, marked, not fatal
            st = ov.queues.get(queue)
            if st is None:
                st = ov.queues[queue] = QueueStats(queue)
            if kind == "running":
                st.running += 1
            elif kind == "finished":
                st.finished_per_s += weight / window_s
            else:
                st.dead += round(weight)
            if kind != "dead" and attempt == b"1" and due and started \
                    and due.isdigit() and started.isdigit():
                lateness.setdefault(st.queue, []).append(max(0.0, (int(started) - int(due)) / 1000))
        for q, values in lateness.items():
            ov.queues[q].lateness_p50_s = percentile(values, 50)
            ov.queues[q].lateness_p99_s = percentile(values, 99)


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
                        if st is not None and st.decode() in wanted and (not queue or q == queue_b)
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
    for value in insp._exec(pipe):
        name = value.decode(errors="replace") if value else ""
        counts[name] = counts.get(name, 0) + 1
    return counts, len(ids)
