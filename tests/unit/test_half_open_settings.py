"""The settings that bound how long a connection whose peer vanished is waited on (docs/
operations.md, "Half-open connections"): kernel keepalive and TCP_USER_TIMEOUT on every TCP
connection, and a reply timeout for the long-running processes that does not depend on the
redis-py version's default (redis-py before 8 waits for ever)."""

from __future__ import annotations

import socket

import pytest
from duetime.common import connection
from duetime.common.durability import Durability


@pytest.mark.parametrize("make", [connection.sync_client, connection.async_client])
def test_every_tcp_connection_gets_keepalive(make: object) -> None:
    client = make("redis://127.0.0.1:1/0")  # type: ignore[operator]
    kw = client.connection_pool.connection_kwargs
    assert kw["socket_keepalive"] is True
    opts = kw["socket_keepalive_options"]
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux
        assert opts[socket.TCP_KEEPIDLE] == connection.KEEPIDLE_S
        assert opts[socket.TCP_KEEPINTVL] == connection.KEEPINTVL_S
        assert opts[socket.TCP_KEEPCNT] == connection.KEEPCNT
        assert opts[socket.TCP_USER_TIMEOUT] == connection.USER_TIMEOUT_MS
    assert connection.KEEPIDLE_S + connection.KEEPINTVL_S * connection.KEEPCNT <= 10


def test_a_unix_socket_takes_no_tcp_options() -> None:
    kw = connection.sync_client("unix:///tmp/nowhere.sock").connection_pool.connection_kwargs
    assert "socket_keepalive" not in kw


def test_a_caller_keeps_its_own_choice() -> None:
    client = connection.sync_client("redis://127.0.0.1:1/0", socket_keepalive=False)
    assert client.connection_pool.connection_kwargs["socket_keepalive"] is False


def test_processes_wait_a_bounded_time_for_a_reply() -> None:
    assert connection.process_kw(Durability())["socket_timeout"] == connection.REPLY_TIMEOUT_S
    # replicated durability: the server's WAIT may take its timeout to answer
    d = Durability(replicas=1, timeout_ms=3000)
    assert connection.process_kw(d)["socket_timeout"] == connection.REPLY_TIMEOUT_S + 3.0
    client = connection.async_client("redis://127.0.0.1:1/0", **connection.process_kw(Durability()))
    assert client.connection_pool.connection_kwargs["socket_timeout"] == connection.REPLY_TIMEOUT_S
