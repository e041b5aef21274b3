"""End-to-end: workers against real Redis and Valkey servers. Workers run in the test's own
event loop (tests/integration/inproc.py), in burst mode where the test waits for the work to
end; worker processes only where a process is the point (SIGKILL, SIGTERM)."""

from __future__ import annotations

import asyncio
import signal

import pytest
import redis

from duetime.client.runs import keyed_run_id
from duetime.embedded import EmbeddedServer
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.inproc import (
    burst,
    drain,
    due_now,
    reaper_thread,
    record_logs,
    serving,
    until,
)


def counts(r, app) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(basic.count_key()).items()}


def states(app, ids) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in ids:
        s = app.get_run(i).state
        out[s] = out.get(s, 0) + 1
    return out


def expire_lease(app, r, run_id: str) -> None:
    """The lease of `run_id` expires now (instead of the test sleeping through it)."""
    r.zadd(app.keys.leases(app.keys.partition_of_run(run_id)), {run_id: 0}, xx=True)


def test_two_workers_race_over_2000_runs_each_runs_exactly_once(app, r):
    """Two workers, each with its own connections, race over the same sets; both stop once
    nothing is left, with every outcome recorded."""
    ids = app.enqueue_many([(basic.noop, [i]) for i in range(1000)]
                           + [(basic.anoop, [i]) for i in range(1000)])
    assert len(set(ids)) == 2000

    async def main() -> None:
        await asyncio.gather(drain(app, concurrency=32, worker_id="racer-1"),
                             drain(app, concurrency=32, worker_id="racer-2",
                                   claim_ahead_ms=0))  # claims only what is due

    asyncio.run(main())
    assert states(app, ids) == {"succeeded": 2000}
    c = counts(r, app)
    assert set(c) == set(ids)  # none lost
    assert max(c.values()) == 1  # none executed twice
    workers = {app.get_run(i).worker for i in ids[::50]}
    assert workers == {"racer-1", "racer-2"}  # both workers took part


def test_concurrency_caps_runs_executing_at_once(app, r):
    """Claims overlap (one travels while another batch starts): the cap must still hold."""
    ids = app.enqueue_many([(basic.overlapping, [0.05]) for _ in range(120)])
    burst(app, concurrency=7)
    assert states(app, ids) == {"succeeded": 120}
    assert max(counts(r, app).values()) == 1
    assert int(r.get(f"{app.keys.namespace}:test:max_running")) == 7


def _killed_mid_run_and_reaped(app, r, procs, run_id: str, state: str) -> None:
    """A worker process runs `run_id` and is SIGKILLed mid-run; its lease is made to expire
    now (not slept through) and the reaper moves the run to `state`."""
    victim = procs.worker("--lease", "1s")
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    expire_lease(app, r, run_id)
    with reaper_thread(app):
        wait_for(lambda: app.get_run(run_id).state == state, 15, what=f"the lease reaped: {state}")


def test_sigkill_mid_run_reruns_after_lease_expiry(app, r, procs):
    """A worker process SIGKILLed mid-run; its lease is made to expire now (rather than
    slept through), the reaper retries the run and another worker runs it. How soon a killed
    worker's run is recovered in real time is measured in bench/chaos.py."""
    run_id = app.enqueue(basic.slow, [2.0])
    _killed_mid_run_and_reaped(app, r, procs, run_id, "retrying")
    burst(app, claim_ahead_ms=1000)  # the reaper's backoff is within claim-ahead
    run = app.get_run(run_id)
    assert run.state == "succeeded"
    assert [a.outcome for a in run.attempts] == ["unknown", "succeeded"]
    assert run.attempts[0].error == "lease expired"
    assert run.attempts[0].worker != run.attempts[1].worker
    assert counts(r, app)[run_id] == 2


def test_heartbeats_keep_a_long_run_owned(app, r):
    """A 3 s run under 1 s leases, a reaper running and a second worker waiting for work."""
    run_id = app.enqueue(basic.aslow, [3.0])

    async def main() -> None:
        with reaper_thread(app, tick_s=0.1):
            await asyncio.gather(drain(app, lease_ms=1000), drain(app, lease_ms=1000))

    asyncio.run(main())
    run = app.get_run(run_id)
    assert run.state == "succeeded"
    assert [a.outcome for a in run.attempts] == ["succeeded"]
    assert counts(r, app)[run_id] == 1


