"""A Redis restart under a running worker, and a worker started before its server: the worker
re-reads its queue heads whenever its wake subscription (re)connects, so a run enqueued right
after the restart (its notice sent before the worker was subscribed again) is served without
waiting for the periodic refresh; a worker whose server is not up yet waits for it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from duetime.embedded import EmbeddedServer, free_port
from tests.apps import basic
from tests.conftest import ROOT, Procs, wait_for
from tests.integration.inproc import serving, until

OUTAGE_S = 8.0  # the outage of the report: long enough for every loop's back-off to grow
REFRESH_S = 600.0  # the safety-net refresh never comes within the test


def test_a_worker_that_rode_out_a_restart_serves_a_run_enqueued_right_after(namespace):
    server = EmbeddedServer("redis", port=free_port(),
                            extra=["--appendonly", "yes", "--appendfsync", "always"]).start()
    app = basic.app
    app.configure(redis_url=server.url, namespace=namespace)

    async def main() -> None:
        async with serving(app, refresh_s=REFRESH_S, lease_ms=3000) as w:
            first = await asyncio.to_thread(app.enqueue, basic.noop)
            await until(lambda: app.get_run(first).state == "succeeded", 30, what="a first run")
            server.stop()  # graceful: SIGTERM, the AOF is flushed
            await asyncio.sleep(OUTAGE_S)
            server.start()
            app.close()  # its pooled connections died with the server
            second = await asyncio.to_thread(app.enqueue, basic.noop)
            await until(lambda: app.get_run(second).state == "succeeded", 60,
                        interval=0.1, what="the run enqueued right after the restart")
            assert app.get_run(first).state == "succeeded"  # the AOF kept it
            assert w.processed == 2

    try:
        asyncio.run(main())
    finally:
        app.close()
        server.stop()


def _readyz(port: int) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def test_a_worker_started_before_its_server_waits_for_it_then_serves(namespace, tmp_path):
    """A crash loop in Kubernetes otherwise: the worker waits, unready on /readyz and saying
    so once per back-off step, and serves as soon as the server is up."""
    port, metrics_port = free_port(), free_port()
    server = EmbeddedServer("redis", port=port)
    procs = Procs(server.url, namespace)
    log = tmp_path / "worker.log"
    env = procs.env()
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "duetime", "--log-level", "INFO", "worker", "--app",
             "tests.apps.basic:app", "--metrics-port", str(metrics_port)],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: log.read_text().count("redis not up yet; waiting") >= 2, 30,
                 what="the worker to say it waits, step by step")
        status, body = _readyz(metrics_port)
        assert status == 503 and body["checks"]["redis"]["ok"] is False, body
        assert body["checks"]["redis"]["reason"].startswith("waiting for Redis at"), body
        assert worker.poll() is None
        server.start()
        basic.app.configure(redis_url=server.url, namespace=namespace)
        run_id = basic.app.enqueue(basic.noop)
        wait_for(lambda: basic.app.get_run(run_id).state == "succeeded", 60,
                 what="the run, once the server is up")
        wait_for(lambda: _readyz(metrics_port)[0] == 200, 30, what="ready")
        waits = [json.loads(x) for x in log.read_text().splitlines() if "redis not up yet" in x]
        assert all(w["tries"] == i + 1 for i, w in enumerate(waits))  # one line per step
    finally:
        worker.kill()
        worker.wait()
        basic.app.close()
        server.stop()


def test_a_worker_whose_password_is_refused_exits_1_with_one_line():
    """Bad configuration is not worth waiting for."""
    with EmbeddedServer("redis") as server:  # no such user: WRONGPASS
        p = subprocess.run(
            [sys.executable, "-m", "duetime", "--redis-url",
             f"redis://nobody:hunter2@127.0.0.1:{server.port}/0", "worker", "--app",
             "tests.apps.basic:app"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and "Traceback" not in p.stderr, lines
    assert "hunter2" not in p.stderr + p.stdout
