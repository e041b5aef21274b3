"""The worker's event loop held past the reply timeout while a claim's reply is on its way
(what a task body that makes a sync call in an `async def` does to it): the claim keeps its
reply (common/loops.py `HeldLoopTimer`), so no run is left leased to no one. Before, every
read in flight timed out when the loop came back and its reply was dropped with the
connection: the claimed batch sat leased until its lease ran out, and the burst below ended
with runs still `running`.

The hold is injected right after a claim is written, so the reply is in flight every time;
the loop is held with `time.sleep` on purpose: that is the fault under test."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from duetime.common import connection, scripts
from duetime.common.loops import HELD_LOOP_S

from tests.apps import basic
from tests.integration.inproc import burst

TIMEOUT_S = 0.3  # the worker's reply timeout, made short so that a hold outlasts it
HOLD_S = TIMEOUT_S + HELD_LOOP_S + 0.4  # and a timer fires later than a merely busy loop's
HOLD_AFTER_CLAIMS = (2, 5)  # the claims after whose sending the loop is held


def test_a_loop_held_past_the_reply_timeout_loses_no_claim(app, r, monkeypatch):
    monkeypatch.setattr(connection, "REPLY_TIMEOUT_S", TIMEOUT_S)
    claim_sha = scripts.sha("claim").encode()
    claims, holds = 0, []
    send = connection._FastConnection.send_packed_command

    async def send_then_hold(self: Any, command: Any, check_health: bool = True) -> None:
        nonlocal claims
        await send(self, command, check_health)
        if any(claim_sha in part for part in command):
            claims += 1
            if claims in HOLD_AFTER_CLAIMS:  # the next step, before the reply is read
                asyncio.get_running_loop().call_soon(time.sleep, HOLD_S)
                holds.append(claims)

    monkeypatch.setattr(connection._FastConnection, "send_packed_command", send_then_hold)
    runs = app.enqueue_many([(basic.anoop, [i]) for i in range(200)])
    worker = burst(app, concurrency=16, lease_ms=30_000)
    assert holds == list(HOLD_AFTER_CLAIMS)  # the loop was held with claims in flight
    states = {i: app.get_run(i).state for i in runs}
    assert [i for i, s in states.items() if s != "succeeded"] == []
    counts = {k.decode(): int(v) for k, v in r.hgetall(basic.count_key()).items()}
    assert all(counts.get(i) == 1 for i in runs)  # each body ran once
    assert worker.executor.processed == len(runs)
