"""Schedules end to end: scheduler processes, catch-up, overlap, lateness, backfill."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from duetime.common.connection import server_time_ms
from duetime.common.time.parse import from_ms as at_ms
from duetime.scheduler.evaluator import Evaluator

import duetime
from tests import schedrec
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.inproc import burst, serving, until


def run_ids_of(app, name: str) -> set[str]:
    """The ids of every run of a schedule, read from its partition's sets (not a key scan)."""
    k = app.keys
    p = k.partition_of_schedule(name)
    pipe = app.store.client.pipeline(transaction=False)
    for key in (k.due(p, "default"), k.retry(p, "default"), k.done(p), k.leases(p), k.dead(p),
                k.uncertain(p)):
        pipe.zrange(key, 0, -1)
    pipe.hget(k.sched(p, name), "buffered")
    *sets, buffered = pipe.execute()
    ids = {x.decode() for members in sets for x in members} | ({buffered.decode()} if buffered else set())
    return {i for i in ids if i.rsplit("@", 1)[0] == name}


def runs_of(app, name: str) -> list[duetime.Run]:
    """Every run of a schedule, read whole."""
    return [app.get_run(i) for i in sorted(run_ids_of(app, name))]


def occurrence(run: duetime.Run) -> int:
    return int(run.id.rsplit("@", 1)[1])


def test_upsert_is_idempotent_and_changes_bump_the_version(app):
    every = duetime.Every(timedelta(minutes=5))
    assert app.schedule("s1", every, basic.noop) == "created"
    assert app.schedule("s1", every, basic.noop) == "unchanged"
    assert app.get_schedule("s1").version == 1
    assert app.schedule("s1", duetime.Every(timedelta(minutes=10)), basic.noop) == "updated"
    info = app.get_schedule("s1")
    assert info.version == 2 and info.trigger == duetime.Every(timedelta(minutes=10))
    assert info.next_fire.timestamp() % 600 == 0


def test_bad_schedule_input(app):
    with pytest.raises(duetime.InvalidSchedule, match="catchup"):
        app.schedule("s", duetime.Every(timedelta(minutes=1)), basic.noop, catchup="Latest")
    with pytest.raises(duetime.InvalidSchedule, match="overlap"):
        app.schedule("s", duetime.Every(timedelta(minutes=1)), basic.noop, overlap="queue")
    with pytest.raises(duetime.InvalidInput):
        app.schedule("bad{name}", duetime.Every(timedelta(minutes=1)), basic.noop)
    with pytest.raises(duetime.UnknownTask):
        app.schedule("s", duetime.Every(timedelta(minutes=1)), "no.such.task")
    with pytest.raises(duetime.ScheduleNotFound):
        app.pause("never-registered")
    assert app.list_schedules() == []


def test_three_schedulers_200_schedules_every_occurrence_exactly_once(app, r, procs):
    every = duetime.Every(timedelta(seconds=1))
    for i in range(200):
        app.schedule(f"fleet-{i:03d}", every, basic.noop, catchup="all")
    schedulers = [procs.duetime("scheduler", "--lead", "500ms") for _ in range(3)]
    names = [f"fleet-{i:03d}" for i in range(200)]

    async def main() -> None:  # the worker in this process; the schedulers are processes
        async with serving(app, concurrency=64):
            await asyncio.sleep(3.0)  # schedules fire meanwhile
            schedulers[0].send_signal(signal.SIGKILL)  # one dies mid-way; the others take over
            schedulers[0].wait()
            # let every schedule reach 5 occurrences: asked in a thread, by run ids alone, so
            # that the asking never holds up the worker's loop (a loop held past the reply
            # timeout loses a claim's reply, and its runs wait out their lease: still running
            # at the end)
            await until(lambda: all(len(run_ids_of(app, n)) >= 5 for n in names), 40,
                        interval=0.5, what="five occurrences of every schedule", off_loop=True)

    asyncio.run(main())
    for s in schedulers[1:]:
        s.send_signal(signal.SIGTERM)
        s.wait(10)
    # what they created is run to its end (a burst: every outcome recorded when it returns;
    # runs created up to the lead ahead are within its claim-ahead)
    burst(app, concurrency=64, claim_ahead_ms=5000)
    unfinished = [(run.id, run.state, run.attempts) for n in names for run in runs_of(app, n)
                  if run.state != "succeeded"]
    assert not unfinished
    counts = {k.decode(): int(v) for k, v in r.hgetall(basic.count_key()).items()}
    total = 0
    for name in names:
        runs = runs_of(app, name)
        occ = sorted(occurrence(run) for run in runs)
        # no gap and no duplicate: consecutive seconds from the first to the last
        assert occ == list(range(occ[0], occ[-1] + 1000, 1000)), name
        assert len(occ) >= 5, (name, len(occ))
        assert all(counts.get(run.id) == 1 for run in runs), [
            (run.id, counts.get(run.id), app.get_run(run.id).attempts) for run in runs
            if counts.get(run.id) != 1]
        total += len(runs)
    assert len(counts) == total  # nothing executed that is not a run of these schedules


