"""`duetime runs|dead|uncertain` against real servers: listings, cancel, replay, resolve, purge."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from duetime.common import transitions as tr
from duetime.common.schedules import run_id_for
from duetime.common.scripts import Scripts
from duetime.common.time.parse import from_ms

import duetime
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.opkit import Driver, as_json, cli, ok, one_line_error

APP = "tests.apps.basic:app"


def in_index(app, name: str, run_id: str, queue: str = "default") -> bool:
    k = app.keys
    p = k.partition_of_run(run_id)
    key = {"due": k.due(p, queue), "retry": k.retry(p, queue), "dead": k.dead(p),
           "uncertain": k.uncertain(p), "done": k.done(p)}[name]
    return app.store.client.zscore(key, run_id) is not None


def test_runs_list_orders_filters_and_limits(app, url, namespace):
    d = Driver(app)
    dead = d.dead(basic.fatal, 2)
    later = app.enqueue(basic.noop, [1], delay=3600)
    soon = app.enqueue(basic.noop, [2], delay=60)
    low = app.enqueue(basic.noop, [3], delay=120, queue="low")
    runs = as_json(cli(url, namespace, "runs", "list", "--json"))
    # scheduled first (soonest first), then the dead letters (newest first)
    assert [r["id"] for r in runs[:3]] == [soon, low, later]
    assert {r["id"] for r in runs[3:]} == set(dead) and len(runs) == 5
    assert runs[0]["state"] == "scheduled" and runs[0]["task"] == "noop"
    assert runs[3]["state"] == "dead" and runs[3]["error"] == "Fatal: broken"
    assert "args" not in runs[0] and "payload" not in runs[0]  # listings never show payloads
    assert [r["id"] for r in as_json(cli(url, namespace, "runs", "list", "--queue", "low",
                                         "--json"))] == [low]
    assert {r["id"] for r in as_json(cli(url, namespace, "runs", "list", "--state", "dead",
                                         "--json"))} == set(dead)
    assert len(as_json(cli(url, namespace, "runs", "list", "--limit", "2", "--json"))) == 2
    assert as_json(cli(url, namespace, "runs", "list", "--state", "succeeded", "--json")) == []
    table = ok(cli(url, namespace, "runs", "list"))
    assert table.splitlines()[0].split() == ["ID", "STATE", "TASK", "QUEUE", "SCHEDULE", "WHEN",
                                             "ATTEMPT", "INFO"]
    assert soon in table.splitlines()[1]
    one_line_error(cli(url, namespace, "runs", "list", "--state", "done"), 2)
    one_line_error(cli(url, namespace, "runs", "list", "--limit", "0"), 2)


def test_runs_show_has_every_attempt_and_lateness(app, url, namespace, procs):
    run_id = app.enqueue(basic.always_fails)  # 3 attempts (retries=2), then dead
    procs.worker("--lease", "2s")
    waited = cli(url, namespace, "runs", "wait", run_id, "--timeout", "30s")
    assert (waited.exit_code, waited.stdout) == (1, "dead\n")
    shown = as_json(cli(url, namespace, "runs", "show", run_id, "--json"))
    assert shown["id"] == run_id and shown["state"] == "dead" and shown["task"] == "flaky"
    assert [a["outcome"] for a in shown["attempts"]] == ["failed", "failed", "failed"]
    for a in shown["attempts"]:
        assert a["worker"] and a["started"] and a["ended"] and a["duration_s"] >= 0
        assert a["error"].startswith("RuntimeError: boom")
    assert 0 <= shown["start_lateness_s"] < 10
    text = ok(cli(url, namespace, "runs", "show", run_id))
    assert text.startswith(f"run {run_id}  dead  task=flaky") and text.count(" failed worker=") == 3
    assert "start_lateness_s" in text
    assert "no run 'nope'" in one_line_error(cli(url, namespace, "runs", "show", "nope"), 1)
    one_line_error(cli(url, namespace, "runs", "show", "bad{id}"), 2)


def test_runs_wait_exit_codes(app, url, namespace, procs):
    good, bad = app.enqueue(basic.noop), app.enqueue(basic.fatal)
    procs.worker()
    assert ok(cli(url, namespace, "runs", "wait", good, "--timeout", "30s")) == "succeeded\n"
    res = cli(url, namespace, "runs", "wait", bad, "--timeout", "30s")
    assert res.exit_code == 1 and res.stdout == "dead\n"
    later = app.enqueue(basic.noop, delay=3600)
    one_line_error(cli(url, namespace, "runs", "wait", later, "--timeout", "200ms"), 1)


def test_cancel_scheduled_retrying_and_running_runs(app, url, namespace, procs):
    waiting = app.enqueue(basic.noop, delay=3600)
    assert ok(cli(url, namespace, "runs", "cancel", waiting)) == f"cancelled {waiting} (it was scheduled)\n"
    run = app.get_run(waiting)
    assert run.state == "cancelled" and run.reason == "cancelled by an operator"
    assert not in_index(app, "due", waiting) and in_index(app, "done", waiting)
    assert "already finished (cancelled)" in one_line_error(cli(url, namespace, "runs", "cancel", waiting), 1)

    d = Driver(app)
    retrying = app.enqueue(basic.always_fails)
    [(p, c)] = d.claim_all()
    assert d.fail(p, c, mode="retry") == "retrying"
    ok(cli(url, namespace, "runs", "cancel", retrying, "--reason", "bad input"))
    assert app.get_run(retrying).state == "cancelled" and not in_index(app, "retry", retrying)

    running = app.enqueue(basic.aslow, [30])
    # the cancel is seen at a heartbeat (every second under 3 s); a 600 ms lease was lost by a
    # loaded machine's delayed heartbeat (the worker gives up an attempt it did not renew)
    procs.worker("--lease", "3s")
    wait_for(lambda: app.get_run(running).state == "running", 20, what="running")
    out = ok(cli(url, namespace, "runs", "cancel", running))
    assert out.startswith(f"cancel requested for {running}: worker ")
    wait_for(lambda: app.get_run(running).state == "cancelled", 20, what="worker to stop the run")
    run = app.get_run(running)
    assert [a.outcome for a in run.attempts] == ["cancelled"] and run.cancel_requested
    assert "no run" in one_line_error(cli(url, namespace, "runs", "cancel", "ghost"), 1)


@pytest.mark.scripts  # proves its scripts: runs on every server kind
def test_replay_links_runs_and_needs_force_for_success(app, url, namespace):
    d = Driver(app)
    [dead_id] = d.dead(basic.fatal, 1)
    new_id = ok(cli(url, namespace, "runs", "replay", dead_id, "--note", "fixed the bug")).strip()
    new, old = app.get_run(new_id), app.get_run(dead_id)
    assert new.replay_of == dead_id and old.replayed_by == new_id and old.state == "dead"
    assert (new.state, new.task, new.queue, new.attempt) == ("scheduled", "fatal", "default", 0)
    assert new.idempotency_key == dead_id  # same business operation, same key
    assert app.keys.partition_of_run(new_id) == app.keys.partition_of_run(dead_id)
    assert not in_index(app, "dead", dead_id) and in_index(app, "due", new_id)
    # asking again gives the same replay
    again = cli(url, namespace, "runs", "replay", dead_id)
    assert ok(again).strip() == new_id and "already replayed" in again.stderr
    # an active run cannot be replayed; a succeeded one only with --force
    assert "still scheduled" in one_line_error(cli(url, namespace, "runs", "replay", new_id), 1)
    assert app.cancel(new_id) == "cancelled"  # the Python API
    good = app.enqueue(basic.noop, [5])
    [(p, c)] = d.claim_all()
    keys, args = tr.complete(app.keys, p, [(c.run_id, c.fence)])
    d.scripts.complete(keys=keys, args=args)
    assert "--force" in one_line_error(cli(url, namespace, "runs", "replay", good), 1)
    forced = ok(cli(url, namespace, "runs", "replay", good, "--force")).strip()
    assert app.get_run(forced).args == [5] and app.get_run(good).replayed_by == forced
    app.cancel(forced)
    # schedule runs keep their schedule (and partition)
    app.schedule("sched-x", duetime.Every(timedelta(hours=1)), basic.fatal)
    trig = app.trigger("sched-x")
    [(p, c)] = d.claim_all()
    d.fail(p, c)
    replayed = ok(cli(url, namespace, "runs", "replay", trig)).strip()
    assert replayed.startswith("sched-x@r") and app.get_run(replayed).schedule == "sched-x"
    assert app.replay(trig) == replayed  # the Python API agrees


@pytest.mark.scripts  # proves its scripts: runs on every server kind
def test_dead_letters_list_show_replay_all_and_purge(app, url, namespace):
    d = Driver(app)
    fatal_ids = d.dead(basic.fatal, 5)
    [other] = d.dead(basic.noop, 1)
    listed = as_json(cli(url, namespace, "dead", "list", "--json"))
    assert {r["id"] for r in listed} == {*fatal_ids, other}
    assert all(r["state"] == "dead" and r["error"] == "Fatal: broken" for r in listed)
    table = ok(cli(url, namespace, "dead", "list"))
    assert table.splitlines()[0].split()[:4] == ["ID", "TASK", "QUEUE", "OWNER"]
    assert len(table.splitlines()) == 7
    shown = as_json(cli(url, namespace, "dead", "show", other, "--json"))
    assert shown["state"] == "dead" and shown["attempts"][0]["outcome"] == "failed"
    assert "full error" in ok(cli(url, namespace, "dead", "show", other))
    live = app.enqueue(basic.noop, delay=60)
    assert "is not dead" in one_line_error(cli(url, namespace, "dead", "show", live), 1)
    one_line_error(cli(url, namespace, "dead", "replay"), 2)
    one_line_error(cli(url, namespace, "dead", "replay", other, "--all"), 2)

    res = cli(url, namespace, "dead", "replay", "--all", "--task", "fatal", "--json")
    pairs = as_json(res)
    assert sorted(x["old"] for x in pairs) == sorted(fatal_ids) and "replaying" in res.stderr
    assert all(app.get_run(x["new"]).replay_of == x["old"] for x in pairs)
    assert [r["id"] for r in as_json(cli(url, namespace, "dead", "list", "--json"))] == [other]
    # nothing left to replay for that task: a rerun (e.g. after Ctrl-C) does nothing twice
    assert as_json(cli(url, namespace, "dead", "replay", "--all", "--task", "fatal", "--json")) == []

    # purge asks first (no answer = no), then deletes records and histories
    refused = cli(url, namespace, "dead", "purge", input="n\n")
    assert refused.exit_code == 1 and app.get_run(other).state == "dead"
    purged = cli(url, namespace, "dead", "purge", "--yes")
    assert ok(purged) == "purged 1 dead run(s)\n" and "purging" in purged.stderr
    with pytest.raises(Exception, match="no run"):
        app.get_run(other)
    assert ok(cli(url, namespace, "dead", "purge", "--yes")) == "no dead runs to purge\n"
    more = d.dead(basic.fatal, 2)
    assert ok(cli(url, namespace, "dead", "purge", "--yes", "--before", "2000-01-01T00:00:00Z")) \
        == "no dead runs to purge\n"
    assert all(app.get_run(i).state == "dead" for i in more)
    one_line_error(cli(url, namespace, "dead", "purge", "--before", "yesterday"), 2)


@pytest.mark.scripts  # proves its scripts: runs on every server kind
def test_uncertain_list_and_resolve(app, url, namespace):
    d = Driver(app)
    a, b, c = d.uncertain(basic.nonidem, 3)
    listed = as_json(cli(url, namespace, "uncertain", "list", "--json"))
    assert {r["id"] for r in listed} == {a, b, c} and {r["state"] for r in listed} == {"uncertain"}
    assert "LAST WORKER" in ok(cli(url, namespace, "uncertain", "list"))

    assert ok(cli(url, namespace, "uncertain", "resolve", a, "--as", "succeeded")) == \
        f"resolved {a}: now succeeded\n"
    run = app.get_run(a)
    assert run.state == "succeeded" and run.resolved_as == "succeeded"
    assert run.attempts[0].outcome == "unknown"  # what was observed stays as observed
    assert in_index(app, "done", a) and not in_index(app, "uncertain", a)

    ok(cli(url, namespace, "uncertain", "resolve", b, "--as", "failed", "--note", "checked the ledger"))
    assert app.get_run(b).state == "dead" and in_index(app, "dead", b)
    assert b in {r["id"] for r in as_json(cli(url, namespace, "dead", "list", "--json"))}

    new_id = ok(cli(url, namespace, "uncertain", "resolve", c, "--as", "replay")).strip()
    old = app.get_run(c)
    assert old.state == "dead" and old.resolved_as == "replay" and old.replayed_by == new_id
    assert app.get_run(new_id).state == "scheduled" and not in_index(app, "uncertain", c)
    assert as_json(cli(url, namespace, "uncertain", "list", "--json")) == []

    assert "not uncertain" in one_line_error(cli(url, namespace, "uncertain", "resolve", a, "--as",
                                                 "failed"), 1)
    one_line_error(cli(url, namespace, "uncertain", "resolve", a, "--as", "maybe"), 2)
    one_line_error(cli(url, namespace, "uncertain", "resolve", "ghost", "--as", "failed"), 1)
    [u] = d.uncertain(basic.nonidem, 1)
    assert "uncertain resolve" in one_line_error(cli(url, namespace, "runs", "cancel", u), 1)


def test_ctrl_c_in_replay_all_leaves_every_run_whole_and_a_rerun_finishes(app, url, namespace, procs):
    d = Driver(app)
    ids = d.dead(basic.fatal, 3000)
    k = app.keys
    r = app.store.client

    def dead_left() -> int:
        return sum(r.zcard(k.dead(p)) for p in range(k.partitions))

    bulk = procs.duetime("dead", "replay", "--all")
    wait_for(lambda: dead_left() < 2900 or bulk.poll() is not None, 30, what="replays to start")
    bulk.send_signal(signal.SIGINT)
    _, err = bulk.communicate(timeout=30)
    if bulk.returncode == 130:  # interrupted (a fast machine may have finished first)
        assert b"interrupted after" in err and b"Traceback" not in err
    else:
        assert bulk.returncode == 0, err
    # every run is either replayed completely (linked, out of the dead set) or untouched
    pipe = r.pipeline(transaction=False)
    for run_id in ids:
        p = k.partition_of_run(run_id)
        pipe.hget(k.run(p, run_id), "replayed_by")
        pipe.zscore(k.dead(p), run_id)
    res = pipe.execute()
    replayed = 0
    for i in range(len(ids)):
        by, score = res[2 * i], res[2 * i + 1]
        assert (by is None) == (score is not None), ids[i]
        replayed += by is not None
    assert replayed == len(ids) - dead_left()
    ok(cli(url, namespace, "dead", "replay", "--all"))
    assert dead_left() == 0
    assert len({app.get_run(i).replayed_by for i in ids[::100]}) == 30


def test_runs_show_says_how_many_occurrences_a_catch_up_run_stands_for(app, url, namespace):
    """materialize.lua writes `coalesced`/`coalesced_from` on a catch-up run (catchup="latest");
    get_run, `runs show` and its --json expose them, and an ordinary run stands for itself."""
    name = "minutely-catchup"
    app.schedule(name, duetime.Every(timedelta(minutes=1)), basic.noop, catchup="latest")
    k, minute, first = app.keys, 60_000, 1_800_000_000_000
    newest, alone = first + 4 * minute, first + 5 * minute
    p = k.partition_of_schedule(name)
    keys, args = tr.materialize(k, p, name, "default", [run_id_for(name, newest), newest, newest,
                                                        5, first, run_id_for(name, alone), alone,
                                                        alone, 1, alone])
    assert Scripts(app.store.client).materialize(keys=keys, args=args)[0] == b"ok"
    caught_up, own = app.get_run(run_id_for(name, newest)), app.get_run(run_id_for(name, alone))
    assert (caught_up.coalesced, caught_up.coalesced_from) == (5, from_ms(first))
    assert (own.coalesced, own.coalesced_from) == (1, None)
    shown = as_json(cli(url, namespace, "runs", "show", caught_up.id, "--json"))
    assert (shown["coalesced"], shown["coalesced_from"]) == (5, "2027-01-15T08:00:00Z")
    text = ok(cli(url, namespace, "runs", "show", caught_up.id))
    assert "  coalesced         5 occurrences, from 2027-01-15T08:00:00Z" in text.splitlines()
    shown = as_json(cli(url, namespace, "runs", "show", own.id, "--json"))
    assert (shown["coalesced"], shown["coalesced_from"]) == (1, None)
    assert "coalesced" not in ok(cli(url, namespace, "runs", "show", own.id))


def succeed_with(app, task, result) -> str:  # noqa: ANN001
    """A run completed through complete.lua with `result` stored (as a worker stores it)."""
    from duetime.common.codec import pack_result

    d = Driver(app)
    run_id = app.enqueue(task, [0])
    (p, c), = d.claim_all()
    keys, args = tr.complete(d.k, p, [(c.run_id, c.fence, pack_result(result))])
    assert d.scripts.complete(keys=keys, args=args) == [b"succeeded"]
    return run_id


def test_runs_show_prints_the_result_bounded_and_json_carries_it_whole(app, url, namespace):
    result = {"invoice": 44, "lines": ["x" * 40] * 30}
    run_id = succeed_with(app, basic.noop, result)
    text = ok(cli(url, namespace, "runs", "show", run_id))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("result "))
    shown = line.split("result", 1)[1].strip()
    assert shown.startswith('{"invoice": 44, "lines": ["xxxx') and shown.endswith("…")
    assert len(shown) == 500
    assert as_json(cli(url, namespace, "runs", "show", run_id, "--json"))["result"] == result
    small = succeed_with(app, basic.noop, [1, "two", None])
    assert '  result            [1, "two", null]' in ok(cli(url, namespace, "runs", "show", small))
