"""Reading the external journal the `limited` tasks append to (tests/apps/basic.py)."""

from __future__ import annotations

import redis

from tests.apps import basic


def entries(r: redis.Redis) -> list[tuple[str, str, int]]:
    """(kind 's'/'e', run id, server ms) in the order the server appended them."""
    out = []
    for raw in r.lrange(basic.ljournal_key(), 0, -1):
        kind, run_id, ms = raw.decode().split("|")
        out.append((kind, run_id, int(ms)))
    return out


def max_running(r: redis.Redis, among: set[str] | None = None) -> int:
    """The most runs (of `among`, default all) between their start and end entries at any
    point of the journal."""
    running, peak = set(), 0
    for kind, run_id, _ in entries(r):
        if among is not None and run_id not in among:
            continue
        if kind == "s":
            running.add(run_id)
            peak = max(peak, len(running))
        else:
            running.discard(run_id)
    return peak


def starts(r: redis.Redis) -> dict[str, int]:
    return {run_id: ms for kind, run_id, ms in entries(r) if kind == "s"}
