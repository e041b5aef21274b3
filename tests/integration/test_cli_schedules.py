"""`duetime schedule ...` and `duetime enqueue` against real servers, through click's runner."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.integration.opkit import as_json, cli, ok, one_line_error

APP = "tests.apps.basic:app"


@pytest.mark.scripts  # proves its scripts: runs on every server kind
def test_schedule_lifecycle_from_the_cli(app, url, namespace):
    def run(*args: str):
        return cli(url, namespace, *args)

    out = ok(run("schedule", "add", "nightly", "--cron", "30 2 * * *", "--tz", "Europe/Paris",
                 "--task", "noop", "--args", "[7]", "--app", APP, "--catchup", "skip",
                 "--lateness", "5m", "--overlap", "skip", "--jitter", "10s", "--owner", "ops",
                 "--dst-gap", "skip", "--dst-fold", "first"))
    assert out.startswith("created nightly: cron '30 2 * * *' in Europe/Paris")
    assert ok(run("schedule", "add", "nightly", "--cron", "30 2 * * *", "--tz", "Europe/Paris",
                  "--task", "noop", "--args", "[7]", "--app", APP, "--catchup", "skip",
                  "--lateness", "5m", "--overlap", "skip", "--jitter", "10s", "--owner", "ops",
                  "--dst-gap", "skip", "--dst-fold", "first")).startswith("unchanged")
    ok(run("schedule", "add", "every-10s", "--every", "10s", "--task", "anoop", "--app", APP,
           "--queue", "bulk"))

    listed = as_json(run("schedule", "list", "--json"))
    assert [s["name"] for s in listed] == ["every-10s", "nightly"]
    assert listed[0]["queue"] == "bulk" and listed[0]["trigger"]["kind"] == "every"
    assert "nightly" in ok(run("schedule", "list"))

    shown = as_json(run("schedule", "show", "nightly", "--json"))
    assert shown["zone"] == "Europe/Paris" and shown["args"] == [7]
    assert shown["catchup"] == "skip" and shown["lateness_s"] == 300 and shown["overlap"] == "skip"
    assert shown["jitter_s"] == 10 and shown["owner"] == "ops" and shown["paused"] is False
    assert shown["trigger"]["dst_gap"] == "skip" and shown["trigger"]["dst_fold"] == "first"
    fires = shown["next_fires"]
    assert len(fires) == 5
    for f in fires:  # 02:30 in Paris is 01:30 UTC in winter, 00:30 UTC in summer
        local = datetime.fromisoformat(f["local"])
        assert (local.hour, local.minute) == (2, 30)
        assert datetime.fromisoformat(f["utc"].replace("Z", "+00:00")) == local.astimezone(UTC)
    text = ok(run("schedule", "show", "nightly"))
    assert "next 5 fire times (Europe/Paris / UTC)" in text
    assert "+01:00" in text or "+02:00" in text

    assert ok(run("schedule", "pause", "nightly", "--note", "maintenance")) == "paused nightly\n"
    shown = as_json(run("schedule", "show", "nightly", "--json"))
    assert shown["paused"] is True and shown["pause_note"] == "maintenance"
    ok(run("schedule", "resume", "nightly"))
    assert as_json(run("schedule", "show", "nightly", "--json"))["paused"] is False

    run_id = ok(run("schedule", "trigger", "nightly")).strip()
    assert run_id.startswith("nightly@m")
    runs = as_json(run("runs", "list", "--schedule", "nightly", "--json"))
    assert [(x["id"], x["state"], x["schedule"]) for x in runs] == [(run_id, "scheduled", "nightly")]

    ok(run("schedule", "delete", "every-10s"))
    one_line_error(run("schedule", "show", "every-10s"), 1)
    assert [s["name"] for s in as_json(run("schedule", "list", "--json"))] == ["nightly"]


def test_backfill_is_idempotent_and_reports_progress(app, url, namespace):
    ok(cli(url, namespace, "schedule", "add", "hourly", "--cron", "0 * * * *", "--task", "noop",
           "--app", APP))
    args = ("schedule", "backfill", "hourly", "--from", "2025-03-01T00:00:00Z",
            "--to", "2025-03-01T23:59:00+00:00")
    first = cli(url, namespace, *args)
    assert ok(first).strip() == "24 occurrence(s), 24 run(s) created (0 existed already)"
    assert "backfilling" in first.stderr  # the progress bar goes to stderr
    assert ok(cli(url, namespace, *args)).startswith("24 occurrence(s), 0 run(s) created")
    runs = as_json(cli(url, namespace, "runs", "list", "--schedule", "hourly", "--limit", "100",
                       "--json"))
    assert len(runs) == 24 and {r["state"] for r in runs} == {"scheduled"}
    assert runs[0]["due"] == "2025-03-01T00:00:00Z"  # soonest first
    one_line_error(cli(url, namespace, "schedule", "backfill", "hourly", "--from",
                       "2025-03-02T00:00:00Z", "--to", "2025-03-01T00:00:00Z"), 2)
    one_line_error(cli(url, namespace, "schedule", "backfill", "hourly", "--from",
                       "2025-03-01T00:00:00", "--to", "2025-03-02T00:00:00Z"), 2)


@pytest.mark.parametrize("args, code, words", [
    (["--cron", "0 0 30 2 *"], 2, "can never fire"),
    (["--cron", "61 * * * *"], 2, "--cron"),
    (["--cron", "0 * * * *", "--tz", "Mars/Olympus"], 2, "unknown time zone"),
    (["--every", "10x"], 2, "--every"),
    (["--every", "10s", "--cron", "* * * * *"], 2, "exactly one of"),
    ([], 2, "exactly one of"),
    (["--at", "2030-01-01T00:00:00"], 2, "no UTC offset"),
    (["--every", "1m", "--catchup", "sometimes"], 2, "--catchup"),
    (["--every", "1m", "--overlap", "queue"], 2, "--overlap"),
    (["--every", "1m", "--args", "[1,"], 2, "bad JSON"),
    (["--every", "1m", "--kwargs", "[1]"], 2, "JSON object"),
    (["--every", "1m", "--max-catchup", "0"], 2, "--max-catchup"),
    (["--every", "1m", "--lateness", "soon"], 2, "--lateness"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_schedule_add_bad_input_is_one_line_and_writes_nothing(app, url, namespace, args, code, words):
    err = one_line_error(cli(url, namespace, "schedule", "add", "s1", "--task", "noop",
                             "--app", APP, *args), code)
    assert words in err
    assert as_json(cli(url, namespace, "schedule", "list", "--json")) == []


def test_schedule_errors_not_found_and_unknown_task(app, url, namespace):
    assert "unknown task 'nope'" in one_line_error(
        cli(url, namespace, "schedule", "add", "s1", "--every", "1m", "--task", "nope", "--app", APP), 1)
    for cmd in ("show", "pause", "resume", "trigger", "delete"):
        assert "no schedule 'ghost'" in one_line_error(cli(url, namespace, "schedule", cmd, "ghost"), 1)
    one_line_error(cli(url, namespace, "schedule", "add", "bad{name}", "--every", "1m",
                       "--task", "noop", "--app", APP), 2)


def test_enqueue_prints_the_run_id_and_validates(app, url, namespace):
    run_id = ok(cli(url, namespace, "enqueue", "noop", "--app", APP, "--args", "[3]",
                    "--delay", "1h", "--queue", "low")).strip()
    run = app.get_run(run_id)
    assert (run.task, run.args, run.queue, run.state) == ("noop", [3], "low", "scheduled")
    assert (run.due - run.created).total_seconds() == pytest.approx(3600, abs=1)
    keyed = ok(cli(url, namespace, "enqueue", "noop", "--app", APP, "--key", "invoice-1",
                   "--at", "2030-01-01T00:00:00Z")).strip()
    assert ok(cli(url, namespace, "enqueue", "noop", "--app", APP, "--key", "invoice-1")).strip() == keyed
    assert app.get_run(keyed).due == datetime(2030, 1, 1, tzinfo=UTC)
    one_line_error(cli(url, namespace, "enqueue", "noop", "--app", APP, "--args", "{bad"), 2)
    one_line_error(cli(url, namespace, "enqueue", "noop", "--app", APP, "--at", "tomorrow"), 2)
    one_line_error(cli(url, namespace, "enqueue", "noop", "--app", APP, "--at",
                       "2030-01-01T00:00:00Z", "--delay", "1s"), 2)
    one_line_error(cli(url, namespace, "enqueue", "noop", "--app", APP, "--queue", "a{b}"), 2)
    assert "unknown task" in one_line_error(cli(url, namespace, "enqueue", "nope", "--app", APP), 1)
    assert "cannot import" in one_line_error(cli(url, namespace, "enqueue", "noop", "--app", "nomod:app"), 2)
    # the queue names are registered for `top` and the gauges
    assert {q.decode() for q in app.store.client.smembers(app.keys.queues)} == {"low", "default"}
