"""The client a Python service uses: asyncio twins that never block the loop, waiting for a
run's end (result or a clear failure), and enqueueing by name without the task's code."""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts

import duetime
from duetime.client import runs as client_runs
from duetime.client.runs import ASYNC_PIPELINE_RUNS, ASYNC_SLICE, SCRIPT_CHUNK
from tests.apps import basic
from tests.integration.inproc import burst, drain


def _claim(app, r, run_id):
    p = app.keys.partition_of_run(run_id)
    keys, args = tr.claim(app.keys, p, "default", "w1", 10, 60_000)
    [c] = [c for c in tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs if c.run_id == run_id]
    return p, c


def _complete(app, r, run_id, value):
    p, c = _claim(app, r, run_id)
    keys, args = tr.complete(app.keys, p, [(run_id, c.fence, msgpack.packb(value))])
    assert Scripts(r).complete(keys=keys, args=args) == [b"succeeded"]


def test_wait_returns_the_result_as_soon_as_the_run_ends(app, r, monkeypatch):
    """Woken by the run's notice, not by re-reading it: with the re-read period longer than the
    wait's timeout, only the notice can end the wait before WaitTimeout."""
    monkeypatch.setattr(client_runs, "WAIT_CHUNK_S", 3600.0)
    run_id = app.enqueue(basic.noop)
    timer = threading.Timer(0.3, _complete, (app, r, run_id, {"invoice": 42, "total": [1.5]}))
    timer.start()
    assert app.wait(run_id, timeout=60) == {"invoice": 42, "total": [1.5]}
    # the notice comes before the script's reply: the completing thread may still be reading
    # it, on `r`, which the fixture closes when the test returns
    timer.join(30)
    assert app.get_run(run_id).result == {"invoice": 42, "total": [1.5]}
    assert app.wait(run_id) == {"invoice": 42, "total": [1.5]}  # already ended: at once


def test_a_wait_longer_than_the_reply_timeout_is_a_wait_timeout_not_a_socket_error(app):
    """The waiter blocks in chunks well under the clients' 5 s reply timeout: a chunk as long
    as that timeout raced it and a patient `wait` failed with 'Timeout reading from socket'."""
    from duetime.common.connection import sync_client

    from duetime.client.runs import WAIT_CHUNK_S

    client = sync_client(app.redis_url)
    reply_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    client.close()
    assert reply_timeout is None or reply_timeout / 2 >= WAIT_CHUNK_S
    run_id = app.enqueue(basic.noop, delay="1h")  # no worker: it never ends here
    with pytest.raises(duetime.WaitTimeout):
        app.wait(run_id, timeout=6)
    with pytest.raises(duetime.WaitTimeout):
        asyncio.run(app.await_result(run_id, timeout=6))


def test_wait_raises_with_the_final_state_and_error(app, r):
    run_id = app.enqueue(basic.always_fails)
    p, c = _claim(app, r, run_id)
    keys, args = tr.fail(app.keys, p, "default", run_id, c.fence, "ValueError: bad card", "fatal", 0, 0.5)
    Scripts(r).fail(keys=keys, args=args)
    with pytest.raises(duetime.RunFailed, match="ended dead: ValueError: bad card") as failed:
        app.wait(run_id, timeout=5)
    assert failed.value.state == "dead" and failed.value.run.id == run_id
    cancelled = app.enqueue(basic.noop, delay=60)
    app.cancel(cancelled)
    with pytest.raises(duetime.RunFailed) as failed:
        app.wait(cancelled, timeout=5)
    assert failed.value.state == "cancelled"
    with pytest.raises(duetime.WaitTimeout, match="still scheduled"):
        app.wait(app.enqueue(basic.noop, delay=60), timeout=0.3)
    with pytest.raises(duetime.RunNotFound):
        app.wait("0123456789abcdef0123", timeout=1)


