"""Damaged keys (hand-edited or hostile state): one damaged key or member affects only itself.

Each test damages one key the way an operator's redis-cli (or another client) could, then
drives the real scripts, reaper, evaluator and readers against it, and checks that the damaged
run or schedule is set aside with a reason naming the key while everything else goes on: no
exception escapes a loop, no run is left in no index, no listing fails for the namespace.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.connection import ensure_meta, server_time_ms
from duetime.common.scripts import Scripts
from duetime.common.time.parse import MAX_MS
from duetime.scheduler.evaluator import Evaluator
from duetime.scheduler.gauges import Gauges
from duetime.scheduler.reaper import Reaper

import duetime
from duetime.ops.doctor import run_checks
from duetime.ops.inspect import Inspector
from tests import schedrec
from tests.apps import basic
from tests.integration.opkit import cli


class Kit:
    """Enqueue, claim, fail and reap through the real scripts, and read a run's indexes."""

    def __init__(self, app, url: str) -> None:
        self.app, self.k, self.url = app, app.keys, url
        self.r = app.store.ready()
        self.scripts = Scripts(self.r)

    def enqueue_in(self, p: int, n: int = 1) -> list[str]:
        """n runs of `noop` whose ids live in partition p."""
        ids: list[str] = []
        while len(ids) < n:
            for rid in self.app.enqueue_many([(basic.noop, [])] * 16):
                if self.k.partition_of_run(rid) == p and len(ids) < n:
                    ids.append(rid)
                else:
                    self.r.delete(self.k.run(self.k.partition_of_run(rid), rid))
                    self.r.zrem(self.k.due(self.k.partition_of_run(rid), "default"), rid)
        return ids

    def claim(self, p: int, lease_ms: int = 60_000):
        keys, args = tr.claim(self.k, p, "default", "w-test", 1000, lease_ms)
        return tr.parse_claim(self.scripts.claim(keys=keys, args=args)).runs

    def fail(self, p: int, c, mode: str = "error") -> str:
        keys, args = tr.fail(self.k, p, "default", c.run_id, c.fence, "boom", mode, 0, 0.5)
        return self.scripts.fail(keys=keys, args=args)[0].decode()

    def state(self, run_id: str) -> str | None:
        v = self.r.hget(self.k.run(self.k.partition_of_run(run_id), run_id), "state")
        return v.decode() if v else None

    def field(self, run_id: str, name: str) -> str:
        v = self.r.hget(self.k.run(self.k.partition_of_run(run_id), run_id), name)
        return v.decode() if v else ""

    def indexes(self, run_id: str) -> set[str]:
        p, k = self.k.partition_of_run(run_id), self.k
        named = {"due": k.due(p, "default"), "retry": k.retry(p, "default"), "leases": k.leases(p),
                 "dead": k.dead(p), "uncertain": k.uncertain(p), "done": k.done(p)}
        return {n for n, key in named.items()
                if self.r.type(key) == b"zset" and self.r.zscore(key, run_id) is not None}

    def events_about(self, p: int, text: str) -> list[dict]:
        out = []
        for _, e in self.r.xrange(self.k.events(p)):
            d = {a.decode(): b.decode(errors="replace") for a, b in e.items()}
            if text in d.get("detail", ""):
                out.append(d)
        return out


@pytest.fixture
def kit(app, url):
    return Kit(app, url)


def reaper(kit: Kit) -> Reaper:
    rp = Reaper(kit.url, kit.k, retention_ms=0)
    rp._swept_ms = server_time_ms(kit.r)  # no retention sweep: only what is due
    return rp