def test_partitions_are_split_between_schedulers_and_taken_over(app, url):
    a = Evaluator(url, app.keys, lease_ms=1000)
    b = Evaluator(url, app.keys, lease_ms=1000)
    a.tick()  # the first tick takes partitions: all 16, a is alone
    assert len(a.ownership.owned) == 16
    b.ownership.refresh()  # b is live: its share is 8, but a holds them all for now
    assert b.ownership.owned == set()
    a.ownership.refresh()  # a gives back the extras now that b is live
    b.ownership.refresh()
    assert len(a.ownership.owned) == 8 and len(b.ownership.owned) == 8
    assert not a.ownership.owned & b.ownership.owned
    # a dies: its partition leases expire and it is no longer live -- made so now (instead of
    # sleeping through the lease) by ageing its entries in the owners table
    r = app.store.client
    for field, value in r.hgetall(app.keys.owners).items():
        if field == f"s:{a.ownership.id}".encode():
            r.hset(app.keys.owners, field, 0)
        elif field.startswith(b"p:") and value.decode().startswith(f"{a.ownership.id}|"):
            r.hset(app.keys.owners, field, f"{a.ownership.id}|0")
    b.ownership.next_ms = 0  # and b's next renewal is due: advance its clock to it
    b.tick()  # renews, takes over
    assert len(b.ownership.owned) == 16
    assert [s.id for s in app_inspector(app).schedulers()] == [b.id]


def app_inspector(app):
    from duetime.ops.inspect import Inspector

    return Inspector(app.store.client, app.keys, app.redis_url)


def _downtime_setup(app, policy: str, **kw) -> None:
    app.schedule(f"down-{policy}", duetime.Every(timedelta(milliseconds=500)), basic.noop,
                 catchup=policy, **kw)


def test_downtime_catchup_policies(app, url):
    _downtime_setup(app, "all", max_catchup=3)
    _downtime_setup(app, "latest")
    _downtime_setup(app, "skip")
    # each schedule's own first occurrence: the three are registered one after the other, and
    # a 500 ms boundary between two registrations gives the later one a first occurrence (and
    # so one missed occurrence) less than the others
    first = {p: int(app.get_schedule(f"down-{p}").next_fire.timestamp() * 1000)
             for p in ("all", "latest", "skip")}
    time.sleep(3.2)  # no scheduler runs: about six occurrences pass
    ev = Evaluator(url, app.keys, lead_ms=0, miss_tolerance_ms=300)
    ev.tick()
    after_ms = server_time_ms(ev.client)
    runs = {p: runs_of(app, f"down-{p}") for p in ("all", "latest", "skip")}
    skip_info, all_info = app.get_schedule("down-skip"), app.get_schedule("down-all")

    def possible(policy: str, missed: int) -> bool:
        """At least the six that passed during the 3.2 s (less the one the tolerance may keep
        on time); at most the occurrences up to the tick (read on the server's clock: a
        machine that sleeps late only adds occurrences)."""
        return 5 <= missed <= (after_ms - first[policy]) // 500 + 1

    # skip: no run for a missed occurrence
    missed = skip_info.skipped_count
    assert possible("skip", missed), missed
    assert all(occurrence(run) >= ev_now_minus(ev, 300) for run in runs["skip"])
    # all: the newest 3 missed ones run, the rest recorded as skipped
    missed = all_info.skipped_count + 3
    assert possible("all", missed), missed
    missed_all = [run for run in runs["all"] if occurrence(run) < first["all"] + 500 * missed]
    assert sorted(occurrence(run) for run in missed_all) == [
        first["all"] + 500 * i for i in range(missed - 3, missed)]
    # latest: one run standing for all of them, carrying the count and the range
    coalesced = [run for run in runs["latest"] if run_field(app, run, "coalesced")]
    assert len(coalesced) == 1
    missed = int(run_field(app, coalesced[0], "coalesced"))
    assert possible("latest", missed), missed
    assert int(run_field(app, coalesced[0], "coalesced_from")) == first["latest"]
    # and the run record says so (app.get_run: Run.coalesced, Run.coalesced_from)
    got = app.get_run(coalesced[0].id)
    assert (got.coalesced, got.coalesced_from) == (missed, at_ms(first["latest"]))
    assert all(app.get_run(run.id).coalesced == 1 for run in runs["all"])
    assert occurrence(coalesced[0]) == first["latest"] + 500 * (missed - 1)


