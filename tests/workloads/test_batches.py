"""Batches: exactly-once callbacks, counted in the script call that ends each member (the
batch's runs all live in its partition), whatever the order, the concurrency, the duplicates
or the replays of the members' reports."""

from __future__ import annotations

import random
import threading

import pytest
from duetime.common import transitions as tr
from duetime.common.errors import InvalidState
from duetime.common.scripts import Scripts

from tests.apps import workloads as w
from tests.conftest import SOAK
from tests.integration.inproc import burst

pytestmark = pytest.mark.scripts


def ran(run_id: str) -> int:
    return int(w.r().hget(w.ran_key(), run_id) or 0)


def released(app, run_id: str) -> int:
    """How many times the run was released from waiting (events of its partition)."""
    k = app.keys
    ev = w.r().xrange(k.events(k.partition_of_run(run_id)))
    return sum(1 for _, e in ev if e[b"run"] == run_id.encode() and e[b"event"] == b"released")


def callbacks(role: str = "x") -> dict:
    return {"on_complete": (w.callback, ["complete"]), "on_success": (w.callback, ["success"]),
            "on_failure": (w.callback, ["failure"])}


def test_all_succeed_runs_on_complete_and_on_success_once_and_cancels_on_failure(wapp):
    bid = wapp.batch([(w.member, [i]) for i in range(5)], **callbacks())
    b = wapp.get_batch(bid)
    assert (b.total, b.pending, b.state) == (5, 5, "open")
    assert set(b.callbacks) == {"on_complete", "on_success", "on_failure"}
    assert wapp.get_run(b.on_complete_run).state == "waiting"
    burst(wapp)
    b = wapp.wait_batch(bid, timeout=30)
    assert (b.succeeded, b.failed, b.pending, b.state) == (5, 0, 0, "succeeded")
    assert ran(b.on_complete_run) == 1 and ran(b.on_success_run) == 1
    assert wapp.get_run(b.on_failure_run).state == "cancelled"
    assert ran(b.on_failure_run) == 0
    seen = sorted(x.decode() for x in w.r().lrange(w.seen_batch_key(), 0, -1))
    assert seen == [f"complete|{bid}", f"success|{bid}"]
    members = wapp.batch_members(bid)
    assert len(members) == 5 and all(wapp.get_run(m).batch_id == bid for m in members)


def test_a_failure_runs_on_failure_at_once_and_cancels_on_success(wapp):
    bid = wapp.batch([(w.member, [0, True])] + [(w.member, [i]) for i in range(1, 4)],
                     **callbacks())
    b = wapp.get_batch(bid)
    burst(wapp)
    b = wapp.wait_batch(bid, timeout=30)
    assert (b.succeeded, b.failed, b.state) == (3, 1, "failed")
    assert ran(b.on_failure_run) == 1 and ran(b.on_complete_run) == 1
    run = wapp.get_run(b.on_success_run)
    assert run.state == "cancelled" and "did not succeed" in (run.reason or "")


def _claim_all(app, p: int, n: int) -> list[tr.Claimed]:
    keys, args = tr.claim(app.keys, p, "default", "test-worker", n, 60_000)
    return tr.parse_claim(Scripts(w.r()).claim(keys=keys, args=args)).runs


