"""How a claim's budget is split over the due keys (worker/claims.py `plan_claim`, and the
depth estimate `DueTimes.sized` feeds it): keys with a backlog are claimed in big calls, few to
a claim (a claim.lua call costs Redis a large fixed amount), without leaving a key that has a
lone run behind them, and without changing the order of queues."""

from __future__ import annotations

import asyncio

from duetime.common.keys import Keyspace
from duetime.worker.claims import CLAIM_MIN_SHARE, CLAIMS_IN_FLIGHT, Claimer, plan_claim
from duetime.worker.clock import ServerClock
from duetime.worker.config import WorkerConfig
from duetime.worker.due import DueTimes, Key


def _keys(n: int, queue: str = "default") -> list[Key]:
    return [(p, queue) for p in range(n)]


def test_keys_of_unknown_depth_share_evenly_at_least_the_minimum_each():
    """What a claim always did when it knew nothing of the keys: 128 slots over 16 keys go
    16 each to the first 8; over 2 keys, half each."""
    assert plan_claim(_keys(16), 128, {}) == [((p, "default"), 16) for p in range(8)]
    assert plan_claim(_keys(2), 128, {}) == [((0, "default"), 64), ((1, "default"), 64)]
    assert plan_claim(_keys(3), 10, {}) == [((0, "default"), 10)]  # the minimum, capped
    assert plan_claim([], 128, {}) == []
    assert plan_claim(_keys(4), 0, {}) == []


def test_a_key_with_a_backlog_is_asked_for_it_in_one_call():
    keys = _keys(16)
    backlog = {k: 1000 for k in keys}
    assert plan_claim(keys, 128, backlog) == [((0, "default"), 128)]  # one call, not 8
    small = {k: 40 for k in keys}
    assert plan_claim(keys, 128, small) == [((0, "default"), 40), ((1, "default"), 40),
                                            ((2, "default"), 40), ((3, "default"), 8)]


def test_keys_of_unknown_depth_go_first_with_at_most_half_beside_a_backlog():
    """A key with a lone run (unknown depth) is in the next claim even when keys with a
    backlog come before it in the fair order; together they take at most half of the
    budget, the backlog the rest."""
    keys = [(0, "default"), (1, "default"), (2, "default"), (3, "default")]
    backlog = {(0, "default"): 1000, (1, "default"): 1000}
    plan = plan_claim(keys, 128, backlog)
    assert plan == [((2, "default"), 32), ((3, "default"), 32), ((0, "default"), 64)]
    many = _keys(16)
    plan = plan_claim(many, 128, {many[0]: 1000})
    asked = dict(plan)
    assert sum(n for k, n in plan if k != many[0]) == 64  # 4 keys of unknown depth, 16 each
    assert asked[many[0]] == 64
    assert all(n >= CLAIM_MIN_SHARE for n in asked.values())


def test_the_order_of_queues_is_kept():
    """Strict priority: a backlog of the first queue takes the budget before a lone run of
    the second is considered, as before."""
    high, low = _keys(4, "high"), [(0, "low")]
    backlog = {k: 1000 for k in high}
    assert plan_claim(high + low, 128, backlog) == [((0, "high"), 128)]
    # the second queue gets what the first leaves (the even share: 128 / 5 keys)
    assert plan_claim(high + low, 128, {k: 20 for k in high}) == [
        ((0, "high"), 20), ((1, "high"), 20), ((2, "high"), 20), ((3, "high"), 20),
        ((0, "low"), 26)]


def test_the_estimate_doubles_while_claims_come_back_full_and_is_forgotten_otherwise():
    due = DueTimes(Keyspace("t", 16), ["default"], "w", lambda: None)
    key = (3, "default")
    due.sized(key, 16, 16, more=True)
    assert due.backlog[key] == 32
    due.sized(key, 32, 32, more=True)
    assert due.backlog[key] == 64
    due.sized(key, 10, 10, more=True)  # asked for less than it holds: the estimate stays
    assert due.backlog[key] == 64
    due.sized(key, 64, 64, more=False)  # full, but nothing more due: drained
    assert key not in due.backlog
    due.sized(key, 16, 16, more=True)
    due.sized(key, 32, 5, more=True)  # fewer than asked (a limit held some back)
    assert key not in due.backlog
    due.sized(key, 0, 0, more=True)
    assert key not in due.backlog


def _drain(partitions: int, per_key: int, budget: int, lone_at: int | None = None
           ) -> tuple[list[list[tuple[Key, int]]], int | None]:
    """Drive DueTimes and plan_claim the way the claim loop does, one claim at a time, over
    a backlog of `per_key` runs in each partition; `lone_at`: after that many claims, a lone
    run becomes due in one more partition (the one served most recently). → the plans, and
    the number of the claim that took the lone run."""
    due = DueTimes(Keyspace("t", partitions + 1), ["default"], "w", lambda: None)
    left = {(p, "default"): per_key for p in range(partitions)}
    for k in left:
        due.note(k, 0)
    plans: list[list[tuple[Key, int]]] = []
    lone: Key = (partitions, "default")
    took_lone: int | None = None
    while any(left.values()) or (lone_at is not None and took_lone is None):
        if lone_at is not None and len(plans) == lone_at:
            left[lone] = 1
            due.served(lone)  # claimed just before: last in the fair order
            due.note(lone, 0)
        plan = plan_claim(due.due_now(1e18), budget, due.backlog)
        for k, _ in plan:
            due.served(k)
        for k, n in plan:
            got = min(n, left[k])
            left[k] -= got
            if k == lone and got:
                took_lone = len(plans)
            due.set(k, 0 if left[k] else None, due.seq)
            due.sized(k, n, got, more=left[k] > 0)
        plans.append(plan)
    return plans, took_lone