def test_retry_with_backoff_then_dead_letter(app, r):
    """Backoff (0.2 s, 0.4 s): the retry after attempt n is due base * 2^(n-1), capped, with
    jitter in its upper half, after the attempt ended; read from the run as the script set
    it, then time is advanced to it (the run made due now) instead of slept through."""
    run_id = app.enqueue(basic.always_fails)
    k, p = app.keys, app.keys.partition_of_run(run_id)
    delays = []
    for _ in range(2):
        burst(app)  # one attempt: its retry is due later than now, not waited for
        run = app.get_run(run_id)
        assert run.state == "retrying"
        delays.append((run.retry_at - run.attempts[-1].ended).total_seconds())
        assert r.zscore(k.retry(p, "default"), run_id) == run.retry_at.timestamp() * 1000
        due_now(app, run_id)
    assert 0.1 <= delays[0] < 0.2 and 0.2 <= delays[1] < 0.4, delays  # grows, within bounds
    burst(app)
    run = app.get_run(run_id)
    assert run.state == "dead"
    assert [a.outcome for a in run.attempts] == ["failed", "failed", "failed"]
    assert run.attempt == 3 == run.max_attempts
    assert "RuntimeError: boom" in run.error
    assert r.zscore(k.dead(p), run_id) is not None


def test_fatal_goes_straight_to_dead(app, r):
    run_id = app.enqueue(basic.fatal)
    burst(app)
    run = app.get_run(run_id)
    assert run.state == "dead"
    assert len(run.attempts) == 1 and run.attempt == 1
    assert "cannot ever work" in run.reason


def test_explicit_retry_delay(app, r):
    """Retry(delay=0.5): the retry is due exactly 0.5 s after the attempt ended, and the
    next attempt (claimed ahead of it) does not start before."""
    run_id = app.enqueue(basic.retry_later, [0.5])
    burst(app)  # attempt 1; its retry is due later: not waited for
    run = app.get_run(run_id)
    assert run.state == "retrying"
    assert (run.retry_at - run.attempts[0].ended).total_seconds() == 0.5
    burst(app, claim_ahead_ms=5000)  # due within claim-ahead: claimed now, started at its time
    run = app.get_run(run_id)
    assert run.state == "succeeded"
    assert run.attempts[1].started >= run.attempts[0].ended + (run.retry_at - run.attempts[0].ended)


def test_non_idempotent_lease_expiry_goes_uncertain_and_is_not_rerun(app, r, procs):
    run_id = app.enqueue(basic.nonidem, [3.0])
    _killed_mid_run_and_reaped(app, r, procs, run_id, "uncertain")
    # a second worker finds nothing to run: it looked at every set and stopped, idle
    assert burst(app, claim_ahead_ms=5000).processed == 0
    run = app.get_run(run_id)
    assert run.state == "uncertain"
    assert [a.outcome for a in run.attempts] == ["unknown"]
    assert counts(r, app)[run_id] == 1
    assert "not idempotent" in run.reason


def _sigtermed_mid_run(app, r, procs, task: str, seconds: float, grace: str):
    """A run of `task` taking `seconds`, on a worker process with `--grace`, which gets
    SIGTERM once the run started and exits 0: the run as it was left."""
    run_id = app.enqueue(task, [seconds])
    w = procs.worker("--grace", grace)
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    w.send_signal(signal.SIGTERM)
    assert w.wait(20) == 0
    return app.get_run(run_id)


@pytest.mark.parametrize("task", ["slow", "aslow"])
def test_sigterm_lets_a_run_finish_within_grace(app, r, procs, task):
    run = _sigtermed_mid_run(app, r, procs, task, 1.0, "10s")
    assert run.state == "succeeded" and run.attempt == 1


@pytest.mark.parametrize("task", ["slow", "aslow"])
def test_sigterm_releases_an_unfinished_run_without_burning_an_attempt(app, r, procs, task):
    run = _sigtermed_mid_run(app, r, procs, task, 4.0, "300ms")
    assert run.state == "scheduled"
    assert run.attempt == 0  # the interrupted attempt is not counted
    assert [a.outcome for a in run.attempts] == ["released"]
    burst(app)
    run = app.get_run(run.id)
    assert run.attempt == 1 and [a.outcome for a in run.attempts] == ["released", "succeeded"]