# -- +-inf scores -------------------------------------------------------------------------
@pytest.mark.parametrize("index", ["leases", "deadlines"])
@pytest.mark.parametrize("score", [math.inf, -math.inf])
def test_an_infinite_lease_or_deadline_score_does_not_stop_the_reaper(kit, index, score):
    p_bad, p_ok = 0, 1
    [victim] = kit.enqueue_in(p_bad)
    [c_bad] = kit.claim(p_bad)
    kit.r.zadd(getattr(kit.k, index)(p_bad), {victim: score})
    [rid] = kit.enqueue_in(p_ok)
    [c] = kit.claim(p_ok)
    kit.r.zadd(kit.k.leases(p_ok), {rid: 0})  # its worker died: the lease expired
    rp = reaper(kit)
    try:
        rp._read_heads()
        assert rp.reap_once() >= 1
    finally:
        rp.close()
    assert kit.state(rid) == "retrying" and "retry" in kit.indexes(rid)
    # the infinite score was repaired (a finite lease again, or the run's own deadline),
    # and the events say which key held it
    s = kit.r.zscore(getattr(kit.k, index)(p_bad), victim)
    assert s is None or math.isfinite(s)
    assert kit.events_about(p_bad, getattr(kit.k, index)(p_bad))
    assert c_bad.run_id == victim and kit.state(victim) == "running"


def test_minus_inf_in_sched_due_does_not_stop_the_evaluator(app, kit, url):
    app.schedule("inf-s", duetime.Every(timedelta(seconds=1)), basic.noop, catchup="skip")
    p = kit.k.partition_of_schedule("inf-s")
    kit.r.zadd(kit.k.sched_due(p), {"inf-s": -math.inf})
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        assert ev.tick() >= 1
    finally:
        ev.client.close()
    assert math.isfinite(kit.r.zscore(kit.k.sched_due(p), "inf-s"))


def test_an_infinite_due_score_does_not_break_top_or_the_gauges(app, kit, url):
    [rid] = kit.enqueue_in(0)
    kit.r.zadd(kit.k.due(0, "default"), {rid: math.inf})
    insp = Inspector(kit.r, kit.k, url)
    ov = insp.overview(activity=True)
    assert ov.queues["default"].scheduled_later >= 1
    assert kit.k.due(0, "default") in insp.damaged
    g = Gauges(url, kit.k)
    g.update()  # raised OverflowError (int(inf)) before


def test_a_lateness_of_1e400_is_quarantined_and_writes_no_infinite_deadline(app, kit, url):
    app.schedule("late", duetime.Every(timedelta(seconds=1)), basic.noop, lateness="10s")
    p = kit.k.partition_of_schedule("late")
    schedrec.edit(kit.r, kit.k, "late", lateness_ms="1e400")
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        ev.tick()
    finally:
        ev.client.close()
    assert kit.r.zscore(kit.k.quarantine(p), "late") is not None
    assert b"lateness_ms" in kit.r.hget(kit.k.sched(p, "late"), "quarantined")
    assert all(math.isfinite(s) for _, s in kit.r.zrange(kit.k.deadlines(p), 0, -1, withscores=True))


# -- keys of the wrong type ----------------------------------------------------------------
def test_a_wrong_type_leases_key_stops_recovery_of_its_partition_only(kit, url):
    p_bad, p_ok = 2, 3
    kit.r.set(kit.k.leases(p_bad), "garbage")
    [rid] = kit.enqueue_in(p_ok)
    kit.claim(p_ok)
    kit.r.zadd(kit.k.leases(p_ok), {rid: 0})
    rp = reaper(kit)
    try:
        rp._read_heads()  # the whole pipeline failed before
        rp._swept_ms = 0  # a sweep: every partition's reap.lua, the damaged one included
        assert rp.reap_once() == 1
    finally:
        rp.close()
    assert kit.state(rid) == "retrying"
    assert kit.r.get(kit.k.leases(p_bad)) == b"garbage"  # refused, left as found


