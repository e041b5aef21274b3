"""The Lua transitions driven directly (no worker), to pin down fencing and late results."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.connection import server_time_ms
from duetime.common.models import to_ms
from duetime.common.scripts import Scripts
from duetime.common.wake import parse_worker_wake, worker_wake

import duetime
from tests import schedrec
from tests.apps import basic
from tests.conftest import wait_for

pytestmark = pytest.mark.scripts


@pytest.fixture
def lc(app, r):
    """A tiny driver: claim/complete/fail/reap one run by hand."""

    class Driver:
        scripts = Scripts(r)
        k = app.keys

        def claim(self, queue="default", worker="w", n=10, lease_ms=10_000, p=None, ahead_ms=0):
            out = []
            for part in ([p] if p is not None else range(self.k.partitions)):
                keys, args = tr.claim(self.k, part, queue, worker, n, lease_ms, ahead_ms)
                out += [(part, c) for c in tr.parse_claim(self.scripts.claim(keys=keys, args=args)).runs]
            return out

        def complete(self, p, c):
            keys, args = tr.complete(self.k, p, [(c.run_id, c.fence)])
            return self.scripts.complete(keys=keys, args=args)[0].decode()

        def fail(self, p, c, mode="error", delay_ms=0):
            keys, args = tr.fail(self.k, p, "default", c.run_id, c.fence, "oops", mode, delay_ms, 0.5)
            return self.scripts.fail(keys=keys, args=args)[0].decode()

        def reap(self, retention_ms=0):
            total = 0
            for p in range(self.k.partitions):
                keys, args = tr.reap(self.k, p, 100, 0.3, retention_ms)
                total += self.scripts.reap(keys=keys, args=args)[0]
            return total

        def expire(self, p, run_id):
            """Make the lease expired right now (instead of sleeping through it): the lease is
            the run's score in the leases zset."""
            r.zadd(self.k.leases(p), {run_id: 0})

    return Driver()


def test_claim_sets_lease_fence_and_attempt(app, r, lc):
    run_id = app.enqueue(basic.noop)
    [(p, c)] = lc.claim(worker="w1", lease_ms=5000)
    assert c.run_id == run_id and c.fence == 1 and c.attempt == 1
    # the lease is one entry: its score is the expiry, the run hash names holder and fence
    expiry = r.zscore(app.keys.leases(p), run_id)
    assert 0 < expiry - int(r.time()[0]) * 1000 <= 5000 + 1000
    assert r.hmget(app.keys.run(p, run_id), "worker", "fence") == [b"w1", b"1"]
    assert not r.keys(f"{app.keys.namespace}:*lease:*")  # no second copy of the lease
    assert lc.claim() == []  # nothing left to claim
    assert app.get_run(run_id).state == "running"


def test_stale_worker_cannot_complete_or_fail(app, r, lc):
    run_id = app.enqueue(basic.noop)
    [(p, old)] = lc.claim(worker="w1")
    lc.expire(p, run_id)
    assert lc.reap() == 1
    r.zadd(app.keys.retry(p, "default"), {run_id: 0})  # skip the backoff
    [(_, new)] = lc.claim(worker="w2")
    assert new.fence == 2
    assert lc.complete(p, old) == "stale"
    assert lc.fail(p, old) == "stale"
    run = app.get_run(run_id)
    assert run.state == "running" and run.fence == 2 and run.worker == "w2"
    assert run.attempts[0].late and run.attempts[0].late_outcome == "failed"
    assert lc.complete(p, new) == "succeeded"
    assert app.get_run(run_id).state == "succeeded"


def test_late_success_finishes_a_run_not_claimed_again(app, r, lc):
    run_id = app.enqueue(basic.noop)
    [(p, c)] = lc.claim()
    lc.expire(p, run_id)
    assert lc.reap() == 1
    assert app.get_run(run_id).state == "retrying"
    assert lc.complete(p, c) == "late_succeeded"
    run = app.get_run(run_id)
    assert run.state == "succeeded"
    assert r.zscore(app.keys.retry(p, "default"), run_id) is None  # the retry will not run
    assert lc.claim() == []


def test_late_success_resolves_uncertain(app, r, lc):
    run_id = app.enqueue(basic.nonidem, [0])
    [(p, c)] = lc.claim()
    lc.expire(p, run_id)
    lc.reap()
    assert app.get_run(run_id).state == "uncertain"
    assert lc.complete(p, c) == "late_succeeded"
    assert app.get_run(run_id).state == "succeeded"
    assert r.zscore(app.keys.uncertain(p), run_id) is None


def test_heartbeat_extends_only_the_current_fence(app, r, lc):
    scripts = Scripts(r)
    run_id = app.enqueue(basic.noop)
    [(p, c)] = lc.claim(worker="w1", lease_ms=1000)
    keys, args = tr.heartbeat(app.keys, p, 60_000, [(run_id, "w1:1"), (run_id, "w9:1")])
    assert scripts.heartbeat(keys=keys, args=args) == [1, 0]
    assert r.zscore(app.keys.leases(p), run_id) - int(r.time()[0]) * 1000 > 50_000
    # an expired lease of a run nobody re-claimed is revived by its holder
    r.zadd(app.keys.leases(p), {run_id: 0})
    keys, args = tr.heartbeat(app.keys, p, 60_000, [(run_id, "w1:1")])
    assert scripts.heartbeat(keys=keys, args=args) == [1]
    assert r.zscore(app.keys.leases(p), run_id) > 0
    assert scripts.heartbeat(keys=keys, args=args) == [1]
    # ... but not once the reaper has taken it
    lc.expire(p, run_id)
    lc.reap()
    assert scripts.heartbeat(keys=keys, args=args) == [0]


