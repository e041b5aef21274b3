"""Worker lifecycle hooks, the standard-library logging bridge, --log-level, readiness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

from duetime.embedded import free_port
from tests.apps import hooks
from tests.conftest import ROOT, wait_for


def _worker(url, namespace, marks, *extra, env_extra=None):
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "DUETIME_TEST_MARKS": str(marks), "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "INFO", "worker",
                             "--app", "tests.apps.hooks:app", *extra], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_start_and_stop_hooks_build_and_close_what_tasks_use(url, namespace, tmp_path):
    hooks.app.configure(redis_url=url, namespace=namespace)
    port = free_port()
    w = _worker(url, namespace, tmp_path, "--metrics-port", str(port))
    try:
        run_id = hooks.uses_client.enqueue()
        value = hooks.app.wait(run_id, timeout=30)
        assert value.startswith("client-for-") and (tmp_path / "started").read_text() == value
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            assert resp.status == 200 and json.loads(resp.read())["checks"]["worker"]["ok"]
        w.send_signal(signal.SIGTERM)
        w.communicate(timeout=60)
        assert (tmp_path / "stopped").read_text() == value
    finally:
        if w.poll() is None:
            w.kill()
        hooks.app.close()


def test_a_start_hook_that_raises_stops_the_worker_before_it_claims(url, namespace, tmp_path):
    hooks.app.configure(redis_url=url, namespace=namespace)
    try:
        run_id = hooks.uses_client.enqueue()
        w = _worker(url, namespace, tmp_path, env_extra={"DUETIME_TEST_BREAK_START": "1"})
        _, err = w.communicate(timeout=60)
        assert w.returncode == 1
        lines = [ln for ln in err.decode().splitlines() if ln.startswith("error:")]
        assert lines and "on_worker_start hook" in lines[0] and "payment API is down" in lines[0]
        assert "Traceback" not in err.decode()
        assert hooks.app.get_run(run_id).state == "scheduled"  # nothing was claimed
    finally:
        hooks.app.close()


def test_stdlib_logging_inside_a_task_carries_the_run(url, namespace, tmp_path):
    hooks.app.configure(redis_url=url, namespace=namespace)
    w = _worker(url, namespace, tmp_path)
    try:
        run_id = hooks.logs_stdlib.enqueue("card-7")
        wait_for(lambda: hooks.app.get_run(run_id).state == "succeeded", 30)
        w.send_signal(signal.SIGTERM)
        _, err = w.communicate(timeout=60)
    finally:
        if w.poll() is None:
            w.kill()
        hooks.app.close()
    lines = [json.loads(ln) for ln in err.decode().splitlines() if ln.startswith("{")]
    [line] = [ln for ln in lines if ln.get("event") == "charging card-7"]
    assert line["logger"] == "myproject.billing" and line["level"] == "warning"
    assert (line["run_id"], line["task"], line["attempt"]) == (run_id, "logs_stdlib", 1)


def test_a_bad_log_level_is_one_error_line():
    p = subprocess.run([sys.executable, "-m", "duetime", "--log-level", "bogus", "keys"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.startswith("error:") and "bogus" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