def ev_now_minus(ev: Evaluator, tol: int) -> int:

    return server_time_ms(ev.client) - tol - 1000


def run_field(app, run: duetime.Run, field: str) -> str | None:
    p = app.keys.partition_of_run(run.id)
    v = app.store.client.hget(app.keys.run(p, run.id), field)
    return v.decode() if v else None


def test_pause_and_resume(app, url):
    app.schedule("pz", duetime.Every(timedelta(milliseconds=500)), basic.noop, catchup="skip")
    app.pause("pz", note="vendor outage, INC-123")
    info = app.get_schedule("pz")
    assert info.paused and info.pause_note == "vendor outage, INC-123"
    ev = Evaluator(url, app.keys, lead_ms=0, miss_tolerance_ms=300)
    time.sleep(1.2)
    ev.tick()
    assert runs_of(app, "pz") == []  # paused: nothing materialised
    app.schedule("pz", duetime.Every(timedelta(milliseconds=500)), basic.noop, catchup="skip")
    assert app.get_schedule("pz").paused  # a redeploy does not undo the operator's pause
    app.resume("pz")
    ev.tick()
    info = app.get_schedule("pz")
    assert not info.paused and info.skipped_count >= 1  # missed while paused: policy skip


def test_changing_a_schedule_while_due_neither_loses_nor_doubles(app, url):
    app.schedule("chg", duetime.Every(timedelta(seconds=1)), basic.noop)
    ev = Evaluator(url, app.keys, lead_ms=1500, miss_tolerance_ms=5000)
    ev.tick()  # materialises the next occurrence(s) ahead of time
    before = {occurrence(run) for run in runs_of(app, "chg")}
    assert before
    app.schedule("chg", duetime.Every(timedelta(milliseconds=500)), basic.noop)
    info = app.get_schedule("chg")
    assert info.version == 2 and info.next_fire.timestamp() * 1000 > max(before)
    time.sleep(1.2)
    ev.tick()
    after = sorted(occurrence(run) for run in runs_of(app, "chg"))
    assert len(after) == len(set(after))
    new = [o for o in after if o > max(before)]
    assert new and all(o % 500 == 0 for o in new)
    assert set(before) <= set(after)


def test_backfill_a_past_day_hourly_gives_24_runs_once(app):
    app.schedule("hourly", duetime.Cron("0 * * * *", tz="Europe/Paris"), basic.noop)
    day = datetime(2026, 3, 29, tzinfo=UTC)  # Europe/Paris springs forward that day
    assert app.backfill("hourly", day, day + timedelta(hours=23, minutes=59)) == (24, 24)
    assert app.backfill("hourly", day, day + timedelta(hours=23, minutes=59)) == (24, 0)
    runs = runs_of(app, "hourly")
    assert len(runs) == 24 and all(run.state == "scheduled" for run in runs)
    assert {run.due for run in runs} == {day + timedelta(hours=h) for h in range(24)}


def test_trigger_now(app):
    app.schedule("manual", duetime.Every(timedelta(days=1)), basic.noop)
    run_id = app.trigger("manual")
    assert run_id.startswith("manual@m")
    burst(app)
    assert app.get_run(run_id).state == "succeeded"
    assert app.get_run(run_id).schedule == "manual"