def test_reaper_dead_letters_when_attempts_are_exhausted(app, r, lc):
    run_id = app.enqueue(basic.fatal)  # retries=5 → 6 attempts; force the last one
    p = app.keys.partition_of_run(run_id)
    r.hset(app.keys.run(p, run_id), "max_attempts", 1)
    lc.claim()
    lc.expire(p, run_id)
    assert lc.reap() == 1
    run = app.get_run(run_id)
    assert run.state == "dead" and run.attempts[0].outcome == "unknown"


def test_claim_takes_due_runs_in_due_order_and_never_early(app, r, lc):
    late = app.enqueue(basic.noop, delay=60)
    first = app.enqueue(basic.noop, at=app_now(r) - _ms(5))
    second = app.enqueue(basic.noop, at=app_now(r) - _ms(1))
    claimed = [c.run_id for _, c in lc.claim(n=10)]
    assert set(claimed) == {first, second}
    assert late not in claimed
    p = app.keys.partition_of_run(late)
    keys, args = tr.claim(app.keys, p, "default", "w", 10, 1000)
    reply = tr.parse_claim(Scripts(r).claim(keys=keys, args=args))
    nxt, runs = reply.next_due_ms, reply.runs
    assert runs == [] and nxt == int(app.get_run(late).due.timestamp() * 1000)


def test_missed_starting_deadline(app, r, lc):
    run_id = app.enqueue(basic.noop)
    p = app.keys.partition_of_run(run_id)
    r.hset(app.keys.run(p, run_id), "deadline", 1)  # long past
    assert lc.claim() == []
    run = app.get_run(run_id)
    assert run.state == "missed" and run.attempts == []


def app_now(r):
    from datetime import UTC, datetime

    sec, usec = r.time()
    return datetime.fromtimestamp(sec + usec / 1e6, tz=UTC)


def _ms(n):
    from datetime import timedelta

    return timedelta(milliseconds=n)


def test_server_clock_decides_due_times(app, r):
    before = time.time()
    sec, usec = r.time()
    server_before = sec + usec / 1e6
    run_id = app.enqueue(basic.noop, delay=2.0)
    sec, usec = r.time()
    server_after = sec + usec / 1e6
    due = app.get_run(run_id).due.timestamp()
    # the server's time at the enqueue, plus the delay: between its clock read before and
    # after the call (a read after get_run, within 0.5 s, measured the machine's speed too);
    # ms resolution, so a millisecond either side
    assert server_before + 2.0 - 0.001 <= due <= server_after + 2.0 + 0.001, (
        server_before, due, server_after)
    assert due > before


def test_complete_acknowledges_a_batch_and_judges_each_fence(app, r, lc):
    ids = [app.enqueue(basic.noop, key=f"batch-{i}") for i in range(40)]
    claimed = lc.claim(n=100)
    assert {c.run_id for _, c in claimed} == set(ids)
    by_p: dict[int, list] = {}
    for p, c in claimed:
        by_p.setdefault(p, []).append(c)
    scripts = Scripts(r)
    for p, cs in by_p.items():
        items = [(c.run_id, c.fence) for c in cs] + [(cs[0].run_id, 99)]  # one stale fence
        keys, args = tr.complete(app.keys, p, items)
        res = [x.decode() for x in scripts.complete(keys=keys, args=args)]
        assert res == ["succeeded"] * len(cs) + ["stale"]
    for i in ids:
        run = app.get_run(i)
        assert run.state == "succeeded" and [a.outcome for a in run.attempts] == ["succeeded"]
    assert sum(r.zcard(app.keys.leases(p)) for p in range(app.keys.partitions)) == 0


def test_retention_sweep_deletes_old_finished_runs_only(app, r, lc):
    done_id = app.enqueue(basic.noop)
    waiting = app.enqueue(basic.noop, delay=60)
    [(p, c)] = lc.claim()
    assert lc.complete(p, c) == "succeeded"
    finished = int(r.hget(app.keys.run(p, done_id), "finished"))
    wait_for(lambda: server_time_ms(r) > finished + 10, 10,
             what="the server's clock past the 10 ms retention")
    lc.reap(retention_ms=10)
    with pytest.raises(duetime.RunNotFound):
        app.get_run(done_id)
    assert r.exists(app.keys.attempts(p, done_id)) == 0
    assert r.zscore(app.keys.done(p), done_id) is None
    assert app.get_run(waiting).state == "scheduled"


def test_running_attempt_is_shown_from_the_run_record(app, lc):
    run_id = app.enqueue(basic.noop)
    lc.claim(worker="w7")
    [a] = app.get_run(run_id).attempts
    assert a.outcome == "running" and a.worker == "w7" and a.number == 1 and a.ended is None


def test_first_lease_expiry_retries_at_once_repeated_ones_back_off(app, r, lc):
    run_id = app.enqueue(basic.slow, [0])  # backoff (0.1 s, 0.2 s)
    p = app.keys.partition_of_run(run_id)
    r.hset(app.keys.run(p, run_id), mapping={"backoff_base": 10_000, "backoff_max": 10_000})
    lc.claim()
    lc.expire(p, run_id)
    lc.reap()
    run = app.get_run(run_id)
    assert run.state == "retrying"
    first_delay = (run.retry_at - run.attempts[0].ended).total_seconds()
    assert first_delay == 0  # the lease itself was the wait
    [(_, c)] = lc.claim()
    assert c.fence == 2
    lc.expire(p, run_id)
    lc.reap()
    run = app.get_run(run_id)
    second_delay = (run.retry_at - run.attempts[1].ended).total_seconds()
    assert 5 <= second_delay <= 10  # a crash loop backs off (equal jitter on a 10 s base)


