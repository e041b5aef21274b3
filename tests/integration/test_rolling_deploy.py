"""Rolling deploys: a worker that does not know a run's task gives the run back, unstarted and
without spending an attempt, for a worker that knows it (worker/unknown.py, handback.lua); it
is dead-lettered only once no live worker has published the task for the grace period."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from duetime.worker.runtime import Worker, WorkerConfig

import duetime
from tests.integration.inproc import until


def fleet(url: str, namespace: str, version: str, tasks: tuple[str, ...],
          executed: list[tuple[str, str, str, int]]) -> duetime.App:
    """An app of one deploy version: each task records (version, task, run id, attempt)."""
    app = duetime.App(redis_url=url, namespace=namespace)
    for name in tasks:
        def body(i: int, _name: str = name) -> None:
            ctx = duetime.current_run()
            executed.append((version, _name, ctx.run_id, ctx.attempt))
        app.task(name=name, retries=0)(body)
    return app


def run_key(app: duetime.App, run_id: str) -> str:
    return app.keys.run(app.keys.partition_of_run(run_id), run_id)


async def start(app: duetime.App, **settings: Any) -> tuple[Worker, asyncio.Task[None]]:
    settings.setdefault("queues", ["default"])
    settings.setdefault("refresh_s", 1.0)
    w = Worker(app.registry, app.redis_url, app.keys, WorkerConfig(**settings))
    task = asyncio.create_task(w.run(handle_signals=False))
    await until(lambda: w.ready.is_set() or task.done(), what="worker to start")
    if task.done():
        task.result()
    return w, task


async def stop(w: Worker, task: asyncio.Task[None]) -> None:
    w.stop()
    await asyncio.wait_for(task, 60)


def test_v1_fleet_replaced_by_v2_under_load_loses_nothing_and_spends_no_attempt(url, namespace, r):
    """v1 knows task `a`, v2 knows `a` and `b`. v2 has published its tasks (one of its workers
    started), then v1 serves alone while runs of both come in: it hands every `b` back. Then
    v2's workers start, v1's stop, the producer keeps going: 0 dead letters, every run executed
    exactly once, by a worker that knows its task, on its first attempt."""
    executed: list[tuple[str, str, str, int]] = []
    v1 = fleet(url, namespace, "v1", ("a",), executed)
    v2 = fleet(url, namespace, "v2", ("a", "b"), executed)
    ids: list[str] = []
    tasks = {"a": v2.registry.get("a"), "b": v2.registry.get("b")}

    async def produce(n: int) -> None:
        for i in range(n):
            ids.append(await v2.aenqueue(tasks["ab"[i % 2]], [i]))
            await asyncio.sleep(0.005)

    async def main() -> None:
        w, t = await start(v2)  # the deploy's first v2 worker: its tasks are published
        await stop(w, t)
        old = [await start(v1) for _ in range(2)]
        await produce(40)
        await until(lambda: sum(w.unknown.handed_back for w, _ in old) >= 5, 30,
                    what="the v1 fleet handing runs of b back")
        producer = asyncio.create_task(produce(200))
        new = []
        for w, t in old:  # one by one: start a v2 worker, stop a v1 worker, under load
            new.append(await start(v2))
            await asyncio.sleep(0.1)
            await stop(w, t)
        await producer
        await until(lambda: len(executed) >= len(ids), 60, what="every run executed")
        handed_back = sum(w.unknown.handed_back for w, _ in old + new)
        for w, t in new:
            await stop(w, t)
        assert handed_back >= 5

    asyncio.run(main())
    runs = [v2.get_run(i) for i in ids]
    assert [x.reason for x in runs if x.state != "succeeded"] == []
    assert sum(r.zcard(v2.keys.dead(p)) for p in range(v2.keys.partitions)) == 0
    by_run: dict[str, list[tuple[str, str, str, int]]] = {}
    for e in executed:
        by_run.setdefault(e[2], []).append(e)
    assert sorted(by_run) == sorted(ids)
    assert all(len(v) == 1 for v in by_run.values())  # once each
    assert {e[0] for e in executed if e[1] == "b"} == {"v2"}
    assert {e[3] for e in executed} == {1}  # no attempt spent on a hand-back
    assert {x.attempt for x in runs} == {1}
    handed = [x for x in runs if int(r.hget(run_key(v2, x.id), "handbacks") or 0) > 0]
    assert handed and {x.task for x in handed} == {"b"}
    for x in handed:  # nothing ran in a hand-back: one attempt entry, the one that succeeded
        assert [a.outcome for a in x.attempts] == ["succeeded"]
    v1.close()
    v2.close()


@pytest.mark.parametrize("published", [None, "2h"])
def test_a_task_nobody_published_within_the_grace_period_is_dead_lettered(url, namespace, r,
                                                                          published):
    """Never published, or last published 2 h ago, and due an hour ago: past the default grace
    of 10 minutes, the run is dead-lettered with that reason (time moved by writing the
    timestamps, not by waiting)."""
    executed: list[tuple[str, str, str, int]] = []
    v1 = fleet(url, namespace, "v1", ("a",), executed)
    v2 = fleet(url, namespace, "v2", ("a", "b"), executed)
    now = datetime.now(UTC)
    run_id = v2.enqueue(v2.registry.get("b"), [1], at=now - timedelta(hours=1))
    if published:
        r.hset(v2.keys.task_seen, "b", int((now - timedelta(hours=2)).timestamp() * 1000))

    async def main() -> None:
        w, t = await start(v1)
        await until(lambda: v1.get_run(run_id).state == "dead", 20, what="the dead letter")
        await stop(w, t)

    asyncio.run(main())
    run = v1.get_run(run_id)
    assert "unknown task 'b': no live worker has published it for the grace period of 10m" in (
        run.reason or "")
    assert ("last published: never" in run.reason) == (published is None)
    assert executed == []
    v1.close()
    v2.close()


def test_a_run_due_now_of_a_task_nobody_published_yet_is_handed_back(url, namespace, r):
    """Due just now: the grace period runs from its due time, so it goes back, unspent."""
    executed: list[tuple[str, str, str, int]] = []
    v1 = fleet(url, namespace, "v1", ("a",), executed)
    v2 = fleet(url, namespace, "v2", ("a", "b"), executed)
    run_id = v2.enqueue(v2.registry.get("b"), [1])

    async def main() -> None:
        w, t = await start(v1)
        await until(lambda: w.unknown.handed_back >= 2, 20, what="hand-backs")
        await stop(w, t)

    asyncio.run(main())
    run = v1.get_run(run_id)
    assert run.state == "scheduled" and run.attempt == 0 and run.attempts == []
    assert int(r.hget(run_key(v1, run_id), "handbacks")) >= 2
    v1.close()
    v2.close()


def test_by_name_enqueue_needs_a_live_or_recent_worker_to_have_published_the_task(url, namespace,
                                                                                  r):
    executed: list[tuple[str, str, str, int]] = []
    worker_app = fleet(url, namespace, "v2", ("a", "b"), executed)
    producer = duetime.App(redis_url=url, namespace=namespace)
    try:
        with pytest.raises(duetime.UnknownTask, match="unknown task 'b'"):
            producer.enqueue("b", [1])
        assert producer.enqueue("b", [1], allow_unknown=True)
        worker_app.publish_tasks()  # what a worker does at its start
        producer._catalogue.clear()
        assert producer.get_run(producer.enqueue("b", [1])).task == "b"
        week_ago = int((datetime.now(UTC) - timedelta(days=8)).timestamp() * 1000)
        r.hset(worker_app.keys.task_seen, "b", week_ago)  # the last worker that knew it: long gone
        producer._catalogue.clear()
        with pytest.raises(duetime.UnknownTask):
            producer.enqueue("b", [1])
        with pytest.raises(duetime.UnknownTask):
            asyncio.run(producer.aenqueue("b", [1]))
    finally:
        producer.close()
        worker_app.close()