def test_lateness_turns_unstarted_runs_into_missed_without_workers(app, procs):
    app.schedule("late", duetime.Every(timedelta(milliseconds=500)), basic.noop,
                 lateness=timedelta(milliseconds=300))
    procs.duetime("scheduler", "--lead", "200ms", "--reap-tick", "100ms")
    wait_for(lambda: app.get_schedule("late").missed_count >= 3, 15, what="missed runs")
    runs = runs_of(app, "late")
    missed = [run for run in runs if run.state == "missed"]
    assert missed and all(run.attempts == [] for run in missed)
    assert all("starting deadline" in run.reason for run in missed)


def _intervals(r, app):
    out = []
    for raw in r.lrange(basic.intervals_key(), 0, -1):
        run_id, start, end = raw.decode().split("|")
        out.append((float(start), float(end), run_id))
    return sorted(out)


@pytest.mark.parametrize("policy", ["skip", "buffer_one", "cancel_other", "allow"])
def test_overlap_policies_with_a_slow_task(app, r, procs, policy):
    app.schedule(f"ov-{policy}", duetime.Every(timedelta(seconds=1)), basic.sched_slow,
                 args=[2.3], overlap=policy)
    procs.duetime("scheduler", "--lead", "300ms")

    def overlapping(iv: list[tuple[float, float, str]]) -> bool:
        return any(b[0] < a[1] - 0.05 for a, b in zip(iv, iv[1:], strict=False))

    def buffered(iv: list[tuple[float, float, str]], runs: list[duetime.Run]) -> bool:
        """A run due while its predecessor still ran, started once that one ended."""
        by_id = {run.id: run for run in runs}
        return any(by_id[b[2]].due.timestamp() < a[1] <= b[0]
                   for a, b in zip(iv, iv[1:], strict=False) if b[2] in by_id)

    def shown() -> bool:
        """The policy's effect was seen. Waited for, not slept through: a scheduler process
        that starts late or stalls a second (catch-up then coalesces the occurrences it
        missed) made too few occurrences in a fixed 6.5 s for the counts below."""
        iv = _intervals(r, app)
        if len(iv) < 2:
            return False
        runs = runs_of(app, f"ov-{policy}")
        states = [run.state for run in runs]
        return {"allow": lambda: overlapping(iv),
                "skip": lambda: states.count("skipped") >= 2,
                "buffer_one": lambda: states.count("skipped") >= 1 and buffered(iv, runs),
                "cancel_other": lambda: "cancelled" in states}[policy]()

    async def main() -> None:  # the worker in this process; the scheduler is a process
        async with serving(app, concurrency=8, lease_ms=900):
            await until(shown, 60, interval=0.2, what=f"the {policy} policy's effect")

    asyncio.run(main())
    runs = runs_of(app, f"ov-{policy}")
    states = [run.state for run in runs]
    iv = _intervals(r, app)
    if policy == "allow":
        assert overlapping(iv)
        assert "skipped" not in states and "cancelled" not in states
    elif policy == "skip":
        assert not overlapping(iv) and states.count("skipped") >= 2
        assert all("previous run still running" in run.reason for run in runs if run.state == "skipped")
    elif policy == "buffer_one":
        assert not overlapping(iv) and states.count("skipped") >= 1
        # a buffered run: due while its predecessor still ran, started once that one ended
        # (how soon after is measured by bench/schedules.py, not asserted here)
        assert buffered(iv, runs), iv
    else:  # cancel_other
        assert "cancelled" in states
        cancelled = [run for run in runs if run.state == "cancelled"]
        assert all(run.attempts[-1].outcome == "cancelled" for run in cancelled)


