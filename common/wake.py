"""The wake messages the scripts publish, built and read here and nowhere else in Python.

Two channels (common/keys.py): the workers' wake channel carries '<partition>|<queue>|<due ms>'
(a run became the earliest of a due/retry set, or a limit it waited on was freed); the
schedulers' channel carries '<kind>|<partition>|<ms>' (kind s: a schedule is due, l: a lease
ends, d: a starting deadline passes). In Lua each is built by one helper of lua/_lib.lua
(`wake_workers`, `tell_schedulers`); tests/integration/test_scripts.py checks that what a script
publishes is what `worker_wake` builds. Both channels are open to any client's PUBLISH, so the
parsers return None for anything else instead of raising: one stray message must not stop the
wake-ups.
"""

from __future__ import annotations

import math
from typing import TypeVar

Ms = TypeVar("Ms", int, float)  # a time in ms: the scheduler keeps ints, the worker floats
SEP = "|"  # never in a queue name (common/names.py refuses it)


def worker_wake(partition: int, queue: str, due_ms: int) -> str:
    """The message telling workers that `queue` of `partition` has a run due at `due_ms`."""
    return f"{partition}{SEP}{queue}{SEP}{int(due_ms)}"


def parse_worker_wake(data: object, partitions: int) -> tuple[int, str, float] | None:
    """(partition, queue, due ms) of a worker wake message, or None for anything else."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        if not isinstance(text, str):
            return None
        parts = text.split(SEP)
        if len(parts) != 3:
            return None
        p, queue, due = int(parts[0]), parts[1], float(parts[2])
    except (ValueError, UnicodeDecodeError):
        return None
    if not 0 <= p < partitions or not queue or not math.isfinite(due):
        return None
    return p, queue, due


def with_notice(read: Ms | None, notice: tuple[int, Ms] | None, since: int) -> Ms | None:
    """A set's head as a read at the server found it (None: empty), unless a notice counted
    after the read began (`notice`: (its count, its due ms); `since`: the count when the read
    began) tells of an earlier one: a read that crossed a notice must not hide it."""
    if notice is not None and notice[0] > since and (read is None or notice[1] < read):
        return notice[1]
    return read


def scheduler_notice(kind: str, partition: int, ms: int) -> str:
    """The message telling schedulers that something of `kind` in `partition` is due at `ms`."""
    return f"{kind}{SEP}{partition}{SEP}{int(ms)}"


def parse_scheduler_notice(data: bytes) -> tuple[str, int, int] | None:
    """(kind, partition, ms) of a scheduler notice, or None for anything else."""
    try:
        kind, p, ms = data.decode().split(SEP)
        return kind, int(p), int(float(ms))
    except (UnicodeDecodeError, ValueError, OverflowError):
        return None
