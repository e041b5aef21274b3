"""Hard timeouts with process isolation (worker/isolation.py): attempts of tasks declared
`isolation="process"` run in child processes the worker kills past the timeout or the memory
cap, while it keeps its leases and serves other runs; Retry and Fatal raised in a child behave
as in a thread. In-process workers (tests/integration/inproc.py); the children are real."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from duetime.common.context import RunContext
from duetime.common.errors import InvalidInput
from duetime.worker.config import WorkerConfig
from duetime.worker.isolation import ProcessPool, parse_size, remote_error, rss_bytes
from duetime.worker.runtime import Worker

import duetime
from tests.apps import isolated
from tests.integration.inproc import serving, until

REF = "tests.apps.isolated:app"


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test body run in its own event loop (the worker runs in it too)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))
    return run


@pytest.fixture
def iso(url: str, namespace: str) -> Iterator[Any]:
    isolated.app.configure(redis_url=url, namespace=namespace)
    yield isolated.app
    isolated.app.close()


def settings(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"queues": ["default"], "app_ref": REF, "concurrency": 4,
                            "kill_grace_s": 0.5, "lease_ms": 2000}
    return {**base, **kw}


def pids(run_id: str) -> list[int]:
    return [int(p) for p in isolated.r().lrange(isolated.pids_key(run_id), 0, -1)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def ended(app: Any, run_id: str) -> Any:
    run = app.get_run(run_id)
    return run if run.state in ("succeeded", "dead") else None


@pytest.mark.parametrize("task", ["spin", "c_sleep"])
@aio
async def test_stuck_child_is_killed_at_the_timeout_and_retried_by_policy(iso: Any,
                                                                          task: str) -> None:
    async with serving(iso, **settings()) as w:
        stuck = iso.enqueue(task)
        run = await until(lambda: ended(iso, stuck), timeout=60, what="the stuck run to end")
    assert run.state == "dead"  # retries=1: both attempts timed out, then dead letter
    assert [a.outcome for a in run.attempts] == ["failed", "failed"]
    for a in run.attempts:
        assert "HardTimeout: timed out after 0.5s" in (a.error or "")
    # Each attempt had a child of its own, both killed: the pool counts two ended. The pids the
    # bodies recorded (their first act, a Redis write from a fresh child) show they were other
    # processes and are gone; a body the timeout struck before its write records none (a busy
    # machine can take half a second to open a child's first connection).
    assert w.executor.processes is not None and w.executor.processes.ended == 2
    both = pids(stuck)
    assert len(set(both)) == len(both) <= 2 and os.getpid() not in both
    assert not any(alive(p) for p in both)  # killed, and reaped, before the attempt was recorded


@pytest.mark.parametrize("task", ["spin_forever", "c_sleep_forever"])
@aio
async def test_worker_serves_thread_runs_while_a_child_is_stuck(iso: Any, task: str) -> None:
    """No timeout: the child stays stuck for good, and the worker completes other runs (on
    its threads) and keeps the stuck run's lease meanwhile; a cancel request then kills it."""
    # a 1 s lease: the worker gives an attempt up itself once a whole lease passed without a
    # renewal, and a 300 ms one was passed by a loaded machine's stalled heartbeat
    r = iso.store.client
    beats: set[bytes] = set()
    async with serving(iso, **settings(lease_ms=1000)):
        stuck = iso.enqueue(task)
        child = (await until(lambda: pids(stuck), what="the stuck child to start"))[0]
        quick = [isolated.athread.enqueue(i) for i in range(5)]
        await until(lambda: all(iso.get_run(q).state == "succeeded" for q in quick),
                    timeout=30, what="thread runs beside the stuck child")
        assert [iso.get_run(q).result for q in quick] == [0, 2, 4, 6, 8]
        run_key = iso.keys.run(iso.keys.partition_of_run(stuck), stuck)

        def beaten() -> bool:  # several leases' worth of heartbeats while it stays stuck
            beat = r.hget(run_key, "heartbeat")
            if beat is not None:
                beats.add(beat)
            return len(beats) >= 4

        await until(beaten, timeout=60, interval=0.02, what="heartbeats of the stuck run")
        assert alive(child)
        run = iso.get_run(stuck)
        assert run.state == "running" and run.attempt == 1  # its lease kept throughout
        iso.cancel(stuck)
        await until(lambda: not alive(child), timeout=30, what="the child to be killed")
        await until(lambda: iso.get_run(stuck).state == "cancelled", timeout=30,
                    what="the run cancelled")


