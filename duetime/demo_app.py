"""The sample application `duetime demo` runs: quick tasks, a flaky one, a fatal one."""

from __future__ import annotations

import os
import random
import time

import duetime

app = duetime.App()


@app.task(name="demo.resize", backoff=(0.2, 1.0))
def resize(image: str, width: int) -> dict[str, str | int]:
    time.sleep(random.uniform(0.001, 0.01))
    return {"image": image, "width": width}


@app.task(name="demo.flaky", retries=3, backoff=(0.2, 1.0))
async def flaky(n: int) -> None:
    # fails on its first attempt, succeeds on the retry
    if duetime.current_run().attempt == 1:
        raise RuntimeError(f"transient failure of item {n}")


@app.task(name="demo.broken", retries=0, owner="team-payments")
def broken(n: int) -> None:
    raise duetime.Fatal(f"item {n} can never be processed (pid {os.getpid()})")