def test_await_result_wakes_on_the_notice_without_blocking_the_loop(app, r, monkeypatch):
    """The run ends only after a ticker on the same loop turned 20 times while the await was
    pending, so an await that held the loop (a blocking read) would never see it end and would
    fail with WaitTimeout; with the re-read period longer than the timeout, only the run's
    notice can wake it. (A bound on the ticker's longest gap, 50 ms, measured the machine's
    load as much as the loop.)"""
    monkeypatch.setattr(client_runs, "WAIT_CHUNK_S", 3600.0)
    run_id = app.enqueue(basic.noop)

    completing = threading.Thread(target=_complete, args=(app, r, run_id, "done"))

    async def main() -> tuple[object, int]:
        turns, stop = 0, asyncio.Event()

        async def ticker() -> None:
            nonlocal turns
            while not stop.is_set():
                await asyncio.sleep(0.001)
                turns += 1
                if turns == 20:  # the loop turned while the await waits: now the run ends
                    completing.start()

        waiting = asyncio.create_task(app.await_result(run_id, timeout=60))
        tick = asyncio.create_task(ticker())
        got = await waiting
        seen = turns
        stop.set()
        await tick
        return got, seen

    got, turns = asyncio.run(main())
    completing.join(30)  # still reading its reply when the notice woke the await: on `r`
    assert got == "done"
    assert turns >= 20


def test_aenqueue_many_never_holds_the_loop_for_more_than_a_slice(app, monkeypatch):
    """10,000 runs from asyncio code while a ticker on the same loop notes, at each of its
    turns, how much of the batch was worked on since its last turn: requests built, requests
    validated, runs put into a pipeline. Between two turns there is never more than a slice of
    each (counted, not timed: how long the loop is held is measured by bench/async_enqueue.py)."""
    from duetime.client import runs as runs_mod

    done = {"built": 0, "validated": 0, "pipelined": 0}
    real_requests, real_prepare = duetime.App._requests, runs_mod.RunStore._prepare_all
    real_pipelines = runs_mod.RunStore._pipelines

    def requests(items, resolve):
        items = list(items)
        done["built"] += len(items)
        return real_requests(items, resolve)

    def prepare_all(self, reqs):
        reqs = list(reqs)
        done["validated"] += len(reqs)
        return real_prepare(self, reqs)

    def pipelines(self, client, prepared, per_trip=runs_mod.PIPELINE_RUNS, **kw):
        for pipe, chunks in real_pipelines(self, client, prepared, per_trip, **kw):
            done["pipelined"] += sum(len(c) for c in chunks)
            yield pipe, chunks

    monkeypatch.setattr(duetime.App, "_requests", staticmethod(requests))
    monkeypatch.setattr(runs_mod.RunStore, "_prepare_all", prepare_all)
    monkeypatch.setattr(runs_mod.RunStore, "_pipelines", pipelines)

    async def main() -> tuple[list[str], list[dict[str, int]]]:
        turns: list[dict[str, int]] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = dict(done)
            while not stop.is_set():
                await asyncio.sleep(0)
                turns.append({k: done[k] - last[k] for k in done})
                last = dict(done)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ids = await app.aenqueue_many([(basic.noop, [i]) for i in range(10_000)])
        # the ticker's last turn counts what the batch did after its previous one; the single
        # enqueues below are not part of the batch (whether the loop turned between the
        # batch's last slice and them depends on how many awaits redis-py's pipeline makes)
        stop.set()
        await tick
        one = await app.aenqueue(basic.noop, [1], key="async-key")
        again = await basic.noop.aenqueue(1, key="async-key")
        run = await app.aget_run(one)
        assert again == one and run.args == [1] and run.state == "scheduled"
        return ids, turns

    ids, turns = asyncio.run(main())
    assert len(set(ids)) == 10_000
    assert app.get_run(ids[-1]).args == [9_999]
    assert len(turns) > 50  # the ticker ran all along, not only at the end
    assert sum(t["built"] for t in turns) >= 10_000  # the work happened between the ticks
    assert sum(t["validated"] for t in turns) >= 10_000
    assert sum(t["pipelined"] for t in turns) >= 10_000
    assert max(t["built"] for t in turns) <= ASYNC_SLICE, turns
    assert max(t["validated"] for t in turns) <= ASYNC_SLICE, turns
    # a pipeline is sent once it holds ASYNC_PIPELINE_RUNS runs or more: at most one script
    # call (SCRIPT_CHUNK runs) past that
    assert max(t["pipelined"] for t in turns) < ASYNC_PIPELINE_RUNS + SCRIPT_CHUNK, turns


