"""An app with worker lifecycle hooks and a task that logs through the standard library."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import duetime

app = duetime.App()
MARKS = Path(os.environ.get("DUETIME_TEST_MARKS", "/tmp/duetime-test-marks"))


@app.on_worker_start
async def open_client(ctx: duetime.WorkerContext) -> None:
    if os.environ.get("DUETIME_TEST_BREAK_START"):
        raise ConnectionError("the payment API is down")
    ctx.http = f"client-for-{ctx.worker_id}"
    (MARKS / "started").write_text(ctx.http)


@app.on_worker_stop
def close_client(ctx: duetime.WorkerContext) -> None:
    (MARKS / "stopped").write_text(ctx.http)


@app.task(name="uses_client")
def uses_client() -> str:
    return duetime.worker_context().http


@app.task(name="logs_stdlib")
def logs_stdlib(word: str) -> None:
    logging.getLogger("myproject.billing").warning("charging %s", word)
