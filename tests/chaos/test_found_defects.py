"""Defects outside the worker the chaos harness found, each with the test that shows it (the
fixes are in the same commits)."""

from __future__ import annotations

import redis

from duetime.embedded import EmbeddedServer
from tests.apps import chaos as chaos_app
from tests.conftest import Procs, wait_for


def test_a_worker_started_while_the_server_refuses_writes_starts(
        servers: dict[str, EmbeddedServer], namespace: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Seen in the chaos run: a worker restarted during an OOM episode exited at once with
    "error: redis: command not allowed when used memory > 'maxmemory'" -- its start-up records
    the queue names (bookkeeping for `top`), a write the server refuses at maxmemory. Workers
    must start then (docs/states.md: at maxmemory heartbeats go on; nothing is lost)."""
    server = servers["redis"]
    admin = redis.Redis(port=server.port)
    app = chaos_app.app
    app.configure(redis_url=server.url, namespace=namespace)
    app.store.ready()  # the namespace exists (meta), as in a running deployment
    procs = Procs(server.url, namespace)
    procs_env = procs.env
    procs.env = lambda: {**procs_env(), "DUETIME_CHAOS_JOURNAL": str(tmp_path)}  # type: ignore[method-assign]
    try:
        admin.config_set("maxmemory", max(1, int(admin.info("memory")["used_memory"]) // 2))
        w = procs.worker(app="tests.apps.chaos:app")
        # the worker is through its start-up once it listens on its wake channel (SUBSCRIBE
        # comes after "worker started"): an event to wait for, where a pause proved nothing
        wait_for(lambda: admin.pubsub_channels(app.keys.wake_channel) or w.poll() is not None, 30,
                 what="the worker to subscribe to its wake channel")
        assert w.poll() is None, (w.stderr.read().decode() if w.stderr else "")
        admin.config_set("maxmemory", 0)
        run_id = chaos_app.quick.enqueue(0.0)
        wait_for(lambda: app.get_run(run_id).state == "succeeded", 20, what="the run")
    finally:
        admin.config_set("maxmemory", 0)
        procs.stop_all()
        admin.close()
        app.close()