@aio
async def test_lease_is_kept_while_the_child_is_stuck(iso: Any) -> None:
    """Stuck for 4 s under a 1 s lease: the worker heartbeats throughout, read from the run
    record (each heartbeat stamps it), not inferred from a reaper that did not strike in time
    (that would prove nothing on a machine too busy to run the reaper). The attempt ends as
    the timeout, not a lost lease. (A 300 ms lease failed on a machine too busy to renew it
    within 300 ms: the worker gives an attempt up itself once a whole lease passed unrenewed.)"""
    r = iso.store.client
    beats: set[bytes] = set()
    async with serving(iso, **settings(lease_ms=1000)):
        rid = iso.enqueue("spin_long")
        run_key = iso.keys.run(iso.keys.partition_of_run(rid), rid)

        def stamped() -> object:
            beat = r.hget(run_key, "heartbeat")
            if beat is not None and r.hget(run_key, "state") == b"running":
                beats.add(beat)
            return ended(iso, rid)

        run = await until(stamped, timeout=60, interval=0.02, what="the stuck run to end")
    assert len(beats) >= 3, beats  # heartbeats kept coming while the child was stuck
    assert run.state == "dead"
    assert [a.outcome for a in run.attempts] == ["failed"]
    assert "timed out after 4s" in (run.attempts[0].error or "")


@aio
async def test_children_are_reused_across_attempts(iso: Any) -> None:
    async with serving(iso, **settings(concurrency=1)) as w:
        ids = [isolated.whoami.enqueue(i) for i in range(4)]
        await until(lambda: all(ended(iso, i) for i in ids), timeout=60, what="runs")
        results = [iso.get_run(i).result for i in ids]
        assert [r["x"] for r in results] == [0, 1, 2, 3]
        assert {r["pid"] for r in results} == {pids(ids[0])[0]}  # one child, four runs
        assert results[0]["pid"] != os.getpid()
        assert results[2]["run_id"] == ids[2] and results[2]["attempt"] == 1  # current_run()
        assert w.executor.processes is not None and w.executor.processes.started == 1


@aio
async def test_processes_the_task_started_are_killed_with_its_child(iso: Any) -> None:
    async with serving(iso, **settings()):
        rid = iso.enqueue("spawner")
        run = await until(lambda: ended(iso, rid), timeout=60, what="the spawner to time out")
    child, grandchild = pids(rid)
    assert "timed out after 5s" in (run.error or "")
    assert not alive(child)
    # not our child: it may linger as a zombie until init reaps it, so read its state
    await until(lambda: not alive(grandchild) or _zombie(grandchild), timeout=30,
                what="the task's own process killed")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@aio
async def test_async_task_runs_in_a_child(iso: Any) -> None:
    async with serving(iso, **settings()):
        rid = isolated.awhoami.enqueue(3)
        run = await until(lambda: ended(iso, rid), timeout=60, what="the async run")
    assert run.state == "succeeded" and run.result["x"] == 3
    assert run.result["pid"] == pids(rid)[0] != os.getpid()


@aio
async def test_shutdown_kills_a_stuck_child_once_the_grace_ends(iso: Any) -> None:
    async with serving(iso, **settings(grace_s=0.2)) as w:
        rid = iso.enqueue("spin_forever")
        child = (await until(lambda: pids(rid), what="the stuck child to start"))[0]
        w.stop()  # the block's end then waits for the worker to have stopped
    assert not alive(child)
    run = iso.get_run(rid)
    assert run.state == "scheduled"  # released: back to its queue
    assert [a.outcome for a in run.attempts] == ["released"]


@aio
async def test_a_child_that_cannot_load_the_app_fails_the_attempt(iso: Any) -> None:
    pool = ProcessPool("tests.apps.isolated:not_there", iso.redis_url, iso.keys.namespace, 1,
                       kill_grace_s=0.5)
    ctx = RunContext(run_id="r1", task="whoami", queue="default", attempt=1, fence=1,
                     worker_id="w", idempotency_key="r1", scheduled_at=None)
    with pytest.raises(duetime.TaskProcessStartFailed, match="is not a duetime App"):
        await pool.call(ctx, "whoami", [1], {}, None, True)
    with pytest.raises(duetime.TaskProcessStartFailed):  # the slot was given back: tried again
        await pool.call(ctx, "whoami", [1], {}, None, True)
    assert pool.started == 0


@aio
async def test_memory_leak_is_killed_past_the_cap(iso: Any) -> None:
    async with serving(iso, **settings(max_task_memory=parse_size("96MiB"))):
        leak = iso.enqueue("leak")
        run = await until(lambda: ended(iso, leak), timeout=60, what="the leak to be stopped")
    assert run.state == "dead"
    assert "exceeded memory limit of 96MiB" in (run.attempts[0].error or "")
    assert "MemoryLimitExceeded" in (run.error or "")