def test_unknown_task_goes_dead_after_the_grace_and_worker_keeps_going(app, r, procs, url,
                                                                        namespace):
    """No worker ever published the task: handed back (no attempt spent) until the grace
    period since its due time has passed, then dead-lettered saying so."""
    from tests.apps import producer

    producer.app.configure(redis_url=url, namespace=namespace)
    bad = producer.app.enqueue(producer.only_in_producer)
    good = app.enqueue(basic.noop)
    procs.worker("--unknown-task-grace", "1s")
    wait_for(lambda: app.get_run(good).state == "succeeded", 20, what="good run")
    wait_for(lambda: app.get_run(bad).state == "dead", 20, what="unknown task dead")
    run = app.get_run(bad)
    assert "unknown task 'only.in.producer': no live worker has published it" in run.reason
    assert len(run.attempts) == 1 and run.attempt == 1  # the hand-backs spent none
    producer.app.close()


def test_a_run_whose_task_name_no_worker_could_publish_is_dead_lettered_at_once(app, r):
    """A record whose task was overwritten with an empty name (a damaged key): no worker of
    any deploy can know it, so it is not handed back for the rolling-deploy grace (10 minutes
    by default, which this burst worker keeps) but dead-lettered with a reason saying why."""
    run_id = app.enqueue(basic.noop)
    k = app.keys
    r.hset(k.run(k.partition_of_run(run_id), run_id), "task", "")
    burst(app)
    run = app.get_run(run_id)
    assert run.state == "dead"
    assert "not a valid task name" in run.reason and run.attempt == 1


def test_async_timeout_fails_the_attempt(app, r):
    run_id = app.enqueue(basic.times_out)
    burst(app)
    assert app.get_run(run_id).state == "dead"
    assert "exceeded its timeout of 0.3s" in app.get_run(run_id).error


def test_current_run_context(app, r):
    run_id = app.enqueue(basic.context, key="order-42")
    burst(app)
    assert app.get_run(run_id).state == "succeeded"
    ctx = {k.decode(): v.decode() for k, v in
           r.hgetall(f"{app.keys.namespace}:test:ctx:{run_id}").items()}
    assert ctx["attempt"] == "1" and ctx["key"] == "order-42" and ctx["lost"] == "0"
    assert ctx["worker"] == app.get_run(run_id).worker
    assert ctx["scheduled"].startswith(str(app.get_run(run_id).due.date()))


def test_delayed_runs_are_never_started_early(app, r):
    """Runs are claimed up to claim-ahead before their due time and started at it: each
    task's own first instant is at or after its due time (ms, rounded up when enqueued). How
    late they start is measured in bench/precision.py, not asserted here."""
    async def main() -> list[str]:
        async with serving(app):  # default claim-ahead: the worker wakes itself at each due time
            ids = app.enqueue_many([{"task": basic.stamp, "delay": 0.5 + i * 0.037}
                                    for i in range(30)])
            await until(lambda: r.hlen(basic.stamps_key()) >= 30, 20, what="30 delayed runs")
        return ids

    ids = asyncio.run(main())
    stamps = {k.decode(): float(v) for k, v in r.hgetall(basic.stamps_key()).items()}
    late = [stamps[i] - app.get_run(i).due.timestamp() * 1000 for i in ids]
    assert min(late) >= 0, sorted(late)[:3]  # never early
    run = app.get_run(ids[0])
    assert run.started >= run.due


def test_runs_claimed_far_ahead_are_held_to_their_due_time(app, r):
    """With a claim-ahead longer than the runs' delays, the first claim takes them all, long
    before they are due: each is held in the worker (worker/clock.py's wait_until) and its
    task starts at or after its due time; a run claimed ahead records the due time as its
    attempt's start. (A machine that stalls the worker past a run's due time makes the claim
    come after it: that run's start is then the claim's instant, still not early; the delays
    leave two seconds for the first claim, so most runs are claimed ahead.)"""
    ids = app.enqueue_many([{"task": basic.stamp, "delay": 2.0 + i * 0.011} for i in range(25)])
    worker = burst(app, concurrency=32, claim_ahead_ms=5000)
    assert worker.processed == 25
    stamps = {k.decode(): float(v) for k, v in r.hgetall(basic.stamps_key()).items()}
    held = 0
    for run_id in ids:
        run = app.get_run(run_id)
        assert run.state == "succeeded"
        due_ms = run.due.timestamp() * 1000
        assert stamps[run_id] >= due_ms, (run_id, stamps[run_id] - due_ms)  # never early
        started = run.attempts[0].started
        assert started is not None and started >= run.due
        held += started == run.due  # claimed ahead: its attempt starts at due
    assert held > 0, "no run was claimed ahead of its due time"


