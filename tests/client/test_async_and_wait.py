"""The client a Python service uses: asyncio twins that never block the loop, waiting for a
run's end (result or a clear failure), and enqueueing by name without the task's code."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import msgpack
import pytest
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts

import duetime
from tests.apps import basic


def _claim(app, r, run_id):
    p = app.keys.partition_of_run(run_id)
    keys, args = tr.claim(app.keys, p, "default", "w1", 10, 60_000)
    [c] = [c for c in tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs if c.run_id == run_id]
    return p, c


def _complete(app, r, run_id, value):
    p, c = _claim(app, r, run_id)
    keys, args = tr.complete(app.keys, p, [(run_id, c.fence, msgpack.packb(value))])
    assert Scripts(r).complete(keys=keys, args=args) == [b"succeeded"]


def test_wait_returns_the_result_as_soon_as_the_run_ends(app, r):
    run_id = app.enqueue(basic.noop)
    timer = threading.Timer(0.3, _complete, (app, r, run_id, {"invoice": 42, "total": [1.5]}))
    timer.start()
    t0 = time.monotonic()
    assert app.wait(run_id, timeout=10) == {"invoice": 42, "total": [1.5]}
    assert 0.2 < time.monotonic() - t0 < 2  # woken by the notice, not by a poll's period
    assert app.get_run(run_id).result == {"invoice": 42, "total": [1.5]}
    assert app.wait(run_id) == {"invoice": 42, "total": [1.5]}  # already ended: at once


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


def test_await_result_wakes_on_the_notice_without_blocking_the_loop(app, r):
    run_id = app.enqueue(basic.noop)

    async def main() -> tuple[object, float]:
        gaps, stop = [], asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        threading.Timer(0.3, _complete, (app, r, run_id, "done")).start()
        got = await app.await_result(run_id, timeout=10)
        stop.set()
        await tick
        return got, max(gaps)

    got, worst_gap = asyncio.run(main())
    assert got == "done"
    assert worst_gap < 0.05


def test_aenqueue_many_never_holds_the_loop_for_more_than_a_slice(app):
    """10,000 runs from asyncio code while a ticker on the same loop counts how long it waits
    between two turns. The wait is measured in the loop thread's CPU time (wall time would also
    count the machine being busy elsewhere), less the time CPython's garbage collector ran in
    it (a full collection over the test process's heap takes tens of milliseconds whatever code
    allocated last; it is the interpreter's pause, not duetime holding the loop)."""
    gc_time = [0.0]
    started: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.thread_time())
        elif started:
            gc_time[0] += time.thread_time() - started.pop()

    async def main() -> tuple[list[str], list[float]]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last, last_gc = time.thread_time(), gc_time[0]
            while not stop.is_set():
                await asyncio.sleep(0)
                now, now_gc = time.thread_time(), gc_time[0]
                gaps.append((now - last) - (now_gc - last_gc))
                last, last_gc = now, now_gc

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ids = await app.aenqueue_many([(basic.noop, [i]) for i in range(10_000)])
        one = await app.aenqueue(basic.noop, [1], key="async-key")
        again = await basic.noop.aenqueue(1, key="async-key")
        stop.set()
        await tick
        run = await app.aget_run(one)
        assert again == one and run.args == [1] and run.state == "scheduled"
        return ids, gaps

    gc.callbacks.append(on_gc)
    gc.freeze()  # what the test process built before (imports, fixtures) is not re-traversed
    try:
        ids, gaps = asyncio.run(main())
    finally:
        gc.unfreeze()
        gc.callbacks.remove(on_gc)
    assert len(set(ids)) == 10_000
    assert app.get_run(ids[-1]).args == [9_999]
    worst_at = (gaps.index(max(gaps)), len(gaps))
    gaps.sort()
    assert len(gaps) > 50  # the ticker ran all along, not only at the end
    assert gaps[-1] < 0.01, (gaps[-5:], worst_at)  # never held for more than a few ms of CPU
    assert sum(gaps) > 0.05  # (the work did happen on this thread, between the ticks)


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


def test_a_worker_stores_return_values_that_wait_returns(app, procs):
    """End to end: the worker stores what a task returns (sync and async), `wait` and
    `await_result` return it; a task with store_result=False stores nothing."""
    procs.worker()
    assert app.wait(basic.add.enqueue(2, 3), timeout=30) == {"sum": 5, "parts": [2, 3]}
    quiet = basic.keeps_nothing.enqueue()
    assert app.wait(quiet, timeout=30) is None
    p = app.keys.partition_of_run(quiet)
    assert app.store.client.hget(app.keys.run(p, quiet), "result") is None

    async def main() -> int:
        return await app.await_result(await basic.aadd.aenqueue(40, 2), timeout=30)

    assert asyncio.run(main()) == 42
