"""End-to-end: worker processes against real Redis and Valkey servers."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from duetime.client.runs import keyed_run_id
from duetime.embedded import EmbeddedServer
from tests.apps import basic
from tests.conftest import wait_for


def counts(r, app) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(basic.count_key()).items()}


def states(app, ids) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in ids:
        s = app.get_run(i).state
        out[s] = out.get(s, 0) + 1
    return out


def test_two_workers_race_over_2000_runs_each_runs_exactly_once(app, r, procs):
    ids = app.enqueue_many([(basic.noop, [i]) for i in range(1000)]
                           + [(basic.anoop, [i]) for i in range(1000)])
    assert len(set(ids)) == 2000
    procs.worker("--concurrency", "32")
    procs.worker("--concurrency", "32", "--claim-ahead", "0")  # claims only what is due
    wait_for(lambda: r.hlen(basic.count_key()) >= 2000, 60, what="2000 executions")
    wait_for(lambda: states(app, ids) == {"succeeded": 2000}, 30, what="2000 succeeded")
    c = counts(r, app)
    assert set(c) == set(ids)  # none lost
    assert max(c.values()) == 1  # none executed twice
    workers = {app.get_run(i).worker.rsplit(":", 1)[0] for i in ids[::50]}
    assert len(workers) == 2  # both workers took part


def test_concurrency_caps_runs_executing_at_once(app, r, procs):
    """Claims overlap (one travels while another batch starts): the cap must still hold."""
    ids = app.enqueue_many([(basic.overlapping, [0.05]) for _ in range(120)])
    procs.worker("--concurrency", "7")
    wait_for(lambda: states(app, ids) == {"succeeded": 120}, 60, what="120 succeeded")
    assert max(counts(r, app).values()) == 1
    assert int(r.get(f"{app.keys.namespace}:test:max_running")) == 7


def test_sigkill_mid_run_reruns_after_lease_expiry(app, r, procs):
    run_id = app.enqueue(basic.slow, [2.0])
    victim = procs.worker("--lease", "1s")
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.monotonic()
    procs.reaper("100ms")
    procs.worker("--lease", "1s")
    wait_for(lambda: app.get_run(run_id).state == "succeeded", 30, what="rerun to succeed")
    rerun_after = time.monotonic() - killed_at
    run = app.get_run(run_id)
    assert [a.outcome for a in run.attempts] == ["unknown", "succeeded"]
    assert run.attempts[0].error == "lease expired"
    assert run.attempts[0].worker != run.attempts[1].worker
    assert counts(r, app)[run_id] == 2
    assert rerun_after < 2.0 + 2.0 + 5.0  # lease + run time + generous slack on a shared box


def test_heartbeats_keep_a_long_run_owned(app, r, procs):
    run_id = app.enqueue(basic.aslow, [3.0])
    procs.reaper("100ms")
    procs.worker("--lease", "1s")
    procs.worker("--lease", "1s")
    wait_for(lambda: app.get_run(run_id).state == "succeeded", 30, what="long run to finish")
    run = app.get_run(run_id)
    assert [a.outcome for a in run.attempts] == ["succeeded"]
    assert counts(r, app)[run_id] == 1


def test_retry_with_backoff_then_dead_letter(app, r, procs):
    run_id = app.enqueue(basic.always_fails)
    procs.worker()
    wait_for(lambda: app.get_run(run_id).state == "dead", 20, what="dead letter")
    run = app.get_run(run_id)
    assert [a.outcome for a in run.attempts] == ["failed", "failed", "failed"]
    assert run.attempt == 3 == run.max_attempts
    assert "RuntimeError: boom" in run.error
    # backoff: the gap between attempts grows and stays within (base/2 .. cap]
    a = run.attempts
    gaps = [(a[i + 1].started - a[i].ended).total_seconds() for i in range(len(a) - 1)]
    assert 0.09 <= gaps[0] <= 0.6 and 0.19 <= gaps[1] <= 0.8, gaps
    assert r.zscore(app.keys.dead(app.keys.partition_of_run(run_id)), run_id) is not None


def test_fatal_goes_straight_to_dead(app, r, procs):
    run_id = app.enqueue(basic.fatal)
    procs.worker()
    wait_for(lambda: app.get_run(run_id).state == "dead", 20, what="dead letter")
    run = app.get_run(run_id)
    assert len(run.attempts) == 1 and run.attempt == 1
    assert "cannot ever work" in run.reason


def test_explicit_retry_delay(app, r, procs):
    run_id = app.enqueue(basic.retry_later, [0.5])
    procs.worker()
    wait_for(lambda: app.get_run(run_id).state == "succeeded", 20, what="retry to succeed")
    run = app.get_run(run_id)
    gap = (run.attempts[1].started - run.attempts[0].ended).total_seconds()
    assert 0.45 <= gap <= 1.5, gap


def test_non_idempotent_lease_expiry_goes_uncertain_and_is_not_rerun(app, r, procs):
    run_id = app.enqueue(basic.nonidem, [3.0])
    victim = procs.worker("--lease", "1s")
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    procs.reaper("100ms")
    procs.worker("--lease", "1s")
    wait_for(lambda: app.get_run(run_id).state == "uncertain", 15, what="uncertain")
    time.sleep(1.5)  # a second worker is up: it must not pick the run up again
    run = app.get_run(run_id)
    assert run.state == "uncertain"
    assert [a.outcome for a in run.attempts] == ["unknown"]
    assert counts(r, app)[run_id] == 1
    assert "not idempotent" in run.reason


@pytest.mark.parametrize("task", ["slow", "aslow"])
def test_sigterm_lets_a_run_finish_within_grace(app, r, procs, task):
    run_id = app.enqueue(task, [1.0])
    w = procs.worker("--grace", "10s")
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    w.send_signal(signal.SIGTERM)
    assert w.wait(20) == 0
    run = app.get_run(run_id)
    assert run.state == "succeeded" and run.attempt == 1


@pytest.mark.parametrize("task", ["slow", "aslow"])
def test_sigterm_releases_an_unfinished_run_without_burning_an_attempt(app, r, procs, task):
    run_id = app.enqueue(task, [4.0])
    w = procs.worker("--grace", "300ms")
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    w.send_signal(signal.SIGTERM)
    assert w.wait(20) == 0
    run = app.get_run(run_id)
    assert run.state == "scheduled"
    assert run.attempt == 0  # the interrupted attempt is not counted
    assert [a.outcome for a in run.attempts] == ["released"]
    procs.worker()
    wait_for(lambda: app.get_run(run_id).state == "succeeded", 20, what="released run to rerun")
    run = app.get_run(run_id)
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


def test_async_timeout_fails_the_attempt(app, r, procs):
    run_id = app.enqueue(basic.times_out)
    procs.worker()
    wait_for(lambda: app.get_run(run_id).state == "dead", 20, what="timeout -> dead")
    assert "exceeded its timeout of 0.3s" in app.get_run(run_id).error


def test_current_run_context(app, r, procs):
    run_id = app.enqueue(basic.context, key="order-42")
    procs.worker()
    wait_for(lambda: app.get_run(run_id).state == "succeeded", 20, what="context run")
    ctx = {k.decode(): v.decode() for k, v in
           r.hgetall(f"{app.keys.namespace}:test:ctx:{run_id}").items()}
    assert ctx["attempt"] == "1" and ctx["key"] == "order-42" and ctx["lost"] == "0"
    assert ctx["worker"] == app.get_run(run_id).worker
    assert ctx["scheduled"].startswith(str(app.get_run(run_id).due.date()))


def test_delayed_runs_are_never_started_early(app, r, procs):
    """Runs are claimed up to --claim-ahead before their due time and started at it: each
    task's own first instant is at or after its due time (ms, rounded up when enqueued)."""
    procs.worker()
    time.sleep(0.5)
    ids = app.enqueue_many([{"task": basic.stamp, "delay": 0.5 + i * 0.037} for i in range(30)])
    wait_for(lambda: r.hlen(basic.stamps_key()) >= 30, 20, what="30 delayed runs")
    stamps = {k.decode(): float(v) for k, v in r.hgetall(basic.stamps_key()).items()}
    late = [stamps[i] - app.get_run(i).due.timestamp() * 1000 for i in ids]
    assert min(late) >= 0, sorted(late)[:3]  # never early
    assert max(late) < 500, max(late)
    run = app.get_run(ids[0])
    assert run.started >= run.due