def test_a_producer_enqueues_by_name_with_the_options_workers_published(url, namespace, app):
    """A service that only enqueues has no task code: by name, the run gets the options the
    worker's app published (or, allowed, the defaults), and the queue is validated for shape only."""
    producer = duetime.App(redis_url=url, namespace=namespace)
    try:
        with pytest.raises(duetime.UnknownTask, match="no live or recent worker has published"):
            producer.enqueue("nonidem", [0.1], queue="billing")
        run_id = producer.enqueue("nonidem", [0.1], queue="billing", allow_unknown=True)
        run = producer.get_run(run_id)
        assert (run.task, run.queue, run.max_attempts) == ("nonidem", "billing", 4)  # defaults
        app.publish_tasks()  # what `duetime worker` does at start
        producer._catalogue.clear()
        run = producer.get_run(producer.enqueue("nonidem", [0.1]))
        spec = basic.nonidem.spec
        assert run.max_attempts == spec.max_attempts and run.queue == spec.queue
        assert r_field(producer, run.id, "idempotent") == b"0"  # the real option, not the default
        with pytest.raises(duetime.InvalidInput):
            producer.enqueue("bad{name}", [])
        with pytest.raises(duetime.InvalidInput):
            producer.enqueue("nonidem", [], queue="a|b")
    finally:
        producer.close()


def r_field(app, run_id, field):
    p = app.keys.partition_of_run(run_id)
    return app.store.client.hget(app.keys.run(p, run_id), field)


def test_a_worker_stores_return_values_that_wait_returns(app):
    """End to end: the worker stores what a task returns (sync and async), `wait` and
    `await_result` return it; a task with store_result=False stores nothing."""
    added = basic.add.enqueue(2, 3)
    quiet = basic.keeps_nothing.enqueue()
    burst(app)
    assert app.wait(added, timeout=30) == {"sum": 5, "parts": [2, 3]}
    assert app.wait(quiet, timeout=30) is None
    p = app.keys.partition_of_run(quiet)
    assert app.store.client.hget(app.keys.run(p, quiet), "result") is None

    async def main() -> int:
        run_id = await basic.aadd.aenqueue(40, 2)
        await drain(app)
        return await app.await_result(run_id, timeout=30)

    assert asyncio.run(main()) == 42


def test_await_result_ends_when_a_read_swallowed_its_cancellation(app, monkeypatch):
    """The caller cancels `await_result` in the step its run read finishes: on Python 3.11
    `asyncio.wait_for` (redis-py's send on a client with a socket timeout) then returns the
    read instead of raising, and the wait went on (another chunk, until the run ended). It
    now ends at once: the next read is never made (common/loops.py)."""
    run_id = app.enqueue(basic.noop, delay=3600)
    store = app.store
    real = store.aget_run
    reads: list[str] = []

    async def main() -> None:
        sent = asyncio.get_running_loop().create_future()
        pending = await real(run_id)

        async def aget_run(rid: str) -> object:
            reads.append(rid)
            if len(reads) > 1:
                raise AssertionError("read again after the wait was cancelled")
            await asyncio.wait_for(sent, 30)  # the read, as redis-py sends it
            return pending

        monkeypatch.setattr(store, "aget_run", aget_run)
        task = asyncio.create_task(app.await_result(run_id))
        while not reads:  # the wait is in its first read
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        sent.set_result(None)  # the read finished ...
        task.cancel()  # ... and the caller cancels in the same step
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert reads == [run_id]
