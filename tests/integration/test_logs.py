"""structlog output: JSON lines off a terminal, readable lines on one; every line about a run
names the run, task, attempt, worker and schedule, and never the payload."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from datetime import timedelta

import duetime
from tests.apps import basic
from tests.conftest import ROOT, wait_for

SECRET = "s3cret-payload-value"
RUN_FIELDS = {"run_id", "task", "attempt", "worker_id", "schedule"}


def test_worker_logs_are_json_lines_with_run_fields_and_no_payload(app, procs):
    plain = app.enqueue(basic.noop, [SECRET])
    failing = app.enqueue(basic.always_fails)
    app.schedule("logged", duetime.Every(timedelta(hours=1)), basic.noop, args=[SECRET])
    scheduled = app.trigger("logged")
    worker = procs.duetime("worker", "--app", "tests.apps.basic:app", log="DEBUG")
    wait_for(lambda: {app.get_run(r).state for r in (plain, scheduled)} == {"succeeded"}
             and app.get_run(failing).state == "dead", 30, what="runs to finish")
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    text = err.decode()
    assert SECRET not in text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # all JSON
    assert {"worker started", "worker stopped"} <= {x["event"] for x in lines}
    about_runs = [x for x in lines if "run_id" in x]
    for x in about_runs:
        assert x.keys() >= RUN_FIELDS, x
        assert x["level"] and x["timestamp"]
    events = {(x["event"], x["run_id"]) for x in about_runs}
    assert {("run started", plain), ("run succeeded", plain), ("run started", scheduled),
            ("run failed", failing)} <= events
    [sched_line] = [x for x in about_runs if x["run_id"] == scheduled and x["event"] == "run started"]
    assert sched_line["schedule"] == "logged" and sched_line["attempt"] == 1
    assert len([x for x in about_runs if x["run_id"] == failing and x["event"] == "run failed"]) == 3


def test_logs_on_a_terminal_are_readable_lines():
    code = ("from duetime.common import logs; logs.configure('INFO'); "
            "logs.get('t').info('run failed', run_id='r1', task='t1', attempt=2)")
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=follower,
                         stdout=subprocess.DEVNULL)
    os.close(follower)
    p.wait(30)
    out = b""
    try:
        while chunk := os.read(leader, 4096):
            out += chunk
    except OSError:
        pass
    os.close(leader)
    line = out.decode().strip()
    assert "run failed" in line and "run_id=r1" in line and "attempt=2" in line
    assert not line.startswith("{")


def test_a_failed_run_logs_its_exception_type_and_a_bounded_message(app, procs, monkeypatch):
    """'run failed' is a warning naming the exception type; its message is cut to one short
    line, and DUETIME_LOG_ERROR_TEXT=0 keeps it out (a KeyError quotes the argument). The run
    record keeps the full text for `duetime runs show`."""
    quoted = SECRET + "k" * 1000

    def failed_lines(env: str | None) -> tuple[str, list[dict]]:
        if env is None:
            monkeypatch.delenv("DUETIME_LOG_ERROR_TEXT", raising=False)
        else:
            monkeypatch.setenv("DUETIME_LOG_ERROR_TEXT", env)
        run_id = app.enqueue(basic.leaky, [quoted])
        worker = procs.duetime("worker", "--app", "tests.apps.basic:app", log="INFO")
        wait_for(lambda: app.get_run(run_id).state == "dead", 30, what="the run to fail")
        worker.send_signal(signal.SIGTERM)
        text = worker.communicate(timeout=30)[1].decode()
        lines = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        return text, [x for x in lines if x["event"] == "run failed" and x["run_id"] == run_id]

    _, [line] = failed_lines(None)
    assert line["level"] == "warning" and line["error_type"] == "KeyError"
    assert line["error"].startswith(f"KeyError: '{SECRET}kkk") and len(line["error"]) <= 200

    text, [line] = failed_lines("0")
    assert line["level"] == "warning" and line["error_type"] == "KeyError"
    assert "error" not in line and SECRET not in text
    dead = app.get_run(line["run_id"])
    assert SECRET in (dead.error or "") and "k" * 1000 in dead.error  # the record keeps it all
