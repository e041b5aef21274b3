"""What a graceful shutdown says about the runs it could not finish: a non-idempotent run
release.lua leaves `uncertain` is logged with its run id, so an operator can find it."""

from __future__ import annotations

import asyncio

from tests.apps import basic
from tests.integration.inproc import record_logs, serving, until


def test_a_shutdown_that_leaves_a_run_uncertain_logs_its_run_id(app, monkeypatch):
    logs = record_logs(monkeypatch)

    async def main() -> str:
        async with serving(app, grace_s=0.0) as w:
            run_id = app.enqueue(basic.nonidem, [3.0])
            await until(lambda: app.get_run(run_id).state == "running"
                        and any(ex.in_body for ex in w.inflight.values()), 30,
                        what="the non-idempotent run in its body")
        return run_id

    run_id = asyncio.run(main())
    assert app.get_run(run_id).state == "uncertain"
    lines = logs.events("run left uncertain by worker shutdown")
    assert [(e["run_id"], e["task"], e["state"]) for e in lines] == [(run_id, "nonidem",
                                                                       "uncertain")]
    assert "not idempotent" in lines[0]["reason"]
    assert lines[0]["worker_id"]