def test_a_cancel_request_outlives_a_dead_worker(app, r, lc):
    """Cancel asked while running, then the worker dies: the reaper cancels instead of
    retrying; a retrying run with a pending request is cancelled at its next claim."""
    run_id = app.enqueue(basic.noop)
    p = app.keys.partition_of_run(run_id)
    lc.claim()
    r.hset(app.keys.run(p, run_id), "cancel_requested", 1)
    lc.expire(p, run_id)
    assert lc.reap() == 1
    run = app.get_run(run_id)
    assert run.state == "cancelled" and run.attempts[0].outcome == "unknown"
    assert lc.claim() == []

    other = app.enqueue(basic.noop)
    q = app.keys.partition_of_run(other)
    [(_, c)] = lc.claim()
    assert lc.fail(q, c, mode="retry", delay_ms=0) == "retrying"
    r.hset(app.keys.run(q, other), "cancel_requested", 1)
    assert lc.claim() == []
    assert app.get_run(other).state == "cancelled"


def test_bulk_enqueue_over_several_round_trips_creates_each_run_once(app, r):
    """5,500 runs take three pipelines (sent by a thread while the next is built)."""
    from duetime.client.runs import PIPELINE_RUNS

    n = 5500
    assert n > 2 * PIPELINE_RUNS
    ids = app.enqueue_many([(basic.noop, [i]) for i in range(n)]
                           + [{"task": basic.noop, "key": f"k{i}"} for i in range(10)])
    assert len(set(ids)) == n + 10
    k = app.keys
    queued = sum(r.zcard(k.due(p, "default")) for p in range(k.partitions))
    assert queued == n + 10
    assert app.get_run(ids[-1]).state == "scheduled"
    assert [app.get_run(i).args for i in (ids[0], ids[n - 1])] == [[0], [n - 1]]
    # idempotency keys still find the first runs
    again = app.enqueue_many([{"task": basic.noop, "key": f"k{i}"} for i in range(10)])
    assert again == ids[n:]


