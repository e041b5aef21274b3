"""`duetime workers` (Inspector.workers) counts a worker's processed runs as they finish: the
count goes to the worker's record with the reports that recorded them, not a heartbeat later."""

from __future__ import annotations

import asyncio

from duetime.ops.inspect import Inspector
from tests.apps import basic
from tests.integration.inproc import serving, until

N = 30


def test_processed_counts_finished_runs_without_waiting_for_a_heartbeat(app, r):
    insp = Inspector(app.store.client, app.keys, app.redis_url)

    def processed(worker_id: str) -> int | None:
        return next((w.processed for w in insp.workers() if w.id == worker_id), None)

    async def main() -> None:
        # a lease of ten minutes: the heartbeat after the first is 200 s away
        async with serving(app, lease_ms=600_000) as w:
            await until(lambda: processed(w.id) == 0, 30, what="the worker's first heartbeat")
            ids = app.enqueue_many([(basic.anoop, [i]) for i in range(N)])

            def counted() -> bool:
                return (all(app.get_run(i).state == "succeeded" for i in ids)
                        and processed(w.id) == N)
            await until(counted, 30, what=f"{N} runs succeeded and counted as processed")

    asyncio.run(main())
