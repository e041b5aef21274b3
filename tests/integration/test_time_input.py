"""Durations and instants at the edges: one `error:` line for a bad or out-of-range value on
every command that takes one, the same forms accepted by the CLI and the API, bounds on the
API, per-schedule miss tolerance and `schedule show` before any scheduler ran."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from duetime.common.connection import server_time_ms
from duetime.common.errors import InvalidInput
from duetime.scheduler.evaluator import Evaluator

import duetime
from duetime.embedded import free_port
from tests.apps import basic
from tests.conftest import ROOT, wait_for
from tests.integration.opkit import as_json, cli, ok
from tests.integration.test_schedules import runs_of

APP = "tests.apps.basic:app"

# (command line, words the error must contain); all fail while parsing options, before any
# connection, so no server is needed
BAD = [
    (["worker", "--app", APP, "--lease", "0"], "'--lease': duration '0' is too small (at least 500ms)"),
    (["worker", "--app", APP, "--lease", "nan"], "expected a number at 'nan'"),
    (["worker", "--app", APP, "--lease", "2d"], "is too large (at most 1d)"),
    (["worker", "--app", APP, "--grace", "-1s"], "'--grace'"),
    (["worker", "--app", APP, "--claim-ahead", "5s"], "is too large (at most 1s)"),
    (["reaper", "--tick", "0"], "'--tick': duration '0' is too small (at least 10ms)"),
    (["reaper", "--retention", "0"], "too small (at least 1s)"),
    (["scheduler", "--tick", "0"], "too small (at least 10ms)"),
    (["scheduler", "--reap-tick", "1ms"], "'--reap-tick'"),
    (["scheduler", "--lead", "2h"], "too large (at most 1h)"),
    (["scheduler", "--gauges-every", "inf"], "'--gauges-every'"),
    (["scheduler", "--miss-tolerance", "1y"], "unknown unit 'y'"),
    (["scheduler", "--retention", "P1M"], "years and months have no fixed length"),
    (["enqueue", "noop", "--app", APP, "--delay", "1e16"], "'--delay'"),
    (["enqueue", "noop", "--app", APP, "--delay", "99999999999999d"], "is too large (at most 36500d)"),
    (["enqueue", "noop", "--app", APP, "--at", "9999-12-31T23:59:59-14:00"],
     "is out of range: instants must lie between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z"),
    (["enqueue", "noop", "--app", APP, "--at", "2030-01-01T00:00:00"], "has no UTC offset"),
    (["enqueue", "noop", "--app", APP, "--at", "tomorrow"], "is not an ISO-8601 instant"),
    (["runs", "wait", "some-run", "--timeout", "nan"], "'--timeout'"),
    (["workers", "--timeout", "-1"], "'--timeout'"),
    (["top", "--interval", "0"], "too small (at least 100ms)"),
    (["top", "--window", "0.5s"], "too small (at least 1s)"),
    (["schedule", "add", "s", "--task", "noop", "--app", APP, "--every", "0"],
     "too small (at least 1ms)"),
    (["schedule", "add", "s", "--task", "noop", "--app", APP, "--every", "1m", "--lateness", "400d"],
     "'--lateness'"),
    (["schedule", "add", "s", "--task", "noop", "--app", APP, "--every", "1m", "--jitter", "nan"],
     "'--jitter'"),
    (["schedule", "add", "s", "--task", "noop", "--app", APP, "--every", "1m",
      "--miss-tolerance", "-5s"], "'--miss-tolerance'"),
    (["schedule", "add", "s", "--task", "noop", "--app", APP, "--at", "0001-01-01T00:00:00+14:00"],
     "out of range"),
    (["schedule", "backfill", "s", "--from", "2026-01-01", "--to", "2026-01-02T00:00Z"],
     "'--from'"),
    (["dead", "purge", "--before", "1960-01-01T00:00:00Z"], "out of range"),
]


@pytest.mark.parametrize(("args", "words"), BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_durations_and_instants_are_one_error_line(args: list[str], words: str) -> None:
    p = subprocess.run([sys.executable, "-m", "duetime", "--redis-url", "redis://127.0.0.1:1/0",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    err = p.stderr.strip()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert words in err, err


def test_the_cli_accepts_every_duration_form(app, url, namespace):
    def due_in(*delay: str) -> float:
        run_id = ok(cli(url, namespace, "enqueue", "noop", "--app", APP, *delay)).strip()
        run = app.get_run(run_id)
        return (run.due - run.created).total_seconds()

    # '1h30m' used to be refused by --delay (and '1.5s' by --every)
    assert due_in("--delay", "1h30m") == pytest.approx(5400, abs=1)
    assert due_in("--delay", "1.5s") == pytest.approx(1.5, abs=0.5)
    assert due_in("--delay", "PT2M") == pytest.approx(120, abs=1)
    assert due_in("--delay", "90") == pytest.approx(90, abs=1)
    run_id = ok(cli(url, namespace, "enqueue", "noop", "--app", APP, "--at",
                    "2030-01-01T01:00:00+01:00")).strip()
    assert app.get_run(run_id).due == datetime(2030, 1, 1, tzinfo=UTC)
    out = ok(cli(url, namespace, "schedule", "add", "s", "--task", "noop", "--app", APP,
                 "--every", "1.5s", "--lateness", "PT1M", "--jitter", "250ms",
                 "--miss-tolerance", "7d"))
    assert out.startswith("created s: every 1s500ms; next fire ")
    shown = as_json(cli(url, namespace, "schedule", "show", "s", "--json"))
    assert (shown["lateness_s"], shown["jitter_s"], shown["miss_tolerance_s"]) == (60, 0.25, 604800)


def _ready(port: int) -> bool:
    """The process's /readyz says ready: its loop runs (its signal handlers are installed)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_long_running_commands_take_days_and_stop_on_sigterm(procs):
    # '--retention 7d' used to be refused; bounded ticks keep an idle process quiet
    ports = [free_port(), free_port()]
    reaper = procs.duetime("reaper", "--retention", "7d", "--tick", "10ms",
                           "--metrics-port", str(ports[0]))
    worker = procs.worker("--lease", "500ms", "--grace", "1s", "--metrics-port", str(ports[1]))
    # up and serving (not a fixed sleep: a loaded machine starts them late, and a SIGTERM
    # before their handlers are installed would kill them)
    wait_for(lambda: all(p.poll() is not None or _ready(port)
                         for p, port in zip((reaper, worker), ports, strict=True)), 30,
             what="the reaper and the worker to be ready")
    for p in (reaper, worker):
        assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
        p.send_signal(signal.SIGTERM)
    for p in (reaper, worker):
        assert p.wait(60) == 0  # a graceful stop, on a loaded machine's time