def test_bulk_enqueue_resolves_every_item_s_task(app, r):
    """Task names made on the fly, mixed in one call: each item keeps its own task (tasks are
    resolved once per distinct object within a call)."""
    names = ["noop", "slow"]
    want = [names[(i // 2) % 2] for i in range(200)]
    ids = app.enqueue_many((name[:2] + name[2:], [i]) for i, name in enumerate(want))
    assert [app.get_run(run_id).task for run_id in ids] == want


def test_claim_ahead_takes_runs_due_soon_and_their_attempt_starts_at_the_due_time(app, r, lc):
    run_id = app.enqueue(basic.noop, delay=1.5)
    assert lc.claim() == [] and lc.claim(ahead_ms=100) == []  # due in 1.5 s
    [(p, c)] = lc.claim(ahead_ms=3000)
    run = app.get_run(run_id)
    assert c.run_id == run_id and run.state == "running"
    assert c.ready_ms == int(run.due.timestamp() * 1000)  # the worker waits for this
    assert run.started == run.due  # the attempt starts at its due time, not at the claim


def test_a_buffered_run_claimed_ahead_is_never_made_due_before_its_time(app, r, lc):
    """overlap buffer_one: B (due in 2 s) is claimed ahead while A runs and gets buffered; A
    finishing must requeue B at B's due time, not at 'now'."""
    from duetime.client.runs import EnqueueRequest

    spec = app.registry.resolve(basic.noop)
    sched = {"schedule": "nightly", "overlap": "buffer_one"}
    now = time.time()
    a_id, b_id = f"nightly@{int(now * 1000)}", f"nightly@{int(now * 1000) + 2000}"
    app.store.enqueue_many([
        EnqueueRequest(spec, run_id=a_id, extra=sched),
        EnqueueRequest(spec, run_id=b_id, delay=2.0, extra=sched),
    ])
    p = app.keys.partition_of_run(a_id)
    [(_, a)] = lc.claim(p=p)
    assert a.run_id == a_id
    assert lc.claim(p=p, ahead_ms=5000) == []  # B: buffered behind the running A
    assert r.hget(app.keys.sched(p, "nightly"), "buffered") == b_id.encode()
    assert lc.complete(p, a) == "succeeded"
    b_due = int(app.get_run(b_id).due.timestamp() * 1000)
    assert r.zscore(app.keys.due(p, "default"), b_id) == b_due


def test_times_fences_and_attempt_entries_are_stored_as_plain_integers(app, r, lc):
    """The scripts format numbers themselves (once per call, as integers); what `redis-cli`
    and the inspect code read must stay plain decimal integers, consistent with each other."""
    import re

    sec, usec = r.time()
    server_ms = sec * 1000 + usec // 1000
    ids = app.enqueue_many([{"task": basic.noop, "delay": d} for d in (5, 5, 0, 7, 0)])
    runs = {i: r.hgetall(app.keys.run(app.keys.partition_of_run(i), i)) for i in ids}
    digits = re.compile(rb"[1-9][0-9]*")
    # format 3 leaves `created` out of a run due at once (it is its `due`; docs/keys.md)
    created = {i: rec.get(b"created", rec[b"due"]) for i, rec in runs.items()}
    for i, rec in runs.items():
        assert digits.fullmatch(created[i]) and digits.fullmatch(rec[b"due"])
    # one bulk call, several delays: each run's due = the call's server time + its own delay
    dues = [int(runs[i][b"due"]) - int(created[i]) for i in ids]
    assert dues == [5000, 5000, 0, 7000, 0]
    assert abs(int(created[ids[2]]) - server_ms) < 5000

    claimed = lc.claim(worker="w1", lease_ms=4000)
    assert sorted(c.run_id for _, c in claimed) == sorted([ids[2], ids[4]])  # the due ones
    p, c = claimed[0]
    rec = r.hgetall(app.keys.run(p, c.run_id))
    for f in (b"fence", b"attempt", b"started"):
        assert digits.fullmatch(rec[f]), (f, rec[f])
    assert r.zscore(app.keys.leases(p), c.run_id) - int(rec[b"started"]) == 4000
    keys, args = tr.heartbeat(app.keys, p, 9000, [(c.run_id, "w1:1")])
    assert Scripts(r).heartbeat(keys=keys, args=args) == [1]
    rec = r.hgetall(app.keys.run(p, c.run_id))
    assert digits.fullmatch(rec[b"heartbeat"])
    assert r.zscore(app.keys.leases(p), c.run_id) - int(rec[b"heartbeat"]) == 9000

    assert lc.complete(p, c) == "succeeded"
    rec = r.hgetall(app.keys.run(p, c.run_id))
    assert digits.fullmatch(rec[b"finished"])
    assert r.zscore(app.keys.done(p), c.run_id) == int(rec[b"finished"])
    # the attempt that succeeded is inline (docs/keys.md): no attempts key, the run hash is it
    assert r.exists(app.keys.attempts(p, c.run_id)) == 0
    [a] = app.get_run(c.run_id).attempts
    assert (a.number, a.fence, a.worker, a.outcome) == (1, 1, "w1", "succeeded")
    assert (to_ms(a.started), to_ms(a.ended)) == (int(rec[b"started"]), int(rec[b"finished"]))


# -- errors name the script and line; the server's memory limit; damaged records -------------
def _line_of(script: str, text: str) -> int:
    lines = (Path(__file__).resolve().parents[2] / "lua" / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.scripts(memory="fakeredis reports a script error without the file and line")
def test_an_error_inside_a_script_names_its_file_and_line(app, r, url):
    """Direct calls, pipelines and the asyncio client: the message points at heartbeat.lua's
    own line, not at a line of the assembled source."""
    import asyncio

    from duetime.common.connection import async_client

    where = f"heartbeat.lua:{_line_of('heartbeat.lua', 'tonumber(ARGV[2])')}:"
    keys, args = tr.heartbeat(app.keys, 0, 1000, [])
    args[1] = "not-a-number"  # the lease length: arithmetic on nil inside the script
    with pytest.raises(redis.ResponseError, match=where) as direct:
        Scripts(r).heartbeat(keys=keys, args=args)
    assert "user_script" not in str(direct.value)
    pipe = r.pipeline(transaction=False)
    Scripts(r).heartbeat(keys=keys, args=args, client=pipe)
    [res] = pipe.execute(raise_on_error=False)
    assert where in str(res)

    async def from_asyncio() -> str:
        client = async_client(url)
        try:
            await Scripts(client).heartbeat(keys=keys, args=args)
        except redis.ResponseError as exc:
            return str(exc)
        finally:
            await client.aclose()
        return ""

    assert where in asyncio.run(from_asyncio())


@pytest.mark.scripts(memory="fakeredis reports a script error without the file and line")
def test_a_redis_error_inside_a_helper_names_lib_and_line(app, r):
    """WRONGTYPE raised by redis.call inside a _lib.lua helper (emit's XADD) is located there."""
    run_id = app.enqueue(basic.noop)
    p = app.keys.partition_of_run(run_id)
    r.set(app.keys.events(p), "damaged")  # the events stream replaced by a string
    keys, args = tr.cancel(app.keys, p, "default", run_id, "test")
    with pytest.raises(redis.ResponseError, match=r"WRONGTYPE.*@_lib\.lua:(\d+)") as err:
        Scripts(r).cancel(keys=keys, args=args)
    line = int(re.search(r"@_lib\.lua:(\d+)", str(err.value)).group(1))
    lib = (Path(__file__).resolve().parents[2] / "lua" / "_lib.lua").read_text().splitlines()
    assert "XADD" in lib[line - 1]


@pytest.fixture
def at_maxmemory(r):
    """The server refuses writes that may grow memory (maxmemory below what is used)."""
    old = r.config_get("maxmemory")["maxmemory"]
    try:
        yield lambda: r.config_set("maxmemory", 1)
    finally:
        r.config_set("maxmemory", old)


@pytest.mark.scripts(memory="fakeredis has no maxmemory (CONFIG SET) to refuse writes with")
def test_heartbeats_extend_leases_while_the_reaper_is_refused(app, r, lc, at_maxmemory):
    """At maxmemory a heartbeat still extends a lease (allow-oom), while reap.lua, claim.lua and
    enqueue.lua are refused as a whole before they write anything: the reaper cannot expire
    what heartbeats are able to keep alive."""
    run_id = app.enqueue(basic.noop)
    later = app.enqueue(basic.noop)
    [(p, c)] = lc.claim(worker="w1", n=1, p=app.keys.partition_of_run(run_id))
    lc.expire(p, run_id)  # expired: the next reap would take it
    at_maxmemory()
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        lc.reap()
    assert app.get_run(run_id).state == "running"
    assert r.zscore(app.keys.leases(p), run_id) == 0  # nothing changed, not even the index
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        lc.claim(p=app.keys.partition_of_run(later))
    with pytest.raises(duetime.DuetimeError, match="maxmemory") as refused:
        app.enqueue(basic.noop)  # a duetime error that says what to do
    assert refused.value.code == "OOM"
    keys, args = tr.heartbeat(app.keys, p, 60_000, [(run_id, "w1:1")])
    assert Scripts(r).heartbeat(keys=keys, args=args) == [1]
    assert r.zscore(app.keys.leases(p), run_id) > int(r.time()[0]) * 1000
    r.config_set("maxmemory", 0)
    assert lc.reap() == 0  # the lease was extended: nothing to reap
    assert lc.complete(p, c) == "succeeded"


def test_a_reaped_run_keeps_its_place_ahead_of_a_backlog(app, r, lc):
    """Recovery is not queued behind runs that became due after it: the retry is scored at
    the time the run first became claimable."""
    run_id = app.enqueue(basic.noop)
    p = app.keys.partition_of_run(run_id)
    [(_, c)] = lc.claim(p=p)
    due = int(r.hget(app.keys.run(p, run_id), "due"))
    backlog = app.enqueue_many([(basic.noop, [i]) for i in range(300)])
    lc.expire(p, run_id)
    assert lc.reap() == 1
    assert r.zscore(app.keys.retry(p, "default"), run_id) == due
    [(_, again)] = lc.claim(p=p, n=1)
    assert again.run_id == run_id and again.fence == 2
    assert len(backlog) == 300


def test_damaged_run_records_are_dead_lettered_with_a_reason_never_lost(app, r, lc):
    k = app.keys
    # an expired lease on a run whose retry policy was damaged by hand
    a = app.enqueue(basic.noop)
    pa = k.partition_of_run(a)
    lc.claim(p=pa)
    r.hset(k.run(pa, a), "max_attempts", "abc")
    lc.expire(pa, a)
    assert lc.reap() == 1
    run = app.get_run(a)
    assert run.state == "dead" and "damaged" in run.reason
    assert r.zscore(k.dead(pa), a) is not None and r.zscore(k.leases(pa), a) is None
    # a due run whose state was overwritten with something that is not a state
    b = app.enqueue(basic.noop)
    pb = k.partition_of_run(b)
    r.hset(k.run(pb, b), "state", "weekly")
    assert lc.claim(p=pb) == []
    run = app.get_run(b)
    assert run.state == "dead" and "weekly" in run.reason
    assert r.zscore(k.dead(pb), b) is not None
    # a leased run whose state vanished
    c = app.enqueue(basic.noop)
    pc = k.partition_of_run(c)
    lc.claim(p=pc)
    r.hdel(k.run(pc, c), "state")
    lc.expire(pc, c)
    lc.reap()
    assert app.get_run(c).state == "dead" and r.zscore(k.dead(pc), c) is not None


def test_a_call_sent_again_after_a_lost_reply_changes_nothing(app, r, lc):
    """redis-py sends a call again when a connection broke before its reply arrived; every
    transition must then answer as the first time and change nothing (no run reset, no
    second attempt entry, no misleading 'stale')."""
    scripts = Scripts(r)
    # enqueue: the same chunk twice, with a claim in between, leaves the running run alone
    rid = "a1b2c3d4e5f6a7b8c9d0"
    p = app.keys.partition_of_run(rid)
    keys, args = tr.enqueue(app.keys, p, "default", ["task", "noop", "queue", "default",
                                                      "max_attempts", 3],
                            [(rid, "", 0, ["payload", b"\x92\x90\x80"])])
    assert scripts.enqueue(keys=keys, args=args) == 1
    [(_, c)] = lc.claim(p=p)
    assert scripts.enqueue(keys=keys, args=args) == 0
    run = app.get_run(rid)
    assert run.state == "running" and run.fence == 1
    assert r.zscore(app.keys.due(p, "default"), rid) is None
    # complete: twice, one attempt entry, the same answer
    assert lc.complete(p, c) == "succeeded"
    assert lc.complete(p, c) == "succeeded"
    assert r.llen(app.keys.attempts(p, rid)) == 0  # inline: the run hash holds it
    assert [a.outcome for a in app.get_run(rid).attempts] == ["succeeded"]
    # fail: twice, the same state and retry time, one attempt entry
    other = app.enqueue(basic.always_fails)
    po = app.keys.partition_of_run(other)
    [(_, f)] = lc.claim(p=po)
    keys, args = tr.fail(app.keys, po, "default", other, f.fence, "boom", "error", 0, 0.5)
    first = scripts.fail(keys=keys, args=args)
    assert first[0] == b"retrying"
    assert scripts.fail(keys=keys, args=args) == first
    assert r.llen(app.keys.attempts(po, other)) == 1
    assert not app.get_run(other).attempts[0].late


@pytest.mark.scripts(memory="fakeredis has no maxmemory (CONFIG SET) to refuse writes with")
def test_a_bulk_enqueue_stopped_by_redis_says_which_runs_exist(app, r, at_maxmemory):
    """maxmemory is reached part way through a bulk enqueue: the error lists the ids that were
    created and those that were not (each script call is all or nothing), and it is right."""
    app.enqueue(basic.noop)  # the namespace exists
    used = r.info("memory")["used_memory"]
    r.config_set("maxmemory", used + 1_500_000)  # room for a few thousand runs, not 20,000
    try:
        with pytest.raises(duetime.EnqueueIncomplete) as stopped:
            app.enqueue_many([(basic.noop, [i]) for i in range(20_000)])
    finally:
        r.config_set("maxmemory", 0)
    err = stopped.value
    assert len(err.ids) == 20_000 and not err.unknown
    assert 0 < len(err.created) < 20_000
    assert len(err.created) + len(err.not_created) == 20_000
    assert "maxmemory" in str(err) and f"{len(err.created):,} of 20,000" in str(err)
    pipe = r.pipeline(transaction=False)
    for i in err.ids:
        pipe.exists(app.keys.run(app.keys.partition_of_run(i), i))
    exists = dict(zip(err.ids, pipe.execute(), strict=True))
    assert all(exists[i] for i in err.created) and not any(exists[i] for i in err.not_created)
    due = sum(r.zcard(app.keys.due(p, "default")) for p in range(app.keys.partitions))
    assert due == len(err.created) + 1  # nothing half-written


def test_the_scripts_publish_the_wake_message_common_wake_builds(app, r, lc):
    """lua/_lib.lua `wake_workers` and common/wake.py spell one message: what enqueue.lua,
    fail.lua (a retry) and reap.lua (an expired lease) publish is what `worker_wake` builds."""
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(app.keys.wake_channel)
    wait_for(lambda: r.pubsub_numsub(app.keys.wake_channel)[0][1] == 1, what="the subscription")
    got: list[bytes] = []

    def messages(n):
        def more():
            m = pubsub.get_message(timeout=0.1)
            if m is not None:
                got.append(m["data"])
            return len(got) >= n
        wait_for(more, what=f"{n} wake messages")
        return got

    try:
        run_id = app.enqueue(basic.noop)
        [(p, c)] = lc.claim()
        due = int(r.hget(app.keys.run(p, run_id), "due"))
        assert lc.fail(p, c) == "retrying"
        retry_at = int(r.zscore(app.keys.retry(p, "default"), run_id))
        r.zadd(app.keys.retry(p, "default"), {run_id: 0})  # skip the backoff
        [(_, again)] = lc.claim()
        r.delete(app.keys.retry(p, "default"))
        lc.expire(p, run_id)
        assert lc.reap() == 1
        reaped_at = int(r.zscore(app.keys.retry(p, "default"), run_id))
        assert messages(3) == [worker_wake(p, "default", t).encode()
                               for t in (due, retry_at, reaped_at)]
        assert [parse_worker_wake(m, app.keys.partitions) for m in got] == [
            (p, "default", float(t)) for t in (due, retry_at, reaped_at)]
    finally:
        pubsub.close()


def test_each_script_reply_reads_with_the_decoder_of_its_shape(app, r, lc):
    """Real replies of every shape: status (alone and with a value), counts (one and several),
    each; `REPLY` says which decoder a script's reply takes."""
    assert [tr.REPLY[n] for n in ("release", "fail", "reap", "schedule_delete", "complete")] == [
        "status", "status", "counts", "counts", "each"]
    scripts = Scripts(r)
    first, second = app.enqueue(basic.noop), app.enqueue(basic.noop, [1])
    claimed = dict((c.run_id, (p, c)) for p, c in lc.claim())
    p, c = claimed[first]
    keys, args = tr.release(app.keys, p, "default", c.run_id, c.fence)
    assert tr.status(scripts.release(keys=keys, args=args)) == b"released"
    keys, args = tr.release(app.keys, p, "default", c.run_id, c.fence)
    assert tr.status_detail(scripts.release(keys=keys, args=args)) == ("stale", "")
    p2, c2 = claimed[second]
    keys, args = tr.fail(app.keys, p2, "default", c2.run_id, c2.fence, "oops", "error", 0, 0.5)
    state, at = tr.status_detail(scripts.fail(keys=keys, args=args))
    assert state == "retrying" and int(at) == int(r.zscore(app.keys.retry(p2, "default"), second))
    keys, args = tr.reap(app.keys, p, 100, 0.3, 0)
    reaped, missed, deleted, nxt, *_ = tr.counts(scripts.reap(keys=keys, args=args))
    assert (reaped, missed, deleted) == (0, 0, 0) and isinstance(nxt, int)
    keys, args = tr.schedule_delete(app.keys, 0, "no-such-schedule")
    assert tr.counts(scripts.schedule_delete(keys=keys, args=args)) == [0]
    keys, args = tr.complete(app.keys, p2, [(c2.run_id, c2.fence)])
    assert scripts.complete(keys=keys, args=args) == [b"late_succeeded"]  # each: a word per run


def test_release_gives_a_run_back_at_its_due_time_without_burning_an_attempt(app, r, lc):
    """release.lua (graceful shutdown): an idempotent run goes back to its due set at its own
    due time with its attempt count undone; a non-idempotent one becomes uncertain; an old
    fence changes nothing."""
    run_id = app.enqueue(basic.noop)
    due_ms = int(app.get_run(run_id).due.timestamp() * 1000)
    [(p, c)] = lc.claim(worker="w1")

    def release(run: str, fence: int) -> str:
        keys, args = tr.release(app.keys, p, "default", run, fence)
        return lc.scripts.release(keys=keys, args=args).decode()

    assert release(run_id, c.fence + 1) == "stale"
    assert app.get_run(run_id).state == "running"
    assert release(run_id, c.fence) == "released"
    run = app.get_run(run_id)
    assert run.state == "scheduled" and run.attempt == 0
    assert [a.outcome for a in run.attempts] == ["released"]
    assert r.zscore(app.keys.due(p, "default"), run_id) == due_ms
    assert r.zscore(app.keys.leases(p), run_id) is None
    [(_, again)] = lc.claim(worker="w2")  # claimable again, as its first attempt
    assert again.run_id == run_id and again.attempt == 1 and again.fence == c.fence + 1

    other = app.enqueue(basic.nonidem, [0.0])
    [(q, d)] = lc.claim(worker="w1", p=app.keys.partition_of_run(other))
    keys, args = tr.release(app.keys, q, "default", other, d.fence)
    assert lc.scripts.release(keys=keys, args=args) == b"uncertain"
    assert app.get_run(other).state == "uncertain"
    assert r.zscore(app.keys.uncertain(q), other) is not None


def test_wait_counts_a_waiter_until_the_run_ends_and_then_answers_its_state(app, r, lc):
    """wait.lua: on a run still to end it counts the waiter (the ending script then notifies
    it on the run's notify list); on an ended one it answers the state; on none, 'missing'."""
    run_id = app.enqueue(basic.noop)
    p = app.keys.partition_of_run(run_id)

    def wait(run: str) -> str:
        keys, args = tr.wait(app.keys, p, run)
        return lc.scripts.wait(keys=keys, args=args).decode()

    assert wait(run_id) == "waiting"
    assert wait(run_id) == "waiting"
    assert r.hget(app.keys.run(p, run_id), "waited") == b"2"
    [(_, c)] = lc.claim(p=p)
    assert lc.complete(p, c) == "succeeded"
    assert r.llen(app.keys.notify(p, run_id)) == 2  # one element per waiter
    assert wait(run_id) == "succeeded"
    assert wait("no-such-run") == "missing"


def test_quarantine_sets_a_schedule_aside_unless_it_changed_meanwhile(app, r, lc):
    """schedule_quarantine.lua: compare-and-set on the version the evaluator read; the
    schedule leaves the evaluator's due set for the quarantine index, with its reason."""
    app.schedule("q1", duetime.Every(60), basic.noop)
    p = app.keys.partition_of_schedule("q1")
    version = schedrec.field(r, app.keys, "q1", "version")

    def quarantine(name: str, read: bytes | str) -> str:
        keys, args = tr.schedule_quarantine(app.keys, p, name, read, "unreadable trigger")
        return lc.scripts.schedule_quarantine(keys=keys, args=args).decode()

    assert quarantine("q1", b"not-" + version) == "changed"
    assert r.zscore(app.keys.sched_due(p), "q1") is not None
    assert quarantine("q1", version) == "quarantined"
    assert r.zscore(app.keys.sched_due(p), "q1") == float("inf")  # listed, never due
    assert r.zscore(app.keys.quarantine(p), "q1") is not None
    assert r.hget(app.keys.sched(p, "q1"), "quarantined") == b"unreadable trigger"
    assert quarantine("gone", "") == "missing"


def test_an_enqueue_is_fresh_only_for_random_ids_never_sent(app, r, monkeypatch):
    """enqueue.lua looks no run up in a call marked fresh (create-once without an EXISTS per
    run): only random ids sent for the first time may be marked; an id with a key, or one a
    pass already sent (its reply lost), is looked up."""
    from duetime.client import runs as client_runs

    marks: list[bool] = []
    real = client_runs.tr.enqueue

    def spy(*a, fresh=False, **kw):
        marks.append(fresh)
        return real(*a, fresh=fresh, **kw)

    monkeypatch.setattr(client_runs.tr, "enqueue", spy)
    store = app.store
    prepared = store._prepare_all([client_runs.EnqueueRequest(basic.noop.spec, [], {})])
    keyed = store._prepare_all([client_runs.EnqueueRequest(basic.noop.spec, [], {}, key="k1")])
    sent: set[str] = set()
    for pipe, _ in store._pipelines(store.ready(), prepared, sent=sent):
        assert pipe.execute() == [1]
    for pipe, _ in store._pipelines(store.ready(), prepared, sent=sent):  # a resend
        assert pipe.execute() == [0]  # looked up: the run exists, nothing is created again
    for pipe, _ in store._pipelines(store.ready(), keyed, sent=sent):
        pipe.execute()
    assert marks == [True, False, False]
    [rid] = [p.run_id for p in prepared]
    assert app.get_run(rid).state == "scheduled"


def test_a_late_report_about_an_inline_success_is_recorded_on_its_entry(app, r, lc):
    """The attempt that succeeded is inline in the run hash (no attempts key); a report about
    it that arrives later (sent again after a fault in transit, or a failure of the same
    fence) pushes its entry from the hash first and is recorded there, once."""
    scripts = Scripts(r)
    rid = app.enqueue(basic.noop)
    [(p, c)] = lc.claim()
    assert lc.complete(p, c) == "succeeded"
    assert r.exists(app.keys.attempts(p, rid)) == 0
    keys, args = tr.complete(app.keys, p, [(rid, c.fence, b"", "ConnectionError: reset")])
    assert scripts.complete(keys=keys, args=args) == [b"succeeded"]
    keys, args = tr.fail(app.keys, p, "default", rid, c.fence, "late boom", "error", 0, 0.5)
    assert scripts.fail(keys=keys, args=args)[0] == b"stale"
    assert r.llen(app.keys.attempts(p, rid)) == 1  # pushed once, then merged into
    run = app.get_run(rid)
    [a] = run.attempts
    assert (a.outcome, a.fence, a.worker, a.report_fault) == ("succeeded", 1, "w",
                                                              "ConnectionError: reset")
    assert a.late and a.late_outcome == "failed" and a.error == "late boom"
    assert (a.started, a.ended) == (run.started, run.finished)


def test_a_bare_run_is_marked_in_its_claim_and_its_success_reads_less_but_ends_it_the_same(app, r, lc):
    """claim.lua marks a run `bare` (no schedule, no batch, no limit slot taken) and the
    worker passes the mark back, so complete.lua does not look those fields up; a run with
    any of them is never marked, so its success still settles them (a slot freed here)."""
    k = app.keys
    plain = app.enqueue(basic.noop)
    batched, scheduled = app.enqueue(basic.noop), app.enqueue(basic.noop)
    r.hset(k.run(k.partition_of_run(batched), batched), "batch", "b-none")  # as hold.lua writes
    r.hset(k.run(k.partition_of_run(scheduled), scheduled), "schedule", "s-none")
    claimed = {c.run_id: (p, c) for p, c in lc.claim()}
    assert claimed[plain][1].bare
    assert not claimed[batched][1].bare and not claimed[scheduled][1].bare
    for run_id, (p, c) in claimed.items():
        keys, args = tr.complete(k, p, [(c.run_id, c.fence, b"", "", c.bare)])
        assert lc.scripts.complete(keys=keys, args=args) == [b"succeeded"]
        assert app.get_run(run_id).state == "succeeded"
        assert r.zscore(k.done(p), run_id) is not None and r.zscore(k.leases(p), run_id) is None
    # a run that took a concurrency slot is not bare: its success frees the slot
    app.set_limit("queue", "default", concurrency=k.partitions * 2)
    limited = app.enqueue(basic.noop)
    [(p, c)] = lc.claim()
    assert c.run_id == limited and not c.bare
    assert r.zcard(k.limrun(p, "queue:default")) == 1
    keys, args = tr.complete(k, p, [(c.run_id, c.fence, b"", "", c.bare)])
    assert lc.scripts.complete(keys=keys, args=args) == [b"succeeded"]
    assert r.zcard(k.limrun(p, "queue:default")) == 0


def test_a_bare_first_attempt_is_marked_so_and_a_bare_retry_still_clears_its_error(app, r, lc):
    """The worker marks a bare run's success '1' when its claim was attempt 1 (complete.lua
    then does not ask the attempt either) and 'b' for a later attempt, whose success still
    clears the earlier attempt's error from the run."""
    k = app.keys
    first, retried = app.enqueue(basic.noop), app.enqueue(basic.noop)
    claimed = {c.run_id: (p, c) for p, c in lc.claim()}
    p, c = claimed[retried]
    assert lc.fail(p, c, mode="retry", delay_ms=0) == "retrying"
    [(p2, c2)] = lc.claim()
    assert (c2.run_id, c2.attempt, c2.bare) == (retried, 2, True)
    assert r.hget(k.run(p2, retried), "error") is not None
    p1, c1 = claimed[first]
    # a bare first attempt with no result: the plain form, run id and fence alone
    keys, args = tr.complete(k, p1, [(c1.run_id, c1.fence, b"", "", c1.bare, c1.attempt)])
    assert args[3:] == ["1", c1.run_id, c1.fence]
    assert lc.scripts.complete(keys=keys, args=args) == [b"succeeded"]
    # a later attempt: the full form, marked 'b'
    keys, args = tr.complete(k, p2, [(c2.run_id, c2.fence, b"", "", c2.bare, c2.attempt)])
    assert args[3] == "" and args[4:] == [c2.run_id, c2.fence, b"", "", "b"]
    assert lc.scripts.complete(keys=keys, args=args) == [b"succeeded"]
    for run_id, attempt in ((first, 1), (retried, 2)):
        run = app.get_run(run_id)
        assert (run.state, run.attempt, run.error) == ("succeeded", attempt, None)
        assert r.hget(k.run(k.partition_of_run(run_id), run_id), "reason") is None
    # the earlier attempt's error stays in its own entry
    assert [a.outcome for a in app.get_run(retried).attempts] == ["failed", "succeeded"]


def test_a_call_with_one_result_or_fault_among_bare_first_attempts_sends_the_full_form(app, r, lc):
    """The plain form is only for a call whose every run is a bare first attempt without a
    result or a fault: one run with a result (or a fault) sends the call in the full form,
    and each run's own values arrive (the result stored, the fault on the attempt entry)."""
    k = app.keys
    for _ in range(2 * k.partitions + 1):  # so one partition has three of them
        app.enqueue(basic.noop)
    by_p: dict[int, list] = {}
    for part, c in lc.claim(n=100):
        by_p.setdefault(part, []).append(c)
    p, group = next((part, g) for part, g in by_p.items() if len(g) >= 3)
    plain, with_result, with_fault = group[:3]
    ids = [c.run_id for c in group[:3]]
    assert all(c.bare and c.attempt == 1 for c in group[:3])
    items = [(plain.run_id, plain.fence, b"", "", True, 1),
             (with_result.run_id, with_result.fence, b"\x05", "", True, 1),
             (with_fault.run_id, with_fault.fence, b"", "ConnectionError: reset", True, 1)]
    keys, args = tr.complete(k, p, items)
    assert args[3] == "" and len(args) == 4 + 5 * 3
    assert lc.scripts.complete(keys=keys, args=args) == [b"succeeded"] * 3
    assert r.hget(k.run(p, with_result.run_id), "result") == b"\x05"
    assert r.hget(k.run(p, plain.run_id), "result") is None
    [a] = app.get_run(with_fault.run_id).attempts
    assert a.outcome == "succeeded" and a.report_fault == "ConnectionError: reset"
    assert {app.get_run(i).state for i in ids} == {"succeeded"}


def test_batched_index_writes_go_into_skiplists_and_leave_no_trace(app, r, lc, server):
    """Each entry written into a listpack-encoded sorted set scans it (lua/_lib.lua
    zadd_batch): the due runs of an enqueue call, the leases of a claim and the finished runs
    of a complete call, 16 or more into one set, go into a skiplist instead, made so by an
    entry that the same call removes again. That entry is never left in a set, and a small
    write keeps the listpack."""
    from tests.conftest import MemoryServer

    k, parts = app.keys, range(app.keys.partitions)
    real = not isinstance(server, MemoryServer)  # the in-memory server has no encodings

    def check(key: str, batch: int) -> None:
        members = r.zrange(key, 0, -1)
        assert len(members) == batch and all(len(m) <= 64 for m in members)  # no seed left
        if real and batch >= 16:
            assert r.object("encoding", key) == b"skiplist", key

    ids = app.enqueue_many([(basic.noop, [i]) for i in range(40 * k.partitions)])
    due = {p: r.zcard(k.due(p, "default")) for p in parts}  # one enqueue.lua call each
    assert sum(due.values()) == len(ids) and sum(n >= 16 for n in due.values()) >= len(due) // 2
    for p in parts:
        check(k.due(p, "default"), due[p])
    claimed = lc.claim(n=1000)  # one claim.lua call per partition
    assert sorted(c.run_id for _, c in claimed) == sorted(ids)
    by_p: dict[int, list] = {}
    for p, c in claimed:
        by_p.setdefault(p, []).append(c)
    scripts = Scripts(r)
    for p, cs in by_p.items():
        check(k.leases(p), len(cs))
        assert {m.decode() for m in r.zrange(k.leases(p), 0, -1)} == {c.run_id for c in cs}
        keys, args = tr.complete(k, p, [(c.run_id, c.fence) for c in cs])
        assert {x.decode() for x in scripts.complete(keys=keys, args=args)} == {"succeeded"}
        check(k.done(p), len(cs))
        assert not r.exists(k.leases(p))
    one = app.enqueue(basic.noop)  # into a due set emptied (so deleted) by the claims
    [key] = [k.due(p, "default") for p in parts if r.zscore(k.due(p, "default"), one)]
    check(key, 1)
    if real:
        assert r.object("encoding", key) == b"listpack"
