"""`current_run().checkpoint(state)`: a small state only the current fence may write, read by
the next attempt as `checkpoint_state`; a stale holder's write is refused, whatever it tries;
an iteration killed again and again (SIGKILL) redoes nothing before its last checkpoint."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import msgpack
import pytest
from duetime.common.codec import CHECKPOINT_MAX_BYTES, pack_checkpoint

import duetime
from tests.apps import longruns
from tests.conftest import SOAK, wait_for
from tests.integration.inproc import Gate, burst, serving, until
from tests.workloads.longrun_kit import Scripted, lapp

__all__ = ["lapp"]


@pytest.mark.scripts
def test_a_stale_holder_cannot_overwrite_the_newer_checkpoint(lapp):
    """Attempt A holds fence 1; its lease expires on purpose, the reaper recovers the run and
    attempt B claims it (fence 2) and checkpoints. A's writes, with its own token or any mix,
    are refused; B's checkpoint is intact, and each refusal is in the events."""
    s = Scripted(lapp)
    run_id = longruns.stale_probe.enqueue("x")
    [a] = s.claim("wA")
    assert s.checkpoint(run_id, "wA", a.fence, pack_checkpoint({"by": "A", "n": 1})) == "stored"
    s.expire_and_reap(run_id)
    [b] = s.claim("wB")
    assert (a.fence, b.fence) == (1, 2)
    b_state = pack_checkpoint({"by": "B", "n": 2})
    assert s.checkpoint(run_id, "wB", b.fence, b_state) == "stored"
    accepted = 0
    for worker, fence in [("wA", 1), ("wA", 2), ("wB", 1), ("wA", 3)]:  # stale, or never held
        accepted += s.checkpoint(run_id, worker, fence, pack_checkpoint({"by": "A"})) == "stored"
    assert accepted == 0
    assert s.field(run_id, "checkpoint") == b_state
    assert s.field(run_id, "checkpoint_fence") == b"2"
    assert s.field(run_id, "checkpoint_size") == str(len(b_state)).encode()
    assert len(s.events(run_id, "checkpoint_rejected")) == 4
    # B itself may write again; once the run is no longer running, nobody may
    assert s.checkpoint(run_id, "wB", 2, pack_checkpoint({"n": 3})) == "stored"
    s.expire_and_reap(run_id)
    assert s.checkpoint(run_id, "wB", 2, pack_checkpoint({"n": 4})) == "stale"
    assert msgpack.unpackb(s.field(run_id, "checkpoint")) == {"n": 3}
    assert s.checkpoint("no-such-run", "wB", 1, b"\x90") == "missing"


@pytest.mark.scripts
def test_the_script_refuses_a_state_over_the_cap_whoever_sends_it(lapp):
    s = Scripted(lapp)
    run_id = longruns.stale_probe.enqueue("x")
    [a] = s.claim("wA")
    assert s.checkpoint(run_id, "wA", a.fence, b"x" * (CHECKPOINT_MAX_BYTES + 1)) == "too_large"
    assert s.field(run_id, "checkpoint") is None
    assert s.checkpoint(run_id, "wA", a.fence, b"x" * CHECKPOINT_MAX_BYTES) == "stored"


def test_a_stale_attempt_in_a_worker_gets_checkpoint_refused_and_sees_lease_lost(lapp):
    """End to end: attempt A runs in a worker (its heartbeats held, so nothing renews the lease
    meanwhile); the lease expires, another holder claims the run (fence 2) and checkpoints;
    then A's task calls checkpoint(): CheckpointRefused in the task, lease_lost True, B's
    checkpoint intact."""
    s = Scripted(lapp)

    async def main() -> str:
        run_id = longruns.stale_probe.enqueue("A")
        async with serving(lapp, concurrency=1) as w:
            gate = Gate(w)
            await until(lambda: longruns.seen.get(run_id), 10, what="attempt A to start")
            gate.open.clear()  # A's heartbeats held: a stalled worker, seen from Redis
            s.expire_and_reap(run_id)
            [b] = s.claim("wB")
            assert b.fence == 2
            assert s.checkpoint(run_id, "wB", 2, pack_checkpoint({"by": "B"})) == "stored"
            longruns.gates[run_id].set()  # A goes on, and tries to checkpoint
            await until(lambda: len(longruns.seen[run_id]) == 2, 10, what="A's checkpoint")
            gate.open.set()
        return run_id

    run_id = asyncio.run(main())
    started, outcome = longruns.seen[run_id]
    assert started == ("started", 1, None)
    assert outcome[0] == "refused" and outcome[1] == 1, outcome
    assert "no longer holds the run" in outcome[2] and outcome[3] is True  # lease_lost
    assert msgpack.unpackb(s.field(run_id, "checkpoint")) == {"by": "B"}
    assert s.field(run_id, "checkpoint_fence") == b"2"
    assert s.events(run_id, "checkpoint_rejected") == ["fence 1 (the run is at fence 2, running)"]
    run = lapp.get_run(run_id)
    assert run.state == "running" and run.worker == "wB"  # A's ending changed nothing


