"""The asyncio client's reads (common/connection.py `_RepliesOutwaitAHeldLoop`): a reply's
timeout counts the time the loop was free to read it. A task body that blocks the worker's
loop past the timeout (a sync call in an `async def`) no longer throws away the replies that
arrived meanwhile (a lost claim reply left its batch leased to no one for a lease), and a
server that does not answer still times out.

The loop is held with `time.sleep` on purpose: that is the fault under test, not a wait."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest
import redis
from duetime.common.connection import async_client
from duetime.common.loops import HELD_LOOP_S

from duetime.embedded import EmbeddedServer

TIMEOUT_S = 0.2
HOLD_S = TIMEOUT_S + HELD_LOOP_S + 0.5  # past the timeout, and by more than a late timer


def hold_the_loop() -> None:
    """What a blocking task body does to the worker's loop."""
    time.sleep(HOLD_S)


@pytest.mark.scripts(memory="the in-memory backend has no socket to read")
def test_replies_that_arrived_while_the_loop_was_held_are_read(url: str) -> None:
    key = f"reads:{uuid.uuid4().hex}"

    async def main() -> None:
        client = async_client(url, socket_timeout=TIMEOUT_S)
        try:
            assert await client.ping()
            call = asyncio.create_task(client.set(key, b"v"))
            await asyncio.sleep(0)  # the command is written; the loop is held before its reply
            hold_the_loop()
            assert await call is True  # without the change: TimeoutError, the reply dropped
            pipe = client.pipeline(transaction=False)
            pipe.get(key)
            pipe.incr(f"{key}:n")
            pipe.delete(key, f"{key}:n")
            call = asyncio.create_task(pipe.execute())
            await asyncio.sleep(0)
            hold_the_loop()
            assert await call == [b"v", 1, 2]  # every reply of a pipeline
            conns = client.connection_pool._available_connections  # type: ignore[attr-defined]
            assert [c.socket_timeout for c in conns] == [TIMEOUT_S]  # one connection, kept
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_server_that_does_not_answer_still_times_out_after_a_held_loop() -> None:
    server = EmbeddedServer("redis").start()
    assert server.proc is not None
    stopped = False
    try:
        async def main() -> tuple[BaseException, BaseException]:
            client = async_client(server.url, socket_timeout=TIMEOUT_S)
            try:
                assert await client.ping()
                nonlocal stopped
                os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                stopped = True
                with pytest.raises(redis.TimeoutError) as on_a_free_loop:
                    await client.get("k")
                call = asyncio.create_task(client.get("k"))
                await asyncio.sleep(0)
                hold_the_loop()  # the timer fires late: armed again, then it expires on time
                with pytest.raises(redis.TimeoutError) as after_a_hold:
                    await call
                return on_a_free_loop.value, after_a_hold.value
            finally:
                client.connection_pool.reset()  # type: ignore[no-untyped-call]

        for error in asyncio.run(main()):
            assert "Timeout reading" in str(error)
    finally:
        if stopped:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def test_a_cancelled_read_stays_a_cancellation() -> None:
    """A read cancelled by its caller (a worker stopping) is a CancelledError, not the
    timer's TimeoutError, and the connection's timeout is set back."""
    server = EmbeddedServer("redis").start()
    assert server.proc is not None
    try:
        async def main() -> None:
            client = async_client(server.url, socket_timeout=TIMEOUT_S)
            try:
                assert await client.ping()
                os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                call = asyncio.create_task(client.get("k"))
                await asyncio.sleep(0)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
                os.kill(server.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
                assert await client.set("k", 1) is True
                conns = client.connection_pool._available_connections  # type: ignore[attr-defined]
                assert conns and all(c.socket_timeout == TIMEOUT_S for c in conns)
            finally:
                await client.aclose()

        asyncio.run(main())
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