def test_a_silent_scheduler_s_partitions_are_taken_as_its_leases_expire(app, url):
    """Leases are renewed every third of their TTL; a survivor also comes back exactly when
    another scheduler would lapse, so it takes the partitions over right at their expiry
    instead of up to a third of the TTL later -- with one script call per renewal."""
    a = Evaluator(url, app.keys, lease_ms=3000)
    b = Evaluator(url, app.keys, lease_ms=3000)
    a.tick()
    b.ownership.refresh()
    a.ownership.refresh()  # gives back half
    b.ownership.refresh()
    assert len(a.ownership.owned) == 8 and len(b.ownership.owned) == 8
    # a goes silent (as if SIGKILLed): it renews nothing from now; its leases' expiry
    expiries = {int(v.decode().split("|")[1]) for f, v in app.store.client.hgetall(
        app.keys.owners).items() if f.startswith(b"p:") and v.decode().startswith(f"{a.ownership.id}|")}
    [a_expiry] = expiries
    calls, planned = 0, []
    while len(b.ownership.owned) < 16 and calls < 10:
        # b's loop: sleep until the time its last call said to come back, then step
        time.sleep(max(0.0, (b.ownership.next_ms - b.ownership.now_ms()) / 1000))
        planned.append(b.ownership.next_ms)
        owned_before = len(b.ownership.owned)
        b.step()
        calls += 1
        if len(b.ownership.owned) < 16:
            assert len(b.ownership.owned) == owned_before == 8  # nothing taken before the lapse
    assert len(b.ownership.owned) == 16
    # a's leases lapse 3 s after its last renewal (expired from the next ms on); b had
    # planned its call right then, from the script's reply. Not later: a plan by b's own
    # renewals alone comes back up to a second after the lapse. (Earlier only when b's sleep
    # before a renewal overran the lapse, as a loaded machine's can: that renewal took over.)
    assert planned[-1] == a_expiry + 1 or planned[-1] < a_expiry, (planned, a_expiry)
    assert calls <= 5  # renewals a second apart, then the takeover: not a call per step


def test_a_damaged_schedule_is_quarantined_and_the_others_keep_firing(app, procs):
    """A schedule hash edited by hand (a trigger kind nobody wrote, a cursor that is not a
    number) is set aside with its reason; every other schedule keeps firing; registering the
    damaged one again brings it back."""
    every = duetime.Every(timedelta(seconds=1))
    for name in ("good", "bad-kind", "bad-cursor"):
        app.schedule(name, every, basic.noop)
    r, k = app.store.client, app.keys
    schedrec.edit(r, k, "bad-kind", t_kind="weekly")
    schedrec.edit(r, k, "bad-cursor", next_ms="abc")
    procs.duetime("scheduler", "--tick", "100ms")
    wait_for(lambda: len(runs_of(app, "good")) >= 3, 20, what="the good schedule to keep firing")
    for name in ("bad-kind", "bad-cursor"):
        wait_for(lambda n=name: app.get_schedule(n).quarantined, 10, what=f"{name} quarantined")
        assert not runs_of(app, name)
        p = k.partition_of_schedule(name)
        # never due again (listed at +inf) until registered again
        assert r.zscore(k.quarantine(p), name) is not None
        assert r.zscore(k.sched_due(p), name) == float("inf")
    assert "weekly" in app.get_schedule("bad-kind").quarantined
    assert app.get_schedule("bad-kind").problem  # listings mark it instead of failing
    assert "abc" in app.get_schedule("bad-cursor").quarantined
    assert {s.name for s in app.list_schedules()} == {"good", "bad-kind", "bad-cursor"}
    from tests.integration.opkit import as_json, cli

    doctor = as_json(cli(app.redis_url, k.namespace, "doctor", "--json"))
    [finding] = [f for f in doctor["findings"] if f["check"] == "schedules"]
    assert finding["level"] == "warn" and "bad-kind" in finding["message"]
    # the fix: register it again (same definition): back in, fires
    assert app.schedule("bad-cursor", every, basic.noop) == "updated"
    assert app.get_schedule("bad-cursor").quarantined is None
    wait_for(lambda: runs_of(app, "bad-cursor"), 20, what="the repaired schedule to fire")
    assert procs.procs[-1].poll() is None  # the scheduler kept serving throughout


def test_a_scheduler_whose_evaluator_dies_exits_non_zero(url, namespace):
    """A bug that kills a part of the scheduler process stops the process (so a supervisor
    restarts it) instead of leaving one that looks alive and evaluates nothing."""
    import subprocess
    import sys

    code = (
        "from duetime.scheduler import evaluator, service\n"
        "from duetime.common.keys import Keyspace\n"
        "def broken(self): raise RuntimeError('a bug in the evaluator')\n"
        "evaluator.Evaluator.step = broken\n"
        f"service.run_scheduler({url!r}, Keyspace({namespace!r}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert p.returncode == 1
    err = p.stderr.decode() + p.stdout.decode()
    assert "a bug in the evaluator" in err and "exiting so it is restarted" in err
