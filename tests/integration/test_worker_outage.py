"""Redis goes away under an idle worker: every loop backs off (no spinning, no log flood),
logs the outage once and the recovery with a count, and the worker runs new work after the
server is back on the same port."""

from __future__ import annotations

import json
import os
import time

from duetime.embedded import EmbeddedServer
from tests.apps import basic
from tests.conftest import Procs, wait_for


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_worker_backs_off_while_redis_is_down_and_recovers(namespace):
    server = EmbeddedServer("redis").start()
    procs = Procs(server.url, namespace)
    try:
        basic.app.configure(redis_url=server.url, namespace=namespace)
        worker = procs.duetime("worker", "--app", "tests.apps.basic:app", "--lease", "3s",
                               log="INFO")
        first = basic.app.enqueue(basic.noop)
        wait_for(lambda: basic.app.get_run(first).state == "succeeded", 20, what="a first run")
        server.kill()
        time.sleep(0.5)  # the loops find out
        cpu0, t0 = cpu_seconds(worker.pid), time.monotonic()
        time.sleep(6.0)  # longer than the claim loop's 5 s refresh: every loop tries Redis
        cpu = cpu_seconds(worker.pid) - cpu0
        down_s = time.monotonic() - t0
        assert cpu < 0.25 * down_s, f"{cpu:.2f}s of CPU in {down_s:.1f}s with Redis down"
        server.start()
        basic.app.close()  # its connections died with the server
        second = basic.app.enqueue(basic.anoop)
        wait_for(lambda: basic.app.get_run(second).state == "succeeded", 30,
                 what="a run after Redis came back")
        time.sleep(2.5)  # every loop's back-off (at most 2 s) ends: each makes its next call
        assert worker.poll() is None
        worker.terminate()
        err = worker.communicate(timeout=30)[1].decode()
        lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
        down = [x for x in lines if x["event"] == "redis unavailable; backing off"]
        back = [x for x in lines if x["event"] == "redis available again"]
        # one line per loop and incident (claim loop, wake listener, heartbeat, reporter)
        said = [(x["loop"], x["error"], x["timestamp"]) for x in down + back if "error" in x]
        assert 1 <= len(down) <= 8, said
        assert len({x["loop"] for x in down}) == len(down), said  # no loop said it twice
        assert {x["loop"] for x in back} == {x["loop"] for x in down}  # each incident closed
        assert len(back) == len(down)
        assert all(x["failures"] >= 1 and x["outage_s"] >= 0 for x in back), back
        assert len(lines) < 40, err[-3000:]  # and nothing else flooded the log
    finally:
        procs.stop_all()
        basic.app.close()
        server.stop()
