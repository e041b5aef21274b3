"""Schedules written by the version before the packed schedule record keep working after the
upgrade: the scheduler reads their old layout (one hash of named fields per schedule, an index
by creation) as it is, each occurrence gets one run on time, and the next upsert of the same
definition converts a record in place without moving its version or its cursor.

The fixture is what that version wrote (tests/fixtures/make_schedules_before_packed.py, run
with its code): a namespace whose schedules were registered and never evaluated, one paused,
one quarantined, one with a calendar, one with every guardrail. Its times are shifted so the
cursors fall ~3 s in the past: the schedulers were upgraded while the namespace was due.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

import pytest
from duetime.common.connection import server_time_ms
from duetime.common.time.parse import from_ms

import duetime
from tests import schedrec
from tests.apps import basic
from tests.conftest import wait_for

FIXTURE = Path(__file__).parents[1] / "fixtures" / "schedules_before_packed.json"
# the fields and indexes whose values are times (ms)
TIME_FIELDS = {"next_ms", "last_ms", "created", "updated", "evaluated", "paused_at",
               "quarantined_at", "start_ms", "end_ms"}
BEHIND_MS = 3000
EVERY_SECOND = ("catchup-all", "latest", "calendared")


def load_before(app) -> tuple[int, int]:
    """Write the fixture into the test's namespace, its times shifted by whole seconds so
    the cursors are ~BEHIND_MS in the past. → (shift ms, the fixture's own now ms)."""
    data = json.loads(FIXTURE.read_text())
    r, k = app.store.client, app.keys
    assert data["partitions"] == k.partitions
    shift = (server_time_ms(r) - BEHIND_MS - data["now_ms"]) // 1000 * 1000
    old, new = data["namespace"] + ":", k.namespace + ":"
    for key, item in data["keys"].items():
        name = new + key[len(old):]
        if item["type"] == "hash":
            fields = {}
            for f, v in item["value"].items():
                raw = base64.b64decode(v)
                if f in TIME_FIELDS and raw:
                    raw = str(int(raw) + shift).encode()
                fields[f] = raw
            r.hset(name, mapping=fields)
        elif item["type"] == "zset":
            r.zadd(name, {m: s + shift for m, s in item["value"]})
        elif item["type"] == "set":
            r.sadd(name, *item["value"])
    return shift, data["now_ms"]


def run_ids(app, name: str) -> set[str]:
    k = app.keys
    p = k.partition_of_schedule(name)
    return {x.decode() for x in app.store.client.zrange(k.due(p, "default"), 0, -1)
            if x.decode().startswith(name + "@")}


def occurrences(ids: set[str]) -> list[int]:
    return sorted(int(i.rsplit("@", 1)[1]) for i in ids)


def definitions(app, shift: int, was: int) -> dict[str, dict]:
    """The fixture's definitions (as its generator registered them), times shifted."""
    every = duetime.Every(timedelta(seconds=1))
    return {
        "catchup-all": dict(trigger=every, task=basic.noop, catchup="all"),
        "latest": dict(trigger=every, task=basic.noop),
        "paused": dict(trigger=every, task=basic.noop),
        "quarantined": dict(trigger=every, task=basic.noop),
        "calendared": dict(trigger=every, task=basic.noop, calendar="open"),
        "guarded": dict(trigger=every, task=basic.noop, pause_after_failures=2, max_runs=3,
                        start=from_ms(was + shift - 60_000), end=from_ms(was + shift + 3_600_000)),
        "yearly": dict(trigger=duetime.Cron("0 0 1 1 *"), task=basic.noop, args=[1],
                       kwargs={"k": "v"}),
    }


@pytest.mark.scripts  # on Redis and on Valkey
def test_schedules_of_the_old_layout_fire_on_time_once_and_convert_in_place(app, procs):
    r, k = app.store.client, app.keys
    shift, was = load_before(app)
    # its bounds moved with the clock: the hash that version computes of them (the same code)
    d = definitions(app, shift, was)["guarded"]
    p = k.partition_of_schedule("guarded")
    r.hset(k.sched(p, "guarded"), "def_hash", app.schedule_def(
        "guarded", d.pop("trigger"), d.pop("task"), **d).def_hash())
    cursor = int(schedrec.field(r, k, "catchup-all", "next_ms"))
    assert not r.hexists(k.scheds(k.partition_of_schedule("catchup-all")), "catchup-all")
    # the readers take the old layout as it is
    assert {s.name for s in app.list_schedules()} == set(definitions(app, shift, was))
    assert app.get_schedule("paused").paused
    assert app.get_schedule("quarantined").quarantined == "damaged by a test"
    assert app.get_schedule("guarded").guardrails["max_runs"] == 3

    procs.duetime("scheduler", "--tick", "100ms")
    # every occurrence from the old cursor on has one run: the missed ones caught up (all),
    # the later ones created ahead of their instant, each due at its occurrence
    want = [cursor + 1000 * i for i in range(BEHIND_MS // 1000 + 3)]
    wait_for(lambda: set(want) <= set(occurrences(run_ids(app, "catchup-all"))), 30,
             what="catchup-all's occurrences")
    occ = occurrences(run_ids(app, "catchup-all"))
    assert occ[0] == cursor and occ == list(range(cursor, occ[-1] + 1, 1000))  # none lost
    runs = [app.get_run(f"catchup-all@{o}") for o in occ]
    up = min(run.created for run in runs)  # the upgraded scheduler's first evaluation
    for o, run in zip(occ, runs, strict=True):
        assert int(run.due.timestamp() * 1000) == o  # due at its occurrence
        if run.due > up + timedelta(seconds=1):
            assert run.created <= run.due  # made ahead of it, not late
    # catch-up "latest": one run for the missed ones, then one per occurrence
    wait_for(lambda: len(run_ids(app, "latest")) >= 3, 30, what="latest's runs")
    latest = occurrences(run_ids(app, "latest"))
    assert latest == list(range(latest[0], latest[-1] + 1, 1000)) and latest[0] > cursor
    # the calendar's runs carry their data interval
    wait_for(lambda: len(run_ids(app, "calendared")) >= 2, 30, what="calendared's runs")
    # the guardrails: three runs (max_runs), then the schedule ended
    wait_for(lambda: app.get_schedule("guarded").guardrails["ended"] == "max_runs", 30,
             what="guarded to end after max_runs")
    assert len(run_ids(app, "guarded")) == 3
    # paused and quarantined: nothing until resumed / registered again
    assert not run_ids(app, "paused") and not run_ids(app, "quarantined")
    assert app.get_schedule("quarantined").quarantined

    # the same definitions registered again (a deploy): converted in place, version kept
    defs = definitions(app, shift, was)
    before = {n: app.get_schedule(n) for n in defs}
    for name, d in defs.items():
        status = app.schedule(name, d.pop("trigger"), d.pop("task"), d.pop("args", ()),
                              d.pop("kwargs", None), **d)
        assert status == ("updated" if name == "quarantined" else "unchanged"), name
        p = k.partition_of_schedule(name)
        assert r.hexists(k.scheds(p), name), name
        assert not r.hexists(k.sched(p, name), "version"), name  # the old fields are gone
        assert r.zscore(k.schedules(p), name) is None, name  # and its old index entry
        after = app.get_schedule(name)
        if name != "quarantined":
            assert after.version == before[name].version, name
            assert after.next_fire == before[name].next_fire or name in EVERY_SECOND, name
            assert after.created == before[name].created, name
    assert app.get_schedule("paused").paused  # a paused one stays paused
    assert app.get_schedule("guarded").guardrails["ended"] == "max_runs"
    assert {s.name for s in app.list_schedules()} == set(defs)

    # firing goes on across the conversion: no occurrence lost, none run twice
    upto = occurrences(run_ids(app, "catchup-all"))[-1]
    wait_for(lambda: occurrences(run_ids(app, "catchup-all"))[-1] >= upto + 3000, 30,
             what="catchup-all to fire after the conversion")
    occ = occurrences(run_ids(app, "catchup-all"))
    assert occ == list(range(cursor, occ[-1] + 1, 1000))
    assert len(run_ids(app, "guarded")) == 3
    app.resume("paused")
    wait_for(lambda: run_ids(app, "paused"), 30, what="the resumed schedule to fire")
    wait_for(lambda: run_ids(app, "quarantined"), 30, what="the re-registered one to fire")
    assert procs.procs[-1].poll() is None


@pytest.mark.scripts  # on Redis and on Valkey; no process: the in-memory backend too
def test_migrate_converts_the_old_layout_in_place_after_a_dry_run(app):
    from tests.integration.opkit import cli, ok

    r, k = app.store.client, app.keys
    load_before(app)
    before = {s.name: s for s in app.list_schedules()}
    assert len(before) == 7
    out = ok(cli(app.redis_url, k.namespace, "schedule", "migrate", "--dry-run"))
    assert "7 schedule(s) in the old layout: would convert 6, left 1 quarantined" in out
    assert not any(r.hexists(k.scheds(k.partition_of_schedule(n)), n) for n in before)
    out = ok(cli(app.redis_url, k.namespace, "schedule", "migrate"))
    assert "7 schedule(s) in the old layout: converted 6, left 1 quarantined" in out
    after = {s.name: s for s in app.list_schedules()}
    assert set(after) == set(before)
    for name, was in before.items():
        p = k.partition_of_schedule(name)
        now = after[name]
        if name == "quarantined":  # left for the registration that fixes it
            assert now == was and r.hexists(k.sched(p, name), "version")
            continue
        assert r.hexists(k.scheds(p), name) and not r.hexists(k.sched(p, name), "version")
        assert r.zscore(k.schedules(p), name) is None
        # the same schedule: definition, version, cursor, pause, guardrails
        assert now == was, name
        score = r.zscore(k.sched_due(p), name)
        assert score == (float("inf") if was.paused else int(was.next_fire.timestamp() * 1000))
    out = ok(cli(app.redis_url, k.namespace, "schedule", "migrate"))
    assert "1 schedule(s) in the old layout: converted 0, left 1 quarantined" in out


def test_a_packed_schedule_dropped_from_its_due_index_is_put_back_by_its_next_registration(app):
    """A scheduler of the previous version, meeting a packed record during a rolling upgrade,
    takes it for an orphan and removes it from the due set: the next registration of the same
    definition (a deploy) puts it back, version and cursor kept."""
    r, k = app.store.client, app.keys
    every = duetime.Every(timedelta(minutes=5))
    assert app.schedule("dropped", every, basic.noop) == "created"
    p = k.partition_of_schedule("dropped")
    score = r.zscore(k.sched_due(p), "dropped")
    r.zrem(k.sched_due(p), "dropped")  # what that scheduler's quarantine.lua does
    assert app.schedule("dropped", every, basic.noop) == "unchanged"
    assert r.zscore(k.sched_due(p), "dropped") == score
    assert app.get_schedule("dropped").version == 1
