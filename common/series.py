"""Small per-queue time series kept in Redis, for the web console's plots.

Schedulers sample the namespace (what `top` shows: backlog, running, finish rate, start
lateness p50/p99, dead per queue) at two fixed steps and append one entry per step to a capped
stream per step (`<ns>:series:10s`, `<ns>:series:5m`). The entry's id is the step's start
time, so when several schedulers sample the same step only the first write lands (XADD refuses
an id that is not greater than the last): no coordination, no duplicates. Memory is bounded by
the cap: one entry holds a few numbers per queue.

Why kept rather than computed when a page is drawn: the past backlog cannot be recomputed (a
claimed run leaves the due set), and rates and lateness over a day would mean reading a day of
finished runs on every page view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import redis
from duetime.common.connection import translated
from duetime.common.overview import NamespaceReader, Overview

# step name -> (step ms, entries kept): one hour at 10 s, one day at 5 min
STEPS: dict[str, tuple[int, int]] = {"10s": (10_000, 360), "5m": (300_000, 288)}
# per queue, in this order
FIELDS = ("backlog", "running", "finished_per_s", "lateness_p50_s", "lateness_p99_s", "dead")
SAMPLE = 1000  # runs sampled per point for rate, lateness and dead (see NamespaceReader.overview)


@dataclass(frozen=True)
class Point:
    t_ms: int
    queues: dict[str, dict[str, float | None]]
    leases: int
    dead: int
    uncertain: int
    workers: int


def encode(ov: Overview) -> dict[str, str]:
    queues = {q: [getattr(st, f) for f in FIELDS] for q, st in sorted(ov.queues.items())}
    return {"queues": json.dumps(queues, separators=(",", ":")), "leases": str(ov.leases),
            "dead": str(ov.dead), "uncertain": str(ov.uncertain), "workers": str(ov.workers)}


def decode(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Point | None:
    """None for an entry this version cannot read (written by hand, or by a newer duetime)."""
    try:
        t = int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])
        raw = json.loads(fields.get(b"queues", b"{}"))
        queues = {q: dict(zip(FIELDS, values, strict=False)) for q, values in raw.items()}
        return Point(t, queues, int(fields.get(b"leases", 0)), int(fields.get(b"dead", 0)),
                     int(fields.get(b"uncertain", 0)), int(fields.get(b"workers", 0)))
    except (ValueError, TypeError, AttributeError):
        return None


class SeriesWriter:
    """Appends a point per step (called often, by every scheduler: it samples only when the
    current step has no point yet, which one read tells)."""

    def __init__(self, inspector: NamespaceReader, steps: dict[str, tuple[int, int]] | None = None) -> None:
        self.inspector = inspector
        self.steps = STEPS if steps is None else steps
        self._last: dict[str, int] = {}

    def record(self, only: tuple[str, ...] | None = None) -> list[str]:
        """→ the steps a point was written for now (`only`: these steps alone)."""
        insp = self.inspector
        client, keys = insp.client, insp.keys
        now = insp.now_ms()
        due = []
        for name, (step_ms, _) in self.steps.items():
            if only is not None and name not in only:
                continue
            start = now - now % step_ms
            if self._last.get(name, -1) < start:
                due.append((name, start))
        if not due:
            return []
        heads = self._heads([name for name, _ in due])
        todo = []
        for (name, start), head in zip(due, heads, strict=True):
            last = int(head[0][0].decode().split("-")[0]) if head else -1
            if last >= start:
                self._last[name] = last  # another scheduler sampled this step
            else:
                todo.append((name, start))
        written = []
        for name, start in todo:
            step_ms, cap = self.steps[name]
            ov = insp.overview(activity=True, window_s=step_ms / 1000, sample=SAMPLE)
            with translated(insp.url):
                try:
                    # redis-py wants exactly dict[FieldT, EncodableT] (dict is invariant)
                    client.xadd(keys.series(name), encode(ov), id=f"{start}-0",  # type: ignore[arg-type]
                                maxlen=cap, approximate=False)
                    written.append(name)
                except redis.ResponseError as exc:  # another scheduler wrote this step first
                    if "equal or smaller" not in str(exc):
                        raise
            self._last[name] = start
        return written


    def _heads(self, names: list[str]) -> list[Any]:
        """The newest point of each named series (the one read that tells a step has one)."""
        insp = self.inspector
        pipe = insp.client.pipeline(transaction=False)
        for name in names:
            pipe.xrevrange(insp.keys.series(name), count=1)
        with translated(insp.url):
            return pipe.execute()


def read(client: redis.Redis, url: str, key: str, since_ms: int | None = None,
         count: int = 400) -> list[Point]:
    """The newest `count` points of one series from `since_ms` on, oldest first."""
    with translated(url):
        # a list, of bytes (no duetime client sets decode_responses), never None
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       client.xrevrange(key, max="+", min=f"{since_ms}-0" if since_ms else "-",
                                        count=count))
    return [p for p in (decode(i, f) for i, f in reversed(entries)) if p is not None]
