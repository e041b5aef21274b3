"""`duetime worker --reload`: the worker is replaced when the code it runs changes, a syntax
error in the file being edited does not end the loop, and stopping the reloader stops its
worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import duetime
from duetime.cli.reload import child_argv
from tests.conftest import ROOT, wait_for

JOBS = '''
import duetime

app = duetime.App()


@app.task(name="reload.version")
def version() -> str:
    return "{v}"
'''


def test_the_child_gets_the_command_line_without_the_reload_options():
    argv = ["--log-level", "INFO", "worker", "--app", "j:app", "--reload", "--reload-dir", "src",
            "--reload-dir=lib", "--concurrency", "4"]
    assert child_argv(argv) == [sys.executable, "-m", "duetime", "--log-level", "INFO",
                                "worker", "--app", "j:app", "--concurrency", "4"]


def _result(app: duetime.App) -> str:
    run_id = app.enqueue("reload.version", allow_unknown=True)
    return str(app.wait(run_id, timeout=30))


@pytest.mark.slow
def test_a_changed_module_is_served_by_a_new_worker(url: str, namespace: str, tmp_path: Path):
    pytest.importorskip("watchfiles")
    (tmp_path / "jobs.py").write_text(JOBS.format(v="v1"))
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT)}
    log_path = tmp_path / "reloader.log"
    log_file = log_path.open("wb")
    reloader = subprocess.Popen(
        [sys.executable, "-m", "duetime", "--log-level", "INFO", "worker", "--app", "jobs:app",
         "--grace", "2s", "--reload", "--reload-dir", str(tmp_path)],
        cwd=tmp_path, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    app = duetime.App(redis_url=url, namespace=namespace)
    try:
        assert _result(app) == "v1"
        (tmp_path / "jobs.py").write_text(JOBS.format(v="v2"))
        wait_for(lambda: _result(app) == "v2", 60, interval=0.2, what="the new code to be served")
        # a syntax error while editing: the worker exits, the reloader waits for the next change
        (tmp_path / "jobs.py").write_text("def broken(:\n")
        wait_for(lambda: "worker exited; it starts again at the next change" in log_path.read_text(),
                 60, what="the worker to fail on the broken module")
        (tmp_path / "jobs.py").write_text(JOBS.format(v="v3"))
        wait_for(lambda: _result(app) == "v3", 60, interval=0.2, what="the fixed code to be served")
        assert reloader.poll() is None  # the loop outlived the broken file
    finally:
        reloader.send_signal(signal.SIGTERM)
        try:
            reloader.wait(timeout=30)
        except subprocess.TimeoutExpired:
            reloader.kill()
            reloader.wait()
        log_file.close()
        app.close()
    text = log_path.read_text(errors="replace")
    assert reloader.returncode == 0, text[-3000:]
    assert text.count("change detected: restarting the worker") >= 3, text[-3000:]
    # the reloader stopped its last worker: no worker of this namespace is left running
    insp_app = duetime.App(redis_url=url, namespace=namespace)
    from duetime.ops.inspect import Inspector

    insp = Inspector(insp_app.store.client, insp_app.keys, url)
    wait_for(lambda: not [w for w in insp.workers() if w.live], 30, what="the workers to stop")
    insp_app.close()


@pytest.mark.slow
def test_dev_runs_your_app_with_a_scheduler_and_reloading_workers(url: str, namespace: str,
                                                                  tmp_path: Path):
    pytest.importorskip("watchfiles")
    (tmp_path / "jobs.py").write_text(JOBS.format(v="v1") + '''
from datetime import timedelta
app.schedule("reload.often", duetime.Every(timedelta(seconds=1)), version)
''')
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT)}
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log_file:
        dev = subprocess.Popen([sys.executable, "-m", "duetime", "dev", "--app", "jobs:app",
                                "--workers", "1"], cwd=tmp_path, env=env, stdout=log_file,
                               stderr=subprocess.STDOUT)
        app = duetime.App(redis_url=url, namespace=namespace)
        try:
            assert _result(app) == "v1"
            # its scheduler fires the schedule the app declares at import
            from duetime.ops.inspect import Inspector

            insp = Inspector(app.store.client, app.keys, url)
            wait_for(lambda: insp.list_runs("succeeded", schedule="reload.often").runs, 60,
                     what="a run of the app's own schedule")
            (tmp_path / "jobs.py").write_text(JOBS.format(v="v2"))
            wait_for(lambda: _result(app) == "v2", 60, interval=0.2, what="the new code")
        finally:
            dev.send_signal(signal.SIGINT)
            try:
                dev.wait(timeout=40)
            except subprocess.TimeoutExpired:
                dev.kill()
                dev.wait()
            app.close()
    text = log_path.read_text(errors="replace")
    assert dev.returncode == 0, text[-3000:]
    assert "worker process(es) of jobs:app (restarted on code changes)" in text
    assert "schedule dev." not in text  # no demo samples beside your app
