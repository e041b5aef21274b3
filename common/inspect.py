"""Read-only views of a namespace for operators: run listings, leases, workers, queue stats.

Everything is read from the partition indexes (`T:due:<q>`, `T:retry:<q>`, `T:leases`,
`T:dead`, `T:uncertain`, `T:done`) with pipelines — never KEYS/SCAN over run keys — so a
listing costs O(partitions × queues + runs examined), whatever the size of the keyspace.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

import redis
from duetime.common.connection import server_time_ms, translated
from duetime.common.errors import InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.models import STATES, Run, from_ms
from duetime.common.runs import read_run
from duetime.common.stats import percentile

SUMMARY_FIELDS = (
    "state", "task", "queue", "schedule", "due", "created", "started", "finished",
    "attempt", "max_attempts", "worker", "error", "reason", "owner", "retry_at", "replay_of",
    "replayed_by", "cancel_requested",
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

    @classmethod
    def decode(cls, run_id: str, values: list[bytes | None]) -> RunSummary:
        """Absent fields hold their defaults (see lua/enqueue.lua); the id is the key's."""
        v = dict(zip(SUMMARY_FIELDS, (x.decode() if x else None for x in values), strict=True))
        err = v["error"]
        return cls(
            id=run_id, state=v["state"] or "", task=v["task"] or "", queue=v["queue"] or "",
            schedule=v["schedule"], due=from_ms(v["due"]), created=from_ms(v["created"]),
            started=from_ms(v["started"]), finished=from_ms(v["finished"]),
            attempt=int(v["attempt"] or 0), max_attempts=int(v["max_attempts"] or 1),
            worker=v["worker"], error=err.splitlines()[0] if err else None, reason=v["reason"],
            owner=v["owner"], retry_at=from_ms(v["retry_at"]), replay_of=v["replay_of"],
            replayed_by=v["replayed_by"], cancel_requested=v["cancel_requested"] is not None,
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
        """Schedulers seen within one partition-lease length, and the partitions they hold."""
        k = self.keys
        now = self.now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(k.schedulers, 0, -1, withscores=True)
        for p in range(k.partitions):
            pipe.get(k.owner(p))
        res = self._exec(pipe)
        owners: dict[str, list[int]] = {}
        for p, owner in enumerate(res[1:]):
            if owner:
                owners.setdefault(owner.decode(), []).append(p)
        out = []
        for m, score in res[0]:
            sid = m.decode()
            age = (now - score) / 1000
            if sid in owners or age < 10:
                out.append(SchedulerInfo(sid, from_ms(score), max(0.0, age), owners.get(sid, [])))
        return out

    # -- queue-level numbers ----------------------------------------------------------
    def overview(self, queues: list[str] | None = None, activity: bool = False,
                 window_s: float = 60.0, sample: int = 5000) -> Overview:
        """Cheap counts per queue (what the scheduler exports as gauges); with `activity`, also
        running, finish rate, start lateness and dead letters per queue, from a sample of at
        most `sample` recent runs (what `top` shows)."""
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
            pipe.exists(k.owner(p))
        res = iter(self._exec(pipe))
        stats = {q: QueueStats(q) for q in qs}
        leases = dead = uncertain = 0
        unowned = []
        for p in range(P):
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
            leases += next(res)
            dead += next(res)
            uncertain += next(res)
            if not next(res):
                unowned.append(p)
        ov = Overview(now, stats, leases, dead, uncertain, P, unowned, len(self.workers()),
                      len(self.schedulers()), window_s)
        if activity:
            self._activity(ov, window_s, sample)
        return ov

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
            st = ov.queues.get(q.decode())
            if st is None:
                st = ov.queues[q.decode()] = QueueStats(q.decode())
            if kind == "running":
                st.running += 1
            elif kind == "finished":
                st.finished_per_s += weight / window_s
            else:
                st.dead += round(weight)
            if kind != "dead" and attempt == b"1" and due and started:
                lateness.setdefault(st.queue, []).append(max(0.0, (int(started) - int(due)) / 1000))
        for q, values in lateness.items():
            ov.queues[q].lateness_p50_s = percentile(values, 50)
            ov.queues[q].lateness_p99_s = percentile(values, 99)
