"""A namespace's queue-level numbers at one instant: what the scheduler exports as gauges and
samples for the console's plots, and what `top` shows (common/series.py, scheduler/gauges.py).

Read from the partition indexes with one pipeline per pass, never a key scan. The operator's
run listings build on this reader (duetime/ops/inspect.py); a scheduler needs only this part.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import redis
from duetime.common.connection import server_time_ms, translated
from duetime.common.keys import Keyspace
from duetime.common.models import DEFAULT_QUEUE, from_ms
from duetime.common.retrycost import TaskCost
from duetime.common.retrycost import read as read_cost
from duetime.common.stats import percentile


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
    formats: int = 0  # the newest namespace format it reads; 0: a release before format 3


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
    paused: bool = False  # duetime queue pause: nothing is claimed from it
    pause_note: str = ""


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


# what a command reads from a damaged key, standing in for it (HMGET: a None per field)
_EMPTY: dict[str, Any] = {"ZCOUNT": 0, "ZCARD": 0, "ZRANGE": [], "ZREVRANGE": [],
                          "ZRANGEBYSCORE": [], "ZREVRANGEBYSCORE": [], "HGETALL": {},
                          "HGET": None, "SMEMBERS": set(), "SCARD": 0, "LRANGE": [], "LLEN": 0,
                          "XREVRANGE": [], "XRANGE": [], "XLEN": 0, "EXISTS": 0}


def _s(b: bytes | None) -> str:
    return b.decode() if b else ""


def _is_ms(b: bytes) -> bool:
    """A stored time in ms: digits, or digits with a fraction (a due time, format 4)."""
    whole, _, frac = b.partition(b".")
    return whole.isdigit() and (not frac or frac.isdigit())


def _queued(pipe: Any) -> list[Any]:
    """The argument lists of a pipeline's queued commands, to name the key of a refused one.
    redis-py 8's cluster pipeline queues them in its execution strategy, not in
    `command_stack`: read there when it has them (guarded: absent in other versions, where
    `command_stack` holds them)."""
    stack = list(getattr(pipe, "command_stack", None) or [])
    if not stack:
        strategy = getattr(pipe, "_execution_strategy", None)
        stack = list(getattr(strategy, "_command_queue", None) or [])
    return [c.args if hasattr(c, "args") else c[0] for c in stack]


class NamespaceReader:
    """Queue stats, live workers and schedulers of one namespace (reads only)."""

    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url
        # keys a read found damaged (of the wrong type): key -> the server's error. A reading
        # of the namespace goes on without them (each read as empty); `doctor` names them.
        self.damaged: dict[str, str] = {}

    def _exec(self, pipe: redis.client.Pipeline) -> list[Any]:
        """The pipeline's replies; a command refused because its key is damaged (WRONGTYPE)
        reads as empty and the key is noted in `damaged`, so one bad key of one partition
        cannot fail a listing of the whole namespace."""
        stack = _queued(pipe)
        with translated(self.url):
            replies = pipe.execute(raise_on_error=False)
            if len(stack) != len(replies):  # commands not told apart: errors are raised
                stack = [()] * len(replies)
            out = []
            for args, reply in zip(stack, replies, strict=True):
                if isinstance(reply, redis.ResponseError) and str(reply).startswith("WRONGTYPE") \
                        and len(args) >= 2:
                    name = str(args[0]).upper()
                    key = args[1].decode(errors="replace") if isinstance(args[1], bytes) else str(args[1])
                    self.damaged[key] = f"{reply} (read with {name})"
                    reply = [None] * (len(args) - 2) if name == "HMGET" else _EMPTY.get(name)
                elif isinstance(reply, Exception):
                    raise reply
                out.append(reply)
            return out

    def now_ms(self) -> int:
        with translated(self.url):
            return server_time_ms(self.client)

    # -- queues -----------------------------------------------------------------------
    def queues(self) -> list[str]:
        """Every queue the namespace knows: registered at enqueue/schedule time, or served by a
        live worker."""
        with translated(self.url):
            # replies are bytes: no duetime client sets decode_responses
            names = {_s(q) for q in cast(set[bytes], self.client.smembers(self.keys.queues))}
        for w in self.workers():
            names.update(w.queues)
        return sorted(n for n in names if n)

    def workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        """Workers register on every heartbeat; the hash expires 3 lease lengths after the last
        one, so an entry without it belongs to a worker that is gone."""
        k = self.keys
        with translated(self.url):
            ids = [(m.decode(), score) for m, score
                   in cast(list[tuple[bytes, float]], self.client.zrange(k.workers, 0, -1, withscores=True))]
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
                formats=int(d["formats"]) if d.get("formats", "").isdigit() else 0,
            ))
        return out

    def schedulers(self) -> list[SchedulerInfo]:
        """Live schedulers and the partitions each holds now (the `<ns>:owners` table)."""
        return self._owners()[0]

    def _owners(self) -> tuple[list[SchedulerInfo], list[int]]:
        """(live schedulers, unowned partitions), from one read of the owners table."""
        now = self.now_ms()
        with translated(self.url):
            table = cast(dict[bytes, bytes], self.client.hgetall(self.keys.owners))
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

        def zkey_of(kind: str, p: int, q: str) -> str:
            return str(k.due(p, q) if kind == "due" else k.retry(p, q))

        leases = dead = uncertain = 0
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
                    score = head[0][1] if head and math.isfinite(head[0][1]) else None
                    if head and score is None:  # +-inf, edited by hand: not a time
                        self.damaged.setdefault(zkey_of(kind, p, q), f"head score {head[0][1]}")
                    if ready and score is not None:
                        st.oldest_due_age_s = max(st.oldest_due_age_s, (now - score) / 1000)
                    elif score is not None and score > now and (st.next_due_ms is None
                                                               or score < st.next_due_ms):
                        st.next_due_ms = int(score)
            leases += next(res)
            dead += next(res)
            uncertain += next(res)
        self._pauses(stats, add=queues is None)
        schedulers, unowned = self._owners()
        ov = Overview(now, stats, leases, dead, uncertain, P, unowned, len(self.workers()),
                      len(schedulers), window_s)
        if activity:
            self._activity(ov, window_s, sample)
        if cost:
            ov.cost = self._exec_cost(ov.now_ms, window_s)
        return ov

    def _pauses(self, stats: dict[str, QueueStats], add: bool) -> None:
        """Mark the paused queues (`<ns>:paused`, duetime/client/pause.py); `add`: a paused
        queue not yet used is listed too."""
        raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys.paused_config))
        for name, value in raw.items():
            q = _s(name)
            if q not in stats:
                if not add:
                    continue
                stats[q] = QueueStats(q)
            stats[q].paused = True
            try:
                stats[q].pause_note = str(json.loads(value).get("note", ""))
            except (ValueError, AttributeError):
                stats[q].pause_note = "(pause record unreadable)"

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
            if q is None and due is None:
                continue  # gone meanwhile
            # absent: the default queue (format 3); a damaged record counts, marked, not fatal
            queue = q.decode(errors="replace") if q is not None else DEFAULT_QUEUE
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
                    and _is_ms(due) and started.isdigit():  # a due time may keep its µs (format 4)
                lateness.setdefault(st.queue, []).append(
                    max(0.0, (int(started) - float(due)) / 1000))
        for q, values in lateness.items():
            ov.queues[q].lateness_p50_s = percentile(values, 50)
            ov.queues[q].lateness_p99_s = percentile(values, 99)
