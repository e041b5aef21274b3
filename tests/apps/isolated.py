"""Tasks run in child processes (`isolation="process"`): ones that never return (a busy loop,
a C call), one that leaks memory, one that crashes, one that asks for a retry. Each records
its child's pid in Redis first, so a test sees which process ran it and that it is alive."""

from __future__ import annotations

import ctypes
import os
import time

import duetime
from tests.apps import OwnClient

app = duetime.App()
r = OwnClient(app)  # the tasks' own client: r()


def pids_key(run_id: str) -> str:
    return f"{app.keys.namespace}:test:pids:{run_id}"


def started() -> duetime.RunContext:
    """The pid of the process running this attempt, appended to the run's list."""
    run = duetime.current_run()
    r().rpush(pids_key(run.run_id), os.getpid())
    return run


@app.task(name="spin", isolation="process", timeout=0.5, retries=1, backoff=(0.05, 0.05))
def spin() -> None:
    started()
    while True:
        pass


@app.task(name="c_sleep", isolation="process", timeout=0.5, retries=1, backoff=(0.05, 0.05))
def c_sleep() -> None:
    started()
    ctypes.CDLL(None).sleep(1000)  # in C: no Python signal handler or exception can stop it


@app.task(name="leak", isolation="process", timeout=60, retries=0)
def leak() -> None:
    started()
    chunks = []
    while True:
        chunks.append(b"x" * (8 * 1024 * 1024))  # bytes, so every page is touched
        time.sleep(0.005)


@app.task(name="crash_once", isolation="process", retries=2, backoff=(0.05, 0.05))
def crash_once() -> int:
    run = started()
    if run.attempt == 1:
        os._exit(3)
    return os.getpid()


@app.task(name="retry_once", isolation="process", retries=2, backoff=(600, 900))
def retry_once() -> dict[str, int]:
    run = started()
    if run.attempt == 1:
        raise duetime.Retry(delay="50ms", reason="not yet")
    return {"attempt": run.attempt, "pid": os.getpid()}


@app.task(name="fatal", isolation="process", retries=3)
def fatal() -> None:
    started()
    raise duetime.Fatal("never works")


@app.task(name="boom", isolation="process", retries=0)
def boom(n: int) -> None:
    started()
    raise KeyError(f"missing {n}")


@app.task(name="whoami", isolation="process")
def whoami(x: int) -> dict[str, object]:
    run = started()
    return {"pid": os.getpid(), "x": x, "run_id": run.run_id, "attempt": run.attempt}


@app.task(name="athread")
def athread(x: int) -> int:
    """Runs in the worker's thread pool, as every task without isolation does."""
    return x * 2


@app.task(name="spin_long", isolation="process", timeout=4.0, retries=0)
def spin_long() -> None:
    """Stuck for longer than several leases of the test's worker (1 s)."""
    started()
    while True:
        pass


@app.task(name="spin_forever", isolation="process", retries=0)
def spin_forever() -> None:
    started()
    while True:
        pass


@app.task(name="c_sleep_forever", isolation="process", retries=0)
def c_sleep_forever() -> None:
    started()
    ctypes.CDLL(None).sleep(100000)


@app.task(name="awhoami", isolation="process")
async def awhoami(x: int) -> dict[str, object]:
    """An async task in a child process: the child runs it to completion on its own loop."""
    run = started()
    return {"pid": os.getpid(), "x": x, "attempt": run.attempt}


@app.task(name="spawner", isolation="process", timeout=5, retries=0)
def spawner() -> None:
    """Starts a process of its own, then hangs: the kill at the timeout ends both (5 s: a
    fresh child on a busy machine must have started it and recorded both pids by then)."""
    import subprocess

    sub = subprocess.Popen(["sleep", "1000"])
    run = started()
    r().rpush(pids_key(run.run_id), sub.pid)
    while True:
        pass


# -- long runs and back-pressure from a child (worker/isolation.py, "across the boundary") --
def log_key(run_id: str) -> str:
    return f"{app.keys.namespace}:test:log:{run_id}"


