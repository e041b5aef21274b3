"""Burst mode (`Worker.run(until_idle=True)`, `duetime worker --burst`): the worker runs what
is due now, retries due now included, records every outcome, and stops by itself; runs due
later are left for later. What "idle" means is written at `Worker.run`."""

from __future__ import annotations

import asyncio

from tests.apps import basic
from tests.integration.inproc import burst, drain


def counts(r) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(basic.count_key()).items()}


def test_burst_runs_what_is_due_records_every_outcome_and_stops(app, r):
    ids = app.enqueue_many([(basic.noop, [i]) for i in range(40)]
                           + [(basic.anoop, [i]) for i in range(40)]
                           + [(basic.fatal, [])])
    later = app.enqueue(basic.noop, [99], delay=3600)
    worker = burst(app, concurrency=8)
    # it returned on its own, with every outcome already recorded by the scripts
    assert worker.processed == 81
    assert {app.get_run(i).state for i in ids[:80]} == {"succeeded"}
    assert app.get_run(ids[80]).state == "dead"
    assert counts(r) == dict.fromkeys(ids, 1)
    run = app.get_run(later)  # due later: not waited for, not touched
    assert run.state == "scheduled" and run.attempt == 0


def test_burst_with_nothing_due_stops_at_once(app, r):
    later = app.enqueue(basic.noop, delay=3600)
    worker = burst(app)
    assert worker.processed == 0
    assert app.get_run(later).state == "scheduled"


def test_burst_waits_for_a_retry_due_now_not_for_one_due_later(app, r):
    """A retry due within claim-ahead is due now: the burst runs it. One due in an hour is
    not waited for: the burst stops with the run retrying."""
    soon = app.enqueue(basic.retry_later, [0.05])  # attempt 1 asks for a retry in 50 ms
    late = app.enqueue(basic.retry_later, [3600])
    worker = burst(app, claim_ahead_ms=2000)  # 50 ms from now is "due now"
    assert worker.processed == 3
    run = app.get_run(soon)
    assert run.state == "succeeded" and [a.outcome for a in run.attempts] == ["failed", "succeeded"]
    run = app.get_run(late)
    assert run.state == "retrying" and [a.outcome for a in run.attempts] == ["failed"]
    assert counts(r) == {soon: 2, late: 1}


def test_burst_finds_a_retry_due_now_whose_wake_notice_was_lost(app, r):
    """The idle decision rests on a read of the sets' heads after the last report, not only
    on wake notices (which a dropped connection loses): with every notice lost, the retry due
    now is still run."""
    from duetime.worker.runtime import Worker, WorkerConfig

    async def main() -> Worker:
        worker = Worker(app.registry, app.redis_url, app.keys,
                        WorkerConfig(queues=["default"], claim_ahead_ms=2000))
        worker.due.note = lambda key, due: None  # type: ignore[method-assign]
        await asyncio.wait_for(worker.run(handle_signals=False, until_idle=True), 60)
        return worker

    run_id = app.enqueue(basic.retry_later, [0.05])
    assert asyncio.run(main()).processed == 2
    assert [a.outcome for a in app.get_run(run_id).attempts] == ["failed", "succeeded"]


def test_burst_waits_for_a_run_claimed_ahead_and_starts_it_at_its_due_time(app, r):
    """A run due within claim-ahead is claimed now and started at its due time, never
    before: the burst ends after it has run."""
    ids = app.enqueue_many([{"task": basic.stamp, "delay": 0.2 + i * 0.05} for i in range(5)])
    burst(app, claim_ahead_ms=5000)
    stamps = {k.decode(): float(v) for k, v in r.hgetall(basic.stamps_key()).items()}
    assert set(stamps) == set(ids)
    for i in ids:
        assert stamps[i] >= app.get_run(i).due.timestamp() * 1000  # never early
        assert app.get_run(i).state == "succeeded"


def test_burst_runs_work_a_task_enqueues_while_it_runs(app, r):
    """Work that becomes due during the burst (enqueued by another run, told by a wake
    notice) is run before the worker stops."""

    async def main() -> None:
        first = app.enqueue(basic.aslow, [0.3])
        task = asyncio.create_task(drain(app))
        while not r.exists(basic.started_key(first)):
            await asyncio.sleep(0.01)
        second = app.enqueue(basic.anoop)  # while the first one runs
        worker = await task
        assert worker.processed == 2
        assert app.get_run(first).state == app.get_run(second).state == "succeeded"

    asyncio.run(main())


def test_cli_worker_burst_exits_0_once_idle(app, r, procs):
    ids = app.enqueue_many([(basic.noop, [i]) for i in range(10)])
    later = app.enqueue(basic.noop, delay=3600)
    w = procs.worker("--burst")
    assert w.wait(60) == 0
    assert {app.get_run(i).state for i in ids} == {"succeeded"}
    assert app.get_run(later).state == "scheduled"


def test_cli_worker_burst_refuses_several_processes(procs):
    w = procs.worker("--burst", "--processes", "2")
    assert w.wait(30) == 2
    assert "--burst" in w.stderr.read().decode()
