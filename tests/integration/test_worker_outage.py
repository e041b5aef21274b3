"""Redis goes away under an idle worker: every loop backs off (no spinning, no log flood),
logs the outage once and the recovery with a count, and the worker runs new work after the
server is back on the same port.

The worker runs in this process (its loops' logs recorded); the test waits for each event
(the loops saying the server is gone, then back) instead of sleeping through windows. The CPU
an idle worker spends while the server is down is measured by `bench/chaos.py --idle-cpu`."""

from __future__ import annotations

import asyncio

from duetime.embedded import EmbeddedServer
from tests.apps import basic
from tests.integration.inproc import record_logs, serving, until

DOWN, BACK = "redis unavailable; backing off", "redis available again"


def test_an_idle_worker_backs_off_while_redis_is_down_and_recovers(namespace, monkeypatch):
    server = EmbeddedServer("redis").start()
    app = basic.app
    rec = record_logs(monkeypatch)

    def said(event: str) -> list[dict]:
        return [f for _, e, f in rec.lines if e == event]

    def loops(event: str) -> set[str]:
        return {f["loop"] for f in said(event)}

    async def main() -> None:
        # refresh_s 0.5: the claim loop, too, calls Redis while it is down
        async with serving(app, lease_ms=3000, refresh_s=0.5):
            first = app.enqueue(basic.noop)
            await until(lambda: app.get_run(first).state == "succeeded", 20, what="a first run")
            server.kill()
            await until(lambda: {"claim loop", "wake listener"} <= loops(DOWN), 20,
                        what="the claim loop and the wake listener to see Redis gone")
            server.start()
            app.close()  # its connections died with the server
            basic.r.clear()  # so did the tasks' own client's
            second = app.enqueue(basic.anoop)
            await until(lambda: app.get_run(second).state == "succeeded", 30,
                        what="a run after Redis came back")
            # every loop that said so makes its next call once its back-off ends, and says so
            await until(lambda: loops(BACK) == loops(DOWN), 20, what="each incident closed")

    try:
        app.configure(redis_url=server.url, namespace=namespace)
        asyncio.run(main())
    finally:
        app.close()
        basic.r.clear()
        server.stop()
    down, back = said(DOWN), said(BACK)
    # one line per loop and incident (claim loop, wake listener, heartbeat, reporter)
    summary = [(e, f.get("loop"), f.get("error"), f.get("failures")) for _, e, f in rec.lines
               if e in (DOWN, BACK)]
    assert 1 <= len(down) <= 8, summary
    assert len(loops(DOWN)) == len(down), summary  # no loop said it twice
    assert loops(BACK) == loops(DOWN)  # each incident closed
    assert len(back) == len(down)
    assert all(x["failures"] >= 1 and x["outage_s"] >= 0 for x in back), back
    # backed off, not spinning: tries doubling from 0.1 s (drawn from the upper half of each
    # wait) come to a few per second of outage, a spinning loop to thousands
    assert all(x["failures"] <= 5 + 20 * x["outage_s"] for x in back), back
    info = [(lv, e) for lv, e, _ in rec.lines if lv != "debug"]
    assert len(info) < 40, info  # and nothing else flooded the log
