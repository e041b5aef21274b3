"""`duetime leases|workers|top|doctor|dev|demo` against real servers and real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid

import pytest
import redis
from duetime.common.keys import Keyspace

from duetime.embedded import EmbeddedServer, free_port
from duetime.ops.inspect import Inspector
from tests.apps import basic
from tests.conftest import ROOT, Procs, wait_for
from tests.integration.opkit import Driver, as_json, cli, ok, one_line_error


def test_leases_workers_and_top_show_live_work(app, url, namespace, procs):
    [dead] = Driver(app).dead(basic.fatal, 1)
    waiting = [app.enqueue(basic.noop, [i], queue="low") for i in range(2)]  # nobody serves 'low'
    later = [app.enqueue(basic.noop, [i], delay=3600) for i in range(3)]
    slow = [app.enqueue(basic.aslow, [30]) for _ in range(2)]
    # a 15 s lease (a beat every 5 s): the lease and heartbeat checks below hold unless the
    # worker process is starved for 10 s; with 3 s, 2 s of a loaded machine broke them
    procs.worker("--lease", "15s", "--concurrency", "4")
    wait_for(lambda: all(app.get_run(r).heartbeat for r in slow), 20, what="heartbeats")

    found = as_json(cli(url, namespace, "workers", "--json"))
    [w] = found["workers"]
    assert w["queues"] == ["default"] and w["concurrency"] == 4 and w["live"] is True
    assert w["inflight"] == 2 and w["pid"] and w["last_seen_age_s"] < 10
    assert found["schedulers"] == []
    assert w["id"] in ok(cli(url, namespace, "workers"))

    held = as_json(cli(url, namespace, "leases", "--json"))
    assert sorted(x["run_id"] for x in held) == sorted(slow)
    for x in held:
        assert x["worker"] == w["id"] and x["fence"] == 1 and x["attempt"] == 1
        assert 0 < x["lease_left_s"] <= 15 and x["last_heartbeat"] and x["heartbeat_age_s"] < 15
        assert x["task"] == "aslow" and x["running_s"] >= 0 and x["cancel_requested"] is False
    text = ok(cli(url, namespace, "leases"))
    assert "LEASE LEFT" in text and slow[0] in text and w["id"] in text

    frame = as_json(cli(url, namespace, "top", "--once", "--json"))
    queues = {q["queue"]: q for q in frame["queues"]}
    assert set(queues) == {"default", "low"} and frame["workers"] == 1
    assert queues["low"]["backlog"] == 2 and queues["low"]["oldest_due_age_s"] > 0
    assert queues["default"]["running"] == 2 and queues["default"]["scheduled_later"] == 3
    assert queues["default"]["dead"] == 1 and queues["default"]["finished_per_s"] > 0
    assert queues["default"]["lateness_p50_s"] is not None and frame["dead"] == 1
    assert frame["leases"] == 2 and len(frame["unowned_partitions"]) == 16
    text = ok(cli(url, namespace, "top", "--once"))
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("QUEUE"))
    assert lines[header].split()[:3] == ["QUEUE", "BACKLOG", "OLDEST"]
    assert lines[header + 2].split()[:2] == ["low", "2"]
    assert waiting and later and dead


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_top_redraws_in_place_until_ctrl_c(app, procs, monkeypatch, sig):
    app.enqueue(basic.noop, queue="q1", delay=60)
    # a `top` that does not stop is made to print where it is (faulthandler, on SIGABRT)
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    top = procs.duetime("top", "--interval", "100ms")
    seen = bytearray()

    def read() -> None:
        while chunk := top.stdout.read1(4096):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # interrupt once it has drawn twice (a loaded machine may take a while to start it)
    wait_for(lambda: seen.count(b"\x1b[H") >= 2, 30, what="two frames of top")
    top.send_signal(sig)
    try:
        top.wait(timeout=60)  # a process stopping on a loaded machine
    except subprocess.TimeoutExpired:
        top.send_signal(signal.SIGABRT)
        top.wait(30)
        pytest.fail(f"top did not stop on {sig.name}; where it was:\n"
                    + top.stderr.read().decode(errors="replace")[-4000:])
    reader.join(5)
    out, err = bytes(seen), top.stderr.read()
    assert top.returncode == 0, err
    assert out.count(b"\x1b[H") >= 2 and b"q1" in out and b"Traceback" not in err


def test_doctor_reports_a_healthy_dev_server(app, url, namespace):
    app.store.ready()
    res = cli(url, namespace, "doctor", "--json")
    report = as_json(res)
    levels = {f["check"]: f["level"] for f in report["findings"]}
    assert report["fatal"] is False
    assert levels["server"] == levels["maxmemory-policy"] == levels["cluster"] == "ok"
    assert levels["persistence"] == "warn"  # the test servers run without AOF/RDB
    assert levels["clock"] == "ok" and levels["partitions"] == "ok"
    assert levels["schedulers"] == "warn"  # none running
    text = ok(cli(url, namespace, "doctor", "--app", "tests.apps.basic:app"))
    assert "WARN  persistence" in text and "→ for anything but development" in text
    assert text.rstrip().endswith("no fatal problems")


def test_doctor_fatal_findings_exit_non_zero(namespace):
    with EmbeddedServer("redis", extra=["--maxmemory-policy", "allkeys-lru"]) as bad:
        res = cli(bad.url, namespace, "doctor")
        assert res.exit_code == 1
        assert "FATAL maxmemory-policy" in res.stdout and "noeviction" in res.stdout
        report = cli(bad.url, namespace, "doctor", "--json")
        assert report.exit_code == 1
        body = json.loads(report.stdout)
        assert body["fatal"] is True
        assert [f["check"] for f in body["findings"] if f["level"] == "fatal"] == ["maxmemory-policy"]
        # a namespace made with another partition count than the app's
        bad_client = redis.Redis.from_url(bad.url)
        bad_client.hset(f"{namespace}:meta", mapping={"partitions": 8, "version": 1})
        res = cli(bad.url, namespace, "doctor", "--app", "tests.apps.basic:app")
        assert res.exit_code == 1 and "created with 8 partitions" in res.stdout
        bad_client.close()
    port = free_port()
    res = cli(f"redis://:hunter2@127.0.0.1:{port}/0", namespace, "doctor")
    assert res.exit_code == 1 and "FATAL connection: cannot reach Redis" in res.stdout
    assert "hunter2" not in res.stdout + res.stderr


def test_doctor_says_when_the_server_refuses_writes(namespace):
    """At maxmemory (noeviction) nothing is created, claimed or recovered: doctor says so."""
    with EmbeddedServer("redis") as full:
        client = redis.Redis.from_url(full.url)
        client.set("ballast", "x" * 100_000)
        client.config_set("maxmemory", 1)  # below what is used: writes are refused
        res = cli(full.url, namespace, "doctor", "--json")
        body = json.loads(res.stdout)
        memory = [f for f in body["findings"] if f["check"] == "memory"]
        assert res.exit_code == 1 and body["fatal"] is True
        assert memory and memory[0]["level"] == "fatal" and "refuses writes" in memory[0]["message"]
        client.config_set("maxmemory", 0)
        body = json.loads(cli(full.url, namespace, "doctor", "--json").stdout)
        assert not [f for f in body["findings"] if f["check"] == "memory"]
        client.close()


def test_usage_errors_are_one_line_with_exit_2(url, namespace):
    for args in (["runs", "show"], ["runs", "list", "--limit", "x"], ["top", "--bogus"],
                 ["nosuchcommand"], ["schedule", "add", "x", "--every", "1m"]):
        err = one_line_error(cli(url, namespace, *args), 2)
        assert "--help" in err
    p = subprocess.run([sys.executable, "-m", "duetime", "runs", "list", "--state", "nope"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: ")


@pytest.fixture
def valkey_procs(servers):
    """dev/demo start whole deployments: once, on Valkey, is enough."""
    ps = Procs(servers["valkey"].url, f"t{uuid.uuid4().hex[:10]}")
    yield ps
    ps.stop_all()


def test_dev_runs_scheduler_workers_and_samples_until_ctrl_c(valkey_procs):
    """On a real server dev cleans up after itself: the sample schedules it created go, with
    their runs not started; one that was there before it started stays."""
    from duetime.common.time.spec import Every

    from duetime import App

    keys = Keyspace(valkey_procs.namespace)
    before = App(redis_url=valkey_procs.url, namespace=valkey_procs.namespace)
    flaky = before.task(name="demo.flaky")(lambda n: n)
    before.schedule("dev.flaky-import", Every(3600), flaky, [0])
    before.close()
    dev = valkey_procs.duetime("dev", "--workers", "1", log="WARNING")
    client = redis.Redis.from_url(valkey_procs.url)
    insp = Inspector(client, keys, valkey_procs.url)
    wait_for(lambda: insp.list_runs("succeeded", schedule="dev.thumbnails").runs, 30,
             what="a sample schedule's run to succeed")
    assert [w.queues for w in insp.workers()] == [["default"]]
    dev.send_signal(signal.SIGINT)
    out, err = dev.communicate(timeout=30)
    assert dev.returncode == 0, err
    assert b"stopped" in out and b"duetime top" in out and b"Traceback" not in err
    assert b"removed the sample schedules it created (dev.thumbnails, dev.nightly-report)" in out
    wait_for(lambda: not insp.workers(), 10, what="the worker to deregister")
    after = App(redis_url=valkey_procs.url, namespace=valkey_procs.namespace)
    assert [s.name for s in after.list_schedules()] == ["dev.flaky-import"]
    assert not insp.list_runs("scheduled", schedule="dev.thumbnails").runs
    after.close()
    client.close()


def test_demo_drains_its_runs(valkey_procs):
    p = subprocess.run([sys.executable, "-m", "duetime", "--log-level", "WARNING", "demo",
                        "--runs", "30", "--workers", "1"], env=valkey_procs.env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "all 31 runs finished" in p.stdout and "a dead-lettered run" in p.stdout


def test_doctor_warns_on_a_namespace_that_does_not_exist(app, url, namespace):
    """A misspelt --namespace looks healthy and idle: doctor says it does not exist."""
    report = as_json(cli(url, namespace + "-typo", "doctor", "--json"))
    found = {f["check"]: f for f in report["findings"]}
    assert found["namespace"]["level"] == "warn" and "does not exist" in found["namespace"]["message"]
    app.store.ready()  # a namespace in use: no such warning
    report = as_json(cli(url, namespace, "doctor", "--json"))
    assert "namespace" not in {f["check"] for f in report["findings"]}
