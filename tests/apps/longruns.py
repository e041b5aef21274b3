"""Tasks of long runs (checkpoints, progress, Continue) for tests/workloads/, with their own
App so a worker subprocess can serve them (`--app tests.apps.longruns:app`)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import duetime
from tests.apps import OwnClient

app = duetime.App()
r = OwnClient(app)  # the tasks' own client: r()

# in-process tests: what a task saw, and gates a test opens (keyed by run id)
seen: dict[str, list[Any]] = {}
gates: dict[str, threading.Event] = {}


@app.task(name="lr.iterate", retries=1000, backoff=(0.01, 0.05))
def iterate(path: str, n: int, every: int, pause_every: int = 100, pause_s: float = 0.0) -> int:
    """Process items 0..n-1, recording each in `path` (one write per item, so a SIGKILL
    loses nothing already processed), checkpointing {"next": i} every `every` items."""
    run = duetime.current_run()
    state = run.checkpoint_state or {"next": 0}
    start = int(state["next"])
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"start {run.fence} {start}\n".encode())
        for i in range(start, n):
            os.write(fd, f"{i}\n".encode())
            if pause_s and (i + 1) % pause_every == 0:
                time.sleep(pause_s)
            if (i + 1) % every == 0 or i + 1 == n:
                run.checkpoint({"next": i + 1})
                run.progress(i + 1, n)
    finally:
        os.close(fd)
    return n


@app.task(name="lr.stale_probe")
def stale_probe(tag: str) -> str:
    """First attempt: wait for the test's gate, then try to checkpoint (the test has given the
    run to another holder meanwhile); records what the checkpoint call did."""
    run = duetime.current_run()
    seen.setdefault(run.run_id, []).append(("started", run.fence, run.checkpoint_state))
    gates.setdefault(run.run_id, threading.Event()).wait(30)
    try:
        run.checkpoint({"by": tag, "fence": run.fence})
        seen[run.run_id].append(("stored", run.fence))
    except duetime.CheckpointRefused as exc:
        seen[run.run_id].append(("refused", run.fence, str(exc), run.lease_lost))
    return tag


@app.task(name="lr.report")
def report(done: int, total: int | None, note: str | None) -> None:
    """Report progress, then wait for the test's gate (it heartbeats meanwhile)."""
    run = duetime.current_run()
    run.progress(done, total, note)
    seen.setdefault(run.run_id, []).append(("reported", done))
    gates.setdefault(run.run_id, threading.Event()).wait(30)


@app.task(name="lr.areport")
async def areport(done: int, total: int) -> None:
    run = duetime.current_run()
    run.progress(done, total)
    await run.acheckpoint({"done": done})
    seen.setdefault(run.run_id, []).append(("reported", done))
    gate = gates.setdefault(run.run_id, threading.Event())
    while not gate.is_set():
        await asyncio.sleep(0.01)


@app.task(name="lr.slices")
def slices(n: int, pause: str | None = None, keep: bool = False) -> int:
    """One slice per run: checkpoint_state {"i": i} -> Continue with {"i": i + 1} until n
    (keep: the next slice's state is checkpointed first, and Continue keeps it)."""
    run = duetime.current_run()
    i = int((run.checkpoint_state or {"i": 0})["i"])
    seen.setdefault(run.run_id, []).append((run.attempt, run.fence, i))
    if i >= n:
        return i
    if keep:
        run.checkpoint({"i": i + 1})
        raise duetime.Continue(delay=pause)
    raise duetime.Continue(delay=pause, state={"i": i + 1})


@app.task(name="lr.aslices")
async def aslices(n: int) -> int:
    run = duetime.current_run()
    i = int((run.checkpoint_state or {"i": 0})["i"])
    seen.setdefault(run.run_id, []).append((run.attempt, run.fence, i))
    if i >= n:
        return i
    await run.acheckpoint({"i": i + 1})
    raise duetime.Continue()


@app.task(name="lr.sync_on_loop")
async def sync_on_loop() -> str:
    """An async task calling the sync checkpoint: refused with a clear error (it would block
    the loop)."""
    try:
        duetime.current_run().checkpoint({"x": 1})
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@app.task(name="lr.too_large")
def too_large(size: int) -> str:
    try:
        duetime.current_run().checkpoint(b"x" * size)
    except duetime.CheckpointTooLarge as exc:
        return f"CheckpointTooLarge: {exc}"
    return "stored"


@app.task(name="lr.fail_once", retries=2, backoff=(0.01, 0.01))
def fail_once() -> Any:
    """Checkpoints, then fails on its first attempt: the retry reads the checkpoint."""
    run = duetime.current_run()
    seen.setdefault(run.run_id, []).append((run.attempt, run.checkpoint_state))
    if run.attempt == 1:
        run.checkpoint({"step": 7})
        raise RuntimeError("first attempt fails after its checkpoint")
    return run.checkpoint_state
