"""A worker stalls (stopped, or its heartbeats held) longer than a lease while a sync task
runs; the reaper retries the run and the same worker claims it again while the old thread
still runs. The task body must not run twice at once, and the run must end succeeded: the
new attempt waits for the old body and takes its success."""

from __future__ import annotations

import asyncio
import signal

from prometheus_client import REGISTRY

from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.inproc import Gate, reaper_thread, serving, until


def executions(path: str) -> list[tuple[float, float]]:
    """(start, end) of every execution the journal shows, in start order; asserts that no
    two overlapped (each start is followed by its own end before the next start)."""
    lines = basic.journal(path)
    spans: list[tuple[float, float]] = []
    for i in range(0, len(lines), 2):
        pair = lines[i:i + 2]
        assert [e for e, _, _ in pair] == ["start", "end"], f"overlapping executions: {lines}"
        spans.append((pair[0][2], pair[1][2]))
    return spans


def test_heartbeats_held_past_the_lease_do_not_run_a_sync_task_twice(app, r, tmp_path):
    """In-process: lease 1 s, heartbeats held during a 3 s sync task until the lease lapsed and
    the run was claimed again, a reaper running."""
    path = str(tmp_path / "journal")
    lost0 = REGISTRY.get_sample_value("duetime_leases_lost_total") or 0

    async def main() -> str:
        with reaper_thread(app):
            run_id = app.enqueue(basic.journaled, [path, 3.0])
            async with serving(app, lease_ms=1000) as w:
                gate = Gate(w)
                await until(lambda: basic.journal(path), 10, what="the run to start")
                gate.open.clear()
                # the lease lapses, the reaper retries the run at once, this worker claims it
                await until(lambda: app.get_run(run_id).fence == 2, 5, what="the second claim")
                assert len(basic.journal(path)) == 1  # the first thread still runs
                gate.open.set()
                await until(lambda: app.get_run(run_id).state in ("succeeded", "dead"), 20,
                            what="the run to end")
        return run_id

    run_id = asyncio.run(main())
    spans = executions(path)
    assert len(spans) == 1, spans  # the work was done once: attempt 2 took attempt 1's success
    run = app.get_run(run_id)
    assert run.state == "succeeded"
    assert [a.outcome for a in run.attempts] == ["unknown", "succeeded"]
    assert (REGISTRY.get_sample_value("duetime_leases_lost_total") or 0) - lost0 == 1


def test_when_the_old_attempt_fails_the_new_one_runs_the_task_after_it(app, r, tmp_path):
    """Same stall, but the old attempt's body raises: its result cannot stand for the new
    attempt, which runs the task itself once the old body has ended (never at once)."""
    path = str(tmp_path / "journal")

    async def main() -> str:
        with reaper_thread(app):
            run_id = app.enqueue(basic.journaled, [path, 2.0, 1])
            async with serving(app, lease_ms=1000) as w:
                gate = Gate(w)
                await until(lambda: basic.journal(path), 10, what="the run to start")
                gate.open.clear()
                await until(lambda: app.get_run(run_id).fence == 2, 5, what="the second claim")
                gate.open.set()
                await until(lambda: app.get_run(run_id).state in ("succeeded", "dead"), 20,
                            what="the run to end")
        return run_id

    run_id = asyncio.run(main())
    spans = executions(path)
    assert [a for e, a, _ in basic.journal(path) if e == "start"] == [1, 2]
    assert spans[0][1] <= spans[1][0]  # the second began after the first ended
    run = app.get_run(run_id)
    assert run.state == "succeeded"
    assert [a.outcome for a in run.attempts] == ["unknown", "succeeded"]


def test_a_stopped_worker_resumes_without_running_the_task_twice_at_once(app, r, procs, tmp_path):
    """A worker process SIGSTOPped for longer than its lease (2 s) during a 6 s sync task,
    a reaper running: after SIGCONT the run is claimed again by the same worker, whose old
    thread is still running. At most two executions, never at once; the run succeeds. (A 1 s
    lease let a heartbeat the resumed worker sent a second late on a loaded machine lapse the
    new attempt too: a third execution.)"""
    path = str(tmp_path / "journal")
    run_id = app.enqueue(basic.journaled, [path, 6.0])
    worker = procs.worker("--lease", "2s")
    with reaper_thread(app, tick_s=0.1):
        wait_for(lambda: basic.journal(path), 60, what="the run to start")
        worker.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: app.get_run(run_id).state == "retrying", 30,
                     what="the lease to be reaped")
        finally:
            worker.send_signal(signal.SIGCONT)
        wait_for(lambda: app.get_run(run_id).state in ("succeeded", "dead"), 30,
                 what="the run to end")
        wait_for(lambda: len(basic.journal(path)) % 2 == 0, 10, what="executions to end")
    # and it cannot start again later: no lease left to lapse, not due, not retrying
    k, p = app.keys, app.keys.partition_of_run(run_id)
    for key in (k.leases(p), k.due(p, "default"), k.retry(p, "default")):
        assert r.zscore(key, run_id) is None, key
    spans = executions(path)
    assert 1 <= len(spans) <= 2, spans
    run = app.get_run(run_id)
    assert run.state == "succeeded", [(a.outcome, a.error) for a in run.attempts]
    assert worker.poll() is None
    worker.terminate()
    err = worker.communicate(timeout=30)[1].decode()
    assert err.count("lease lost") >= 1, err[-3000:]  # the loss was logged
