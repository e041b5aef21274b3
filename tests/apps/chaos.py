"""The chaos harness's application: a mixed load whose every execution is journaled outside
Redis (tests/chaos/journal.py), so the checker can compare what ran with what Redis says.

Each task's behaviour is fixed by its name and arguments, so the checker knows what was
injected: `failing` always raises (it ends dead), `flaky` raises on its first attempt only
(one retry), `nonidem` is declared not idempotent (an interrupted run ends uncertain), `slow`
is a sync task longer than a heartbeat interval, `tick` and `long_tick` serve schedules.
"""

from __future__ import annotations

import asyncio
import os
import time

import duetime
from tests.chaos import journal

app = duetime.App()

FAILURE = "injected failure"
FIRST_ATTEMPT_FAILURE = "injected first-attempt failure"


def _begin() -> dict[str, object]:
    run = duetime.current_run()
    entry: dict[str, object] = {"run": run.run_id, "task": run.task, "attempt": run.attempt,
                                "fence": run.fence, "worker": run.worker_id,
                                "pid": os.getpid()}
    journal.append({"e": "start", **entry, "t": journal.now()})
    return entry


def _end(entry: dict[str, object], outcome: str) -> None:
    journal.append({"e": "end", **entry, "t": journal.now(), "outcome": outcome,
                    "lost": duetime.current_run().lease_lost})


def _sync(body: object) -> None:
    entry = _begin()
    try:
        body()  # type: ignore[operator]
    except BaseException:
        _end(entry, "raised")
        raise
    _end(entry, "ok")


async def _async(seconds: float) -> None:
    entry = _begin()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _end(entry, "cancelled")
        raise
    _end(entry, "ok")


@app.task(name="chaos.quick", retries=6, backoff=(0.2, 1.0))
def quick(seconds: float = 0.02) -> None:
    _sync(lambda: time.sleep(seconds))


@app.task(name="chaos.aquick", retries=6, backoff=(0.2, 1.0))
async def aquick(seconds: float = 0.02) -> None:
    await _async(seconds)


@app.task(name="chaos.slow", retries=6, backoff=(0.2, 1.0))
def slow(seconds: float = 2.0) -> None:
    """A sync task longer than a heartbeat interval: it lives on its heartbeats."""
    _sync(lambda: time.sleep(seconds))


@app.task(name="chaos.failing", retries=2, backoff=(0.1, 0.2))
def failing() -> None:
    def body() -> None:
        raise RuntimeError(FAILURE)
    _sync(body)


@app.task(name="chaos.flaky", retries=6, backoff=(0.1, 0.2))
def flaky() -> None:
    def body() -> None:
        if duetime.current_run().attempt == 1:
            raise RuntimeError(FIRST_ATTEMPT_FAILURE)
    _sync(body)


@app.task(name="chaos.nonidem", idempotent=False)
def nonidem(seconds: float = 0.3) -> None:
    _sync(lambda: time.sleep(seconds))


@app.task(name="chaos.tick", retries=6, backoff=(0.2, 1.0))
async def tick() -> None:
    await _async(0.01)


@app.task(name="chaos.long_tick", retries=6, backoff=(0.2, 1.0))
async def long_tick(seconds: float = 2.5) -> None:
    """Runs longer than its schedule's interval: with overlap `skip`, the next one is skipped."""
    await _async(seconds)


@app.task(name="chaos.watchful", retries=6, backoff=(0.2, 1.0))
def watchful(seconds: float = 5.0) -> None:
    """A sync task that does what the docs ask of one: it watches `current_run().lease_lost`
    and journals the moment it turns true (then stops, as it should before external effects)."""
    def body() -> None:
        run = duetime.current_run()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if run.lease_lost:
                journal.append({"e": "lost", "run": run.run_id, "fence": run.fence,
                                "pid": os.getpid(), "t": journal.now()})
                return
            time.sleep(0.02)
    _sync(body)
