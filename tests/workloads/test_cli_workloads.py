"""`duetime enqueue --depends-on` and `duetime batches list|show|cancel`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from duetime.cli import main as cli
from tests.apps import workloads as w


def run(wapp, *args: str) -> str:
    env = {"DUETIME_REDIS_URL": wapp.redis_url, "DUETIME_NAMESPACE": wapp.keys.namespace}
    res = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout  # the command's output alone: a log line goes to stderr


def test_enqueue_depends_on_is_repeatable_and_waits(wapp):
    a = wapp.enqueue(w.step, [1], delay="1h")
    b = wapp.enqueue(w.step, [2], delay="1h")
    out = run(wapp, "enqueue", "w.step", "--app", "tests.apps.workloads:app", "--args", "[3]",
              "--depends-on", a, "--depends-on", b)
    run_id = out.strip()
    got = wapp.get_run(run_id)
    assert got.state == "waiting" and sorted(got.depends_on) == sorted([a, b])


def test_batches_list_show_and_cancel(wapp):
    bid = wapp.batch([(w.member, [i]) for i in range(3)], on_complete=(w.callback, ["c"]))
    listed = json.loads(run(wapp, "batches", "list", "--json"))
    assert [b["id"] for b in listed] == [bid] and listed[0]["total"] == 3
    shown = run(wapp, "batches", "show", bid)
    assert "open" in shown and "on_complete" in shown and shown.count("scheduled") == 3
    shown_json = json.loads(run(wapp, "batches", "show", bid, "--json"))
    assert shown_json["callback_states"] == {"on_complete": "waiting"}
    assert "3 member(s) cancelled" in run(wapp, "batches", "cancel", bid)
    assert json.loads(run(wapp, "batches", "show", bid, "--json"))["state"] == "failed"


def test_runs_list_shows_waiting_runs(wapp):
    a = wapp.enqueue(w.step, [1], delay="1h")
    b = wapp.enqueue(w.step, [2], depends_on=[a])
    listed = json.loads(run(wapp, "runs", "list", "--state", "waiting", "--json"))
    assert [x["id"] for x in listed] == [b]
    assert b in run(wapp, "runs", "list")
    wapp.cancel(b)
    assert json.loads(run(wapp, "runs", "list", "--state", "waiting", "--json")) == []


def test_runs_show_names_dependencies_and_batch(wapp):
    a = wapp.enqueue(w.step, [1], delay="1h")
    b = wapp.enqueue(w.step, [2], depends_on=[a])
    shown = run(wapp, "runs", "show", b)
    assert "waiting" in shown and f"depends_on        {a}" in shown
    bid = wapp.batch([(w.member, [0])], on_complete=(w.callback, ["c"]))
    cb = wapp.get_batch(bid).on_complete_run
    assert json.loads(run(wapp, "runs", "show", cb, "--json"))["batch_role"] == "on_complete"
    assert f"batch             {bid} (on_complete)" in run(wapp, "runs", "show", cb)