def test_api_bounds_refuse_and_write_nothing(app, r):
    def keys() -> list[bytes]:
        return [k for k in r.scan_iter(f"{app.keys.namespace}:*") if not k.endswith(b":meta")]

    for kw, words in (({"delay": 1e16}, "too large"), ({"delay": float("nan")}, "finite"),
                      ({"delay": -1}, "must not be negative"), ({"delay": "soon"}, "invalid delay"),
                      ({"delay": ""}, "empty delay"),
                      ({"at": datetime(1960, 1, 1, tzinfo=UTC)}, "out of range"),
                      ({"at": "9999-12-31T23:59:59-14:00"}, "out of range"),
                      ({"at": datetime(2030, 1, 1)}, "naive")):
        with pytest.raises(InvalidInput, match=words):
            app.enqueue(basic.noop, **kw)
        with pytest.raises(InvalidInput, match=words):
            app.enqueue_many([(basic.noop, [1]), {"task": basic.noop, **kw}])
    assert keys() == []
    run = app.get_run(app.enqueue(basic.noop, delay="1h30m"))
    assert (run.due - run.created).total_seconds() == pytest.approx(5400, abs=1)
    run = app.get_run(app.enqueue(basic.noop, at="2030-01-01T00:00:00Z"))
    assert run.due == datetime(2030, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="lateness '-1s'|expected a number"):
        app.schedule("s", duetime.Every("1m"), basic.noop, lateness="-1s")
    with pytest.raises(InvalidInput, match="shorter than 1ms"):
        app.schedule("s", duetime.Every(timedelta(microseconds=10)), basic.noop)