def test_listings_and_doctor_read_past_a_wrong_type_leases_key_and_name_it(app, kit, url,
                                                                            namespace):
    [rid] = kit.enqueue_in(4)
    kit.r.set(kit.k.leases(5), "garbage")
    insp = Inspector(kit.r, kit.k, url)
    assert rid in [s.id for s in insp.list_runs().runs]
    assert insp.leases() == []
    insp.overview(activity=True)
    assert kit.k.leases(5) in insp.damaged
    findings = run_checks(kit.r, kit.k, url)
    assert any(f.check == "damaged key" and kit.k.leases(5) in f.message for f in findings)
    for args in (["runs", "list"], ["leases"], ["top", "--once"], ["doctor"], ["keys"]):
        res = cli(url, namespace, *args)
        assert res.exit_code == 0, (args, res.output)
    assert kit.k.leases(5) in cli(url, namespace, "doctor").output


def test_a_wrong_type_run_key_under_a_lease_is_dead_lettered_naming_the_key(kit):
    p = 6
    bad, good = kit.enqueue_in(p, 2)
    kit.claim(p)
    run_key = kit.k.run(p, bad)
    kit.r.delete(run_key)
    kit.r.rpush(run_key, "not", "a", "hash")
    kit.r.zadd(kit.k.leases(p), {bad: 0, good: 0})
    rp = reaper(kit)
    try:
        rp.reap_once()
    finally:
        rp.close()
    assert kit.r.zscore(kit.k.dead(p), bad) is not None
    assert kit.events_about(p, "not a hash"), kit.r.xrange(kit.k.events(p))[-3:]
    assert any(run_key in e["detail"] for e in kit.events_about(p, "not a hash"))
    assert kit.state(good) == "retrying"  # the other run of the batch was recovered
    assert kit.r.lrange(run_key, 0, -1) == [b"not", b"a", b"hash"]  # left as found
    listed = {s.id: s for s in Inspector(kit.r, kit.k, kit.url).list_runs(state="dead").runs}
    assert run_key in (listed[bad].reason or "")


def test_a_wrong_type_attempts_list_dead_letters_the_run_naming_the_key(kit):
    p = 7
    rid, other = kit.enqueue_in(p, 2)
    claimed = {c.run_id: c for c in kit.claim(p)}
    kit.r.set(kit.k.attempts(p, rid), "garbage")
    assert kit.fail(p, claimed[rid]) == "dead"
    assert kit.indexes(rid) == {"dead"}
    assert kit.k.attempts(p, rid) in kit.field(rid, "reason")
    assert kit.fail(p, claimed[other]) == "retrying"
    # the reaper's path: an attempts key damaged under an expired lease
    [c] = kit.claim(p, lease_ms=60_000) or [None]
    if c is None:  # the retry waits its backoff: make it due now
        kit.r.zadd(kit.k.retry(p, "default"), {other: 0})
        [c] = kit.claim(p)
    kit.r.set(kit.k.attempts(p, other), "garbage")
    kit.r.zadd(kit.k.leases(p), {other: 0})
    rp = reaper(kit)
    try:
        rp.reap_once()
    finally:
        rp.close()
    assert kit.indexes(other) == {"dead"} and kit.k.attempts(p, other) in kit.field(other, "reason")


@pytest.mark.parametrize("field,value", [("backoff_base", "nan"), ("backoff_max", "inf"),
                                         ("max_attempts", "nan"), ("attempt", "1e400")])
def test_a_non_finite_number_in_a_run_record_dead_letters_it_in_an_index(kit, field, value):
    p = 8
    [rid] = kit.enqueue_in(p)
    [c] = kit.claim(p)
    kit.r.hset(kit.k.run(p, rid), field, value)
    assert kit.fail(p, c) == "dead"
    assert kit.indexes(rid) == {"dead"} and "damaged" in kit.field(rid, "reason")


def test_a_wrong_type_due_set_refuses_the_enqueue_before_writing_a_run(app, kit):
    for p in range(kit.k.partitions):
        kit.r.set(kit.k.due(p, "default"), "garbage")
    with pytest.raises(redis.ResponseError, match="DAMAGED"):
        app.enqueue_many([(basic.noop, [])])
    assert not [k for k in kit.r.scan_iter(f"{kit.k.namespace}:*run:*")]


