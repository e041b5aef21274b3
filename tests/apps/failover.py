"""The failover test's application: a task that touches no Redis of its own (a write of the
task's to a dead primary would fail the attempt and blur what the test counts: duetime's own
bookkeeping of runs and attempts)."""

from __future__ import annotations

import duetime

app = duetime.App()


@app.task(name="fo.work", retries=5, backoff=(0.1, 0.5))
async def work(i: int = 0) -> int:
    return i