def test_lost_lease_cancels_an_async_run(app, r, procs):
    """Another owner takes the run (here: the reaper after a simulated stall, then a claim by
    someone else); the original worker's next heartbeat finds the lease lost and cancels."""
    from duetime.common import transitions as tr
    from duetime.common.scripts import Scripts

    run_id = app.enqueue(basic.sched_slow, [6.0])
    procs.worker("--lease", "1500ms")
    wait_for(lambda: r.exists(basic.started_key(run_id)), 15, what="run to start")
    k, p = app.keys, app.keys.partition_of_run(run_id)
    scripts = Scripts(r)
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
    wait_for(lambda: r.llen(basic.intervals_key()) == 1, 10, what="the original execution to stop")
    _, start, end = r.lrange(basic.intervals_key(), 0, -1)[0].decode().split("|")
    assert float(end) - float(start) < 4.0  # cancelled, not run to its 6 s end
    run = app.get_run(run_id)
    assert run.state == "running" and run.worker == "thief" and run.fence == 2
    assert [a.outcome for a in run.attempts] == ["unknown", "running"]
    assert not run.attempts[0].late  # the cancelled execution reported nothing


def test_worker_carries_on_after_a_redis_restart(namespace):
    """Redis restarts under a running worker (script cache and data gone): it reconnects,
    reloads the scripts on its new connections, resubscribes, and runs new work."""
    from duetime.embedded import EmbeddedServer
    from tests.conftest import Procs

    with EmbeddedServer("redis") as server:
        basic.app.configure(redis_url=server.url, namespace=namespace)
        procs = Procs(server.url, namespace)
        try:
            procs.worker()
            first = basic.app.enqueue(basic.noop)
            wait_for(lambda: basic.app.get_run(first).state == "succeeded", 20, what="first run")
            server.kill()
            time.sleep(0.5)
            server.start()
            basic.app.close()
            second = basic.app.enqueue(basic.anoop)
            wait_for(lambda: basic.app.get_run(second).state == "succeeded", 30,
                     what="a run after the restart")
        finally:
            procs.stop_all()
            basic.app.close()


