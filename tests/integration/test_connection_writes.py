"""The asyncio client's writes (common/connection.py `_UntimedSmallWrites`): a command the
transport takes whole is sent without `asyncio.wait_for` (a task per pipeline, on the
worker's hot path), and every wait stays bounded by the socket timeout: a small command to a
server that stopped answering times out on its read, a large one that cannot be written
times out on its write, as before."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import pytest
import redis
from duetime.common.connection import WRITE_HIGH_WATER, async_client

from duetime.embedded import EmbeddedServer

TIMEOUT_S = 0.5


@pytest.fixture
def wait_fors(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeouts of every asyncio.wait_for call made while the test runs (redis-py calls
    it through the module attribute)."""
    seen: list[float] = []
    real = asyncio.wait_for

    async def counting(aw: Any, timeout: float | None) -> Any:
        seen.append(timeout if timeout is not None else -1.0)
        return await real(aw, timeout)

    monkeypatch.setattr(asyncio, "wait_for", counting)
    return seen


def test_a_small_write_takes_no_wait_for_and_the_timeout_stays(url: str,
                                                                wait_fors: list[float]) -> None:
    key = f"writes:{uuid.uuid4().hex}"

    async def main() -> None:
        client = async_client(url, socket_timeout=5)
        try:
            assert await client.ping()  # connected (the handshake may use wait_for)
            wait_fors.clear()
            pipe = client.pipeline(transaction=False)
            pipe.set(key, b"x" * 100)
            pipe.get(key)
            assert await pipe.execute() == [True, b"x" * 100]
            assert wait_fors == []  # the write went out without a task around it
            big = b"y" * (WRITE_HIGH_WATER + 1)
            assert await client.set(key, big)
            assert wait_fors == [5]  # too large to be sure it never waits: bounded, as before
            for conn in client.connection_pool._available_connections:  # type: ignore[attr-defined]
                assert conn.socket_timeout == 5  # set back after each write
            await client.delete(key)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_writes_to_a_server_that_stopped_stay_bounded() -> None:
    server = EmbeddedServer("redis").start()
    stopped = False
    try:
        async def main() -> tuple[BaseException, BaseException]:
            small = async_client(server.url, socket_timeout=TIMEOUT_S)
            large = async_client(server.url, socket_timeout=TIMEOUT_S)
            try:
                assert await small.ping() and await large.ping()
                nonlocal stopped
                assert server.proc is not None
                os.kill(server.proc.pid, signal.SIGSTOP)  # it reads nothing more
                stopped = True
                with pytest.raises(redis.TimeoutError) as read_timeout:
                    await small.get("k")  # written at once; its reply never comes
                with pytest.raises(redis.TimeoutError) as write_timeout:
                    # far more than the kernel's socket buffers take: the write itself waits
                    await large.set("k", b"z" * (64 << 20))
                return read_timeout.value, write_timeout.value
            finally:
                for c in (small, large):
                    c.connection_pool.reset()  # type: ignore[no-untyped-call]

        read_error, write_error = asyncio.run(main())
        assert "read" in str(read_error).lower()
        assert "writing" in str(write_error).lower()
    finally:
        if stopped and server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
