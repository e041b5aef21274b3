"""`duetime.testing`'s drain() with a task that retries with a duration string (was: the run
wedged, drain hung its whole timeout and raised without naming the run), and a drain that
times out names the runs and states it waits for."""

from __future__ import annotations

import asyncio
import re

import pytest

import duetime
import duetime.testing

app = duetime.App(redis_url="redis://127.0.0.1:1/0")  # never reached: tests run in memory


@app.task(name="later-string", retries=2)
def later_string() -> str:
    if duetime.current_run().attempt == 1:
        raise duetime.Retry(delay="1h", reason="upstream not ready")
    return "done"


@app.task(name="hangs", retries=0)
async def hangs() -> None:
    await asyncio.Event().wait()  # never set: only the drain's end stops it


def test_a_string_retry_delay_is_retried_under_drain():
    with duetime.testing.local(app) as backend:
        run_id = later_string.enqueue()
        assert backend.drain(timeout=20) == 2
        run = app.get_run(run_id)
        assert (run.state, run.attempt) == ("succeeded", 2)
        assert "upstream not ready" in (run.attempts[0].error or "")
        assert app.wait(run_id) == "done"


def test_a_drain_that_times_out_names_the_runs_it_waits_for():
    with duetime.testing.local(app) as backend:
        run_id = hangs.enqueue()
        with pytest.raises(duetime.DuetimeError) as info:
            backend.drain(timeout=1)
    message = str(info.value)
    assert re.search(rf"run {run_id} \(hangs: running, attempt 1 of 1\)", message), message