@pytest.mark.scripts(memory="fakeredis's pcall hands Lua a wrong-type error as userdata, not "
                           "the string run_fields names the key with")
def test_a_wrong_type_run_key_behind_a_wrong_type_leases_key_waits_for_the_repair(kit):
    """The state the damage fuzz once made (seed 141405): a run key of the wrong type waiting
    in a due set, then its partition's leases key of the wrong type too. The claim refuses the
    partition naming the leases key and writes nothing (the damaged run is neither claimed nor
    half dead-lettered); once the leases key is repaired the next claim dead-letters the run,
    naming its key, and claims the other."""
    p = 11
    bad, good = kit.enqueue_in(p, 2)
    kit.r.delete(kit.k.run(p, bad))
    kit.r.set(kit.k.run(p, bad), "garbage")
    kit.r.set(kit.k.leases(p), "garbage")
    with pytest.raises(redis.ResponseError, match="DAMAGED key " + kit.k.leases(p)):
        kit.claim(p)
    assert kit.r.zscore(kit.k.dead(p), bad) is None and kit.r.get(kit.k.run(p, bad)) == b"garbage"
    assert kit.state(good) == "scheduled" and kit.indexes(good) == {"due"}
    kit.r.delete(kit.k.leases(p))  # the repair (doctor names the key)
    assert [c.run_id for c in kit.claim(p)] == [good]
    assert kit.r.zscore(kit.k.dead(p), bad) is not None
    assert kit.events_about(p, kit.k.run(p, bad)), "the dead event names the run key"

# -- schedules ------------------------------------------------------------------------------
def _same_partition_names(kit, n: int) -> list[str]:
    by: dict[int, list[str]] = {}
    i = 0
    while True:
        name = f"sch{i}"
        by.setdefault(kit.k.partition_of_schedule(name), []).append(name)
        if len(by[kit.k.partition_of_schedule(name)]) == n:
            return by[kit.k.partition_of_schedule(name)]
        i += 1


def test_a_wrong_type_schedule_key_stops_only_that_schedule(app, kit, url):
    bad, good = _same_partition_names(kit, 2)
    other = "elsewhere"
    for name in (bad, good, other):
        app.schedule(name, duetime.Every(timedelta(seconds=1)), basic.noop, catchup="skip")
    p = kit.k.partition_of_schedule(bad)
    kit.r.delete(kit.k.sched(p, bad))
    kit.r.set(kit.k.sched(p, bad), "garbage")
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        ev.tick()
    finally:
        ev.client.close()
    made = {rid.decode().split("@")[0] for q in range(kit.k.partitions)
            for rid in kit.r.zrange(kit.k.due(q, "default"), 0, -1)}
    assert {good, other} <= made and bad not in made
    assert kit.r.zscore(kit.k.quarantine(p), bad) is not None
    assert kit.events_about(p, kit.k.sched(p, bad))


def _commands(r: redis.Redis) -> int:
    return sum(v["calls"] for k, v in r.info("commandstats").items())


def test_a_due_entry_whose_schedule_was_deleted_is_removed_without_spinning(app, kit, url):
    p = kit.k.partition_of_schedule("ghost")
    kit.r.zadd(kit.k.sched_due(p), {"ghost": server_time_ms(kit.r) - 1000})
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        ev.tick()
        assert kit.r.zscore(kit.k.sched_due(p), "ghost") is None
        # a partition whose due schedules cannot be moved on (here: paused by hand while
        # still in the due set) is set aside for a few seconds, not evaluated in a loop
        app.schedule("stuck", duetime.Every(timedelta(seconds=1)), basic.noop)
        q = kit.k.partition_of_schedule("stuck")
        kit.r.hset(kit.k.sched(q, "stuck"), "paused", "1")
        ev.tick()
        before = _commands(kit.r)
        for _ in range(200):
            ev.step()
        assert _commands(kit.r) - before < 200  # before: ~4 commands a step, every step
    finally:
        ev.client.close()