def test_redis_refusing_writes_for_a_while_loses_and_duplicates_nothing(server, namespace):
    """Redis at maxmemory (OOM errors) for 1.6 s, shorter than the lease: the heartbeat, the
    outcome reports, the claims and the reaper are refused and must each try again. No loop may
    die from it (a dead heartbeat loop lets the lease lapse: the run would run twice; a dead
    report loop leaves successes unrecorded) and nothing may spin."""
    from tests.conftest import Procs

    own = EmbeddedServer(server.kind).start()  # its own server: maxmemory is server-wide
    try:
        basic.app.configure(redis_url=own.url, namespace=namespace)
        app = basic.app
        r = redis.Redis.from_url(own.url)
        procs = Procs(own.url, namespace)
        long_id = app.enqueue(basic.aslow, [4.0])  # heartbeats must go on past the window
        short_id = app.enqueue(basic.aslow, [1.0])  # ends, and reports, inside the window
        late_id = app.enqueue(basic.aslow, [0.1], delay=1.2)  # due inside the window
        procs.reaper("100ms")
        worker = procs.worker("--lease", "3s")
        wait_for(lambda: r.hlen(basic.count_key()) >= 2, 15, what="two runs to start")
        time.sleep(0.3)
        r.config_set("maxmemory", 1)  # noeviction: every write is refused with OOM
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.set(f"{namespace}:probe", 1)
        time.sleep(1.6)
        r.config_set("maxmemory", 0)
        ids = [long_id, short_id, late_id]
        wait_for(lambda: states(app, ids) == {"succeeded": 3}, 30, what="all three succeeded")
        assert worker.poll() is None  # still serving
        time.sleep(1.0)  # a lapsed lease would have been reaped and re-run by now
        assert counts(r, app) == {long_id: 1, short_id: 1, late_id: 1}
        for i in ids:
            assert [a.outcome for a in app.get_run(i).attempts] == ["succeeded"]
        worker.terminate()
        err = worker.communicate(timeout=30)[1].decode()
        procs.stop_all()
        refused = err.count("refused")
        assert 0 < refused < 100, err[-3000:]  # it said so, and did not spin
    finally:
        basic.app.close()
        own.stop()


def test_a_damaged_partition_key_does_not_stop_the_other_partitions(app, r, procs):
    """One partition's due set overwritten with a string (WRONGTYPE for every script that
    reads it): the worker says which key, leaves that partition alone for a while, and runs
    the other partitions' runs, including those claimed in the same pipeline."""
    k = app.keys
    bad = 3
    r.set(k.due(bad, "default"), "not a sorted set")
    worker = procs.worker("--concurrency", "8")
    wait_for(lambda: r.zcard(k.workers) >= 1, 15, what="worker to register")
    # keyed runs, keys chosen so that none lands in the damaged partition
    keys = [f"dmg-{i}" for i in range(260)
            if k.partition_of_run(keyed_run_id("anoop", f"dmg-{i}")) != bad][:200]
    ids = app.enqueue_many([{"task": basic.anoop, "args": [n], "key": key}
                            for n, key in enumerate(keys)])
    for _ in range(3):  # a (forged) wake notice sends the worker to the damaged key
        r.publish(k.wake_channel, f"{bad}|default|0")
        time.sleep(0.2)
    wait_for(lambda: states(app, ids) == {"succeeded": 200}, 30, what="200 succeeded")
    assert max(counts(r, app).values()) == 1
    assert worker.poll() is None
    worker.terminate()
    err = worker.communicate(timeout=30)[1].decode()
    lines = [ln for ln in err.splitlines() if "redis refused a call" in ln]
    assert lines and all(k.due(bad, "default") in ln and "WRONGTYPE" in ln for ln in lines)
    assert len(lines) < 10  # held for a while after each refusal, not retried in a loop


def test_damaged_run_records_are_dead_lettered_once_with_the_reason(app, r, procs):
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
    procs.worker("--concurrency", "16")
    ids = [*good, bad_due, bad_payload]
    wait_for(lambda: states(app, ids) == {"succeeded": 5, "dead": 2}, 30, what="5 ok, 2 dead")
    for run_id, why in ((bad_due, "run record unreadable"), (bad_payload, "payload unreadable")):
        run = app.get_run(run_id)
        assert [a.outcome for a in run.attempts] == ["failed"], run.attempts
        assert why in (run.attempts[0].error or ""), run.attempts[0].error
    assert set(counts(r, app)) == set(good)  # the damaged ones never ran the task
