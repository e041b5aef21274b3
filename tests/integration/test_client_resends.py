"""duetime's clients never send a command again themselves (common/connection.py NO_RETRIES).

A command whose reply was lost may have run. redis-py's defaults for resending one move
between its versions (its cluster client went from 3 resends to 10 in 8.2); duetime states
none for its plain clients and retries in its own loops, which know what a resend means.
(redis-py 8.2 itself gives a client made from a URL no retries: this guards duetime's own
setting against a default that changes.) Proven through the
chaos proxy's `reset_reply`: the server runs an INCR, then the connection is reset mid-reply
(and so is every connection opened after it, until the link heals). A client that resent
would leave the counter past 1."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from duetime.common.connection import async_client, sync_client

from tests.chaos.proxy import ProxyHub


@pytest.fixture
def link(server):
    with ProxyHub() as hub:
        yield hub.link(server.port)


def test_a_sync_client_does_not_resend_a_command_whose_reply_was_lost(link, r):
    key = f"resend:{uuid.uuid4().hex}"
    client = sync_client(link.url())
    try:
        assert client.ping()
        link.reset_reply()
        with pytest.raises(redis.ConnectionError):
            client.incr(key)
        link.heal()
        assert int(r.get(key)) == 1
        assert client.incr(key) == 2  # the next call connects again, as before
    finally:
        client.close()


def test_an_asyncio_client_does_not_resend_a_command_whose_reply_was_lost(link, r):
    key = f"resend:{uuid.uuid4().hex}"

    async def main() -> int:
        client = async_client(link.url())
        try:
            assert await client.ping()
            link.reset_reply()
            with pytest.raises(redis.ConnectionError):
                await client.incr(key)
            link.heal()
            return int(await client.incr(key))
        finally:
            await client.aclose()

    assert asyncio.run(main()) == 2
    assert int(r.get(key)) == 2
