"""/healthz and /readyz on the metrics port: what an orchestrator's probes see, from the
registry up to a real scheduler whose Redis goes away and comes back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from duetime.common.errors import DuetimeError
from duetime.common.health import Health
from duetime.common.metrics import serve

from duetime.embedded import EmbeddedServer, free_port
from tests.conftest import ROOT, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    """(status, body) of one probe; the body must be one line of JSON."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode()
    assert text.endswith("\n") and text.count("\n") == 1, text
    return status, json.loads(text)


def status_of(port: int, path: str) -> int | None:
    try:
        return get(port, path)[0]
    except (OSError, ValueError):
        return None


def test_liveness_fails_only_when_a_loop_stops_going_round():
    clock = Clock()
    h = Health(clock)
    assert h.liveness().ok  # nothing reported yet: the process answers, nothing is stuck
    h.beat("evaluator", within_s=10)
    h.beat("reaper", within_s=60)
    clock.now += 9
    assert h.liveness().ok
    clock.now += 2
    v = h.liveness()
    assert not v.ok and v.http_status == 503 and v.status == "stuck"
    assert v.checks["evaluator"] == {"ok": False, "silent_s": 11.0}
    assert v.checks["reaper"]["ok"] is True
    h.beat("evaluator", within_s=10)
    assert h.liveness().ok


def test_readiness_needs_a_report_every_part_ok_and_no_stuck_loop():
    clock = Clock()
    h = Health(clock)
    v = h.readiness()
    assert not v.ok and v.status == "starting"
    h.ready("evaluator")
    h.ready("reaper")
    assert h.readiness().ok
    h.ready("reaper", False, "cannot reach Redis at redis://127.0.0.1:1/0\nTraceback ...")
    v = h.readiness()
    assert not v.ok and v.status == "unready"
    assert v.checks["reaper"] == {"ok": False, "reason": "cannot reach Redis at redis://127.0.0.1:1/0"}
    h.ready("reaper")
    h.beat("evaluator", within_s=5)
    clock.now += 6
    v = h.readiness()
    assert not v.ok and v.checks["evaluator"]["reason"] == "loop silent for 6.0s"
    h.forget("evaluator")
    assert h.readiness().ok


def test_a_process_is_not_ready_until_every_expected_part_reported_ready():
    """A scheduler whose evaluator is up but whose reaper has not reported yet is starting."""
    h = Health(Clock())
    h.expect("evaluator")
    h.expect("reaper")
    h.ready("evaluator")
    v = h.readiness()
    assert not v.ok and v.checks["reaper"] == {"ok": False, "reason": "starting"}
    h.ready("reaper")
    h.expect("reaper")  # expecting again does not undo a report
    assert h.readiness().ok


def test_probes_are_served_beside_metrics():
    h = Health()
    port = free_port()
    httpd = serve(port, "127.0.0.1", probes=h)
    assert httpd is not None
    try:
        assert get(port, "/healthz") == (200, {"status": "ok", "checks": {}})
        assert get(port, "/readyz") == (503, {"status": "starting", "checks": {}})
        h.beat("loop")
        h.ready("loop")
        assert get(port, "/readyz") == (200, {"status": "ok", "checks": {"loop": {"ok": True}}})
        h.ready("loop", False, "redis refused a call: OOM")
        status, body = get(port, "/readyz")
        assert status == 503
        assert body["checks"] == {"loop": {"ok": False, "reason": "redis refused a call: OOM"}}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
            assert b"# TYPE duetime_queue_backlog gauge" in resp.read()
        with pytest.raises(DuetimeError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve(port, "127.0.0.1", probes=h)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert serve(None) is None


def all_unready(port: int) -> bool:
    try:
        status, body = get(port, "/readyz")
    except (OSError, ValueError):
        return False
    return status == 503 and not any(c["ok"] for c in body["checks"].values())  # type: ignore[union-attr]


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, to stop and start again."""
    with EmbeddedServer("redis") as s:
        yield s


def _start(server: EmbeddedServer, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DUETIME_REDIS_URL": server.url, "DUETIME_NAMESPACE": f"probe{os.getpid()}",
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", *args],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_a_real_scheduler_and_reaper_are_ready_then_unready_while_redis_is_down(own_server: EmbeddedServer):
    sched_port, reaper_port = free_port(), free_port()
    procs = [_start(own_server, "scheduler", "--metrics-port", str(sched_port)),
             _start(own_server, "reaper", "--tick", "100ms", "--metrics-port", str(reaper_port))]
    try:
        for port, parts in ((sched_port, {"evaluator", "reaper"}), (reaper_port, {"reaper"})):
            wait_for(lambda port=port: status_of(port, "/readyz") == 200, 20, what="ready")
            status, body = get(port, "/readyz")
            assert set(body["checks"]) == parts, body
            status, body = get(port, "/healthz")
            assert status == 200 and set(body["checks"]) == parts, body

        own_server.kill()
        for port in (sched_port, reaper_port):
            wait_for(lambda port=port: all_unready(port), 20, what="every part unready")
            status, body = get(port, "/readyz")
            assert status == 503 and body["status"] == "unready"
            for check in body["checks"].values():
                assert str(check["reason"]).startswith("cannot reach Redis at redis://127.0.0.1:"), body
            # an outage is not a reason to restart the process: it stays live, and retries
            assert get(port, "/healthz")[0] == 200

        own_server.start()
        for port in (sched_port, reaper_port):
            wait_for(lambda port=port: status_of(port, "/readyz") == 200, 30, what="ready again")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            _, err = p.communicate(timeout=30)
            assert p.returncode == 0, err.decode()[-2000:]


def test_a_metrics_port_in_use_is_one_error_line(own_server: EmbeddedServer):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = _start(own_server, "scheduler", "--metrics-port", str(port))
        _, err = p.communicate(timeout=30)
    lines = err.decode().strip().splitlines()
    assert p.returncode == 1
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot serve metrics on 127.0.0.1:{port}"), lines
