"""Retention by state under a namespace of many finished runs (bench/retention.py measures
the sweep's cost at 10k and 1,000,000): what each state keeps and deletes, per-queue and
per-task overrides, and that runs examined once are not read again.

Time is controlled: runs are written in bulk by a Lua script with their `finished` time (and
index score) set in the past; the sweep is called directly. Nothing sleeps."""

from __future__ import annotations

import pytest
from duetime.common.retention import DEAD_MS
from duetime.common.tasks import TaskSpec
from duetime.scheduler.reaper import Reaper

from bench.retention import bulk_finished, sweep
from tests.integration.opkit import as_json, cli, ok

H = 3600 * 1000
D = 24 * H


def _exists(app, ids: list[str]) -> list[bool]:
    k, r = app.keys, app.store.client
    pipe = r.pipeline(transaction=False)
    for i in ids:
        pipe.exists(k.run(k.partition_of_run(i), i))
    return [bool(x) for x in pipe.execute()]


def _all(app, ids):
    return all(_exists(app, ids))


def _none(app, ids):
    return not any(_exists(app, ids))


@pytest.mark.scripts(memory="bulk-writes 50,000 runs: on the real servers only")
def test_retention_per_state_with_overrides_in_a_large_namespace(app, url, namespace):
    r, k = app.store.client, app.keys
    w = {}  # name -> ids
    # the bulk of the namespace: kept finished runs older than the shortest retention
    w["filler_dead"] = bulk_finished(r, k, 20_000, state="dead", age_ms=2 * D)
    w["filler_uncertain"] = bulk_finished(r, k, 20_000, state="uncertain", age_ms=400 * D)
    w["filler_new"] = bulk_finished(r, k, 10_000, state="succeeded", age_ms=2 * H)
    for state in ("succeeded", "cancelled", "skipped", "missed"):
        w[f"{state}_old"] = bulk_finished(r, k, 300, state=state, age_ms=25 * H)
        w[f"{state}_young"] = bulk_finished(r, k, 300, state=state, age_ms=23 * H)
    w["dead_young"] = bulk_finished(r, k, 300, state="dead", age_ms=29 * D)
    w["dead_old"] = bulk_finished(r, k, 300, state="dead", age_ms=31 * D)
    # overrides: a queue keeps successes 1 h; a task (decorator) keeps them forever; an
    # operator's task override deletes its dead letters after a day; the namespace default
    # for cancelled runs is 1 h
    w["bulk_q"] = bulk_finished(r, k, 200, state="succeeded", age_ms=2 * H, queue="bulkq")
    w["keep_task"] = bulk_finished(r, k, 200, state="succeeded", age_ms=40 * D, queue="bulkq",
                                   task="keepme")
    w["t2_dead"] = bulk_finished(r, k, 200, state="dead", age_ms=2 * D, task="t2")
    w["cancel_2h"] = bulk_finished(r, k, 200, state="cancelled", age_ms=2 * H)
    r.hset(k.tasks, "keepme", TaskSpec(name="keepme", retention={"succeeded": "never"}).options_json())
    ok(cli(url, namespace, "retention", "set", "--queue", "bulkq", "--succeeded", "1h"))
    ok(cli(url, namespace, "retention", "set", "--task", "t2", "--dead", "1d"))
    ok(cli(url, namespace, "retention", "set", "--cancelled", "1h"))
    shown = as_json(cli(url, namespace, "retention", "show", "--json"))
    assert shown["defaults"]["dead"] == DEAD_MS and shown["defaults"]["uncertain"] == 0
    assert shown["effective"]["t:keepme|succeeded"] == 0
    assert shown["effective"]["q:bulkq|succeeded"] == H

    Reaper(url, k).sync_retention()  # what the reaper does before each sweep
    deleted, examined, _ = sweep(r, k)

    for name in ("succeeded_old", "cancelled_old", "skipped_old", "missed_old", "dead_old",
                 "bulk_q", "t2_dead", "cancel_2h", "cancelled_young"):
        assert _none(app, w[name]), name
    for name in ("succeeded_young", "skipped_young", "missed_young", "dead_young",
                 "keep_task", "filler_dead", "filler_uncertain", "filler_new"):
        assert _all(app, w[name]), name
    gone = sum(len(w[n]) for n in ("succeeded_old", "cancelled_old", "skipped_old", "missed_old",
                                   "dead_old", "bulk_q", "t2_dead", "cancel_2h", "cancelled_young"))
    assert deleted == gone
    for p in range(k.partitions):  # the index entries went with the records
        for key in (k.done(p), k.dead(p)):
            members = {m.decode() for m in r.zrange(key, 0, -1)}
            assert not members & set(w["dead_old"] + w["succeeded_old"])

    # the runs kept were examined once: the next sweep reads nothing and deletes nothing
    assert sweep(r, k)[:2] == (0, 0)
    # more runs past their retention, come into the index since (as a replayed dead run
    # enters the done index when replayed): a sweep reads those, not the 50,000 kept
    more = bulk_finished(r, k, 100, state="dead", age_ms=31 * D, indexed_age_ms=90 * 60_000)
    deleted, examined, _ = sweep(r, k)
    assert deleted == 100 and examined == 100 and _none(app, more)
    assert examined < 2 * len(more)

    # a changed table applies to runs examined before: dead letters now kept 1 day
    ok(cli(url, namespace, "retention", "set", "--dead", "1d"))
    Reaper(url, k).sync_retention()
    deleted, _, _ = sweep(r, k)
    assert _none(app, w["filler_dead"] + w["dead_young"]) and _all(app, w["filler_uncertain"])
    assert deleted == len(w["filler_dead"]) + len(w["dead_young"])


def test_a_cleared_override_leaves_every_partition_s_copy(app, url, namespace):
    k, r = app.keys, app.store.client
    ok(cli(url, namespace, "retention", "set", "--queue", "bulkq", "--succeeded", "1h"))
    assert Reaper(url, k).sync_retention() == k.partitions
    assert all(r.hget(k.retention(p), "q:bulkq|succeeded") == b"3600000" for p in range(k.partitions))
    assert Reaper(url, k).sync_retention() == 0  # unchanged: nothing written
    ok(cli(url, namespace, "retention", "clear", "--queue", "bulkq"))
    assert Reaper(url, k).sync_retention() == k.partitions
    assert not any(r.hexists(k.retention(p), "q:bulkq|succeeded") for p in range(k.partitions))