@pytest.mark.parametrize("field,value", [
    ("queue", "a b"), ("task", ""), ("catchup", "sometimes"), ("overlap", "never"),
    ("paused", "yes"), ("miss_tolerance_ms", "-5"), ("payload", "\xff\x00"),
    ("t.interval_us", "1"), ("max_catchup", "0"), ("jitter_ms", "nan")])
def test_a_damaged_schedule_field_is_quarantined_naming_it(app, kit, url, field, value):
    app.schedule("fld", duetime.Every(timedelta(seconds=1)), basic.noop)
    p = kit.k.partition_of_schedule("fld")
    schedrec.edit(kit.r, kit.k, "fld", **{field: value})
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        ev.tick()
    finally:
        ev.client.close()
    assert kit.r.zscore(kit.k.quarantine(p), "fld") is not None, field
    assert field.encode() in kit.r.hget(kit.k.sched(p, "fld"), "quarantined")
    assert not [r for r in kit.r.zrange(kit.k.due(p, "default"), 0, -1) if r.startswith(b"fld@")]


# -- values read back: meta and limits --------------------------------------------------------
def test_a_damaged_partition_count_is_refused_with_a_reason(app, kit, url, namespace):
    from duetime.common.errors import DamagedState

    kit.r.hset(kit.k.meta, "partitions", "abc")
    with pytest.raises(DamagedState, match="partitions"):
        ensure_meta(kit.r, kit.k, url)
    res = cli(url, namespace, "runs", "list")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert kit.k.meta in res.output and "partitions" in res.output


@pytest.mark.parametrize("raw", ["[]", "{", '{"concurrency": "x"}', '{"rate": 1e400}'])
def test_a_damaged_limit_is_refused_with_a_reason(app, kit, url, namespace, raw):
    from duetime.common.errors import DamagedState

    kit.r.hset(kit.k.limit_config, "queue:bogus", raw)
    with pytest.raises(DamagedState, match="queue:bogus"):
        app.limits()
    res = cli(url, namespace, "limits", "list")
    assert res.exit_code == 1 and "Traceback" not in res.output and "queue:bogus" in res.output


# -- claim.lua -------------------------------------------------------------------------------------
def test_a_wrong_type_leases_key_leaves_no_run_running_without_a_lease(kit):
    p = 9
    [rid] = kit.enqueue_in(p)
    kit.r.set(kit.k.leases(p), "garbage")
    with pytest.raises(redis.ResponseError):
        kit.claim(p)
    assert kit.state(rid) == "scheduled" and kit.indexes(rid) == {"due"}


@pytest.mark.parametrize("index", ["done", "deadlines", "events", "dead"])
def test_a_wrong_type_rare_path_key_refuses_only_the_claim_that_would_write_it(kit, index):
    """The keys only a rare path of claim.lua writes (a run finished unstarted or
    dead-lettered) are checked when a candidate takes that path, not on every claim: plain
    runs are claimed past the damage; a run that needs the key stays due, untouched, and the
    claim that meets it first is refused naming the key."""
    p = 11
    [plain] = kit.enqueue_in(p)
    key = getattr(kit.k, index)(p)
    kit.r.delete(key)
    kit.r.set(key, "garbage")
    # the plain run is claimed as if nothing were damaged
    assert [c.run_id for c in kit.claim(p)] == [plain]
    # a record in no known state must be dead-lettered: that writes the dead set and events
    [bad] = kit.enqueue_in(p)
    kit.r.hset(kit.k.run(p, bad), "state", "bogus")
    with pytest.raises(redis.ResponseError, match="DAMAGED key " + key):
        kit.claim(p)
    assert kit.field(bad, "state") == "bogus" and "due" in kit.indexes(bad)
    # repaired, the next claim dead-letters it
    kit.r.delete(key)
    assert kit.claim(p) == []
    assert kit.state(bad) == "dead"