@aio
async def test_crashed_child_fails_the_attempt_and_is_replaced(iso: Any) -> None:
    async with serving(iso, **settings()):
        rid = iso.enqueue("crash_once")
        run = await until(lambda: ended(iso, rid), timeout=60, what="the crashing run")
    assert run.state == "succeeded"
    assert [a.outcome for a in run.attempts] == ["failed", "succeeded"]
    assert "exited during the attempt (exit code 3" in (run.attempts[0].error or "")
    first, second = pids(rid)
    assert first != second and run.result == second  # a new child ran the retry


@aio
async def test_retry_and_fatal_raised_in_the_child_behave_as_in_a_thread(iso: Any) -> None:
    async with serving(iso, **settings()):
        retry, fatal, boom = iso.enqueue("retry_once"), iso.enqueue("fatal"), iso.enqueue("boom", [7])
        runs = [await until(lambda i=i: ended(iso, i), timeout=60, what="runs")
                for i in (retry, fatal, boom)]
    r, f, b = runs
    # Retry's own delay (50 ms) was used, not the task's 600 s back-off: the retry came back
    assert r.state == "succeeded" and r.result["attempt"] == 2
    assert [a.outcome for a in r.attempts] == ["failed", "succeeded"]
    assert "not yet" in (r.attempts[0].error or "")
    # Fatal: dead at once, though retries=3, its child's traceback in the record
    assert f.state == "dead" and len(f.attempts) == 1
    assert "Fatal: never works" in (f.error or "") and "isolated.py" in (f.error or "")
    assert b.state == "dead" and (b.error or "").startswith("KeyError: 'missing 7'")
    assert 'raise KeyError(f"missing {n}")' in (b.error or "")


def test_options_are_validated(iso: Any) -> None:
    with pytest.raises(InvalidInput, match="isolation must be one of thread, process"):
        iso.task(name="bad_iso", isolation="fork")(lambda: None)  # type: ignore[arg-type]
    assert iso.registry.get("spin").isolation == "process"
    assert iso.registry.get("athread").isolation == "thread"
    # a worker of an app with isolated tasks must know how its children import the app
    with pytest.raises(InvalidInput, match="needs app_ref"):
        Worker(iso.registry, iso.redis_url, iso.keys, WorkerConfig(queues=["default"]))
    with pytest.raises(InvalidInput, match="max_task_memory"):
        WorkerConfig(queues=["default"], max_task_memory=1024)
    assert parse_size("512MiB") == 512 * 1024**2 and parse_size("1GB") == 10**9
    for bad in ("lots", "1MiB", "-5MiB"):
        with pytest.raises(InvalidInput):
            parse_size(bad)
    rss = rss_bytes(os.getpid())
    assert rss is not None and rss > 1024**2


def test_remote_errors_map_back_to_their_kind() -> None:
    exc = remote_error({"kind": "retry", "type": "Backoff", "msg": "m", "delay_ms": 1500,
                        "tb": "tb", "frames": "f"})
    assert isinstance(exc, duetime.Retry) and type(exc).__name__ == "Backoff"
    assert exc.delay_ms == 1500 and str(exc) == "m"
    assert isinstance(remote_error({"kind": "fatal", "type": "X"}), duetime.Fatal)
    plain = remote_error({"kind": "error", "type": "not an identifier!"})
    assert type(plain).__name__ == "Exception" and not isinstance(plain, duetime.Retry | duetime.Fatal)


def test_cli_worker_runs_isolated_tasks_with_its_options(iso: Any, procs: Any) -> None:
    """`duetime worker --app ... --max-task-memory ... --kill-grace ...`: the task processes
    import the worker's --app, the cap kills a leak, a plain task still runs."""
    ok, leak = isolated.whoami.enqueue(5), iso.enqueue("leak")
    p = procs.worker("--burst", "--max-task-memory", "96MiB", "--kill-grace", "1s",
                     app=REF)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()[-2000:]
    result = iso.get_run(ok).result
    assert result["x"] == 5 and result["pid"] not in (os.getpid(), p.pid)
    run = iso.get_run(leak)
    assert run.state == "dead" and "exceeded memory limit of 96MiB" in (run.error or "")


def test_cli_refuses_a_bad_memory_cap(procs: Any) -> None:
    p = procs.worker("--max-task-memory", "lots", app=REF)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and b"--max-task-memory must be a size" in err
