"""The cost of retries, per task and owner: attempts, attempts that did not succeed, and the
execution seconds spent on those.

Workers count attempts in memory (`Ledger`) and add them to two hashes with HINCRBY in their
report pipeline, at most about once a second: `<ns>:cost` (since the namespace began) and
`<ns>:cost:<minute>` (one per minute of the workers' clocks, kept a day), so `duetime top`, a
separate process, reads the totals and a recent window without scanning runs. Numbers are
integers (seconds as ms) so the worker's ACL needs no command beyond HINCRBY and PEXPIRE.

An attempt is counted by the worker that ran it, as that worker saw it end: `succeeded` (the
task returned), `failed` (it raised, timed out, or could not start) or `interrupted` (its
lease was lost, it was stopped on a cancel request or given back at shutdown). A worker killed
outright loses its last second of counts; the runs themselves are unaffected.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from duetime.common.keys import Keyspace

# how an attempt ended as its worker saw it: the `ending` label of duetime_attempts_total
ATTEMPT_ENDINGS = ("succeeded", "failed", "interrupted")
MINUTE_MS = 60_000
KEEP_MS = 86_400_000 + MINUTE_MS  # minute buckets live a day
SEP = "|"  # never in a task or owner name (common/names.py refuses it)
# field kinds: attempts, attempts that did not succeed, ms spent on those
ATTEMPTS, FAILED, FAILED_MS = "a", "f", "ms"


def field(task: str, owner: str, kind: str) -> str:
    """`<task>|<owner>|<kind>`; a `|` inside an owner (names cannot hold one) reads as `/`."""
    return f"{task.replace(SEP, '/')}{SEP}{owner.replace(SEP, '/')}{SEP}{kind}"


def minute_of(ms: float) -> int:
    return int(ms // MINUTE_MS)


class Ledger:
    """Counts not yet in Redis, by (task, owner): [attempts, failed, failed ms]."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], list[int]] = {}

    def add(self, task: str, owner: str, ending: str, seconds: float, count: int = 1) -> None:
        """`count` attempts of `task` that ended so, `seconds` spent on them in all."""
        row = self.pending.get((task, owner))
        if row is None:
            row = self.pending[(task, owner)] = [0, 0, 0]
        row[0] += count
        if ending != "succeeded":
            row[1] += count
            row[2] += round(seconds * 1000)

    def __bool__(self) -> bool:
        return bool(self.pending)

    def take(self) -> dict[tuple[str, str], list[int]]:
        taken, self.pending = self.pending, {}
        return taken

    def give_back(self, taken: dict[tuple[str, str], list[int]]) -> None:
        """Counts whose write failed: kept for the next one."""
        for key, (a, f, ms) in taken.items():
            row = self.pending.setdefault(key, [0, 0, 0])
            row[0] += a
            row[1] += f
            row[2] += ms


def commands(keys: Keyspace, taken: dict[tuple[str, str], list[int]], now_ms: float
             ) -> list[tuple[Any, ...]]:
    """The HINCRBY/PEXPIRE commands that add `taken` to the totals and the current minute."""
    bucket = keys.cost_minute(minute_of(now_ms))
    out: list[tuple[Any, ...]] = []
    for (task, owner), values in taken.items():
        for kind, n in zip((ATTEMPTS, FAILED, FAILED_MS), values, strict=True):
            if n:
                f = field(task, owner, kind)
                out += [("HINCRBY", keys.cost, f, n), ("HINCRBY", bucket, f, n)]
    if out:
        out.append(("PEXPIRE", bucket, KEEP_MS))
    return out


@dataclass
class TaskCost:
    task: str
    owner: str
    attempts: int = 0
    failed: int = 0
    failed_s: float = 0.0
    recent_attempts: int = 0
    recent_failed: int = 0
    recent_failed_s: float = 0.0


def _add(rows: dict[tuple[str, str], TaskCost], h: dict[bytes, bytes], recent: bool) -> None:
    for raw, value in h.items():
        try:
            task, owner, kind = raw.decode(errors="replace").split(SEP)
            n = int(value)
        except ValueError:
            continue  # a field written by hand: not ours
        row = rows.get((task, owner))
        if row is None:
            row = rows[(task, owner)] = TaskCost(task, owner)
        if kind == ATTEMPTS:
            row.attempts += 0 if recent else n
            row.recent_attempts += n if recent else 0
        elif kind == FAILED:
            row.failed += 0 if recent else n
            row.recent_failed += n if recent else 0
        elif kind == FAILED_MS:
            row.failed_s += 0 if recent else n / 1000
            row.recent_failed_s += n / 1000 if recent else 0


def read(client: Any, keys: Keyspace, now_ms: float | None = None, window_s: float = 60.0
         ) -> list[TaskCost]:
    """Per task and owner: totals, and the minutes overlapping the last `window_s` (whole
    minutes, so a 60 s window reads the current minute and the one before); costliest first."""
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    last = minute_of(now_ms)
    first = minute_of(now_ms - window_s * 1000)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.cost)
    for m in range(max(first, last - KEEP_MS // MINUTE_MS), last + 1):
        pipe.hgetall(keys.cost_minute(m))
    total, *minutes = pipe.execute()
    rows: dict[tuple[str, str], TaskCost] = {}
    _add(rows, total, False)
    for h in minutes:
        _add(rows, h, True)
    return sorted(rows.values(), key=lambda r: (-r.failed_s, -r.failed, r.task, r.owner))


def as_dicts(rows: Iterable[TaskCost]) -> list[dict[str, Any]]:
    return [{"task": r.task, "owner": r.owner, "attempts": r.attempts, "failed": r.failed,
             "failed_s": round(r.failed_s, 3), "recent_attempts": r.recent_attempts,
             "recent_failed": r.recent_failed, "recent_failed_s": round(r.recent_failed_s, 3)}
            for r in rows]
