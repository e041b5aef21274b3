"""The chaos proxy does what the harness relies on: pass, slow, stall and cut a link."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from duetime.embedded import EmbeddedServer
from tests.chaos.proxy import ProxyHub
from tests.conftest import wait_for


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    with ProxyHub() as h:
        yield h


def client(port: int) -> redis.Redis:
    """A client that gives up after 0.5 s: what proves a link silent."""
    return redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))


def patient(port: int) -> redis.Redis:
    """A client for what must pass: a loaded machine may take longer than 0.5 s to answer."""
    return redis.Redis(port=port, socket_timeout=60, retry=Retry(NoBackoff(), 0))


def test_links_pass_slow_stall_and_cut(servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    other = hub.link(servers["redis"].port)
    # `c` gives up after 0.5 s (to see a silent link); what must pass goes through patient
    # clients: the slowed ping takes 0.4 s at least, which left a loaded machine 0.1 s
    c, o = client(link.port), patient(other.port)
    assert c.ping() and o.ping()

    link.slow(0.2)
    slowed = patient(link.port)
    t = time.monotonic()
    assert slowed.ping()
    assert time.monotonic() - t >= 0.4  # both directions wait
    link.heal()
    slowed.close()

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
    assert patient(link.port).ping()


def test_a_stalled_link_holds_bytes_and_delivers_them_when_healed(
        servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    c = redis.Redis(port=link.port, socket_timeout=60)
    c.ping()
    link.stall()
    healed: list[float] = []

    def heal() -> None:
        healed.append(time.monotonic())
        link.heal()

    threading.Timer(0.3, heal).start()
    assert c.set("chaos:proxy:held", "1")
    replied = time.monotonic()
    # held until the heal, then delivered: the reply came after it (whenever a loaded machine
    # ran the timer; a reply bound of 4 s and a 5 s socket timeout measured its load)
    assert healed and replied >= healed[0]


def test_a_cut_resets_open_connections(servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["valkey"].port)
    c = client(link.port)
    c.ping()
    link.cut()
    with pytest.raises(redis.ConnectionError):
        c.ping()
    link.heal()
    assert c.ping()


def test_latency_delays_every_chunk_both_ways_in_order(
        servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    c = redis.Redis(port=link.port, socket_timeout=60)
    c.ping()
    link.latency(0.05, 0.1)
    t = time.monotonic()
    assert c.ping()
    assert time.monotonic() - t >= 0.1  # 50 ms at least each way
    pipe = c.pipeline(transaction=False)
    for i in range(200):  # many chunks in flight, each with its own delay: order is kept
        pipe.rpush("chaos:proxy:order", i)
    pipe.lrange("chaos:proxy:order", 0, -1)
    assert [int(x) for x in pipe.execute()[-1]] == list(range(200))
    c.delete("chaos:proxy:order")
    link.latency(0.0)


def test_a_precise_hub_delays_sub_millisecond_chunks_and_keeps_their_order(
        servers: dict[str, EmbeddedServer]) -> None:
    """The hub bench.throughput uses for --rtt_ms: the same delay line on a loop whose timers
    are finer than a millisecond; a round trip is never shorter than the latency asked."""
    with ProxyHub(precise=True) as precise:
        link = precise.link(servers["redis"].port)
        c = redis.Redis(port=link.port, socket_timeout=60)
        c.ping()
        link.latency(0.0005)
        for _ in range(20):
            t = time.perf_counter()
            assert c.ping()
            assert time.perf_counter() - t >= 0.001  # 0.5 ms at least each way
        pipe = c.pipeline(transaction=False)
        for i in range(200):
            pipe.rpush("chaos:proxy:precise", i)
        pipe.lrange("chaos:proxy:precise", 0, -1)
        assert [int(x) for x in pipe.execute()[-1]] == list(range(200))
        c.delete("chaos:proxy:precise")
        c.close()


def test_half_open_drops_silently_and_its_connections_stay_dead_after_heal(
        servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    c = client(link.port)
    c.ping()
    raw = socket.create_connection(("127.0.0.1", link.port))
    link.half_open()
    with pytest.raises(redis.TimeoutError):  # no FIN, no RST: only silence
        c.ping()
    with pytest.raises(redis.TimeoutError):  # a new connection is accepted, then silent too
        client(link.port).ping()
    # each client gave its connection up after its 0.5 s socket timeout: the link saw it
    wait_for(lambda: len(link.detections) >= 2, 5, what="the clients closing")
    assert all(d >= 0.4 for d in link.detections), link.detections
    link.heal()
    raw.sendall(b"PING\r\n")  # the old connection's peer is gone for good
    raw.settimeout(0.3)
    with pytest.raises(TimeoutError):
        raw.recv(10)
    raw.close()
    assert patient(link.port).ping()  # new connections work again


def test_reset_mid_reply_forwards_part_of_it_then_resets(
        servers: dict[str, EmbeddedServer], hub: ProxyHub) -> None:
    link = hub.link(servers["redis"].port)
    direct = redis.Redis(port=servers["redis"].port)
    direct.set("chaos:proxy:big", b"x" * 100_000)
    raw = socket.create_connection(("127.0.0.1", link.port))
    raw.settimeout(5)
    link.reset_reply(cut_at=10)
    raw.sendall(b"GET chaos:proxy:big\r\n")
    got = b""
    with pytest.raises(ConnectionResetError):
        while chunk := raw.recv(65536):
            got += chunk
    assert 0 < len(got) <= 10 and got.startswith(b"$100000")
    assert link.resets == 1
    raw.close()
    link.heal()
    assert client(link.port).get("chaos:proxy:big") == b"x" * 100_000
    direct.delete("chaos:proxy:big")
    direct.close()
