"""A Redis restart under a running worker, and a worker started before its server: the worker
re-reads its queue heads whenever its wake subscription (re)connects, so a run enqueued right
after the restart (its notice sent before the worker was subscribed again) is served without
waiting for the periodic refresh; a worker whose server is not up yet waits for it."""

from __future__ import annotations

import asyncio
import time

from duetime.embedded import EmbeddedServer, free_port
from tests.apps import basic
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