def test_lost_lease_cancels_an_async_run(app, r):
    """Another owner takes the run (here: the reaper after a simulated stall, then a claim by
    someone else); the original worker's next heartbeat finds the lease lost and cancels. The
    task would sleep ten minutes: that its execution ended at all is the cancellation."""
    from duetime.common import transitions as tr
    from duetime.common.scripts import Scripts

    async def main() -> None:
        async with serving(app, lease_ms=1500):
            await until(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
            steal()
            await until(lambda: r.llen(basic.intervals_key()) == 1, 15,
                        what="the original execution to stop")

    run_id = app.enqueue(basic.sched_slow, [600.0])
    k, p = app.keys, app.keys.partition_of_run(run_id)

    def steal() -> None:
        _steal(app, r, k, p, run_id, Scripts(r), tr)

    asyncio.run(main())
    [entry] = r.lrange(basic.intervals_key(), 0, -1)
    assert entry.decode().startswith(f"{run_id}|")
    run = app.get_run(run_id)
    assert run.state == "running" and run.worker == "thief" and run.fence == 2
    assert [a.outcome for a in run.attempts] == ["unknown", "running"]
    assert not run.attempts[0].late  # the cancelled execution reported nothing


def _steal(app, r, k, p, run_id, scripts, tr) -> None:
    """The reaper takes the run, then someone else claims it."""
    # the reaper takes the run (a long backoff keeps the worker from claiming it back) ...
    r.hset(k.run(p, run_id), mapping={"attempt": 2, "backoff_base": 600_000,
                                      "backoff_max": 600_000, "max_attempts": 9})
    r.zadd(k.leases(p), {run_id: 0})
    keys, args = tr.reap(k, p, 10, 0.5, 0)
    assert scripts.reap(keys=keys, args=args)[0] == 1
    # ... and someone else claims it
    r.zadd(k.retry(p, "default"), {run_id: 0})
    keys, args = tr.claim(k, p, "default", "thief", 1, 60_000)
    runs = tr.parse_claim(scripts.claim(keys=keys, args=args)).runs
    assert [c.run_id for c in runs] == [run_id]


def test_worker_carries_on_after_a_redis_restart(namespace):
    """Redis restarts under a running worker (script cache and data gone): it reconnects,
    reloads the scripts on its new connections, resubscribes, and runs new work."""
    from duetime.embedded import EmbeddedServer

    app = basic.app

    async def main() -> None:
        async with serving(app):
            first = app.enqueue(basic.noop)
            await until(lambda: app.get_run(first).state == "succeeded", 20, what="first run")
            server.kill()
            await asyncio.sleep(0.5)  # the length of the outage, not a wait for an outcome
            server.start()
            app.close()
            basic.r.clear()  # the tasks' own client: connections to the old process
            second = app.enqueue(basic.anoop)
            await until(lambda: app.get_run(second).state == "succeeded", 30,
                        what="a run after the restart")

    with EmbeddedServer("redis") as server:
        app.configure(redis_url=server.url, namespace=namespace)
        try:
            asyncio.run(main())
        finally:
            app.close()


def test_redis_refusing_writes_for_a_while_loses_and_duplicates_nothing(server, namespace,
                                                                         monkeypatch):
    """Redis at maxmemory (OOM errors) for 1.6 s, shorter than the lease: the heartbeat, the
    outcome reports, the claims and the reaper are refused and must each try again. No loop may
    die from it (a dead heartbeat loop lets the lease lapse: the run would run twice; a dead
    report loop leaves successes unrecorded) and nothing may spin."""
    own = EmbeddedServer(server.kind).start()  # its own server: maxmemory is server-wide
    app = basic.app
    rec = record_logs(monkeypatch)

    async def main() -> list[str]:
        long_id = app.enqueue(basic.aslow, [4.0])  # heartbeats must go on past the window
        short_id = app.enqueue(basic.aslow, [1.0])  # ends, and reports, inside the window
        late_id = app.enqueue(basic.aslow, [0.1], delay=1.2)  # due inside the window
        ids = [long_id, short_id, late_id]
        with reaper_thread(app, tick_s=0.1):
            async with serving(app, lease_ms=3000):
                await until(lambda: r.hlen(basic.count_key()) >= 2, 15, what="two runs to start")
                await asyncio.sleep(0.3)
                r.config_set("maxmemory", 1)  # noeviction: every write is refused with OOM
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    r.set(f"{namespace}:probe", 1)
                await asyncio.sleep(1.6)  # the length of the outage
                r.config_set("maxmemory", 0)
                await until(lambda: states(app, ids) == {"succeeded": 3}, 30,
                            what="all three succeeded")
                after = app.enqueue(basic.anoop)  # still serving
                await until(lambda: app.get_run(after).state == "succeeded", 15,
                            what="a run after the window")
        return ids

    try:
        app.configure(redis_url=own.url, namespace=namespace)
        r = redis.Redis.from_url(own.url)
        ids = asyncio.run(main())
        c = counts(r, app)
        assert {i: c[i] for i in ids} == dict.fromkeys(ids, 1)
        for i in ids:
            assert [a.outcome for a in app.get_run(i).attempts] == ["succeeded"]
        # and none can run again later: no lease left to lapse, nothing due or retrying
        k = app.keys
        for p in range(k.partitions):
            assert not r.zcard(k.leases(p)) and not r.zcard(k.due(p, "default")) \
                and not r.zcard(k.retry(p, "default")), p
        refused = sum("refused" in f"{event} {fields}" for _, event, fields in rec.lines)
        assert 0 < refused < 100, rec.lines[-30:]  # it said so, and did not spin
    finally:
        app.close()
        own.stop()


def test_a_damaged_partition_key_does_not_stop_the_other_partitions(app, r, monkeypatch):
    """One partition's due set overwritten with a string (WRONGTYPE for every script that
    reads it): the worker says which key, leaves that partition alone for a while, and runs
    the other partitions' runs, including those claimed in the same pipeline."""
    k = app.keys
    bad = 3
    r.set(k.due(bad, "default"), "not a sorted set")
    rec = record_logs(monkeypatch)
    # keyed runs, keys chosen so that none lands in the damaged partition
    keys = [f"dmg-{i}" for i in range(260)
            if k.partition_of_run(keyed_run_id("anoop", f"dmg-{i}")) != bad][:201]
    keys, after_key = keys[:200], keys[200]

    async def main() -> list[str]:
        async with serving(app, concurrency=8):
            ids = app.enqueue_many([{"task": basic.anoop, "args": [n], "key": key}
                                    for n, key in enumerate(keys)])
            for _ in range(3):  # a (forged) wake notice sends the worker to the damaged key
                r.publish(k.wake_channel, f"{bad}|default|0")
                await asyncio.sleep(0.2)
            # a cheap poll first: reading 200 runs blocks the loop the worker runs on
            await until(lambda: r.hlen(basic.count_key()) >= 200, 30, what="200 executions")
            await until(lambda: states(app, ids) == {"succeeded": 200}, 30, interval=0.2,
                        what="200 succeeded")
            after = app.enqueue(basic.anoop, key=after_key)  # still serving
            await until(lambda: app.get_run(after).state == "succeeded", 15, what="one more run")
        return ids

    asyncio.run(main())
    assert max(counts(r, app).values()) == 1
    lines = [f"{fields}" for _, event, fields in rec.lines if "redis refused a call" in event]
    # each names the key and says it is of the wrong type: Redis's own WRONGTYPE (a read from
    # Python) or the scripts' check before their first write ('... is a string, not a zset')
    assert lines and all(k.due(bad, "default") in ln
                         and ("WRONGTYPE" in ln or "is a string, not a zset" in ln) for ln in lines)
    assert len(lines) < 10  # held for a while after each refusal, not retried in a loop


def test_damaged_run_records_are_dead_lettered_once_with_the_reason(app, r):
    """An operator's HSET may leave a run record unreadable (a non-numeric due time, a
    payload that is not msgpack). Such a run goes to dead-letter at its first attempt, saying
    why, instead of failing its whole claim batch or being retried until attempts run out;
    the good runs claimed with it run as usual."""
    good = [app.enqueue(basic.anoop, [i], delay=1.0) for i in range(5)]
    bad_due = app.enqueue(basic.anoop, [99], delay=1.0)
    bad_payload = app.enqueue(basic.anoop, [98], delay=1.0)
    k = app.keys
    r.hset(k.run(k.partition_of_run(bad_due), bad_due), "due", "tomorrow")
    r.hset(k.run(k.partition_of_run(bad_payload), bad_payload), "payload", b"\xc1not msgpack")
    ids = [*good, bad_due, bad_payload]
    burst(app, concurrency=16, claim_ahead_ms=5000)  # due in 1 s: claimed now, run at their time
    assert states(app, ids) == {"succeeded": 5, "dead": 2}
    for run_id, why in ((bad_due, "run record unreadable"), (bad_payload, "payload unreadable")):
        run = app.get_run(run_id)
        assert [a.outcome for a in run.attempts] == ["failed"], run.attempts
        assert why in (run.attempts[0].error or ""), run.attempts[0].error
    assert set(counts(r, app)) == set(good)  # the damaged ones never ran the task
