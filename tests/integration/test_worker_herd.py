"""Runs claimed ahead of their due time, held together and started together
(worker/execution.py `_hold`, `_release`, `_settle_deferred`): one wait per instant however
many runs share it, every body of a herd started before any of its bookkeeping, never early,
and a held run stopped before its due time stops at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from duetime.common.connection import sync_client
from duetime.common.time.parse import from_ms
from duetime.worker.runtime import Worker, WorkerConfig

import duetime
from tests.integration.inproc import stopped, until

herd_app = duetime.App()
# what each body saw as it started: (its run id, its own instant in server ms, attempts the
# executor had counted, reports handed to the reporter, ...)
seen: list[tuple[str, float, int, int]] = []
WORKER: list[Worker] = []


# what each body's log lines would carry (its context was made the run's while it was held)
fields: dict[str, dict[str, object]] = {}


@herd_app.task(name="herd.look")
async def look(i: int = 0) -> None:
    ex = WORKER[0].executor
    run = duetime.current_run()
    seen.append((run.run_id, time.time() * 1000, ex.processed, len(ex.reporter.unsent)))
    fields[run.run_id] = structlog.contextvars.get_contextvars()


@pytest.fixture
def happ(url: str) -> Any:
    herd_app.configure(redis_url=url, namespace=f"herd{uuid.uuid4().hex[:8]}")
    seen.clear()
    WORKER.clear()
    fields.clear()
    yield herd_app
    herd_app.close()


def _instant(app: Any, ahead_s: float) -> datetime:
    sec, usec = sync_client(app.redis_url).time()
    return datetime.fromtimestamp(sec + usec / 1e6, tz=UTC) + timedelta(seconds=ahead_s)


def test_a_herd_waits_once_and_starts_every_body_before_any_bookkeeping(happ):
    """300 runs due at one instant, claimed seconds ahead: a single wait for the instant (not
    one per run), then every body starts before the first of them is counted or reported,
    none before its due time; each is then reported once."""
    at = _instant(happ, 1.5)
    ids = happ.enqueue_many([{"task": look, "args": [i], "at": at} for i in range(300)])
    worker = Worker(happ.registry, happ.redis_url, happ.keys,
                    WorkerConfig(queues=["default"], concurrency=400, claim_ahead_ms=5000))
    WORKER.append(worker)
    waits: list[float] = []
    wait_until = worker.clock.wait_until

    async def counted(server_ms: float) -> None:
        waits.append(server_ms)
        await wait_until(server_ms)

    worker.clock.wait_until = counted  # type: ignore[method-assign]

    async def main() -> None:
        await stopped(asyncio.create_task(worker.run(handle_signals=False, until_idle=True)), 60)

    asyncio.run(main())
    assert worker.processed == 300
    assert sorted(r for r, *_ in seen) == sorted(ids)
    due = happ.get_run(ids[0]).due
    assert due == at  # the instant asked for, to the microsecond (namespace format 4)
    assert len(waits) == 1 and from_ms(waits[0]) == due  # one wait for the whole herd
    due_ms = due.timestamp() * 1000
    assert all(t >= due_ms for _, t, _, _ in seen)  # never early (same machine's clock)
    # no body of the herd started after another's attempt was counted or reported
    assert {(processed, unsent) for *_, processed, unsent in seen} == {(0, 0)}
    assert {happ.get_run(i).state for i in ids} == {"succeeded"}
    # each body's log fields name its own run, though its context was bound before the instant
    assert {i: (f["run_id"], f["task"], f["attempt"]) for i, f in fields.items()} == \
        {i: (i, "herd.look", 1) for i in ids}


def test_a_held_run_stopped_before_its_due_time_is_given_back_at_once(happ):
    """A run held for a due time 50 s away, and the worker stops with a short grace: the run
    goes back to its queue now (released, no attempt spent), not when it was due."""
    run_id = happ.enqueue(look, [0], at=_instant(happ, 50))

    async def main() -> None:
        worker = Worker(happ.registry, happ.redis_url, happ.keys,
                        WorkerConfig(queues=["default"], lease_ms=120_000,
                                     claim_ahead_ms=60_000, grace_s=0.05))
        WORKER.append(worker)
        task = asyncio.create_task(worker.run(handle_signals=False))
        await until(lambda: len(worker.executor.inflight) == 1, what="the run to be claimed")
        assert len(worker.executor._hold_tasks) == 1  # held, waiting for its due time
        worker.stop()
        await stopped(task, 30)  # within the test's deadline, not 60 s later
        assert not worker.executor._holds and not worker.executor._hold_tasks

    asyncio.run(main())
    run = happ.get_run(run_id)
    assert run.state == "scheduled" and run.attempt == 0
    assert seen == []  # its body never ran


@herd_app.task(name="herd.stopper")
async def stopper(i: int = 0) -> None:
    """Cancels every other attempt of its herd that is queued and not started yet."""
    ex = WORKER[0].executor
    me = duetime.current_run().run_id
    seen.append((me, time.time() * 1000, 0, 0))
    for other in list(ex.inflight.values()):
        if other.ctx.run_id != me and other.runner is None and not other.in_body:
            ex.cancel(other)


def test_a_released_run_cancelled_before_its_body_starts_stops_as_it_starts(happ):
    """A herd is queued for the runners at its instant and marked released just after its
    bodies started (`_after_release`). The first body cancels the other, still queued, in
    between: that one stops as it starts (no body, no second start of its attempt, nothing
    left held) and the worker goes on."""
    at = _instant(happ, 1.0)
    ids = happ.enqueue_many([{"task": stopper, "args": [i], "at": at} for i in range(2)])

    async def main() -> None:
        worker = Worker(happ.registry, happ.redis_url, happ.keys,
                        WorkerConfig(queues=["default"], concurrency=10, claim_ahead_ms=5000))
        WORKER.append(worker)
        await stopped(asyncio.create_task(worker.run(handle_signals=False, until_idle=True)), 60)
        assert not worker.executor._holds and not worker.executor._hold_tasks
        assert not worker.executor.inflight

    asyncio.run(main())
    [(first, *_)] = seen  # one body ran
    [other] = [i for i in ids if i != first]
    assert happ.get_run(first).state == "succeeded"
    assert happ.get_run(other).state == "cancelled"
