"""Workers inside the test's own event loop, against a real server (as arq and rq test
theirs): a test can drive and observe the parts (claims, executor, reporter, leases) directly.

The default harness for claim, retry, concurrency, limits and reporting tests:
  burst(app) / await drain(app)  run what is due now and return once idle, every outcome
                                 recorded (Worker.run(until_idle=True)): the test reads the
                                 end state without polling, and a burst that processed nothing
                                 proves that nothing was claimable (no sleep needed)
  serving(app)                   a worker for the length of a block, to act while it runs
  reaper_thread(app)             the reaper beside it
  due_now(app, run_id)           advance time for one run (a backoff, a delay) instead of
                                 sleeping through it
  record_logs(monkeypatch)       what the worker and the reaper logged
Worker processes (the `procs` fixture) only where a process is the point: signals, SIGKILL,
SIGSTOP, `--processes`, the CLI's own behaviour (its options, logs and metrics endpoint)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from duetime.scheduler.reaper import Reaper
from duetime.worker.runtime import Worker, WorkerConfig

from tests.conftest import WAIT_FLOOR_S
from tests.recorder import Recorder


async def until(pred: Callable[[], object], timeout: float = 15.0, interval: float = 0.01,
                what: str = "condition", off_loop: bool = False) -> object:
    """Poll `pred` without blocking the loop the worker runs on (the same deadline floor as
    `tests.conftest.wait_for`: a wait is never a latency bound). `off_loop`: call `pred` in a
    thread, for a predicate that makes many server calls (called on the loop, it would hold up
    the worker's heartbeats and replies for as long as it takes)."""
    timeout = max(timeout, WAIT_FLOOR_S)
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(pred) if off_loop else pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def serving(app: Any, **settings: Any) -> AsyncIterator[Worker]:
    """A worker of `app` running in this loop until the block ends (then stopped and drained)."""
    settings.setdefault("queues", ["default"])
    worker = Worker(app.registry, app.redis_url, app.keys, WorkerConfig(**settings))
    task = asyncio.create_task(worker.run(handle_signals=False))
    await until(lambda: worker.ready.is_set() or task.done(), what="worker to start")
    if task.done():
        task.result()  # raises what stopped it
    try:
        yield worker
    finally:
        worker.stop()
        await stopped(task, 60)


def stacks() -> str:
    """Every asyncio task's stack and every thread's: what a worker that does not stop waits on."""
    out = io.StringIO()
    for t in asyncio.all_tasks():
        out.write(f"--- task {t.get_name()} {t!r}\n")
        t.print_stack(file=out)
    for ident, frame in sys._current_frames().items():
        name = next((th.name for th in threading.enumerate() if th.ident == ident), "?")
        out.write(f"--- thread {name} ({ident})\n")
        out.write("".join(traceback.format_stack(frame)))
    return out.getvalue()


async def stopped(task: asyncio.Task[Any], timeout: float) -> None:
    """Await a worker's run task; one not ended within `timeout` is reported with every task's
    and thread's stack (printed, and in the error) before it is cancelled: the hang names
    itself."""
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        where = stacks()
        print(where, file=sys.stderr)
        task.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        raise TimeoutError(f"the worker did not stop within {timeout}s; stacks:\n{where}")
    task.result()


async def drain(app: Any, timeout: float = 60.0, **settings: Any) -> Worker:
    """A worker of `app` in burst mode (`Worker.run(until_idle=True)`): it runs what is due
    now, retries due now included, records every outcome and returns; → the stopped worker
    (its `processed` count). Runs due later are not waited for: a test controls time instead
    (enqueue due now, or move a run's due time with `due_now`)."""
    settings.setdefault("queues", ["default"])
    worker = Worker(app.registry, app.redis_url, app.keys, WorkerConfig(**settings))
    await stopped(asyncio.create_task(worker.run(handle_signals=False, until_idle=True)), timeout)
    return worker


def burst(app: Any, timeout: float = 60.0, **settings: Any) -> Worker:
    """`drain` from a plain (sync) test: its own event loop, until the worker is idle."""
    return asyncio.run(drain(app, timeout, **settings))


@contextlib.contextmanager
def reaper_thread(app: Any, tick_s: float = 0.05) -> Iterator[Reaper]:
    """The reaper, in a thread of this process. `reaper.thread` is that thread and
    `reaper.thread_error` what ended it, if anything did (a test's failure message says so: a
    reaper thread that died is otherwise only a warning at the end of the session)."""
    reaper = Reaper(app.redis_url, app.keys, tick_s=tick_s)
    reaper.thread_error = None  # type: ignore[attr-defined]

    def body() -> None:
        try:
            reaper.run()
        except BaseException as exc:
            reaper.thread_error = exc  # type: ignore[attr-defined]
            raise

    thread = threading.Thread(target=body, daemon=True, name="reaper")
    reaper.thread = thread  # type: ignore[attr-defined]
    thread.start()
    try:
        yield reaper
    finally:
        reaper.stop()
        thread.join(10)
        reaper.close()


def due_now(app: Any, run_id: str) -> None:
    """Advance time for one run: its entry in its due or retry set becomes due at the server's
    now (instead of the test sleeping through a backoff or a delay)."""
    from tests.apps import basic

    r, k = basic.r(), app.keys
    run = app.get_run(run_id)
    p = k.partition_of_run(run_id)
    sec, usec = r.time()
    now_ms = sec * 1000 + usec // 1000
    moved = sum(r.zadd(key, {run_id: now_ms}, xx=True, ch=True)
                for key in (k.due(p, run.queue), k.retry(p, run.queue)))
    assert moved, f"run {run_id} is in neither its due nor its retry set"


def record_logs(monkeypatch: Any) -> Recorder:
    """What the worker's parts and the reaper log, kept in a Recorder (in this process the
    structlog loggers are cached: patching the modules' `log` is what sees them). Call before
    the worker is made: its outage trackers take the logger when they are built."""
    from duetime.scheduler import reaper
    from duetime.worker import claims, due, execution, leases, reporter, runtime, wake

    rec = Recorder()
    for module in (claims, due, execution, leases, reporter, runtime, wake, reaper):
        monkeypatch.setattr(module, "log", rec)
    return rec


class Gate:
    """Holds a worker's heartbeats while closed (a stalled worker, seen from Redis)."""

    def __init__(self, worker: Worker) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.beats = 0
        real = worker.leases.beat

        async def beat() -> None:
            await self.open.wait()
            await real()
            self.beats += 1

        worker.leases.beat = beat  # type: ignore[method-assign]
