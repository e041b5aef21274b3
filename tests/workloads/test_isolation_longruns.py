"""Process isolation across the child boundary: a task with `isolation="process"` checkpoints,
reports progress, continues and meets back-pressure exactly as from a thread. The child sends
its checkpoint and progress to the worker, which writes the checkpoint with the attempt's
fence (a stale attempt is refused by checkpoint.lua and sees lease_lost in the child) and puts
the progress on its heartbeat; Continue and RateLimited come back as themselves
(worker/isolation.py). Retry and Fatal are in test_isolation.py. In-process workers, real
children, real Redis."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from duetime.common.codec import pack_checkpoint
from duetime.common.metrics import RATE_LIMITED
from duetime.worker.isolation import remote_error

import duetime
from tests.apps import isolated
from tests.integration.inproc import Gate, serving, until
from tests.workloads.longrun_kit import Scripted
from tests.workloads.test_isolation import aio, ended, iso, pids, settings

__all__ = ["iso"]
# real servers, both kinds (checkpoint.lua's fence check is what is crossed); not the memory
# backend (a child process cannot reach it); slow: each test starts task processes
pytestmark = [pytest.mark.scripts(memory="task processes cannot reach this process's memory"),
              pytest.mark.slow]


def entries(run_id: str) -> list[list[Any]]:
    return [json.loads(e) for e in isolated.r().lrange(isolated.log_key(run_id), 0, -1)]


def go(run_id: str) -> None:
    isolated.r().rpush(isolated.go_key(run_id), "go")


@aio
async def test_a_child_checkpoints_and_the_next_child_resumes_from_the_checkpoint(iso: Any) -> None:
    """50 items, a checkpoint every 10; the first attempt's child dies at item 25: the retry,
    in a new child, starts from item 20 (the checkpoint the worker wrote for the first)."""
    async with serving(iso, **settings()) as w:
        rid = isolated.ck_iter.enqueue(50, 10, 25)
        run = await until(lambda: ended(iso, rid), timeout=60, what="the iteration")
        assert w.executor.checkpoints is not None
        written = w.executor.checkpoints.written
    assert run.state == "succeeded"
    assert [a.outcome for a in run.attempts] == ["failed", "succeeded"]
    log = entries(rid)
    assert [e for e in log if e[0] == "start"] == [["start", 1, 1, None],
                                                   ["start", 2, 2, {"next": 20}]]
    assert [e[1] for e in log if e[0] == "item"] == list(range(25)) + list(range(20, 50))
    assert run.result == {"start": 20, "state": {"next": 50}}
    assert run.checkpoint_fence == 2  # written under the second attempt's fence
    assert written == 5  # by the worker: 10 and 20 for the first child, 30, 40, 50 after
    first, second = pids(rid)
    assert first != second


@aio
async def test_progress_from_a_child_rides_on_the_worker_heartbeat(iso: Any) -> None:
    async with serving(iso, **settings()):
        rid = isolated.progress_wait.enqueue(250, 1000, "importing shard 3")
        await until(lambda: entries(rid), timeout=60, what="the child to report")

        def shown() -> object:
            p = iso.get_run(rid).progress
            return p if p is not None and p.done == 250 else None

        p = await until(shown, timeout=30, what="a heartbeat to carry the progress")
        go(rid)
        run = await until(lambda: ended(iso, rid), timeout=30, what="the run to end")
    assert (p.done, p.total, p.note) == (250, 1000, "importing shard 3")
    assert run.state == "succeeded"


@aio
async def test_an_async_task_in_a_child_acheckpoints_and_reports_progress(iso: Any) -> None:
    async with serving(iso, **settings()):
        rid = isolated.aprogress_ck.enqueue(7, 9)
        [[what, sync_error]] = await until(lambda: entries(rid), timeout=60,
                                           what="the child to checkpoint")

        def shown() -> object:
            p = iso.get_run(rid).progress
            return p if p is not None and p.done == 7 else None

        p = await until(shown, timeout=30, what="a heartbeat to carry the progress")
        go(rid)
        run = await until(lambda: ended(iso, rid), timeout=30, what="the run to end")
    assert what == "checkpointed" and p.total == 9
    # the sync call from an async task is refused as in the worker (it would block the loop)
    assert sync_error.startswith("checkpoint() would block the event loop")
    assert run.state == "succeeded" and run.result == {"async": 7}
    assert run.checkpoint_fence == 1 and run.checkpoint_size == len(pack_checkpoint({"async": 7}))


@aio
async def test_a_stale_child_gets_checkpoint_refused_and_sees_lease_lost(iso: Any) -> None:
    """The child's attempt A checkpoints (fence 1), then waits; its worker's heartbeats are
    held (a stalled worker, seen from Redis), its lease expires, holder B claims the run
    (fence 2) and checkpoints. Then A's child checkpoints again: the worker's fenced write is
    refused, the child gets CheckpointRefused with lease_lost True, B's checkpoint stands."""
    s = Scripted(iso)
    async with serving(iso, **settings(concurrency=1)) as w:  # one slot: it cannot claim B
        gate = Gate(w)
        rid = isolated.stale_ck.enqueue()
        await until(lambda: entries(rid), timeout=60, what="attempt A's first checkpoint")
        gate.open.clear()
        s.expire_and_reap(rid)
        [b] = s.claim("wB")
        assert b.fence == 2
        assert s.checkpoint(rid, "wB", 2, pack_checkpoint({"by": "B"})) == "stored"
        go(rid)  # A goes on, and tries to checkpoint
        await until(lambda: len(entries(rid)) == 2, timeout=30, what="A's second checkpoint")
        assert w.executor.checkpoints is not None
        refused = w.executor.checkpoints.refused
        gate.open.set()
    first, second = entries(rid)
    assert first == ["stored", 1]
    assert second[0] == "refused" and second[1] == 1, second
    assert "no longer holds the run" in second[2] and second[3] is True  # lease_lost
    assert refused == 1
    assert msgpack.unpackb(s.field(rid, "checkpoint")) == {"by": "B"}
    assert s.field(rid, "checkpoint_fence") == b"2"
    assert s.events(rid, "checkpoint_rejected") == ["fence 1 (the run is at fence 2, running)"]
    run = iso.get_run(rid)
    assert run.state == "running" and run.worker == "wB"  # A's ending changed nothing


