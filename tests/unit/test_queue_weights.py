"""Weighted queues (`--queues high:5,low:1`, worker/due.py): each queue's virtual time advances
by runs claimed / weight, the queue furthest behind is claimed first. What a weight means, as
docs/fairness.md states it: a queue's share of the runs claimed while every queue has work."""

from __future__ import annotations

import collections

import pytest
from duetime.common.keys import Keyspace
from duetime.worker.due import DueTimes


def _shares(weights: dict[str, int], in_flight: int, runs: dict[str, int], claims: int = 6000,
            idle: tuple[str, int, int] | None = None) -> dict[str, float]:
    """Drive DueTimes the way the worker does: up to `in_flight` claims planned before the
    oldest reply is accounted; a claim on queue q returns runs[q] runs. `idle`: (queue, from,
    to) claim numbers during which that queue has nothing due."""
    queues = list(weights)
    due = DueTimes(Keyspace("t", 16), queues, "w", lambda: None, dict(weights))
    for p in range(16):
        for q in queues:
            due.note((p, q), 0)
    got: collections.Counter[str] = collections.Counter()
    pending: collections.deque[tuple[int, str]] = collections.deque()
    for n in range(claims):
        while len(pending) < in_flight:
            if idle and idle[1] <= n < idle[2]:
                for p in range(16):
                    due.next_due.pop((p, idle[0]), None)
            elif idle and n == idle[2]:
                for p in range(16):
                    due.note((p, idle[0]), 0)
            key = due.due_now(1e18)[0]
            due.served(key)
            pending.append(key)
        key = pending.popleft()
        due.account(key, runs[key[1]])
        got[key[1]] += runs[key[1]]
    total = sum(got.values())
    return {q: got[q] / total for q in queues}


@pytest.mark.parametrize("in_flight", [1, 2])
@pytest.mark.parametrize("low_runs", [4, 1])
def test_a_weight_is_a_share_of_the_runs_claimed(in_flight: int, low_runs: int) -> None:
    """high:5,low:1 gives low 1/6 of the runs, with one or two claims in flight, and whether a
    low claim brings back a full batch or a single run."""
    shares = _shares({"high": 5, "low": 1}, in_flight, {"high": 4, "low": low_runs})
    assert shares["low"] == pytest.approx(1 / 6, abs=0.005)


def test_a_queue_back_from_idle_does_not_catch_up() -> None:
    """A queue idle for a while starts at the current virtual time: no burst afterwards."""
    shares = _shares({"high": 5, "low": 1}, 2, {"high": 4, "low": 4}, claims=6000,
                     idle=("low", 1000, 3000))
    # low had work for 4000 of 6000 claims: about 1/6 of the runs claimed in that time
    assert shares["low"] < 1 / 6
    after = _shares({"high": 1, "low": 1}, 2, {"high": 4, "low": 4}, claims=2000,
                    idle=("low", 0, 1000))
    assert after["low"] == pytest.approx(0.25, abs=0.01)  # half of the second half, no more