def test_an_outage_of_a_1s_schedule_skips_the_missed_whatever_the_tolerance(app, url):
    # skip + a tolerance longer than the outage: the successor rule still marks them missed
    app.schedule("sec", duetime.Every(timedelta(seconds=1)), basic.noop, catchup="skip",
                 miss_tolerance="30s")
    time.sleep(3.3)  # no scheduler: about three occurrences pass
    ev = Evaluator(url, app.keys, lead_ms=0)  # no override: each schedule's own tolerance
    before_ms = server_time_ms(ev.client)  # the tick's clock reads no earlier than this
    ev.tick()
    info = app.get_schedule("sec")
    assert info.miss_tolerance_s == 30
    assert info.skipped_count >= 2
    # at most the current occurrence ran: its successor was not due at the tick, so it is
    # later than the tick's now - 1 s (a clock read after the tick and the reads above put
    # that bound as late as the machine was slow)
    assert all(int(run.id.rsplit("@", 1)[1]) > before_ms - 1000 for run in runs_of(app, "sec"))
    assert len(runs_of(app, "sec")) <= 1


def test_miss_tolerance_is_read_per_schedule(app, url):
    # far enough ahead that both are registered before it (an At in the past when registered
    # has no occurrence at all); 300 ms was passed by a slow registration
    soon_ms = server_time_ms(app.store.client) + 2000
    soon = datetime.fromtimestamp(soon_ms / 1000, UTC)
    app.schedule("lenient", duetime.At(soon), basic.noop, catchup="skip")  # default 60 s
    app.schedule("strict", duetime.At(soon), basic.noop, catchup="skip", miss_tolerance=0.5)
    # both at least 1.2 s late when first evaluated (later on a slow machine: still < 60 s)
    time.sleep(max(0.0, (soon_ms + 1200 - server_time_ms(app.store.client)) / 1000))
    Evaluator(url, app.keys, lead_ms=0).tick()
    assert [run.state for run in runs_of(app, "lenient")] == ["scheduled"]
    assert runs_of(app, "strict") == [] and app.get_schedule("strict").skipped_count == 1
    assert app.get_schedule("strict").miss_tolerance_s == 0.5


def test_schedule_show_before_any_scheduler_ran_agrees_with_next_fire(app, url, namespace):
    ok(cli(url, namespace, "schedule", "add", "tick", "--every", "1s", "--task", "noop",
           "--app", APP))
    ok(cli(url, namespace, "schedule", "add", "paris", "--cron", "30 2 * * *", "--tz",
           "Europe/Paris", "--task", "noop", "--app", APP))
    time.sleep(1.2)  # tick's next_fire passes without a scheduler
    for name in ("tick", "paris"):
        shown = as_json(cli(url, namespace, "schedule", "show", name, "--json"))
        fires = shown["next_fires"]
        assert len(fires) == 5 and fires[0]["utc"] == shown["next_fire"]
        assert [f["utc"] for f in fires] == sorted({f["utc"] for f in fires})
        assert all(not f["overdue"] for f in fires[1:])
    tick = as_json(cli(url, namespace, "schedule", "show", "tick", "--json"))
    assert tick["next_fires"][0]["overdue"] is True
    text = ok(cli(url, namespace, "schedule", "show", "paris"))
    assert "zone                Europe/Paris (now UTC+0" in text
    assert "next 5 fire times (Europe/Paris / UTC)" in text
    next_line = next(line for line in text.splitlines() if line.startswith("  next_fire"))
    first_fire = text.split("fire times (Europe/Paris / UTC):\n")[1].splitlines()[0]
    assert shown_utc(next_line) == shown_utc(first_fire)
    assert " (in " in next_line  # relative to the server's clock
    listed = ok(cli(url, namespace, "schedule", "list"))
    assert "(in " in listed and "ago)" in listed  # tick's overdue next fire reads "... ago"


def shown_utc(line: str) -> str:
    return next(word for word in line.split() if word.endswith("Z"))


def test_backfill_takes_instants_in_every_form_and_refuses_naive_ones(app):
    app.schedule("hourly", duetime.Cron("0 * * * *"), basic.noop)
    assert app.backfill("hourly", "2025-03-01T00:00:00Z", "2025-03-01T06:00:00+01:00") == (6, 6)
    assert app.backfill("hourly", datetime(2025, 3, 1, tzinfo=UTC), "20250301T0500Z") == (6, 0)
    with pytest.raises(InvalidInput, match="backfill start 2025-03-01T00:00:00 is naive"):
        app.backfill("hourly", datetime(2025, 3, 1), datetime(2025, 3, 2, tzinfo=UTC))
    with pytest.raises(InvalidInput, match="backfill end '10000-01-01' is not"):
        app.backfill("hourly", "2025-03-01T00:00:00Z", "10000-01-01")