def go_key(run_id: str) -> str:
    return f"{app.keys.namespace}:test:go:{run_id}"


def note(run_id: str, *what: object) -> None:
    """Append one entry to the run's log (JSON), read by the test."""
    import json

    r().rpush(log_key(run_id), json.dumps(what))


def wait_go(run_id: str) -> None:
    """Block until the test says go (BLPOP: no polling, and a deadline)."""
    r().blpop([go_key(run_id)], timeout=60)


@app.task(name="ck_iter", isolation="process", retries=2, backoff=(0.05, 0.05))
def ck_iter(total: int, every: int, crash_at: int) -> dict[str, object]:
    """Iterate from the checkpoint, checkpointing every `every` items and reporting progress;
    the first attempt's child dies at item `crash_at` (after its last checkpoint)."""
    run = started()
    state = run.checkpoint_state
    start = 0 if state is None else int(state["next"])
    note(run.run_id, "start", run.attempt, run.fence, state)
    for i in range(start, total):
        if run.attempt == 1 and i == crash_at:
            os._exit(3)
        note(run.run_id, "item", i)
        if (i + 1) % every == 0:
            run.checkpoint({"next": i + 1})
        run.progress(i + 1, total)
    return {"start": start, "state": run.checkpoint_state}


@app.task(name="progress_wait", isolation="process", retries=0)
def progress_wait(done: int, total: int, note_text: str) -> None:
    """Report progress (several times, fast: only the last must arrive), then wait for go."""
    run = started()
    for d in range(done + 1):
        run.progress(d, total, note_text)
    note(run.run_id, "reported", done)
    wait_go(run.run_id)


@app.task(name="aprogress_ck", isolation="process", retries=0)
async def aprogress_ck(done: int, total: int) -> object:
    """An async task in a child: progress, then `await acheckpoint`, then the sync checkpoint
    (refused with the thread path's RuntimeError), then wait for go."""
    import asyncio

    run = started()
    run.progress(done, total)
    await run.acheckpoint({"async": done})
    try:
        run.checkpoint({"sync": True})
        sync = "no error"
    except RuntimeError as exc:
        sync = str(exc)
    note(run.run_id, "checkpointed", sync)
    await asyncio.to_thread(wait_go, run.run_id)
    return run.checkpoint_state


@app.task(name="stale_ck", isolation="process", retries=2)
def stale_ck() -> str:
    """Checkpoint once, wait for go (the test gives the run to another holder meanwhile),
    then try again: records what each call did."""
    run = started()
    run.checkpoint({"by": "A", "n": 1})
    note(run.run_id, "stored", run.fence)
    wait_go(run.run_id)
    try:
        run.checkpoint({"by": "A", "n": 2})
        note(run.run_id, "stored", run.fence)
    except duetime.CheckpointRefused as exc:
        note(run.run_id, "refused", run.fence, str(exc), run.lease_lost)
    return "A"


@app.task(name="iso_slices", isolation="process", retries=0)
def iso_slices(n: int, keep: bool = False) -> int:
    """One slice per claim: state {"i": i} -> Continue with {"i": i + 1} until n (keep: the
    next state is checkpointed first, and Continue() keeps it)."""
    run = started()
    i = int((run.checkpoint_state or {"i": 0})["i"])
    note(run.run_id, "slice", run.attempt, run.fence, i)
    if i >= n:
        return i
    if keep:
        run.checkpoint({"i": i + 1})
        raise duetime.Continue()
    raise duetime.Continue(delay="10ms", state={"i": i + 1})


@app.task(name="iso_limited", isolation="process", retries=0)
def iso_limited(scope: str) -> int:
    """The first claim meets a 429: RateLimited for 1 s; the next one succeeds."""
    run = started()
    note(run.run_id, "claim", run.attempt, run.fence)
    if run.fence == 1:
        raise duetime.RateLimited(retry_after="1s", scope=scope, reason="partner said 429")
    return run.fence
