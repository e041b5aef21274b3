"""A worker stops even when the cancellation of one of its background loops (wake listener,
heartbeat, task publisher) is lost in a Redis call.

On Python 3.11 `asyncio.wait_for`, through which redis-py sends every command of a client with
a socket timeout, returns the call's result instead of raising CancelledError when the
cancellation meets a send that just finished (tests/unit/test_worker_loops.py shows it). The
window is a loop step or two, so in the suite it was rare: an in-process worker that did not
stop within 60 s (the wake listener went on listening, the publisher on publishing every 30 s).
Here the call the loop is in when the worker stops loses the cancellation every time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio.client
from duetime.worker import unknown

from tests.apps import basic
from tests.integration.inproc import reaper_thread, record_logs, serving, until


class LostCancellation:
    """Wraps a Redis call of a worker loop. Once armed, the next call holds until its task is
    cancelled and then returns None, as if the cancellation had not reached it (what
    asyncio.wait_for does on Python 3.11 when it meets a finished send); later calls are the
    real ones again."""

    def __init__(self) -> None:
        self.armed = False
        self.held = asyncio.Event()  # a call holds, waiting for the cancellation
        self.lost = 0  # cancellations the wrapped call swallowed

    def wrap(self, real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if not self.armed:
                return await real(*args, **kwargs)
            self.armed = False
            self.held.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.lost += 1
            return None

        return call


@pytest.mark.parametrize("loop", ["wake", "heartbeat", "task-seen"])
def test_a_background_loop_whose_cancellation_a_call_swallowed_still_ends(app, monkeypatch,
                                                                          loop):
    monkeypatch.setattr(unknown, "SEEN_EVERY_S", 0.05)  # the publisher calls Redis meanwhile
    lost = LostCancellation()
    if loop == "wake":  # the listener's pubsub is made in its loop: its class is patched
        monkeypatch.setattr(redis.asyncio.client.PubSub, "get_message",
                            lost.wrap(redis.asyncio.client.PubSub.get_message))

    async def main() -> None:
        # a 30 s lease: a heartbeat's own timeout (10 s) does not cut the held call first
        async with serving(app, lease_ms=30000) as w:
            if loop == "heartbeat":
                w.leases.beat = lost.wrap(w.leases.beat)  # type: ignore[method-assign]
            elif loop == "task-seen":
                w.unknown.publish = lost.wrap(w.unknown.publish)  # type: ignore[method-assign]
            lost.armed = True
            await asyncio.wait_for(lost.held.wait(), 30)
        # serving() stopped the worker and waited for its run() to end (60 s at most)

    asyncio.run(main())
    assert lost.lost == 1  # the stop's cancellation was swallowed, and the loop ended


def test_the_loops_end_after_the_drain_the_heartbeat_keeping_the_lease_through_it(app,
                                                                                   monkeypatch):
    """The loops end once the in-flight run drained, not when the stop is asked: a 1.5 s run
    under a 1 s lease, a reaper beside, finishes within the grace period on its first attempt
    (the heartbeat renewed its lease during the drain) and its success is recorded."""
    logs = record_logs(monkeypatch)
    lost = LostCancellation()
    monkeypatch.setattr(redis.asyncio.client.PubSub, "get_message",
                        lost.wrap(redis.asyncio.client.PubSub.get_message))

    async def main() -> str:
        with reaper_thread(app):
            async with serving(app, lease_ms=1000, grace_s=30.0) as w:
                run_id = app.enqueue(basic.slow, [1.5])
                await until(lambda: w.inflight, 30, what="the run to start")
                lost.armed = True
                await asyncio.wait_for(lost.held.wait(), 30)
        return run_id

    run_id = asyncio.run(main())
    assert lost.lost == 1
    run = app.get_run(run_id)
    assert run.state == "succeeded", [(a.outcome, a.error) for a in run.attempts]
    assert [a.outcome for a in run.attempts] == ["succeeded"]
    assert not logs.events("lease lost; stopping the run")