@pytest.mark.scripts
def test_the_next_attempt_reads_the_checkpoint_and_a_first_attempt_none(lapp):
    run_id = longruns.fail_once.enqueue()
    burst(lapp)  # attempt 1 fails after its checkpoint; its retry is due at once
    assert lapp.wait(run_id, timeout=10) == {"step": 7}
    assert longruns.seen[run_id] == [(1, None), (2, {"step": 7})]
    run = lapp.get_run(run_id)
    assert run.checkpoint_fence == 1 and run.checkpoint_size == len(pack_checkpoint({"step": 7}))


@pytest.mark.scripts
def test_a_checkpoint_redis_cannot_read_gives_the_run_back_without_spending_an_attempt(
        lapp, monkeypatch):
    """A chaos run caught it: the server went away while a retry read its checkpoint, and the
    attempt was recorded as failed with the connection error although its body never ran."""
    import redis
    from duetime.worker.checkpoints import Checkpoints

    real, failed = Checkpoints.prepare, []

    async def flaky(self, ex):  # the first read of a checkpoint fails, as during a restart
        if ex.ctx.fence > 1 and not failed:
            failed.append(ex.ctx.run_id)
            raise redis.ConnectionError("Connection closed by server.")
        return await real(self, ex)

    monkeypatch.setattr(Checkpoints, "prepare", flaky)
    run_id = longruns.fail_once.enqueue()
    burst(lapp)  # attempt 1 fails; its retry's start meets the lost read and is handed back
    assert failed == [run_id] and lapp.get_run(run_id).state == "scheduled"
    # the hand-back's short delay, advanced instead of slept through: due at the server's now
    r, k = lapp.store.client, lapp.keys
    sec, usec = r.time()
    assert r.zadd(k.due(k.partition_of_run(run_id), lapp.get_run(run_id).queue),
                  {run_id: sec * 1000 + usec // 1000}, xx=True, ch=True)
    burst(lapp)
    assert lapp.wait(run_id, timeout=10) == {"step": 7}
    run = lapp.get_run(run_id)
    assert failed == [run_id]
    # attempt 1 failed (the task's own failure); the given-back claim spent nothing
    assert [a.outcome for a in run.attempts][-1] == "succeeded"
    assert run.attempt == 2 and longruns.seen[run_id] == [(1, None), (2, {"step": 7})]
    assert not any("Connection closed" in (a.error or "") for a in run.attempts)


@pytest.mark.scripts
def test_a_checkpoint_damaged_by_hand_dead_letters_the_run_instead_of_starting_over(lapp):
    s = Scripted(lapp)
    run_id = longruns.slices.enqueue(3)
    s.claim("wA")
    s.r.hset(lapp.keys.run(lapp.keys.partition_of_run(run_id), run_id), "checkpoint", b"\xc1")
    s.expire_and_reap(run_id)
    burst(lapp)
    run = lapp.get_run(run_id)
    assert run.state == "dead" and "checkpoint unreadable" in (run.error or ""), run.error
    assert run_id not in longruns.seen  # the body never ran from nothing


@pytest.mark.scripts
def test_checkpoint_errors_are_clear(lapp):
    big = longruns.too_large.enqueue(CHECKPOINT_MAX_BYTES)
    small = longruns.too_large.enqueue(1000)
    on_loop = longruns.sync_on_loop.enqueue()
    burst(lapp)
    assert lapp.wait(big, timeout=5).startswith("CheckpointTooLarge: checkpoint state is 65,5")
    assert "over the 65,536-byte cap (64 KiB)" in lapp.wait(big, timeout=5)
    assert lapp.wait(small, timeout=5) == "stored"
    assert "use `await current_run().acheckpoint(state)`" in lapp.wait(on_loop, timeout=5)
    with pytest.raises(RuntimeError, match="only available inside a task run by a duetime"):
        duetime.RunContext(run_id="r", task="t", queue="q", attempt=1, fence=1, worker_id="w",
                           idempotency_key="r", scheduled_at=None).checkpoint({"a": 1})


# `make soak`: the size, 100,000 items and 20 kills (about 25 s a server kind on a busy
# machine); CI: 5 kills, each at a random point of a chunk like the soak's, over 30,000 items
# (the kills' targets add up to at most 5 x 4,000, so the run is still going at the last kill)
ITEMS, EVERY, KILLS = (100_000, 1_000, 20) if SOAK else (30_000, 1_000, 5)
APP = "tests.apps.longruns:app"


class Journal:
    """The task's record of what it processed (tests/apps/longruns.py `iterate`): `start
    <fence> <from>` when an attempt starts, then one line per item. Read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.segments: list[tuple[int, int, list[int]]] = []  # (fence, from, items)

    def poll(self) -> Journal:
        if not self.path.exists():
            return self
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1  # whole lines only
        self.offset += cut
        for line in data[:cut].decode().splitlines():
            if line.startswith("start "):
                _, fence, start = line.split()
                self.segments.append((int(fence), int(start), []))
            else:
                self.segments[-1][2].append(int(line))
        return self


@pytest.mark.scripts(memory="worker subprocesses")
def test_an_iteration_killed_again_and_again_redoes_nothing_before_its_last_checkpoint(
        lapp, procs, tmp_path):
    """ITEMS items, a checkpoint every 1,000, the worker holding the run SIGKILLed KILLS times
    at random points (its lease expired on purpose and reaped at once, a spare worker taking
    over; the holder is SIGSTOPped at the kill point until a spare is up, then SIGKILLed):
    every item processed; each attempt resumed exactly at the last checkpoint stored
    before the kill, so none was processed more than once past it per kill."""
    s, rng = Scripted(lapp), random.Random(19)
    path = tmp_path / "items"
    journal = Journal(path)
    workers = [procs.worker("--lease", "3s", "--concurrency", "2", app=APP) for _ in range(3)]
    run_id = longruns.iterate.enqueue(str(path), ITEMS, EVERY, 100, 0.004)
    by_pid = {p.pid: p for p in workers}

    def ready_spares(holder_pid: int) -> list[int]:
        live = {int(w.decode().split(":")[-2]) for w in s.r.zrange(lapp.keys.workers, 0, -1)}
        return [pid for pid, p in by_pid.items()
                if pid != holder_pid and pid in live and p.poll() is None]

    started = time.monotonic()
    for kill in range(KILLS):
        target = rng.randint(300, 4_000)  # items into this attempt: anywhere within a chunk
        wait_for(lambda k=kill, t=target: (j := journal.poll()).segments
                 and len(j.segments) == k + 1 and len(j.segments[-1][2]) >= t,
                 60, 0.01, what=f"attempt {kill + 1} to process {target} items")
        holder = s.field(run_id, "worker")
        assert holder is not None
        holder_pid = int(holder.decode().split(":")[-2])
        # stopped where it is while a spare comes up (the kill point is the target, not
        # however far it got meanwhile), then killed
        os.kill(holder_pid, signal.SIGSTOP)
        wait_for(lambda h=holder_pid: ready_spares(h), 60, what="a spare worker to be up")
        os.kill(holder_pid, signal.SIGKILL)
        by_pid.pop(holder_pid).wait(10)
        s.expire_and_reap(run_id)  # its lease expires now, not 3 s later
        p = procs.worker("--lease", "3s", "--concurrency", "2", app=APP)
        by_pid[p.pid] = p
    wait_for(lambda: lapp.get_run(run_id).state == "succeeded", 120, 0.1, what="the run's end")
    assert lapp.get_run(run_id).result == ITEMS
    elapsed = time.monotonic() - started

    segments = journal.poll().segments
    assert len(segments) == KILLS + 1, [(f, st, len(it)) for f, st, it in segments]
    seen_items: set[int] = set()
    redone = 0
    for n, (fence, start, items) in enumerate(segments):
        assert fence == n + 1  # one claim per kill, no other restart
        assert items == list(range(start, start + len(items)))  # in order, none skipped
        assert start % EVERY == 0
        if n:  # resumed at the last checkpoint the killed attempt stored
            _, prev_start, prev = segments[n - 1]
            reached = prev[-1] + 1 if prev else prev_start  # items the killed attempt wrote
            assert prev_start <= start <= reached, (n, prev_start, start, reached)
            assert reached - start <= EVERY, (n, start, reached)  # at most one chunk again
            redone += reached - start
        seen_items.update(items)
    assert seen_items == set(range(ITEMS))  # every item processed
    assert segments[-1][2][-1] == ITEMS - 1
    run = lapp.get_run(run_id)
    assert [a.outcome for a in run.attempts] == ["unknown"] * KILLS + ["succeeded"]
    assert run.checkpoint_size is not None and run.checkpoint_fence == KILLS + 1
    assert msgpack.unpackb(s.field(run_id, "checkpoint")) == {"next": ITEMS}
    print(f"{KILLS} kills, {redone} items redone in all (at most {EVERY} per kill), "
          f"{elapsed:.1f}s")