def test_a_wrong_type_run_key_in_a_due_set_blocks_only_itself(kit):
    p = 10
    bad, good = kit.enqueue_in(p, 2)
    kit.r.delete(kit.k.run(p, bad))
    kit.r.set(kit.k.run(p, bad), "garbage")
    claimed = [c.run_id for c in kit.claim(p)]
    assert good in claimed
    assert kit.r.zscore(kit.k.dead(p), bad) is not None


def test_schedule_listings_and_doctor_read_past_a_wrong_type_schedule_key(app, kit, url,
                                                                          namespace):
    for name in ("sl-bad", "sl-good"):
        app.schedule(name, duetime.Every(timedelta(seconds=5)), basic.noop)
    p = kit.k.partition_of_schedule("sl-bad")
    kit.r.delete(kit.k.sched(p, "sl-bad"))
    kit.r.set(kit.k.sched(p, "sl-bad"), "garbage")
    for args in (["schedule", "list"], ["schedule", "lint"], ["doctor"]):
        res = cli(url, namespace, *args)
        assert res.exit_code == 0, (args, res.output)
    assert "sl-good" in cli(url, namespace, "schedule", "list").output


def test_registering_a_schedule_again_replaces_its_key_of_the_wrong_type(app, kit, url):
    app.schedule("again", duetime.Every(timedelta(seconds=1)), basic.noop)
    p = kit.k.partition_of_schedule("again")
    kit.r.delete(kit.k.sched(p, "again"))
    kit.r.set(kit.k.sched(p, "again"), "garbage")
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        ev.tick()
        assert kit.r.zscore(kit.k.quarantine(p), "again") is not None
        app.schedule("again", duetime.Every(timedelta(seconds=1)), basic.noop)  # the fix
        assert kit.r.zscore(kit.k.quarantine(p), "again") is None
        assert ev.tick() >= 1
    finally:
        ev.client.close()


def test_a_trigger_field_damaged_after_a_first_evaluation_is_quarantined(app, kit, url):
    """The evaluator caches parsed triggers; an edit by hand bumps no version."""
    app.schedule("cached", duetime.Every(timedelta(seconds=1)), basic.noop)
    p = kit.k.partition_of_schedule("cached")
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        assert ev.tick() >= 1
        schedrec.edit(kit.r, kit.k, "cached", t_kind="weekly")
        kit.r.zadd(kit.k.sched_due(p), {"cached": 0})  # due again now
        ev.tick()
    finally:
        ev.client.close()
    assert kit.r.zscore(kit.k.quarantine(p), "cached") is not None


@pytest.mark.scripts
@pytest.mark.parametrize("cursor", ["99999999999999999999", str(MAX_MS + 1), "-1"])
def test_a_cursor_past_any_instant_is_quarantined_naming_it(app, kit, url, cursor):
    """A next_ms no schedule could have written (past 9999-12-31, where Lua's numbers are not
    even exact above 2**53, or before 1970): planned from, it moved the schedule's due entry
    to that score, where it waited for good, neither fired nor reported. Quarantined now,
    naming the field, while a schedule beside it goes on."""
    app.schedule("far", duetime.Every(timedelta(seconds=1)), basic.noop)
    app.schedule("near", duetime.Every(timedelta(seconds=1)), basic.noop)
    p = kit.k.partition_of_schedule("far")
    schedrec.edit(kit.r, kit.k, "far", next_ms=cursor)
    ev = Evaluator(url, kit.k, lead_ms=2000)
    try:
        assert ev.tick() >= 1  # "near" made its runs
    finally:
        ev.client.close()
    assert kit.r.zscore(kit.k.quarantine(p), "far") is not None, schedrec.record(kit.r, kit.k, "far")
    assert b"next_ms" in kit.r.hget(kit.k.sched(p, "far"), "quarantined")
    assert kit.r.zscore(kit.k.sched_due(p), "far") in (None, math.inf)
    assert not [r for r in kit.r.zrange(kit.k.due(p, "default"), 0, -1) if r.startswith(b"far@")]
    assert app.get_schedule("near").materialized_count >= 1 and not app.get_schedule("near").quarantined
