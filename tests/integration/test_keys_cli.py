"""`duetime keys` against the real `redis-cli`: every documented key type is where, and of the
type, the command says, and the printed redis-cli lines run as they are."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from datetime import timedelta

import pytest

import duetime
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.opkit import Driver, as_json, cli, ok

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
pytestmark = pytest.mark.skipif(not shutil.which("redis-cli"), reason="redis-cli not installed")


def redis_cli(url: str, *command: str) -> str:
    p = subprocess.run([REDIS_CLI, "-u", url, *command], capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.decode(errors="replace")  # payloads are msgpack


def test_every_documented_key_is_readable_with_redis_cli(app, url, namespace, procs):
    d = Driver(app)
    d.dead(basic.fatal, 1)
    d.uncertain(basic.nonidem, 1)
    d.succeeded(basic.noop, 1)
    app.enqueue(basic.always_fails)
    [(p, c)] = d.claim_all()
    d.fail(p, c, mode="retry", delay_ms=3_600_000)  # retrying, due in an hour
    app.enqueue(basic.noop, delay=3600)  # scheduled
    app.schedule("keys-demo", duetime.Every(timedelta(hours=1)), basic.aslow, args=[30],
                 overlap="skip")
    running = app.trigger("keys-demo")
    procs.duetime("scheduler")
    procs.worker("--lease", "5s")
    wait_for(lambda: app.get_run(running).state == "running", 20, what="a running scheduled run")
    wait_for(lambda: app.store.client.hlen(app.keys.owners) > 1, 20, what="a partition owned")

    doc = as_json(cli(url, namespace, "keys", "--json"))
    assert doc["namespace"] == namespace and doc["partitions"] == 16
    assert doc["prefixes"][0] == app.keys.prefix(0)
    entries = {e["pattern"]: e for e in doc["keys"]}
    core = {"T:due:<queue>", "T:retry:<queue>", "T:leases", "T:run:<run>",
            "T:attempts:<run>", "T:scheds", "T:sched_due",
            "T:sched_running:<name>", "T:dead", "T:uncertain", "T:done", "T:events",
            f"{namespace}:meta", f"{namespace}:queues", f"{namespace}:workers",
            f"{namespace}:worker:<worker>", f"{namespace}:owners", f"{namespace}:wake"}
    # a schedule is one field of T:scheds; its side hash T:sched:<name> exists only while it
    # holds something (a pause note, counters: none here) and T:schedules only for schedules
    # written before the packed layout (docs/keys.md)
    live = {p for p, e in entries.items() if e["live"]}
    assert core <= live, core - live
    for e in entries.values():
        if not e["live"]:
            continue
        if e["type"] != "channel":
            assert redis_cli(url, "TYPE", e["example"]).strip() == e["type"], e
        out = redis_cli(url, *e["command"])
        assert out.strip(), e  # the command shows the live key's content
        assert e["redis_cli"] == shlex.join(["redis-cli", "-u", url, *e["command"]])
    # what the layout says holds, holds: the leases zset holds the running run, scored with
    # its expiry (the lease itself; the run record names the holder) ...
    assert "lease:<run>" not in " ".join(entries)  # the lease exists once
    leases = redis_cli(url, *entries["T:leases"]["command"]).split()
    assert running in leases
    expiry = int(float(leases[leases.index(running) + 1]))
    assert expiry > int(redis_cli(url, "TIME").split()[0]) * 1000
    rp = app.keys.partition_of_run(running)
    assert redis_cli(url, "HGET", app.keys.run(rp, running), "worker").strip() == app.get_run(running).worker
    # ... the running set of the schedule holds the run, the wake channel has a subscriber
    assert redis_cli(url, *entries["T:sched_running:<name>"]["command"]).strip() == running
    assert redis_cli(url, *entries[f"{namespace}:wake"]["command"]).split()[-1] != "0"
    assert redis_cli(url, "HGET", f"{namespace}:meta", "partitions").strip() == "16"

    # the text form prints runnable redis-cli lines
    text = ok(cli(url, namespace, "keys"))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("redis-cli ")]
    assert len(lines) == len(entries)
    for line in lines:
        if "# (no such key" in line:
            continue
        p = subprocess.run(["bash", "-c", line], capture_output=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin"})
        assert p.returncode == 0 and p.stdout.strip(), (line, p.stderr)

    # and a run's own keys
    key = ok(cli(url, namespace, "keys", "--run", running)).strip()
    assert redis_cli(url, "HGET", key, "state").strip() == "running"
    assert as_json(cli(url, namespace, "keys", "--run", running, "--json"))["leases"] == app.keys.leases(rp)
