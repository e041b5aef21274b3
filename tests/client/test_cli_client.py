"""The CLI as a client: enqueue by name without --app, wait for a run's result, and global
options after the subcommand."""

from __future__ import annotations

import json
import subprocess
import sys

from duetime.cli.common import hoist_global_options
from tests.apps import basic
from tests.conftest import ROOT
from tests.integration.inproc import burst


def duetime(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "duetime", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_global_options_are_accepted_after_the_subcommand():
    assert hoist_global_options(["runs", "list", "--redis-url", "U", "--state", "dead"]) == [
        "--redis-url", "U", "runs", "list", "--state", "dead"]
    assert hoist_global_options(["--json", "runs", "list", "--namespace=n"]) == [
        "--namespace=n", "runs", "list", "--json"]
    assert hoist_global_options(["enqueue", "t", "--args", "[1]", "--", "--namespace"]) == [
        "enqueue", "t", "--args", "[1]", "--", "--namespace"]


def test_enqueue_by_name_without_app_then_wait_for_the_result(app, url, namespace):
    """A producer with no task code (`duetime enqueue NAME` without --app) and `runs wait`."""
    out = duetime("enqueue", "noop", "--args", "[3]", "--redis-url", url, "--namespace",
                  namespace, "--allow-unknown")  # no worker has published it yet
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    assert app.get_run(run_id).task == "noop"
    burst(app)
    waited = duetime("runs", "wait", run_id, "--timeout", "30s", "--json", "--redis-url", url,
                     "--namespace", namespace)
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout) == {"id": run_id, "state": "succeeded", "result": None,
                                         "error": None}
    dead = app.enqueue(basic.fatal)
    burst(app)
    assert app.get_run(dead).state == "dead"
    waited = duetime("--redis-url", url, "--namespace", namespace, "runs", "wait", dead)
    assert waited.returncode == 1 and waited.stdout.strip() == "dead"


def test_without_a_url_the_cli_says_which_server_it_reads(namespace, monkeypatch):
    monkeypatch.delenv("DUETIME_REDIS_URL", raising=False)
    out = subprocess.run([sys.executable, "-m", "duetime", "--namespace", namespace, "runs",
                          "list"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={k: v for k, v in __import__("os").environ.items()
                              if k != "DUETIME_REDIS_URL"})
    assert "note: no --redis-url or DUETIME_REDIS_URL given: using redis://127.0.0.1:6379/0" \
        in out.stderr


def test_enqueue_of_a_name_no_worker_published_exits_1_and_writes_nothing(url, namespace, r):
    """A typo (`demo.resze`) is refused at once with one error line, not dead-lettered later;
    --allow-unknown enqueues it all the same."""
    out = duetime("enqueue", "demo.resze", "--redis-url", url, "--namespace", namespace)
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown task 'demo.resze'"), lines
    assert r.keys(f"{namespace}:*") == [] or all(b"run" not in k for k in r.keys(f"{namespace}:*"))
    out = duetime("enqueue", "demo.resze", "--allow-unknown", "--redis-url", url, "--namespace",
                  namespace)
    assert out.returncode == 0, out.stderr
