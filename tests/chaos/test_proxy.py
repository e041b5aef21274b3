"""The chaos proxy does what the harness relies on: pass, slow, stall and cut a link."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from duetime.embedded import EmbeddedServer
from tests.chaos.proxy import ProxyHub


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    with ProxyHub() as h:
        yield h


def client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))


def test_links_pass_slow_stall_and_cut(servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    other = hub.link(servers["redis"].port)
    c, o = client(link.port), client(other.port)
    assert c.ping() and o.ping()

    link.slow(0.2)
    t = time.monotonic()
    assert c.ping()
    assert time.monotonic() - t >= 0.4  # both directions wait
    link.heal()

    link.stall()
    with pytest.raises(redis.TimeoutError):
        c.ping()
    assert o.ping()  # the other link is unaffected
    link.heal()

    link.cut()
    with pytest.raises(redis.ConnectionError):
        client(link.port).ping()
    assert o.ping()
    link.heal()
    assert client(link.port).ping()


def test_a_stalled_link_holds_bytes_and_delivers_them_when_healed(
        servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    c = redis.Redis(port=link.port, socket_timeout=5)
    c.ping()
    link.stall()
    threading.Timer(0.3, link.heal).start()
    t = time.monotonic()
    assert c.set("chaos:proxy:held", "1")
    assert 0.25 <= time.monotonic() - t < 4


def test_a_cut_resets_open_connections(servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["valkey"].port)
    c = client(link.port)
    c.ping()
    link.cut()
    with pytest.raises(redis.ConnectionError):
        c.ping()
    link.heal()
    assert c.ping()