def test_a_drain_of_many_partitions_ends_up_in_calls_of_the_whole_budget():
    plans, _ = _drain(16, 1250, 128)
    calls = [n for plan in plans for _, n in plan]
    assert sum(calls) >= 16 * 1250
    # the first claims know nothing and spread (16 a call, as before); soon the calls ask
    # for the whole budget: 9 runs of 10 go in calls of 128 (before: every call was 16)
    assert len(calls) < 16 * 1250 / 100, len(calls)
    assert sum(n for n in calls if n == 128) > 0.9 * 16 * 1250


def test_a_lone_run_is_in_the_next_claim_beside_the_backlogs():
    """16 partitions with a backlog each, claimed one big call at a time; a lone run in a
    partition claimed just before (last in the fair order) is taken by the very next claim."""
    plans, took = _drain(16, 1250, 128, lone_at=40)
    assert took == 40
    assert len(plans[40]) == 2  # the lone key, and a backlog with the rest of the budget


class _Executor:
    """What the claim loop reads of the executor: the attempts in flight."""

    def __init__(self) -> None:
        self.inflight: dict[object, object] = {}


def _claimer(concurrency: int) -> tuple[Claimer, list[int]]:
    """A Claimer whose claims only record their budget and wait for the test to end them."""
    cfg = WorkerConfig(queues=["default"], concurrency=concurrency, claim_ahead_ms=0)
    due = DueTimes(Keyspace("t", 16), ["default"], "w", lambda: None)
    for p in range(16):
        due.note((p, "default"), 0)
    claimer = Claimer(None, None, Keyspace("t", 16), cfg, due, ServerClock(),  # type: ignore[arg-type]
                      _Executor(), asyncio.Event())  # type: ignore[arg-type]
    budgets: list[int] = []
    gate = asyncio.Event()

    async def claim(plan: list[tuple[Key, int]]) -> int:
        budgets.append(sum(n for _, n in plan))
        await gate.wait()
        return 1

    claimer._claim = claim  # type: ignore[method-assign]
    claimer.gate = gate  # type: ignore[attr-defined]
    return claimer, budgets


def test_a_second_claim_for_a_lone_run_is_not_sent_while_the_first_is_on_its_way():
    """A key of unknown depth with a claim on its way is left out of the next claim (the
    runs it had are on their way already: a second claim came back empty and held the loop
    a millisecond, for every run of a sparse queue); a key known to hold more is not."""
    async def main() -> None:
        claimer, budgets = _claimer(64)
        claimer.due.next_due = {(0, "default"): 0}  # a lone key due
        claimer._stopping = asyncio.Event()
        claimer.poke()
        await asyncio.sleep(0)
        assert budgets == [32] and claimer._in_flight == 1  # one claim, not two
        claimer.due.backlog[(0, "default")] = 1000  # a backlog: a second claim is worth it
        claimer.poke()
        await asyncio.sleep(0)
        assert budgets == [32, 32]
        claimer.gate.set()  # type: ignore[attr-defined]
        await asyncio.gather(*claimer._claims)
        assert claimer._claiming == {}

    asyncio.run(main())


def test_a_poke_sends_the_claims_the_freed_slots_allow_at_once():
    """At a claimed batch's end (Executor.on_batch_end) the claimer spawns the next claims
    itself rather than waiting for its loop's turn: up to CLAIMS_IN_FLIGHT, each for its share
    of the free slots; a claim that ended counts as ended at once (not a step later, when its
    task's done callback runs); nothing is sent before the loop runs nor once it stops."""
    async def main() -> None:
        claimer, budgets = _claimer(256)
        claimer.poke()
        assert budgets == [] and claimer._in_flight == 0  # the claim loop is not running
        stopping = asyncio.Event()
        claimer._stopping = stopping
        claimer.poke()
        await asyncio.sleep(0)
        assert budgets == [128, 128] and claimer._in_flight == CLAIMS_IN_FLIGHT
        # planned as they were spawned: the second claim went to the keys the first left
        assert len(claimer._claiming) == 16 and set(claimer._claiming.values()) == {1}
        claimer.poke()  # nothing more: two claims are in flight
        await asyncio.sleep(0)
        assert len(budgets) == 2
        seen: list[int] = []  # claims counted in flight when each claim's task is done
        for task in claimer._claims:
            task.add_done_callback(lambda _: seen.append(claimer._in_flight))
        claimer.gate.set()  # type: ignore[attr-defined]
        await asyncio.gather(*claimer._claims)
        assert seen == [0, 0] and claimer._reserved == 0
        stopping.set()
        claimer.poke()
        await asyncio.sleep(0)
        assert len(budgets) == 2
        await asyncio.gather(*claimer._claims)

    asyncio.run(main())