@pytest.mark.parametrize("keep", [False, True])
@aio
async def test_continue_raised_in_a_child_reruns_the_same_id_from_its_state(iso: Any,
                                                                           keep: bool) -> None:
    """Continue(state=...) and, with keep, checkpoint() then Continue(): one slice per claim,
    each from the state the previous left, no attempt spent."""
    async with serving(iso, **settings()):
        rid = isolated.iso_slices.enqueue(3, keep=keep)
        run = await until(lambda: ended(iso, rid), timeout=60, what="the slices")
    assert run.state == "succeeded" and run.result == 3
    assert [e[1:] for e in entries(rid)] == [[1, f, f - 1] for f in range(1, 5)]
    assert run.attempt == 1 and run.fence == 4 and run.continuations == 3
    assert [a.outcome for a in run.attempts] == ["continued"] * 3 + ["succeeded"]
    assert run.checkpoint_fence == 3


@pytest.mark.parametrize("scope", ["task", "queue"])
@aio
async def test_rate_limited_raised_in_a_child_gives_the_run_back_and_holds_its_scope(
        iso: Any, scope: str) -> None:
    before = RATE_LIMITED.labels("iso_limited", scope)._value.get()
    async with serving(iso, **settings()):
        rid = isolated.iso_limited.enqueue(scope)
        run = await until(lambda: ended(iso, rid), timeout=60, what="the limited run")
    assert run.state == "succeeded" and run.result == 2
    assert run.attempt == 1  # the 429 spent no attempt
    assert entries(rid) == [["claim", 1, 1], ["claim", 1, 2]]
    p = iso.keys.partition_of_run(rid)
    assert iso.store.client.hget(iso.keys.run(p, rid), "rate_limited") == b"1"
    # reported with the child's scope (the hold's effect is tests/workloads/test_rate_limited)
    assert RATE_LIMITED.labels("iso_limited", scope)._value.get() - before == 1


def test_continue_and_rate_limited_map_back_with_what_the_worker_reads() -> None:
    c = remote_error({"kind": "continue", "type": "Continue", "msg": "m", "delay_ms": 1500,
                      "state": b"\x81\xa1i\x01"})
    assert isinstance(c, duetime.Continue)
    assert (c.delay_ms, c.delay, c.state_bytes) == (1500, 1.5, b"\x81\xa1i\x01")
    rl = remote_error({"kind": "rate_limited", "type": "Partner429", "retry_after_ms": 2500,
                       "scope": "tenant"})
    assert isinstance(rl, duetime.RateLimited) and type(rl).__name__ == "Partner429"
    assert (rl.retry_after_ms, rl.retry_after, rl.scope) == (2500, 2.5, "tenant")
    # what no child of ours sends is a plain failure, never a hold or a continuation
    for bad in ({"kind": "rate_limited", "retry_after_ms": 10, "scope": "planet"},
                {"kind": "rate_limited", "retry_after_ms": 0, "scope": "task"},
                {"kind": "continue", "delay_ms": -1, "state": None},
                {"kind": "continue", "delay_ms": 0, "state": "not bytes"}):
        exc = remote_error(bad)
        assert not isinstance(exc, duetime.Continue | duetime.RateLimited | duetime.Retry), bad