@pytest.mark.parametrize("outcomes", [("ok", "ok"), ("ok", "fail"), ("fail", "fail")])
def test_the_last_two_members_finishing_at_once_create_each_callback_once(wapp, url, outcomes):
    """Two connections report the last two members at the same instant, 200 times."""
    from duetime.common.connection import sync_client

    k = wapp.keys
    conns = [sync_client(url) for _ in range(2)]  # two connections, as two workers have
    try:
        for _ in range(200):
            bid = wapp.batch([(w.member, [0]), (w.member, [1])], **callbacks())
            p = k.partition_of_run(bid)
            claimed = [c for c in _claim_all(wapp, p, 10) if c.task == "w.member"]
            assert len(claimed) == 2
            go = threading.Barrier(2)

            def report(c: tr.Claimed, conn, outcome: str, go=go, p=p) -> None:
                s = Scripts(conn)
                go.wait()
                if outcome == "ok":
                    keys, args = tr.complete(k, p, [(c.run_id, c.fence)])
                    s.complete(keys=keys, args=args)
                else:
                    keys, args = tr.fail(k, p, "default", c.run_id, c.fence, "boom", "fatal", 0, 0)
                    s.fail(keys=keys, args=args)

            threads = [threading.Thread(target=report, args=(c, conn, o))
                       for c, conn, o in zip(claimed, conns, outcomes, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            b = wapp.get_batch(bid)
            failed = outcomes.count("fail")
            assert (b.succeeded, b.failed, b.pending) == (2 - failed, failed, 0)
            assert b.state == ("failed" if failed else "succeeded")
            assert released(wapp, b.on_complete_run) == 1
            assert released(wapp, b.on_success_run) == (0 if failed else 1)
            assert released(wapp, b.on_failure_run) == (1 if failed else 0)
            # released ones are due exactly once
            due = w.r().zrange(k.due(p, "default"), 0, -1)
            assert due.count(b.on_complete_run.encode()) == 1
            w.r().delete(k.due(p, "default"))  # the next round claims only its own members
    finally:
        for c in conns:
            c.close()


def test_the_callback_exists_once_the_member_report_returns(wapp):
    """No step lies between a member's end and its callback's release for a worker to die
    in: the one complete.lua call that records the last member's success released it."""
    bid = wapp.batch([(w.member, [0])], on_complete=(w.callback, ["complete"]))
    p = wapp.keys.partition_of_run(bid)
    [c] = _claim_all(wapp, p, 10)
    keys, args = tr.complete(wapp.keys, p, [(c.run_id, c.fence)])
    assert Scripts(w.r()).complete(keys=keys, args=args) == [b"succeeded"]
    b = wapp.get_batch(bid)
    assert b.state == "succeeded" and wapp.get_run(b.on_complete_run).state == "scheduled"


def test_a_member_reported_again_or_replayed_after_the_batch_finished_adds_nothing(wapp):
    bid = wapp.batch([(w.member, [0, True]), (w.member, [1])], **callbacks())
    p = wapp.keys.partition_of_run(bid)
    claimed = [c for c in _claim_all(wapp, p, 10) if c.task == "w.member"]
    s = Scripts(w.r())
    for c in claimed:
        keys, args = tr.complete(wapp.keys, p, [(c.run_id, c.fence)])
        s.complete(keys=keys, args=args)
        s.complete(keys=keys, args=args)  # the same report again (a lost reply)
    b = wapp.get_batch(bid)
    assert (b.succeeded, b.failed, b.state) == (2, 0, "succeeded")
    burst(wapp)
    replayed = wapp.replay(claimed[0].run_id, force=True)
    burst(wapp)
    assert wapp.get_run(replayed).state in ("dead", "succeeded")  # the work, done again
    b = wapp.get_batch(bid)
    assert (b.total, b.succeeded, b.failed) == (2, 2, 0)
    assert ran(b.on_complete_run) == 1 and ran(b.on_success_run) == 1
    assert released(wapp, b.on_complete_run) == 1


def test_batch_add_from_inside_a_member(wapp):
    bid = wapp.batch([(w.spawner, [3]), (w.member, [0])], on_complete=(w.callback, ["complete"]))
    burst(wapp)
    b = wapp.wait_batch(bid, timeout=30)
    assert (b.total, b.succeeded, b.failed) == (5, 5, 0)
    assert ran(b.on_complete_run) == 1
    with pytest.raises(InvalidState):
        wapp.batch_add(bid, [(w.member, [9])])


def test_cancel_batch_cancels_members_and_callbacks(wapp):
    bid = wapp.batch([(w.member, [i]) for i in range(3)], **callbacks())
    assert wapp.cancel_batch(bid) == (3, 0, 3)
    b = wapp.get_batch(bid)
    assert (b.failed, b.state, b.cancelled) == (3, "failed", True)
    burst(wapp)
    for rid in b.callbacks.values():
        assert wapp.get_run(rid).state == "cancelled" and ran(rid) == 0


def test_an_empty_batch_completes_at_once(wapp):
    bid = wapp.batch([], on_complete=(w.callback, ["complete"]))
    b = wapp.get_batch(bid)
    assert (b.total, b.state) == (0, "succeeded")
    assert wapp.get_run(b.on_complete_run).state == "scheduled"


# `make soak`: 10,000 members, the size; CI: 2,000, still created in several hold.lua
# calls (HOLD_CHUNK runs each), with two workers racing to the last members
BIG_BATCH = 10_000 if SOAK else 2_000


@pytest.mark.scripts(memory="thousands of runs through the in-memory server take minutes")
def test_a_big_batch_with_random_failures_drained_by_two_workers(wapp):
    import asyncio

    from tests.integration.inproc import drain

    rnd = random.Random(7)
    fails = [rnd.random() < 0.1 for _ in range(BIG_BATCH)]
    bid = wapp.batch([(w.member, [i, f]) for i, f in enumerate(fails)], **callbacks())

    async def two() -> None:
        await asyncio.gather(drain(wapp, concurrency=64), drain(wapp, concurrency=64))

    asyncio.run(two())
    b = wapp.wait_batch(bid, timeout=120)
    members = wapp.batch_members(bid, limit=2 * BIG_BATCH)
    assert len(members) == BIG_BATCH
    pipe = w.r().pipeline(transaction=False)
    for m in members:
        pipe.hget(wapp.keys.run(wapp.keys.partition_of_run(m), m), "state")
    states = [s.decode() for s in pipe.execute()]
    assert b.succeeded == states.count("succeeded") == fails.count(False)
    assert b.failed == states.count("dead") == fails.count(True)
    burst(wapp)
    assert ran(b.on_complete_run) == 1 and ran(b.on_failure_run) == 1
    assert ran(b.on_success_run) == 0


def test_await_batch_and_the_timeout(wapp):
    import asyncio

    from duetime.common.errors import BatchWaitTimeout

    bid = wapp.batch([(w.member, [0])])
    with pytest.raises(BatchWaitTimeout):
        wapp.wait_batch(bid, timeout=0)
    burst(wapp)
    b = asyncio.run(wapp.await_batch(bid, timeout=30))
    assert b.state == "succeeded" and b.callbacks == {}


def test_the_retention_sweep_deletes_finished_batches_and_keeps_open_ones(wapp):
    done = wapp.batch([(w.member, [0])])
    burst(wapp)
    assert wapp.get_batch(done).finished
    still = wapp.batch([(w.member, [1])], on_complete=(w.callback, ["c"]))
    w.r().delete(*[wapp.keys.due(p, "default") for p in range(wapp.keys.partitions)])
    for b in (done, still):  # time moved on: both are older than the retention
        w.r().zadd(wapp.keys.batches(wapp.keys.partition_of_run(b)), {b: 1})
    s = Scripts(w.r())
    for p in {wapp.keys.partition_of_run(done), wapp.keys.partition_of_run(still)}:
        keys, args = tr.reap(wapp.keys, p, 100, 0.5, 60_000)
        s.reap(keys=keys, args=args)
    from duetime.common.errors import RunNotFound

    with pytest.raises(RunNotFound):
        wapp.get_batch(done)
    assert wapp.get_batch(still).state == "open"
