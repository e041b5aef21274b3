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


@app.task(name="spin_long", isolation="process", timeout=2.0, retries=0)
def spin_long() -> None:
    """Stuck for longer than several leases of the test's worker (300 ms)."""
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


@app.task(name="spawner", isolation="process", timeout=0.5, retries=0)
def spawner() -> None:
    """Starts a process of its own, then hangs: the kill at the timeout ends both."""
    import subprocess

    sub = subprocess.Popen(["sleep", "1000"])
    run = started()
    r().rpush(pids_key(run.run_id), sub.pid)
    while True:
        pass
