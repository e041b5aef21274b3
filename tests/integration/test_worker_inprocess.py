"""The worker's parts, driven inside the test's event loop against a real server: the claim
loop, the reporter, the lease keeper, wake notices and the outcome metric."""

from __future__ import annotations

import asyncio

import pytest
from duetime.common import transitions as tr
from duetime.common.context import RunContext
from duetime.common.errors import InvalidInput
from duetime.common.scripts import Scripts
from duetime.worker import execution, leases
from duetime.worker.execution import Execution
from duetime.worker.runtime import Worker, WorkerConfig
from prometheus_client import REGISTRY

from tests.apps import basic
from tests.integration.inproc import Gate, reaper_thread, serving, until
from tests.recorder import Recorder


def finished(task: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("duetime_runs_finished_total",
                                     {"task": task, "outcome": outcome}) or 0.0


def test_claim_loop_runs_each_run_once_within_the_concurrency_cap(app, r):
    """Runs spread over all partitions, more than the slots: every one runs exactly once and
    the number in flight never exceeds the cap (claims in flight reserve their slots)."""
    async def main() -> None:
        ids = app.enqueue_many([(basic.overlapping, [0.02]) for _ in range(150)])
        async with serving(app, concurrency=6) as w:
            most = 0

            def done() -> bool:
                nonlocal most
                most = max(most, len(w.inflight))
                return r.hlen(basic.count_key()) >= 150 and not w.inflight
            await until(done, 60, interval=0.002, what="150 executions")
        assert most <= 6
        assert set(ids) == {k.decode() for k in r.hkeys(basic.count_key())}
        assert max(int(v) for v in r.hvals(basic.count_key())) == 1
        assert int(r.get(f"{app.keys.namespace}:test:max_running")) <= 6
        assert {app.get_run(i).state for i in ids} == {"succeeded"}

    asyncio.run(main())


def test_the_worker_reports_plain_first_successes_in_complete_luas_plain_form(app, r):
    """Successes of plain runs on their first attempt, without a result, go to complete.lua
    in its plain form (run id and fence per run: a bare first attempt's mark); they end the
    runs as the full form does."""
    async def main() -> None:
        async with serving(app) as w:
            forms: list[str] = []
            real = w.scripts.complete

            async def complete(keys, args, client=None):  # noqa: ANN001
                forms.append(args[3])
                return await real(keys=keys, args=args, client=client)

            w.scripts.complete = complete
            ids = app.enqueue_many([(basic.noop, []) for _ in range(20)])
            await until(lambda: all(app.get_run(i).state == "succeeded" for i in ids), 60,
                        what="20 successes")
        assert forms and set(forms) == {"1"}
        assert [a.outcome for i in ids for a in app.get_run(i).attempts] == ["succeeded"] * 20

    asyncio.run(main())


async def _started_before_a_refresh(app, r, run_id: str) -> None:
    """The delayed run started, not before its due time, well within the worker's 60 s refresh
    of the due heads: only the enqueue's wake notice told the worker of it (how late it started
    is a latency, measured in bench/)."""
    await until(lambda: r.hlen(basic.stamps_key()) == 1, 30, what="the delayed run")
    started = float(r.hget(basic.stamps_key(), run_id))
    assert started >= app.get_run(run_id).due.timestamp() * 1000


def test_a_delayed_run_starts_at_its_due_time_from_the_wake_notice(app, r):
    """refresh_s is a minute: only the enqueue's wake notice can start the run on time."""
    async def main() -> None:
        async with serving(app, refresh_s=60.0):
            run_id = app.enqueue(basic.stamp, delay=0.8)
            await _started_before_a_refresh(app, r, run_id)

    asyncio.run(main())


def test_garbage_on_the_wake_channel_does_not_stop_wake_ups(app, r):
    """Any client may PUBLISH on the channel; a queue name may not hold the separator. After
    unreadable notices the listener still starts a delayed run on time (refresh 60 s)."""
    garbage = [b"hello", b"1|default", b"x|default|5", b"1|default|soon", b"\xff\xfe|\x00|1",
               b"999999|default|1", b"1|default|nan", b"1|a|b|c", b""]

    async def main() -> None:
        async with serving(app, refresh_s=60.0) as w:
            for g in garbage:
                r.publish(app.keys.wake_channel, g)
            await until(lambda: w.listener.ignored >= len(garbage), 5, what="notices read")
            run_id = app.enqueue(basic.stamp, delay=0.8)
            await _started_before_a_refresh(app, r, run_id)

    asyncio.run(main())


def test_retry_on_the_last_attempt_counts_as_dead(app, r):
    """duetime_runs_finished_total counts what fail.lua decided, not what the task asked."""
    before = {o: finished("retry_always", o) for o in ("retrying", "dead", "retry")}

    async def main() -> str:
        run_id = app.enqueue(basic.retry_always)
        async with serving(app):
            await until(lambda: app.get_run(run_id).state == "dead", 15, what="dead letter")
            await until(lambda: finished("retry_always", "dead") > before["dead"], 5,
                        what="the metric")
        return run_id

    run_id = asyncio.run(main())
    assert [a.outcome for a in app.get_run(run_id).attempts] == ["failed", "failed"]
    assert finished("retry_always", "retrying") - before["retrying"] == 1
    assert finished("retry_always", "dead") - before["dead"] == 1
    assert finished("retry_always", "retry") == before["retry"] == 0


def test_reporter_acknowledges_successes_in_one_call_per_partition(app, r):
    """Successes of one flush go as one complete.lua call per partition; a failure as its own
    call; each outcome is counted from the script's reply (a stale fence is refused)."""
    k = app.keys
    scripts = Scripts(app.store.ready())
    ids = app.enqueue_many([(basic.noop, [i]) for i in range(40)])
    claimed = []
    for p in range(k.partitions):
        keys, args = tr.claim(k, p, "default", "w-test", 100, 60_000)
        claimed += [(p, c) for c in tr.parse_claim(scripts.claim(keys=keys, args=args)).runs]
    assert len(claimed) == 40

    def ex(p: int, c: tr.Claimed, fence: int | None = None) -> Execution:
        ctx = RunContext(run_id=c.run_id, task=c.task, queue="default", attempt=c.attempt,
                         fence=c.fence if fence is None else fence, worker_id="w-test",
                         idempotency_key=c.run_id, scheduled_at=None)
        return Execution(ctx, p)

    ok, failing, stale = claimed[:38], claimed[38], claimed[39]
    before = {o: finished("noop", o) for o in ("succeeded", "retrying", "stale")}

    async def main() -> None:
        async with serving(app) as w:
            calls: list[int] = []
            real = w.scripts.complete

            async def complete(keys, args, client=None):  # noqa: ANN001
                # the full form (these attempts are not marked bare): after prefix, channel,
                # partition and form, run id, fence, result, fault, bare per run
                assert args[3] == ""
                calls.append((len(args) - 4) // 5)
                return await real(keys=keys, args=args, client=client)

            w.scripts.complete = complete
            items = [("complete", ex(p, c), ()) for p, c in ok]
            items.append(("fail", ex(*failing), ("RuntimeError: x", "error", 0)))
            items.append(("complete", ex(*stale, fence=99), ()))
            assert await w.reporter.flush(items) == []
            partitions = {p for p, _ in ok} | {stale[0]}
            assert len(calls) == len(partitions) and sum(calls) == 39

    asyncio.run(main())
    assert {app.get_run(c.run_id).state for _, c in ok} == {"succeeded"}
    assert app.get_run(failing[1].run_id).state == "retrying"
    assert app.get_run(stale[1].run_id).state == "running"  # fence 99 is not the holder's
    assert finished("noop", "succeeded") - before["succeeded"] == 38
    assert finished("noop", "retrying") - before["retrying"] == 1
    assert finished("noop", "stale") - before["stale"] == 1
    assert set(ids) >= {c.run_id for _, c in claimed}


def test_heartbeats_keep_a_run_longer_than_its_lease(app, r):
    """Lease 1 s, run 3.5 s, a reaper running: the lease is renewed, never reaped. (A 300 ms
    lease was lapsed by a heartbeat a loaded machine delayed 300 ms, and the reaper retried
    the run.)"""
    async def main() -> str:
        with reaper_thread(app):
            run_id = app.enqueue(basic.aslow, [3.5])
            async with serving(app, lease_ms=1000):
                await until(lambda: app.get_run(run_id).state == "succeeded", 15, what="success")
        return run_id

    run_id = asyncio.run(main())
    assert [a.outcome for a in app.get_run(run_id).attempts] == ["succeeded"]
    assert int(r.hget(basic.count_key(), run_id)) == 1


def test_a_lost_lease_is_logged_once_and_the_sync_run_no_longer_heartbeated(app, r, monkeypatch,
                                                                          tmp_path):
    """Another worker takes the run mid-way; the sync task's thread cannot be stopped, so it
    runs on: the loss is logged and counted once, not at every beat, and its lease is not
    renewed again (the thief's is left alone)."""
    rec = Recorder()
    monkeypatch.setattr(execution, "log", rec)
    monkeypatch.setattr(leases, "log", rec)
    lost_before = REGISTRY.get_sample_value("duetime_leases_lost_total") or 0
    path = str(tmp_path / "journal")

    async def main() -> str:
        # 5 s: still running after the lapse, the reap and the thief's claim below, however
        # long a loaded machine takes for them (2 s could end first)
        run_id = app.enqueue(basic.journaled, [path, 5.0])
        # one slot, which the run keeps while its thread runs: the thief's claim wins
        with reaper_thread(app):
            async with serving(app, lease_ms=300, concurrency=1) as w:
                gate = Gate(w)
                await until(lambda: basic.journal(path), 10, what="the run to start")
                gate.open.clear()  # the lease lapses; the reaper retries the run
                await until(lambda: app.get_run(run_id).state == "retrying", 5, what="the reaper")
                scripts = Scripts(app.store.ready())
                p = app.keys.partition_of_run(run_id)
                keys, args = tr.claim(app.keys, p, "default", "thief", 1, 60_000)
                claimed = tr.parse_claim(scripts.claim(keys=keys, args=args)).runs
                assert [c.run_id for c in claimed] == [run_id]
                gate.open.set()
                await until(lambda: len(basic.journal(path)) == 2, 10, what="the thread to end")
                await until(lambda: not w.inflight, 5, what="the attempt to end")
                assert gate.beats >= 3  # it went on beating (the worker record) after the loss
        return run_id

    run_id = asyncio.run(main())
    lost = rec.events("lease lost; stopping the run")
    assert len(lost) == 1 and lost[0]["run_id"] == run_id and lost[0]["attempt"] == 1
    assert (REGISTRY.get_sample_value("duetime_leases_lost_total") or 0) - lost_before == 1
    run = app.get_run(run_id)
    assert run.worker == "thief" and run.state == "running"  # the late success was refused
    assert run.attempts[0].late


def test_worker_config_is_checked_before_anything_runs(app):
    cfg = WorkerConfig(queues=["default"])
    cfg.lease_ms = 0  # changed after construction: the worker checks again
    with pytest.raises(InvalidInput, match="lease_ms"):
        Worker(app.registry, app.redis_url, app.keys, cfg)


def test_a_run_that_succeeds_on_retry_carries_no_error_of_the_failed_attempt(app, tmp_path):
    """The run shows how it ended; the first attempt's error stays in that attempt's entry."""
    path = str(tmp_path / "journal")

    async def main() -> str:
        run_id = app.enqueue(basic.journaled, [path, 0.0, 1])  # attempt 1 raises
        async with serving(app):
            await until(lambda: app.get_run(run_id).state == "succeeded", 15, what="the retry")
        return run_id

    run = app.get_run(asyncio.run(main()))
    assert run.error is None and run.reason is None
    assert [(a.outcome, a.error) for a in run.attempts][1] == ("succeeded", None)
    assert run.attempts[0].outcome == "failed" and "failed at its end" in (run.attempts[0].error or "")
